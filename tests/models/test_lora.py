"""LoRA: a fresh adapter changes nothing, the math is W x + (alpha / r) B A x, the adapters
train alone, and merging gives the same outputs."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxspatial.models.lora import LoRALinear, apply_lora, merge_lora
from jaxspatial.models.qwen2_5_vl import TextConfig, TextModel, text_position_ids

CONFIG = TextConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, mrope_section=(1, 1, 2),
                    tie_word_embeddings=False)


def forward(model, ids):
  mask = jnp.ones_like(ids)
  return model(ids, text_position_ids(mask), mask)


@pytest.mark.slow
def test_lora_math_training_and_merge():
  model = TextModel(CONFIG, rngs=nnx.Rngs(0))
  ids = jnp.asarray(np.random.default_rng(0).integers(0, 128, (2, 6)))
  before = forward(model, ids)
  wrapped = apply_lora(model, ("q_proj", "v_proj"), rank=4, alpha=8.0, rngs=nnx.Rngs(1))
  assert wrapped == 4 and isinstance(model.layers[0].self_attn.q_proj, LoRALinear)
  np.testing.assert_allclose(forward(model, ids), before, atol=1e-6)  # B = 0

  layer = model.layers[1].self_attn.v_proj
  layer.lora_b[...] = jax.random.normal(jax.random.key(2), layer.lora_b[...].shape)
  x = jax.random.normal(jax.random.key(3), (5, 32))
  expected = x @ layer.base.kernel[...] + layer.base.bias[...] + 2.0 * (
      x @ layer.lora_a[...] @ layer.lora_b[...])
  np.testing.assert_allclose(layer(x), expected, rtol=1e-5, atol=1e-5)

  # Only the adapters move under an optimizer over LoRAParams.
  base_params = nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))  # LoRAParam subclasses Param
  frozen = jax.tree.map(jnp.copy, nnx.state(model, base_params))
  optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.LoRAParam)
  target = jnp.roll(ids, 1, axis=1)

  def loss_fn(m):
    return optax.softmax_cross_entropy_with_integer_labels(forward(m, ids), target).mean()

  losses = []
  for _ in range(5):
    loss, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, nnx.LoRAParam))(model)
    optimizer.update(model, grads)
    losses.append(float(loss))
  assert losses[-1] < losses[0]
  jax.tree.map(np.testing.assert_array_equal, frozen, nnx.state(model, base_params))

  adapted = forward(model, ids)
  assert merge_lora(model) == 4
  assert isinstance(model.layers[0].self_attn.q_proj, nnx.Linear)
  np.testing.assert_allclose(forward(model, ids), adapted, atol=1e-5)


def test_dropout_and_errors():
  base = nnx.Linear(8, 8, rngs=nnx.Rngs(0))
  layer = LoRALinear(base, rank=2, alpha=2.0, dropout=0.5, rngs=nnx.Rngs(1))
  layer.lora_b[...] = jnp.ones_like(layer.lora_b[...])
  x = jnp.ones((4, 8))
  layer.eval()
  np.testing.assert_allclose(layer(x), layer(x))
  layer.train()
  assert not np.allclose(layer(x), layer(x))
  with pytest.raises(ValueError, match="no nnx.Linear named any of"):
    apply_lora(TextModel(CONFIG, rngs=nnx.Rngs(0)), ("missing",), 2, 2.0, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="rank must be positive"):
    LoRALinear(base, 0, 1.0, rngs=nnx.Rngs(0))


TIED = TextConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, mrope_section=(1, 1, 2),
                  tie_word_embeddings=True)


def test_every_linear_and_the_tied_lm_head():
  """3DThinker's stage-2 trainer puts LoRA on every nn.Linear outside the vision tower,
  `lm_head` included (PEFT, tied head: the adapter adds (alpha / r) x A B to the logits; the
  embedding stays shared and unchanged)."""
  from jaxspatial.models.lora import LoRATiedHead, linear_names
  model = TextModel(TIED, rngs=nnx.Rngs(0))
  assert model.lm_head is None
  names = linear_names(model)
  assert names == ("down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj")
  ids = jnp.asarray(np.random.default_rng(0).integers(0, 128, (2, 6)))
  mask = jnp.ones_like(ids)
  before = forward(model, ids)
  assert apply_lora(model, names + ("lm_head",), rank=4, alpha=8.0, rngs=nnx.Rngs(1)) == 15
  head = model.lm_head
  assert isinstance(head, LoRATiedHead) and head.embed is model.embed_tokens
  np.testing.assert_allclose(forward(model, ids), before, atol=1e-6)  # B = 0
  head.lora_b[...] = jax.random.normal(jax.random.key(2), head.lora_b[...].shape)
  hidden = np.asarray(model.hidden_states(model.embed_tokens(ids), text_position_ids(mask),
                                          mask), np.float64)
  embedding = np.asarray(model.embed_tokens.embedding[...], np.float64)
  expected = hidden @ embedding.T + 2.0 * hidden @ np.asarray(head.lora_a[...]) @ np.asarray(
      head.lora_b[...])
  np.testing.assert_allclose(forward(model, ids), expected, rtol=1e-4, atol=1e-4)
  # The adapters train alone; the shared embedding (input lookup and head) does not move.
  embedding_before = np.asarray(model.embed_tokens.embedding[...])
  optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.LoRAParam)
  loss_fn = lambda m: optax.softmax_cross_entropy_with_integer_labels(
      forward(m, ids), jnp.roll(ids, 1, axis=1)).mean()
  a_before = np.asarray(head.lora_a[...])
  _, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, nnx.LoRAParam))(model)
  optimizer.update(model, grads)
  assert np.abs(np.asarray(head.lora_a[...]) - a_before).max() > 0
  np.testing.assert_array_equal(model.embed_tokens.embedding[...], embedding_before)
  with pytest.raises(ValueError, match="tied LM head cannot be folded"):
    merge_lora(model)
