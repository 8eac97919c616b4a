"""Interleaved multimodal rotary position embedding (M-RoPE) of Qwen3-VL.

Positions come as three streams [3, B, L] (temporal, height, width), as in Qwen2.5-VL, but
the streams are interleaved over the frequencies instead of taking contiguous sections:
frequency d rotates with the height stream where d = 1 mod 3 and d < 3 * section[1], with
the width stream where d = 2 mod 3 and d < 3 * section[2], and with the temporal stream
elsewhere (transformers' `Qwen3VLTextRotaryEmbedding`). The image position rule
(`jaxspatial.models.rope.rope_index`) is the shared one.
"""

from __future__ import annotations

import jax
import numpy as np

from jaxspatial.models import rope

Array = jax.Array


def interleaved_streams(half_dim: int, section: tuple[int, int, int]) -> np.ndarray:
  """The position stream (0 t, 1 h, 2 w) each of the head's `half_dim` frequencies uses."""
  stream = np.zeros(half_dim, np.int32)
  for axis in (1, 2):
    stream[axis:3 * section[axis]:3] = axis
  return stream


def mrope_cos_sin(position_ids_3xBxL: Array, head_dim: int, theta: float,
                  section: tuple[int, int, int]) -> tuple[Array, Array]:
  """cos, sin of shape [B, L, head_dim] (the two halves repeat, as rotate_half expects)."""
  return rope.mrope_cos_sin(position_ids_3xBxL, head_dim, theta,
                            interleaved_streams(head_dim // 2, section))
