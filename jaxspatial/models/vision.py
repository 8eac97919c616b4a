"""What the Qwen-VL vision encoders share: the encoder's output to the decoder
(`VisionOutput`), static image grids and the segments attention runs inside, 2-D rotary
attention over packed segments, the pre-norm encoder block, and the host-side layout
helpers. Grids fix every shape, so layouts and rotary angles are computed on the host and
an encoder compiles once per set of grids."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from jaxspatial.models.attention import attention, check_implementation
from jaxspatial.models.layers import linear, remat_call
from jaxspatial.models.rope import rotate_half

Array = jax.Array
Grids = tuple[tuple[int, int, int], ...]


@struct.dataclass
class VisionOutput:
  """What a family's vision encoder gives the decoder: the tokens placed at the image
  placeholders, in order, and (Qwen3-VL) the DeepStack features of some encoder blocks,
  added to the first decoder layers' hidden states at the same positions."""
  tokens_NxC: jax.Array
  deepstack_KxNxC: jax.Array | None = None


def patch_hw(grids: Grids, merge: int) -> np.ndarray:
  """(row, column) of every patch [N, 2], block-major over merge units within each frame
  (the processor's order), frames repeating the layout."""
  out = []
  for t, h, w in grids:
    if h % merge or w % merge:
      raise ValueError(f"vision grid {(t, h, w)}: height and width must be multiples of the "
                       f"merge size {merge}")
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    blocks = lambda a: a.reshape(h // merge, merge, w // merge, merge).transpose(
        0, 2, 1, 3).reshape(-1)
    out.append(np.tile(np.stack([blocks(rows), blocks(cols)], -1), (t, 1)))
  return np.concatenate(out)


def rotary_cos_sin(hw_Nx2: np.ndarray, head_dim: int, theta: float) -> tuple[Array, Array]:
  """cos, sin [N, head_dim] of the 2-D rope: half the frequencies turn with the row, half
  with the column."""
  rope_dim = head_dim // 2
  inv_freq = 1.0 / (theta ** (np.arange(0, rope_dim, 2, dtype=np.float32) / rope_dim))
  freqs = np.concatenate([hw_Nx2[:, :1] * inv_freq, hw_Nx2[:, 1:] * inv_freq], -1)
  angles = jnp.asarray(np.concatenate([freqs, freqs], -1), jnp.float32)
  return jnp.cos(angles), jnp.sin(angles)


def checked_grids(config, pixel_values_NxP: Array, grids) -> Grids:
  """The grids as int tuples, once pixel_values is [N patches, patch_dim] for them."""
  grids = tuple(tuple(int(v) for v in g) for g in grids)
  total = sum(t * h * w for t, h, w in grids)
  if pixel_values_NxP.shape != (total, config.patch_dim):
    raise ValueError(f"VisionModel: pixel_values must be [{total}, {config.patch_dim}] for "
                     f"grids {grids}, got {pixel_values_NxP.shape}")
  return grids


@dataclasses.dataclass(frozen=True)
class Segments:
  """Tokens grouped by segment (a window, or a frame), each segment packed at the front of
  a row of `width`: attention inside segments costs O(N x width), not O(N^2)."""
  gather_SxW: np.ndarray    # token index at each (segment, slot); 0 in padding slots
  lengths_S: np.ndarray     # real tokens per segment
  flat_N: np.ndarray        # each token's slot in the flattened [S * W] rows

  @classmethod
  def of(cls, ids_N: np.ndarray) -> "Segments":
    _, segment, counts = np.unique(ids_N, return_inverse=True, return_counts=True)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    by_segment = np.argsort(segment, kind="stable")
    slot = np.empty(len(ids_N), np.int64)
    slot[by_segment] = np.arange(len(ids_N)) - np.repeat(starts, counts)
    width = int(counts.max())
    gather = np.zeros((len(counts), width), np.int32)
    gather[segment, slot] = np.arange(len(ids_N))
    return cls(gather, counts.astype(np.int32), (segment * width + slot).astype(np.int32))


class VisionAttention(nnx.Module):
  def __init__(self, config, *, rngs, dtype, param_dtype, implementation: str = "auto"):
    self.config = config
    self.implementation = check_implementation(implementation)
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.qkv = linear(config.hidden_size, 3 * config.hidden_size, ("embed", "heads"),
                      use_bias=True, **kw)
    self.proj = linear(config.hidden_size, config.hidden_size, ("heads", "embed"),
                       use_bias=True, **kw)

  def __call__(self, x_NxC: Array, cos: Array, sin: Array, segments: Segments) -> Array:
    """Attention inside each segment (window or frame) of the tokens."""
    n = x_NxC.shape[0]
    heads, d = self.config.num_heads, self.config.head_dim
    q, k, v = jnp.moveaxis(self.qkv(x_NxC).reshape(n, 3, heads, d), 1, 0)
    rotate = lambda x: (x.astype(jnp.float32) * cos[:, None] + rotate_half(
        x.astype(jnp.float32)) * sin[:, None]).astype(x.dtype)
    q, k = rotate(q), rotate(k)
    rows = lambda x: x[jnp.asarray(segments.gather_SxW)]  # [S, W, heads, d]
    out = attention(rows(q), rows(k), rows(v), implementation=self.implementation,
                    lengths_B=jnp.asarray(segments.lengths_S))
    out = out.reshape(-1, heads * d)[jnp.asarray(segments.flat_N)]
    return self.proj(out)


class VisionBlock(nnx.Module):
  """Pre-norm encoder block: attention inside segments, then the family's MLP; `norm`
  (size, eps) and `mlp` (config, **kw) are the family's classes."""

  def __init__(self, config, norm, mlp, *, rngs, dtype, param_dtype, attention="auto"):
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.norm1 = norm(config.hidden_size, 1e-6, param_dtype=param_dtype)
    self.norm2 = norm(config.hidden_size, 1e-6, param_dtype=param_dtype)
    self.attn = VisionAttention(config, implementation=attention, **kw)
    self.mlp = mlp(config, **kw)

  def __call__(self, x, cos, sin, segments):
    x = x + self.attn(self.norm1(x), cos, sin, segments)
    return x + self.mlp(self.norm2(x))


def run_block(block: VisionBlock, x: Array, cos: Array, sin: Array, segments: Segments,
              remat: bool) -> Array:
  """One block, recomputed in the backward pass under `remat`."""
  if remat:
    return remat_call(block, lambda block, x: block(x, cos, sin, segments), x)
  return block(x, cos, sin, segments)
