"""What a request costs in device memory, known before anything runs: the serving engine
refuses a prompt whose prefill would not fit its budget (a 400 naming the limit) instead of
failing an allocation halfway.

`prefill_bytes` bounds the transient memory of prefilling one prompt at batch 1 (the
scheduler's prefill program): per decoder layer, the attention scores and their softmax in
float32 (four [heads, L, L] arrays: 0 when the fused kernel runs, which never materialises
them), the projections' and MLP's activations; the fresh cache; the vision encoder's
attention over each image's patches (full attention, the worst of its blocks) and
activations. Checked against XLA's compiled memory analysis (tests/serving/test_memory.py):
never below it, at most a few times above it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxspatial.models.attention import decode_block, resolve

FLOAT = 4  # bytes: scores, softmax and activations are float32 at worst


def _fused(model) -> bool:
  text = model.language_model
  layer = text.layers[0]
  attention = getattr(layer, "self_attn", None)
  implementation = getattr(attention, "implementation", "einsum")
  dtype = text.embed_tokens.embedding[...].dtype
  return resolve(implementation, dtype) == "cudnn"


def prefill_bytes(model, tokens: int, patches: tuple[int, ...] = (),
                  cache_dtype: str = "float32") -> int:
  """An upper bound of the device memory that prefilling `tokens` prompt tokens (a padded
  bucket) with images of `patches` patches each takes beyond the model's weights."""
  c = model.config.text
  heads, kv, dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
  kinds = getattr(c, "layer_types", None) or ("full_attention",) * c.num_hidden_layers
  full_layers = sum(kind == "full_attention" for kind in kinds)
  block = decode_block()
  if _fused(model) or not full_layers:
    scores = 0
  elif 0 < block < tokens:  # the einsum path reads the cache by blocks (filled_attention)
    scores = (4 * block + 3 * dim) * heads * tokens * FLOAT
  else:
    scores = 4 * heads * tokens * tokens * FLOAT
  activations = tokens * (2 * heads * dim + 2 * kv * dim + 3 * c.intermediate_size
                          + 6 * c.hidden_size) * FLOAT
  cache = full_layers * 2 * tokens * kv * dim * jnp.dtype(cache_dtype).itemsize
  recurrent = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(
      jax.eval_shape(lambda: model.language_model.init_cache(1, 1, jnp.dtype(cache_dtype)))))
  logits = c.vocab_size * FLOAT
  vision = 0
  if patches:
    v = model.config.vision
    total = sum(patches)
    vision = (4 * v.num_heads * max(patches) ** 2 * FLOAT
              + total * (8 * v.hidden_size + 3 * v.intermediate_size) * FLOAT)
  return int(scores + activations + cache + recurrent + logits + vision)


def image_patches(model, image_shape) -> int:
  """Vision-encoder patches of an image of (H, W) at the model's size."""
  t, h, w = model.image_grid(tuple(image_shape[:2]))
  return t * h * w


def slot_bytes(model, slots: int, capacity: int, cache_dtype: str = "float32") -> int:
  """Device memory of the scheduler's slots: every row's cache at `capacity` + 1 slots and
  its next-token logits."""
  text = model.language_model
  cache = jax.eval_shape(lambda: text.init_cache(slots, capacity + 1, jnp.dtype(cache_dtype)))
  return int(sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(cache))
             + slots * model.config.text.vocab_size * FLOAT)


def free_device_bytes() -> int | None:
  """The default device's memory limit less what it holds, or None where it reports none
  (CPU)."""
  stats = jax.devices()[0].memory_stats() or {}
  if "bytes_limit" not in stats:
    return None
  return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def gigabytes(value: int) -> str:
  return f"{value / 1e9:.2f} GB"


__all__ = ["free_device_bytes", "gigabytes", "image_patches", "prefill_bytes", "slot_bytes"]
