"""Qwen3-VL checkpoint layout: the tensors a config implies, where each one goes in the
NNX model, and loading them from a local Hugging Face folder, tensor by tensor.

transformers 5.x writes `model.language_model.*`, `model.visual.*` and (untied) `lm_head.*`;
the 4.x-style names (`model.*`, `visual.*`) are read too. Tensors are named here by
Qwen2.5-VL's `canonical_key` (`model.*`, `visual.*`, `lm_head.weight`); the index and shard
checks, dtype rules and finite-value checks are Qwen2.5-VL's (`hf_params.scan`,
`read_tensor`).
"""

from __future__ import annotations

import pathlib

from flax import nnx

from jaxspatial.models import sharding
from jaxspatial.models.qwen2_5_vl.hf_params import (CheckpointError, TensorInfo, open_shard,
                                                    read_tensor, scan)

__all__ = ["CheckpointError", "checkpoint_shapes", "from_param", "hf_key", "load_weights",
           "scan", "targets", "to_param"]


def hf_key(canonical: str) -> str:
  """The transformers 5.x name of a canonical key (what `save_pretrained` writes)."""
  if canonical.startswith("visual."):
    return "model." + canonical
  if canonical.startswith("model."):
    return "model.language_model." + canonical[len("model."):]
  return canonical


def _linear_shapes(out: dict, prefix: str, rows: int, cols: int, bias: bool) -> None:
  out[prefix + ".weight"] = (rows, cols)
  if bias:
    out[prefix + ".bias"] = (rows,)


def checkpoint_shapes(config) -> dict[str, tuple[int, ...]]:
  """Every tensor a checkpoint of `config` (a Qwen3VLConfig) holds, under its canonical
  name, with its shape in torch layout (what `export.state_dict` writes)."""
  t, v = config.text, config.vision
  d, c = t.head_dim, t.hidden_size
  out = {"model.embed_tokens.weight": (t.vocab_size, c)}
  for i in range(t.num_hidden_layers):
    p = f"model.layers.{i}."
    for name, rows in (("q_proj", t.num_attention_heads * d),
                       ("k_proj", t.num_key_value_heads * d),
                       ("v_proj", t.num_key_value_heads * d)):
      _linear_shapes(out, p + "self_attn." + name, rows, c, t.attention_bias)
    _linear_shapes(out, p + "self_attn.o_proj", c, t.num_attention_heads * d, t.attention_bias)
    out[p + "self_attn.q_norm.weight"] = (d,)
    out[p + "self_attn.k_norm.weight"] = (d,)
    out[p + "mlp.gate_proj.weight"] = (t.intermediate_size, c)
    out[p + "mlp.up_proj.weight"] = (t.intermediate_size, c)
    out[p + "mlp.down_proj.weight"] = (c, t.intermediate_size)
    out[p + "input_layernorm.weight"] = (c,)
    out[p + "post_attention_layernorm.weight"] = (c,)
  out["model.norm.weight"] = (c,)
  if not t.tie_word_embeddings:
    out["lm_head.weight"] = (t.vocab_size, c)
  out.update(vision_shapes(v))
  return out


def vision_shapes(v) -> dict[str, tuple[int, ...]]:
  """The vision encoder's tensors (a VisionConfig's), canonical names, torch layout."""
  out = {}
  h = v.hidden_size
  out["visual.patch_embed.proj.weight"] = (h, v.in_channels, v.temporal_patch_size,
                                           v.patch_size, v.patch_size)
  out["visual.patch_embed.proj.bias"] = (h,)
  out["visual.pos_embed.weight"] = (v.num_position_embeddings, h)
  for i in range(v.depth):
    p = f"visual.blocks.{i}."
    for norm in ("norm1", "norm2"):
      out[p + norm + ".weight"] = (h,)
      out[p + norm + ".bias"] = (h,)
    _linear_shapes(out, p + "attn.qkv", 3 * h, h, True)
    _linear_shapes(out, p + "attn.proj", h, h, True)
    _linear_shapes(out, p + "mlp.linear_fc1", v.intermediate_size, h, True)
    _linear_shapes(out, p + "mlp.linear_fc2", h, v.intermediate_size, True)
  merged = h * v.spatial_merge_size ** 2
  mergers = ["visual.merger."] + [f"visual.deepstack_merger_list.{k}."
                                  for k in range(len(v.deepstack_visual_indexes))]
  for k, p in enumerate(mergers):
    width = h if k == 0 else merged  # DeepStack mergers normalise after the 2 x 2 shuffle
    out[p + "norm.weight"] = (width,)
    out[p + "norm.bias"] = (width,)
    _linear_shapes(out, p + "linear_fc1", merged, merged, True)
    _linear_shapes(out, p + "linear_fc2", v.out_hidden_size, merged, True)
  return out


def _linear(out: dict, prefix: str, layer) -> None:
  out[prefix + ".weight"] = (layer.kernel, "t")
  if layer.bias is not None:
    out[prefix + ".bias"] = (layer.bias, None)


