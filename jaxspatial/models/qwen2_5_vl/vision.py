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

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspatial.models import sharding
from jaxspatial.models.attention import attention, check_implementation
from jaxspatial.models.qwen2_5_vl.config import VisionConfig
from jaxspatial.models.qwen2_5_vl.rope import rotate_half
from jaxspatial.models.qwen2_5_vl.text import RMSNorm, linear, remat_call

Array = jax.Array
Grids = tuple[tuple[int, int, int], ...]


def layout(config: VisionConfig, grids: Grids):
  """Host-side, from static grids: (window order of merge units, window segment id and
  frame segment id of every patch in window order, (h, w) of every patch in window order)."""
  merge = config.spatial_merge_size
  unit = merge * merge
  window = config.window_size // merge // config.patch_size
  order, window_ids, image_ids, hw = [], [], [], []
  offset, next_window, frame_segment = 0, 0, 0
  for t, h, w in grids:
    if h % merge or w % merge:
      raise ValueError(f"vision grid {(t, h, w)}: height and width must be multiples of the "
                       f"merge size {merge}")
    gh, gw = h // merge, w // merge
    # Patch positions, laid out block-major over merge units (as the processor orders them).
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    blocks = lambda a: a.reshape(gh, merge, gw, merge).transpose(0, 2, 1, 3).reshape(-1)
    patch_hw = np.tile(np.stack([blocks(rows), blocks(cols)], -1), (t, 1))  # [t*h*w, 2]
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
    hw.append(patch_hw)
    offset += t * gh * gw
  order = np.asarray(order)
  hw = np.concatenate(hw).reshape(-1, unit, 2)[order].reshape(-1, 2)
  return order, np.asarray(window_ids), np.asarray(image_ids), hw


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
  def __init__(self, config: VisionConfig, *, rngs, dtype, param_dtype,
               implementation: str = "auto"):
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


class VisionMLP(nnx.Module):
  def __init__(self, config: VisionConfig, *, rngs, dtype, param_dtype):
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.gate_proj = linear(config.hidden_size, config.intermediate_size, ("embed", "mlp"),
                            use_bias=True, **kw)
    self.up_proj = linear(config.hidden_size, config.intermediate_size, ("embed", "mlp"),
                          use_bias=True, **kw)
    self.down_proj = linear(config.intermediate_size, config.hidden_size, ("mlp", "embed"),
                            use_bias=True, **kw)

  def __call__(self, x):
    return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class VisionBlock(nnx.Module):
  def __init__(self, config: VisionConfig, *, rngs, dtype, param_dtype, attention="auto"):
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.norm1 = RMSNorm(config.hidden_size, 1e-6, param_dtype=param_dtype)
    self.norm2 = RMSNorm(config.hidden_size, 1e-6, param_dtype=param_dtype)
    self.attn = VisionAttention(config, implementation=attention, **kw)
    self.mlp = VisionMLP(config, **kw)

  def __call__(self, x, cos, sin, segments):
    x = x + self.attn(self.norm1(x), cos, sin, segments)
    return x + self.mlp(self.norm2(x))


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
    self.blocks = nnx.List([VisionBlock(config, attention=attention, **kw)
                            for _ in range(config.depth)])
    self.merger = PatchMerger(config, **kw)

  def __call__(self, pixel_values_NxP: Array, grids: Grids) -> Array:
    """pixel_values [N patches, C*T*P*P] of the images with the given (t, h, w) patch grids
    -> [N / merge^2, out_hidden] tokens in the processor's (and the LLM's) order."""
    c = self.config
    grids = tuple(tuple(int(v) for v in g) for g in grids)
    total = sum(t * h * w for t, h, w in grids)
    if pixel_values_NxP.shape != (total, c.patch_dim):
      raise ValueError(f"VisionModel: pixel_values must be [{total}, {c.patch_dim}] for grids "
                       f"{grids}, got {pixel_values_NxP.shape}")
    order, window_ids, image_ids, hw = layout(c, grids)
    unit = c.spatial_merge_size ** 2
    x = self.patch_embed(pixel_values_NxP)
    x = x.reshape(-1, unit, c.hidden_size)[order].reshape(total, c.hidden_size)
    rope_dim = c.head_dim // 2
    inv_freq = 1.0 / (c.rope_theta ** (np.arange(0, rope_dim, 2, dtype=np.float32) / rope_dim))
    freqs = np.concatenate([hw[:, :1] * inv_freq, hw[:, 1:] * inv_freq], -1)
    angles = jnp.asarray(np.concatenate([freqs, freqs], -1), jnp.float32)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    windows, frames = Segments.of(window_ids), Segments.of(image_ids)
    for index, block in enumerate(self.blocks):
      segments = frames if index in c.fullatt_block_indexes else windows
      if self.remat:
        x = remat_call(block, lambda block, x: block(x, cos, sin, segments), x)
      else:
        x = block(x, cos, sin, segments)
    merged = self.merger(x)
    return merged[jnp.asarray(np.argsort(order))]


def load_vision_weights(model: VisionModel, folder) -> None:
  """Loads `visual.*` / `model.visual.*` tensors of a Hugging Face checkpoint."""
  from safetensors import safe_open  # pylint: disable=import-outside-toplevel
  from jaxspatial.models.qwen2_5_vl.hf_params import (CheckpointError,  # pylint: disable=import-outside-toplevel
                                                      safetensors_files)
  targets = {"patch_embed.proj.weight": (model.patch_embed.kernel, "patch"),
             "merger.ln_q.weight": (model.merger.ln_q.weight, None),
             "merger.mlp.0.weight": (model.merger.fc1.kernel, "t"),
             "merger.mlp.0.bias": (model.merger.fc1.bias, None),
             "merger.mlp.2.weight": (model.merger.fc2.kernel, "t"),
             "merger.mlp.2.bias": (model.merger.fc2.bias, None)}
  for i, block in enumerate(model.blocks):
    p = f"blocks.{i}."
    targets[p + "norm1.weight"] = (block.norm1.weight, None)
    targets[p + "norm2.weight"] = (block.norm2.weight, None)
    for name, layer in (("attn.qkv", block.attn.qkv), ("attn.proj", block.attn.proj),
                        ("mlp.gate_proj", block.mlp.gate_proj),
                        ("mlp.up_proj", block.mlp.up_proj),
                        ("mlp.down_proj", block.mlp.down_proj)):
      targets[p + name + ".weight"] = (layer.kernel, "t")
      targets[p + name + ".bias"] = (layer.bias, None)
  loaded = set()
  for file in safetensors_files(folder):
    with safe_open(str(file), framework="numpy") as reader:
      for key in reader.keys():
        for prefix in ("model.visual.", "visual."):
          if key.startswith(prefix):
            name = key[len(prefix):]
            break
        else:
          continue
        if name not in targets:
          raise CheckpointError(f"unexpected checkpoint key {key!r}")
        param, how = targets[name]
        value = reader.get_tensor(key)
        if how == "patch":
          value = value.reshape(value.shape[0], -1).T
        elif how == "t":
          value = value.T
        current = param.get_value()  # an array, or a ShapeDtypeStruct on an abstract model
        if value.shape != current.shape:
          raise CheckpointError(f"{file.name}: {key} does not fit: {value.shape} against "
                                f"{current.shape} (our layout)")
        sharding.place(param, value)
        loaded.add(name)
  missing = sorted(set(targets) - loaded)
  if missing:
    raise CheckpointError(f"checkpoint in {folder} lacks vision tensors, e.g. {missing[:5]}")
