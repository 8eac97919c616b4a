"""Qwen2-VL / Qwen2.5-VL's sectioned M-RoPE: the head's frequency dimensions are split by
`mrope_section` (t, h, w), section k rotating with position stream k (positions, rotation
and the image position rule: `jaxspatial.models.rope`)."""

from __future__ import annotations

import jax
import numpy as np

from jaxspatial.models import rope

Array = jax.Array


def sectioned_streams(section: tuple[int, int, int]) -> np.ndarray:
  """The position stream (0 t, 1 h, 2 w) of each frequency: contiguous sections."""
  return np.repeat(np.arange(3, dtype=np.int32), section)


def mrope_cos_sin(position_ids_3xBxL: Array, head_dim: int, theta: float,
                  section: tuple[int, int, int]) -> tuple[Array, Array]:
  """cos, sin of shape [B, L, head_dim] (the two halves repeat, as rotate_half expects)."""
  return rope.mrope_cos_sin(position_ids_3xBxL, head_dim, theta, sectioned_streams(section))
