"""The Qwen3-VL vision encoder in Flax NNX.

Patches of 16 x 16 pixels x 2 frames (the processor's `pixel_values` rows) -> a linear
patch embedding (the Conv3d, with its bias) plus learned position embeddings, bilinearly
resampled from a square table to each image's grid -> blocks of LayerNorm, attention with
2-D rotary embeddings over each frame, and a tanh-GELU MLP -> LayerNorm and a 2 x 2 patch
merger -> one token per merged patch. DeepStack: the outputs of the
`deepstack_visual_indexes` blocks go through mergers of their own (LayerNorm after the
2 x 2 shuffle) and are returned with the final tokens, for the decoder's first layers.

Every block attends over one frame of one image. The grids fix every shape, so the rotary
angles, the attention segments and the position-embedding taps are computed on the host
from the (static) grids: the encoder compiles once per set of grids.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspatial.models.layers import linear
from jaxspatial.models.qwen3_vl.config import VisionConfig
from jaxspatial.models.sharding import logical_init
from jaxspatial.models.vision import (Grids, Segments, VisionBlock, checked_grids, patch_hw,
                                      rotary_cos_sin, run_block)

Array = jax.Array


def _axis_taps(index: np.ndarray, size: int, side: int):
  """Bilinear taps (align_corners) of target positions `index` on an axis of `size` into a
  `side`-long table, in float32 as transformers computes them."""
  src = (index.astype(np.float32) * np.float32(side - 1)) / np.float32(max(size - 1, 1))
  floor = np.floor(src)
  offsets = np.arange(2, dtype=np.float32)
  taps = np.clip(floor.astype(np.int64)[:, None] + np.arange(2), 0, side - 1)
  distance = np.abs(src[:, None] - floor[:, None] - offsets)
  return taps, np.maximum(np.float32(1) - distance, np.float32(0))


def position_taps(grids: Grids, side: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
  """(indices [N, 4] into the flattened side x side table, weights [N, 4] float32): the
  bilinear (align_corners) resampling of the learned table to every image's grid."""
  indices, weights = [], []
  for t, h, w in grids:
    hw = patch_hw(((1, h, w),), merge)
    h_taps, h_weights = _axis_taps(hw[:, 0], h, side)
    w_taps, w_weights = _axis_taps(hw[:, 1], w, side)
    index = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4)
    weight = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, 4)
    indices.append(np.tile(index, (t, 1)))
    weights.append(np.tile(weight, (t, 1)))
  return np.concatenate(indices).astype(np.int32), np.concatenate(weights)


class LayerNorm(nnx.Module):
  """LayerNorm with weight and bias, computed in float32."""

  def __init__(self, size: int, eps: float = 1e-6, *, param_dtype=jnp.float32):
    self.weight = nnx.Param(jnp.ones((size,), param_dtype))
    self.bias = nnx.Param(jnp.zeros((size,), param_dtype))
    self.eps = eps

  def __call__(self, x: Array) -> Array:
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    centred = x32 - mean
    variance = jnp.mean(centred * centred, axis=-1, keepdims=True)
    y = centred * jax.lax.rsqrt(variance + self.eps)
    return (y * self.weight[...].astype(jnp.float32)
            + self.bias[...].astype(jnp.float32)).astype(x.dtype)


class VisionMLP(nnx.Module):
  def __init__(self, config: VisionConfig, *, rngs, dtype, param_dtype):
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype, use_bias=True)
    self.linear_fc1 = linear(config.hidden_size, config.intermediate_size, ("embed", "mlp"),
                             **kw)
    self.linear_fc2 = linear(config.intermediate_size, config.hidden_size, ("mlp", "embed"),
                             **kw)

  def __call__(self, x):
    # gelu_pytorch_tanh: the tanh approximation (the config refuses other activations)
    return self.linear_fc2(jax.nn.gelu(self.linear_fc1(x), approximate=True))


