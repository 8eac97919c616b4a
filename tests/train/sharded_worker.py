"""Run with 8 fake CPU devices (tests/train/test_sharded.py): a sharded SFT step and GRPO
step equal the single-device steps; a checkpoint saved on one mesh restores onto another."""

import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxspatial.models.qwen2_5_vl import Qwen25VL, Qwen25VLConfig, TextConfig, VisionConfig
from jaxspatial.models.sharding import make_mesh
from jaxspatial.rl.objectives import PolicyLossConfig
from jaxspatial.train import Checkpointer, StepConfig, TrainBatch, shard_batch, train_step

CONFIG = Qwen25VLConfig(
    text=TextConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, mrope_section=(2, 3, 3),
                    tie_word_embeddings=False),
    vision=VisionConfig(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                        out_hidden_size=64, fullatt_block_indexes=(1,)),
    image_token_id=250)


def batch(seed: int) -> TrainBatch:
  rng = np.random.default_rng(seed)
  b, s = 8, 24
  tokens = rng.integers(0, 240, (b, s)).astype(np.int32)
  tokens[:, 2:6] = 250  # one 56x56 view: 4 merged vision tokens
  attention = np.ones((b, s), bool)
  attention[1, :2] = False
  loss = np.zeros((b, s), bool)
  loss[:, 10:20] = True
  images = rng.integers(0, 255, (b, 1, 56, 56, 3)).astype(np.uint8)
  return TrainBatch(tokens=jnp.asarray(tokens), attention_mask=jnp.asarray(attention),
                    loss_mask=jnp.asarray(loss), images=jnp.asarray(images),
                    advantages=jnp.asarray(rng.normal(size=b), jnp.float32),
                    old_logprobs=jnp.asarray(rng.normal(size=(b, s)) * 0.1 - 5.5, jnp.float32),
                    ref_logprobs=jnp.asarray(rng.normal(size=(b, s)) * 0.1 - 5.5, jnp.float32))


def copy_into(target, source):
  state = nnx.state(target, nnx.Param)
  values = jax.tree.map(lambda x, s: jax.device_put(np.asarray(x), s.sharding),
                        nnx.to_pure_dict(nnx.state(source, nnx.Param)), nnx.to_pure_dict(state))
  nnx.replace_by_pure_dict(state, values)
  nnx.update(target, state)


def params(model):
  return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def make_sgd(model):
  # Linear in the gradient (unlike Adam's m / sqrt(v), which turns rounding of ~0 gradients
  # into +-lr), with state (momentum) that checkpoints must carry.
  return nnx.Optimizer(model, optax.sgd(0.5, momentum=0.9), wrt=nnx.Param)


def main():
  assert len(jax.devices()) == 8, jax.devices()
  steps = [StepConfig(objective="sft", micro_batches=2),
           StepConfig(objective="grpo", loss=PolicyLossConfig(beta=0.01), micro_batches=1)]
  plain = Qwen25VL(CONFIG, rngs=nnx.Rngs(0))
  plain_opt = make_sgd(plain)
  mesh = make_mesh(data=2, fsdp=2, tensor=2)
  with jax.set_mesh(mesh):
    sharded = Qwen25VL(CONFIG, rngs=nnx.Rngs(1))
    copy_into(sharded, plain)
    sharded_opt = make_sgd(sharded)
  for i, config in enumerate(steps):
    data = batch(i)
    expected = train_step(plain, plain_opt, data, config)
    with jax.set_mesh(mesh):
      got = train_step(sharded, sharded_opt, shard_batch(data, mesh), config)
    np.testing.assert_allclose(float(got["loss"]), float(expected["loss"]), rtol=1e-5, atol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
                 params(sharded), params(plain))
    print(f"{config.objective}: sharded step equals single-device step, loss "
          f"{float(got['loss']):.6f}")
  kernel = sharded.language_model.layers[0].mlp.gate_proj.kernel[...]
  assert kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor"), kernel.sharding

  # Save on the (2, 2, 2) mesh, restore onto (8, 1, 1).
  with tempfile.TemporaryDirectory() as folder:
    saver = Checkpointer(folder, keep=1)
    saver.save(7, sharded, sharded_opt, {"phase": "grpo", "note": [1, 2]})
    saver.close()
    other_mesh = make_mesh(data=1, fsdp=8, tensor=1)
    with jax.set_mesh(other_mesh):
      fresh = Qwen25VL(CONFIG, rngs=nnx.Rngs(5))
      fresh_opt = make_sgd(fresh)
      loader = Checkpointer(folder, keep=1)
      step, extra = loader.restore(fresh, fresh_opt)
    assert step == 7 and extra == {"phase": "grpo", "note": [1, 2]}, (step, extra)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), params(fresh), params(sharded))
    embed = fresh.language_model.embed_tokens.embedding[...]
    assert "fsdp" in str(embed.sharding.spec), embed.sharding
    # The restored optimizer continues identically.
    data = batch(5)
    with jax.set_mesh(other_mesh):
      a = train_step(fresh, fresh_opt, shard_batch(data, other_mesh), steps[0])
    with jax.set_mesh(mesh):
      b = train_step(sharded, sharded_opt, shard_batch(data, mesh), steps[0])
    np.testing.assert_allclose(float(a["loss"]), float(b["loss"]), rtol=1e-5)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6),
                 params(fresh), params(sharded))
    print("checkpoint restored onto another mesh continues identically")
  return 0


if __name__ == "__main__":
  sys.exit(main())
