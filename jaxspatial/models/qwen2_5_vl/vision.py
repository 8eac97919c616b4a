"""The Qwen2.5-VL vision encoder in Flax NNX.

Patches of 14 x 14 pixels x 2 frames (the processor's `pixel_values` rows) -> a linear
patch embedding -> blocks of RMSNorm, attention with 2-D rotary embeddings and a gated
SiLU MLP -> RMSNorm and a 2 x 2 patch merger -> one token per merged patch.

Most blocks attend inside windows of `window_size` pixels; the `fullatt_block_indexes`
attend over the whole image. The image grids fix every shape, so the window order, the
attention segments and the rotary angles are computed on the host from the (static) grids,
and the encoder compiles once per set of grids (rendered observations have one size).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspatial.models.layers import MLP, RMSNorm, linear
from jaxspatial.models.qwen2_5_vl.config import VisionConfig
from jaxspatial.models.vision import (Grids, Segments, VisionBlock, checked_grids, patch_hw,
                                      rotary_cos_sin, run_block)

Array = jax.Array


def layout(config: VisionConfig, grids: Grids):
  """Host-side, from static grids: (window order of merge units, window segment id and
  frame segment id of every patch in window order, (h, w) of every patch in window order)."""
  merge = config.spatial_merge_size
  unit = merge * merge
  window = config.window_size // merge // config.patch_size
  order, window_ids, image_ids, hw = [], [], [], []
  offset, next_window, frame_segment = 0, 0, 0
  for t, h, w in grids:
    hw.append(patch_hw(((t, h, w),), merge))  # block-major over merge units
    gh, gw = h // merge, w // merge
    units = np.arange(t * gh * gw).reshape(t, gh, gw)
    for frame in range(t):
      for wy in range(0, gh, window):
        for wx in range(0, gw, window):
          members = units[frame, wy:wy + window, wx:wx + window].reshape(-1)
          order.extend((members + offset).tolist())
          window_ids.extend([next_window] * (len(members) * unit))
          image_ids.extend([frame_segment] * (len(members) * unit))
          next_window += 1
      frame_segment += 1  # full attention spans one frame of one image, as transformers does
    offset += t * gh * gw
  order = np.asarray(order)
  hw = np.concatenate(hw).reshape(-1, unit, 2)[order].reshape(-1, 2)
  return order, np.asarray(window_ids), np.asarray(image_ids), hw


class PatchMerger(nnx.Module):
  def __init__(self, config: VisionConfig, *, rngs, dtype, param_dtype):
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    merged = config.hidden_size * config.spatial_merge_size ** 2
    self.ln_q = RMSNorm(config.hidden_size, 1e-6, param_dtype=param_dtype)
    self.fc1 = linear(merged, merged, ("embed", "mlp"), use_bias=True, **kw)
    self.fc2 = linear(merged, config.out_hidden_size, ("mlp", "embed"), use_bias=True, **kw)
    self.unit = config.spatial_merge_size ** 2

  def __call__(self, x_NxC):
    x = self.ln_q(x_NxC).reshape(x_NxC.shape[0] // self.unit, -1)
    return self.fc2(jax.nn.gelu(self.fc1(x), approximate=False))


class VisionModel(nnx.Module):
  def __init__(self, config: VisionConfig, *, rngs: nnx.Rngs, dtype=jnp.float32,
               param_dtype=jnp.float32, attention: str = "auto", remat: bool = False):
    self.config = config
    self.remat = remat
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.patch_embed = linear(config.patch_dim, config.hidden_size, ("patch", "embed"),
                              use_bias=False, **kw)
    mlp = functools.partial(MLP, use_bias=True)  # the gated SiLU MLP, with biases
    self.blocks = nnx.List([VisionBlock(config, RMSNorm, mlp, attention=attention, **kw)
                            for _ in range(config.depth)])
    self.merger = PatchMerger(config, **kw)

  def __call__(self, pixel_values_NxP: Array, grids: Grids) -> Array:
    """pixel_values [N patches, C*T*P*P] of the images with the given (t, h, w) patch grids
    -> [N / merge^2, out_hidden] tokens in the processor's (and the LLM's) order."""
    c = self.config
    grids = checked_grids(c, pixel_values_NxP, grids)
    order, window_ids, image_ids, hw = layout(c, grids)
    unit = c.spatial_merge_size ** 2
    x = self.patch_embed(pixel_values_NxP)
    x = x.reshape(-1, unit, c.hidden_size)[order].reshape(-1, c.hidden_size)
    cos, sin = rotary_cos_sin(hw, c.head_dim, c.rope_theta)
    windows, frames = Segments.of(window_ids), Segments.of(image_ids)
    for index, block in enumerate(self.blocks):
      segments = frames if index in c.fullatt_block_indexes else windows
      x = run_block(block, x, cos, sin, segments, self.remat)
    merged = self.merger(x)
    return merged[jnp.asarray(np.argsort(order))]
