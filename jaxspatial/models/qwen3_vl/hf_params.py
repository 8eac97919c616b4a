"""Qwen3-VL's checkpoint layout: the tensors a config implies and where each one goes in the
NNX model (the name map, `jaxspatial.models.hf.names`). transformers 5.x writes
`model.language_model.*`, `model.visual.*` and (untied) `lm_head.*`; the 4.x-style names
(`model.*`, `visual.*`) are read too. Loading, shard checks and export are
`jaxspatial.models.hf`'s.
"""

from __future__ import annotations

from jaxspatial.models.hf import (Shapes, Targets, attention_shapes, attention_targets,
                                  checked_targets, decoder_shapes, decoder_targets,
                                  linear_shape, linear_target)


def checkpoint_shapes(config) -> Shapes:
  """Every tensor a checkpoint of `config` (a Qwen3VLConfig) holds, under its canonical
  name, with its shape in torch layout (what `export.state_dict` writes)."""
  t = config.text
  out = decoder_shapes(t, lambda out, p, _: attention_shapes(
      out, p + "self_attn.", t, query_rows=t.num_attention_heads * t.head_dim,
      bias=(t.attention_bias,) * 2, qk_norm=True))
  out.update(vision_shapes(config.vision))
  return out


def vision_shapes(v) -> Shapes:
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
    linear_shape(out, p + "attn.qkv", 3 * h, h, True)
    linear_shape(out, p + "attn.proj", h, h, True)
    linear_shape(out, p + "mlp.linear_fc1", v.intermediate_size, h, True)
    linear_shape(out, p + "mlp.linear_fc2", h, v.intermediate_size, True)
  merged = h * v.spatial_merge_size ** 2
  mergers = ["visual.merger."] + [f"visual.deepstack_merger_list.{k}."
                                  for k in range(len(v.deepstack_visual_indexes))]
  for k, p in enumerate(mergers):
    width = h if k == 0 else merged  # DeepStack mergers normalise after the 2 x 2 shuffle
    out[p + "norm.weight"] = (width,)
    out[p + "norm.bias"] = (width,)
    linear_shape(out, p + "linear_fc1", merged, merged, True)
    linear_shape(out, p + "linear_fc2", v.out_hidden_size, merged, True)
  return out


def targets(model) -> Targets:
  """Every parameter of a Qwen3VL under its canonical checkpoint name, with how the torch
  tensor maps onto it (`jaxspatial.models.hf.to_param`)."""
  out = decoder_targets(model.language_model, lambda out, p, layer: attention_targets(
      out, p + "self_attn.", layer.self_attn))
  out.update(vision_targets(model.visual))
  return checked_targets(model, out)


def vision_targets(vision) -> Targets:
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
    linear_target(out, p + "attn.qkv", block.attn.qkv)
    linear_target(out, p + "attn.proj", block.attn.proj)
    linear_target(out, p + "mlp.linear_fc1", block.mlp.linear_fc1)
    linear_target(out, p + "mlp.linear_fc2", block.mlp.linear_fc2)
  mergers = [("visual.merger.", vision.merger)] + [
      (f"visual.deepstack_merger_list.{k}.", m)
      for k, m in enumerate(vision.deepstack_merger_list)]
  for p, merger in mergers:
    out[p + "norm.weight"] = (merger.norm.weight, None)
    out[p + "norm.bias"] = (merger.norm.bias, None)
    linear_target(out, p + "linear_fc1", merger.linear_fc1)
    linear_target(out, p + "linear_fc2", merger.linear_fc2)
  return out
