"""Multimodal rotary position embedding (M-RoPE) of Qwen2-VL / Qwen2.5-VL.

Positions come as three streams [3, B, L] (temporal, height, width); text tokens have
the same value in all three. The head's frequency dimensions are split by
`mrope_section` (t, h, w): section k rotates with stream k.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def mrope_cos_sin(position_ids_3xBxL: Array, head_dim: int, theta: float,
                  section: tuple[int, int, int]) -> tuple[Array, Array]:
  """cos, sin of shape [B, L, head_dim] (the two halves repeat, as rotate_half expects)."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  angles = position_ids_3xBxL.astype(jnp.float32)[..., None] * inv_freq  # [3, B, L, D/2]
  stream = jnp.concatenate([jnp.full((n,), k, jnp.int32) for k, n in enumerate(section)])
  # Frequency d rotates with position stream stream[d] (a gather: exact on every backend,
  # where a one-hot matmul would drop to bfloat16 precision on TPU).
  index = jnp.broadcast_to(stream, (1,) + angles.shape[1:])
  chosen = jnp.take_along_axis(angles, index, axis=0)[0]
  emb = jnp.concatenate([chosen, chosen], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def rotate_half(x: Array) -> Array:
  half = x.shape[-1] // 2
  return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rotary(x_BxLxHxD: Array, cos_BxLxD: Array, sin_BxLxD: Array) -> Array:
  cos, sin = cos_BxLxD[:, :, None, :], sin_BxLxD[:, :, None, :]
  return (x_BxLxHxD * cos + rotate_half(x_BxLxHxD) * sin).astype(x_BxLxHxD.dtype)


def text_position_ids(attention_mask_BxL: Array) -> Array:
  """Positions of a text-only batch [3, B, L]: the count of real tokens before each one
  (left padding shifts nothing); padded positions get 1, as transformers does."""
  mask = attention_mask_BxL.astype(jnp.int32)
  positions = jnp.cumsum(mask, axis=-1) - 1
  positions = jnp.where(mask > 0, positions, 1)
  return jnp.broadcast_to(positions[None], (3,) + positions.shape)
