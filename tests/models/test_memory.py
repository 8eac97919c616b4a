"""The memory estimate against the arrays a job really allocates."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from jaxspatial.models import memory
from jaxspatial.models.precision import Precision
from jaxspatial.models.qwen2_5_vl import Qwen25VL, Qwen25VLConfig
from jaxspatial.train import OptimizerConfig, make_optimizer


def _nbytes(tree) -> int:
  return sum(x.nbytes for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("precision", [Precision(), Precision("bfloat16", "bfloat16",
                                                              "bfloat16")])
def test_parameters_cache_and_optimizer_match_the_allocated_arrays(precision):
  config = Qwen25VLConfig.tiny()
  model = Qwen25VL(config, rngs=nnx.Rngs(0), **precision.model_kwargs())
  abstract = nnx.eval_shape(lambda: Qwen25VL(config, rngs=nnx.Rngs(0),
                                             **precision.model_kwargs()))
  params = _nbytes(nnx.state(model, nnx.Param))
  assert memory.parameter_bytes(model) == memory.parameter_bytes(abstract) == params
  cache = model.language_model.init_cache(3, 50, precision.cache)
  assert memory.kv_cache_bytes(config.text, 3, 50, precision.cache) == _nbytes(cache)
  estimate = memory.estimate(model, precision, rollout_batch=3, cache_length=50, train_batch=4,
                             train_length=32, training=precision.param_dtype == "float32")
  assert estimate.parameters == params and estimate.kv_cache == _nbytes(cache)
  if precision.param_dtype == "float32":
    optimizer = make_optimizer(model, OptimizerConfig(learning_rate=1e-3))
    moments = [x for x in jax.tree.leaves(nnx.state(optimizer)) if x.size > 1]
    assert estimate.optimizer == _nbytes(moments)  # AdamW's mu and nu
    assert estimate.gradients == params
  else:
    assert estimate.optimizer == estimate.gradients == estimate.activations == 0


def test_remat_micro_batches_and_the_mesh_shrink_the_estimate():
  config = Qwen25VLConfig.tiny()
  model = nnx.eval_shape(lambda: Qwen25VL(config, rngs=nnx.Rngs(0)))
  kw = dict(rollout_batch=64, cache_length=512, train_batch=64, train_length=512)
  plain = memory.estimate(model, Precision(), **kw)
  assert memory.estimate(model, Precision(), remat=True, **kw).activations < plain.activations
  assert memory.estimate(model, Precision(), micro_batches=4, **kw).activations < plain.activations
  mesh = jax.make_mesh((1, 1, 1), ("data", "fsdp", "tensor"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)
  assert memory.estimate(model, Precision(), mesh=mesh, **kw) == plain
  text = config.text
  assert (memory.activation_bytes(text, 2, 128, jnp.float32, fused_attention=True)
          < memory.activation_bytes(text, 2, 128, jnp.float32))


def test_the_table_says_when_a_batch_does_not_fit():
  estimate = memory.MemoryEstimate(parameters=6 * memory.GiB, gradients=6 * memory.GiB,
                                   optimizer=12 * memory.GiB, kv_cache=30 * memory.GiB,
                                   activations=50 * memory.GiB, device_bytes=80 * memory.GiB,
                                   device_kind="NVIDIA H100 80GB HBM3")
  assert estimate.total == 74 * memory.GiB and estimate.fits
  assert "fits" in estimate.table() and "74.00 GiB" in estimate.table()
  tight = memory.MemoryEstimate(**{**estimate.__dict__, "device_bytes": 40 * memory.GiB})
  assert not tight.fits and "DOES NOT FIT" in tight.table()


def test_a_hybrid_cache_holds_keys_for_attention_layers_and_a_fixed_state_for_the_others():
  """Qwen3.5: keys and values only in full-attention layers; each Gated DeltaNet layer
  holds K - 1 convolution inputs and a float32 [H, K, V] state, whatever the length."""
  from jaxspatial.models.qwen3_5 import Qwen35, Qwen35Config
  config = Qwen35Config.tiny()
  model = nnx.eval_shape(lambda: Qwen35(config, rngs=nnx.Rngs(0)))
  t = config.text
  full = t.layer_types.count("full_attention")
  linear = t.num_hidden_layers - full
  for length in (64, 4096):
    expected = (full * 2 * 3 * length * t.num_key_value_heads * t.head_dim * 2  # bf16
                + linear * 3 * (t.linear_conv_kernel_dim - 1) * t.conv_dim * 2
                + linear * 3 * t.linear_num_value_heads * t.linear_key_head_dim
                * t.linear_value_head_dim * 4)
    assert memory.cache_bytes(model, 3, length, "bfloat16") == expected
