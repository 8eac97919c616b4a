"""Interleaved multimodal rotary position embedding (M-RoPE) of Qwen3-VL.

Positions come as three streams [3, B, L] (temporal, height, width), as in Qwen2.5-VL, but
the streams are interleaved over the frequencies instead of taking contiguous sections:
frequency d rotates with the height stream where d = 1 mod 3 and d < 3 * section[1], with
the width stream where d = 2 mod 3 and d < 3 * section[2], and with the temporal stream
elsewhere (transformers' `Qwen3VLTextRotaryEmbedding`).

The image position rule (`rope_index`) is Qwen2.5-VL's for images: t = 1 grids, tokens at
start + (frame, row, column), the text after resuming at start + max(h, w) / merge.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxspatial.models.qwen2_5_vl.rope import apply_rotary, rope_index, rotate_half, \
    text_position_ids

Array = jax.Array
__all__ = ["apply_rotary", "interleaved_streams", "mrope_cos_sin", "rope_index",
           "rotate_half", "text_position_ids"]


def interleaved_streams(half_dim: int, section: tuple[int, int, int]) -> np.ndarray:
  """The position stream (0 t, 1 h, 2 w) each of the head's `half_dim` frequencies uses."""
  stream = np.zeros(half_dim, np.int32)
  for axis in (1, 2):
    stream[axis:3 * section[axis]:3] = axis
  return stream


def mrope_cos_sin(position_ids_3xBxL: Array, head_dim: int, theta: float,
                  section: tuple[int, int, int]) -> tuple[Array, Array]:
  """cos, sin of shape [B, L, head_dim] (the two halves repeat, as rotate_half expects)."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  angles = position_ids_3xBxL.astype(jnp.float32)[..., None] * inv_freq  # [3, B, L, D/2]
  stream = jnp.asarray(interleaved_streams(head_dim // 2, section))
  # A gather, not a one-hot matmul: exact on every backend.
  index = jnp.broadcast_to(stream, (1,) + angles.shape[1:])
  chosen = jnp.take_along_axis(angles, index, axis=0)[0]
  emb = jnp.concatenate([chosen, chosen], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)