def targets(model) -> dict[str, tuple[nnx.Param, str | None]]:
  """Every parameter of a Qwen3VL under its canonical checkpoint name, with how the torch
  tensor maps onto it: None (as is), "t" (transposed linear), "patch" (the Conv3d kernel
  flattened and transposed)."""
  text, vision = model.language_model, model.visual
  out = {"model.embed_tokens.weight": (text.embed_tokens.embedding, None),
         "model.norm.weight": (text.norm.weight, None)}
  if text.lm_head is not None:
    out["lm_head.weight"] = (text.lm_head.kernel, "t")
  for i, layer in enumerate(text.layers):
    p = f"model.layers.{i}."
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
      _linear(out, p + "self_attn." + name, getattr(layer.self_attn, name))
    out[p + "self_attn.q_norm.weight"] = (layer.self_attn.q_norm.weight, None)
    out[p + "self_attn.k_norm.weight"] = (layer.self_attn.k_norm.weight, None)
    for name in ("gate_proj", "up_proj", "down_proj"):
      _linear(out, p + "mlp." + name, getattr(layer.mlp, name))
    out[p + "input_layernorm.weight"] = (layer.input_layernorm.weight, None)
    out[p + "post_attention_layernorm.weight"] = (layer.post_attention_layernorm.weight, None)
  out.update(vision_targets(vision))
  return checked_targets(model, out)


def vision_targets(vision) -> dict[str, tuple[nnx.Param, str | None]]:
  """The vision encoder's parameters under their canonical checkpoint names."""
  out = {}
  out["visual.patch_embed.proj.weight"] = (vision.patch_embed.kernel, "patch")
  out["visual.patch_embed.proj.bias"] = (vision.patch_embed.bias, None)
  out["visual.pos_embed.weight"] = (vision.pos_embed.embedding, None)
  for i, block in enumerate(vision.blocks):
    p = f"visual.blocks.{i}."
    for name in ("norm1", "norm2"):
      norm = getattr(block, name)
      out[p + name + ".weight"] = (norm.weight, None)
      out[p + name + ".bias"] = (norm.bias, None)
    _linear(out, p + "attn.qkv", block.attn.qkv)
    _linear(out, p + "attn.proj", block.attn.proj)
    _linear(out, p + "mlp.linear_fc1", block.mlp.linear_fc1)
    _linear(out, p + "mlp.linear_fc2", block.mlp.linear_fc2)
  mergers = [("visual.merger.", vision.merger)] + [
      (f"visual.deepstack_merger_list.{k}.", m)
      for k, m in enumerate(vision.deepstack_merger_list)]
  for p, merger in mergers:
    out[p + "norm.weight"] = (merger.norm.weight, None)
    out[p + "norm.bias"] = (merger.norm.bias, None)
    _linear(out, p + "linear_fc1", merger.linear_fc1)
    _linear(out, p + "linear_fc2", merger.linear_fc2)
  return out


def checked_targets(model, out: dict) -> dict[str, tuple[nnx.Param, str | None]]:
  """`out`, refused when some parameter of `model` has no checkpoint name in it."""
  covered = {id(param) for param, _ in out.values()}
  unnamed = [".".join(map(str, path)) for path, value in nnx.iter_graph(model)
             if isinstance(value, nnx.Param) and id(value) not in covered]
  if unnamed:  # a parameter without a checkpoint name would be left uninitialised
    raise CheckpointError(f"{type(model).__name__} parameters without a checkpoint name: "
                          f"{unnamed[:5]}")
  return out


def to_param(value, how: str | None):
  """A torch-layout tensor in our layout ("t": a linear's kernel transposed, "patch": the
  Conv3d patch kernel flattened, "conv": a depthwise Conv1d kernel)."""
  if how == "t":
    return value.T
  if how == "patch":
    return value.reshape(value.shape[0], -1).T
  if how == "conv":  # a depthwise Conv1d kernel [C, 1, K] as [K, C]
    return value[:, 0, :].T
  return value


def from_param(value, how: str | None, shape: tuple[int, ...]):
  """Our parameter value in torch layout of `shape`."""
  if how == "t":
    return value.T
  if how == "patch":
    return value.T.reshape(shape)
  if how == "conv":
    return value.T[:, None, :]
  return value


def load_weights(model, folder, tensors: dict[str, TensorInfo], wanted=None) -> None:
  """Places every checkpoint tensor (`scan`'s, by canonical key) into the (abstract)
  model, shard by shard; NaN / Inf refused as read. Fails naming parameters left unloaded.
  `wanted`: the family's `targets(model)` (default: Qwen3-VL's)."""
  wanted = targets(model) if wanted is None else wanted
  by_file: dict[pathlib.Path, list[tuple[str, TensorInfo]]] = {}
  for name, info in tensors.items():
    if name not in wanted:
      raise CheckpointError(f"{info.file}: unexpected checkpoint key {info.key!r}")
    by_file.setdefault(info.file, []).append((name, info))
  loaded = set()
  for file, entries in by_file.items():
    with open_shard(file) as reader:
      for name, info in entries:
        param, how = wanted[name]
        current = param.get_value()  # an array, or a ShapeDtypeStruct on an abstract model
        value = to_param(read_tensor(reader, file, info.key, current.dtype), how)
        if value.shape != tuple(current.shape):
          raise CheckpointError(f"{file}: {info.key} does not fit: {info.shape} against "
                                f"{tuple(current.shape)} (our layout)")
        sharding.place(param, value)
        loaded.add(name)
  missing = sorted(set(wanted) - loaded)
  if missing:
    raise CheckpointError(f"checkpoint in {folder} lacks {len(missing)} tensor(s), e.g. "
                          f"{missing[:5]}")
