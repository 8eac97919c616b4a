"""Multimodal rotary position embedding (M-RoPE) that the Qwen-VL families share.

Positions come as three streams [3, B, L] (temporal, height, width); text tokens have the
same value in all three. Each of the head's frequencies rotates with one stream; which one
is the family's choice (Qwen2.5-VL: contiguous sections, Qwen3-VL: interleaved), given as
`streams`, one stream index per frequency.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def mrope_cos_sin(position_ids_3xBxL: Array, head_dim: int, theta: float,
                  streams: np.ndarray) -> tuple[Array, Array]:
  """cos, sin of shape [B, L, head_dim] (the two halves repeat, as rotate_half expects);
  frequency d rotates with position stream `streams[d]`."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  angles = position_ids_3xBxL.astype(jnp.float32)[..., None] * inv_freq  # [3, B, L, D/2]
  # A gather: exact on every backend, where a one-hot matmul would drop to bfloat16
  # precision on TPU.
  index = jnp.broadcast_to(jnp.asarray(streams, jnp.int32), (1,) + angles.shape[1:])
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


def rope_index(input_ids_L: Array, attention_mask_L: Array, image_grid_thw_Kx3: Array,
               image_token_id: int, spatial_merge_size: int = 2) -> Array:
  """M-RoPE positions [3, L] of one sequence with images, as transformers' get_rope_index.

  Text tokens count up by one. The n = t * (h/m) * (w/m) tokens of image k (in order of
  appearance; its grid is row k of `image_grid_thw`, in patches) sit at
  start + (t index, row, column), and the text after it resumes at start + max(h, w) / m.
  Padding gets position 0. A scan over tokens: jit and vmap friendly.
  """
  grids = jnp.asarray(image_grid_thw_Kx3, jnp.int32)
  merged = grids // jnp.asarray([1, spatial_merge_size, spatial_merge_size], jnp.int32)

  def step(carry, inputs):
    current, k, j = carry
    token, attended = inputs
    is_image = attended & (token == image_token_id)
    t, h, w = (merged[jnp.minimum(k, merged.shape[0] - 1), axis] for axis in range(3))
    area = jnp.maximum(h * w, 1)
    image_pos = current + jnp.stack([j // area, (j // jnp.maximum(w, 1)) % jnp.maximum(h, 1),
                                     j % jnp.maximum(w, 1)])
    text_pos = jnp.full((3,), current)
    position = jnp.where(is_image, image_pos, jnp.where(attended, text_pos, 0))
    j_next = jnp.where(is_image, j + 1, j)
    finished = is_image & (j_next == t * h * w)
    current = jnp.where(attended & ~is_image, current + 1, current)
    current = jnp.where(finished, current + jnp.maximum(h, w), current)
    return (current, jnp.where(finished, k + 1, k), jnp.where(finished, 0, j_next)), position

  zero = jnp.zeros((), jnp.int32)
  _, positions = jax.lax.scan(step, (zero, zero, zero),
                              (jnp.asarray(input_ids_L), jnp.asarray(attention_mask_L, bool)))
  return positions.T
