"""The optimizer's schedules and weight-decay rule against transformers' own functions (the
trainers 3DThinker's scripts run: `get_cosine_schedule_with_warmup`,
`get_linear_schedule_with_warmup`, and the Trainer's decay rule)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspatial.models.qwen2_5_vl import TextConfig, TextModel
from jaxspatial.train import OptimizerConfig, make_optimizer
from jaxspatial.train.optim import schedule

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def transformers_rates(make_scheduler, peak: float, steps: int) -> list[float]:
  """The learning rate transformers' scheduler gives the optimizer step k = 0 .. steps - 1
  (the Trainer steps the scheduler after each optimizer step)."""
  optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
  scheduler = make_scheduler(optimizer)
  rates = []
  for _ in range(steps):
    rates.append(optimizer.param_groups[0]["lr"])
    optimizer.step()
    scheduler.step()
  return rates


@pytest.mark.parametrize("warmup", [0, 10])
@pytest.mark.parametrize("decay", ["cosine", "linear"])
def test_schedules_match_transformers_when_decaying_to_zero(decay, warmup):
  total, peak = 60, 3e-4
  config = OptimizerConfig(learning_rate=peak, warmup_steps=warmup, total_steps=total,
                           final_fraction=0.0, decay=decay)
  make = (transformers.get_cosine_schedule_with_warmup if decay == "cosine"
          else transformers.get_linear_schedule_with_warmup)
  expected = transformers_rates(lambda o: make(o, warmup, total), peak, total)
  got = [float(schedule(config)(k)) for k in range(total)]
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-9)  # float32 near 0
  assert got[-1] < 0.03 * peak  # the last step is almost at 0


def test_config_rejects_unknown_options():
  with pytest.raises(ValueError, match=r"OptimizerConfig.decay: expected one of .*got 'step'"):
    OptimizerConfig(decay="step")
  with pytest.raises(ValueError, match="OptimizerConfig.weight_decay_mask: expected one of"):
    OptimizerConfig(weight_decay_mask="norms")


CONFIG = TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, mrope_section=(1, 1, 2),
                    tie_word_embeddings=True)


def transformers_decayed_names() -> set[str]:
  """The names transformers' Trainer (4.49, the version 3DThinker's scripts pin) decays on
  the same Qwen2 decoder: `get_parameter_names(model, [LayerNorm], ["bias", "layernorm",
  "rmsnorm"])`, in our naming (no "model." prefix; kernel / embedding for weight)."""
  from transformers.trainer_pt_utils import get_parameter_names
  hf_config = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, tie_word_embeddings=True)
  model = transformers.Qwen2ForCausalLM(hf_config)
  names = get_parameter_names(model, [torch.nn.LayerNorm], ["bias", "layernorm", "rmsnorm"])
  trained = dict(model.named_parameters())  # the tied lm_head.weight is embed_tokens'
  ours = set()
  for name in (n for n in names if n in trained):
    name = name.removeprefix("model.")
    if name.startswith("embed_tokens"):
      name = "embed_tokens.embedding"
    elif name.endswith(".weight") and "proj" in name:
      name = name.removesuffix(".weight") + ".kernel"
    ours.add(name)
  return ours


@pytest.mark.parametrize("rule", ["all", "transformers"])
def test_weight_decay_skips_biases_and_norms_as_transformers_trainer(rule):
  """One AdamW update with zero gradients moves a parameter only by decay: x (1 - lr wd)."""
  model = TextModel(CONFIG, rngs=nnx.Rngs(0))
  params = nnx.state(model, nnx.Param)  # nonzero everywhere (biases start at 0)
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  nnx.update(model, jax.tree.unflatten(tree, [jax.random.normal(k, x.shape) + 2.0
                                              for k, x in zip(keys, leaves)]))
  lr, wd = 0.5, 0.1
  optimizer = make_optimizer(model, OptimizerConfig(learning_rate=lr, weight_decay=wd,
                                                    weight_decay_mask=rule, clip_norm=None))
  before = {".".join(map(str, path)): np.asarray(v[...])
            for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  optimizer.update(model, jax.tree.map(jnp.zeros_like, nnx.state(model, nnx.Param)))
  after = {".".join(map(str, path)): np.asarray(v[...])
           for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  decayed = {name for name in before if not np.array_equal(after[name], before[name])}
  for name in decayed:
    np.testing.assert_allclose(after[name], before[name] * (1 - lr * wd), rtol=1e-6)
  if rule == "all":
    assert decayed == set(before)
    return
  assert decayed == transformers_decayed_names()
  assert "layers.0.input_layernorm.weight" not in decayed
  assert "layers.0.self_attn.q_proj.bias" not in decayed
  assert {"norm.weight", "layers.1.mlp.down_proj.kernel"} <= decayed  # as transformers 4.49