class PatchMerger(nnx.Module):
  """2 x 2 merge: LayerNorm (per patch, or after the shuffle for DeepStack), then a GELU
  MLP to the decoder's width."""

  def __init__(self, config: VisionConfig, *, postshuffle_norm: bool, rngs, dtype,
               param_dtype):
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype, use_bias=True)
    merged = config.hidden_size * config.spatial_merge_size ** 2
    self.postshuffle_norm = postshuffle_norm
    self.merged = merged
    self.norm = LayerNorm(merged if postshuffle_norm else config.hidden_size,
                          param_dtype=param_dtype)
    self.linear_fc1 = linear(merged, merged, ("embed", "mlp"), **kw)
    self.linear_fc2 = linear(merged, config.out_hidden_size, ("mlp", "embed"), **kw)

  def __call__(self, x_NxC):
    if self.postshuffle_norm:
      x = self.norm(x_NxC.reshape(-1, self.merged))
    else:
      x = self.norm(x_NxC).reshape(-1, self.merged)
    return self.linear_fc2(jax.nn.gelu(self.linear_fc1(x), approximate=False))


class VisionModel(nnx.Module):
  def __init__(self, config: VisionConfig, *, rngs: nnx.Rngs, dtype=jnp.float32,
               param_dtype=jnp.float32, attention: str = "auto", remat: bool = False):
    config.check()
    self.config = config
    self.remat = remat
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.patch_embed = linear(config.patch_dim, config.hidden_size, ("patch", "embed"),
                              use_bias=True, **kw)
    self.pos_embed = nnx.Embed(
        config.num_position_embeddings, config.hidden_size, dtype=dtype,
        param_dtype=param_dtype, rngs=rngs,
        embedding_init=logical_init(nnx.initializers.normal(0.02), (None, "embed")))
    self.blocks = nnx.List([VisionBlock(config, LayerNorm, VisionMLP, attention=attention, **kw)
                            for _ in range(config.depth)])
    self.merger = PatchMerger(config, postshuffle_norm=False, **kw)
    self.deepstack_merger_list = nnx.List([
        PatchMerger(config, postshuffle_norm=True, **kw)
        for _ in config.deepstack_visual_indexes])

  def __call__(self, pixel_values_NxP: Array, grids: Grids) -> tuple[Array, Array]:
    """pixel_values [N patches, C*T*P*P] of the images with the given (t, h, w) patch grids
    -> (tokens [N / merge^2, out_hidden], DeepStack features [K, N / merge^2, out_hidden]),
    in the processor's (and the LLM's) order; the K features in block order."""
    c = self.config
    grids = checked_grids(c, pixel_values_NxP, grids)
    merge = c.spatial_merge_size
    x = self.patch_embed(pixel_values_NxP)
    indices, weights = position_taps(grids, c.grid_side, merge)
    table = self.pos_embed.embedding[...].astype(jnp.float32)
    positions = jnp.sum(table[jnp.asarray(indices)] * jnp.asarray(weights)[..., None], axis=1)
    x = x + positions.astype(x.dtype)
    cos, sin = rotary_cos_sin(patch_hw(grids, merge), c.head_dim, c.rope_theta)
    frame_ids = np.concatenate([np.repeat(np.arange(t), h * w) + sum(g[0] for g in grids[:i])
                                for i, (t, h, w) in enumerate(grids)])
    frames = Segments.of(frame_ids)  # full attention within each frame of each image
    indexes = list(c.deepstack_visual_indexes)
    deepstack = []
    for index, block in enumerate(self.blocks):
      x = run_block(block, x, cos, sin, frames, self.remat)
      if index in indexes:  # features in block order, each through its list position's merger
        deepstack.append(self.deepstack_merger_list[indexes.index(index)](x))
    tokens = self.merger(x)
    if not deepstack:
      return tokens, jnp.zeros((0,) + tokens.shape, tokens.dtype)
    return tokens, jnp.stack(deepstack)
