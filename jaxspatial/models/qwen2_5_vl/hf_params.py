"""Qwen2.5-VL's checkpoint layout: the tensors a config implies and where each goes in the
NNX model (the name map, `jaxspatial.models.hf.names`), and loading the text decoder or
the vision encoder on its own. transformers 5.x writes `model.language_model.*` and
`model.visual.*`, 4.x `model.*` and `visual.*`; both are read (`canonical_key`)."""

from __future__ import annotations

from jaxspatial.models.hf import (Targets, attention_shapes, attention_targets,
                                  checked_targets, decoder_shapes, decoder_targets,
                                  linear_shape, linear_target, load_weights, scan)

VISION = "visual."


def checkpoint_shapes(config) -> dict[str, tuple[int, ...]]:
  """Every tensor a checkpoint of `config` (a Qwen25VLConfig) holds, under its canonical
  (4.x) name, with its shape in torch layout (what `export.state_dict` writes)."""
  t, v = config.text, config.vision
  out = decoder_shapes(t, lambda out, p, _: attention_shapes(
      out, p + "self_attn.", t, query_rows=t.num_attention_heads * t.head_dim,
      bias=(True, False), qk_norm=False))
  c = v.hidden_size
  out["visual.patch_embed.proj.weight"] = (c, v.in_channels, v.temporal_patch_size,
                                           v.patch_size, v.patch_size)
  for i in range(v.depth):
    p = f"visual.blocks.{i}."
    out[p + "norm1.weight"] = (c,)
    out[p + "norm2.weight"] = (c,)
    for name, rows, cols in (("attn.qkv", 3 * c, c), ("attn.proj", c, c),
                             ("mlp.gate_proj", v.intermediate_size, c),
                             ("mlp.up_proj", v.intermediate_size, c),
                             ("mlp.down_proj", c, v.intermediate_size)):
      linear_shape(out, p + name, rows, cols, True)
  merged = c * v.spatial_merge_size ** 2
  out["visual.merger.ln_q.weight"] = (c,)
  linear_shape(out, "visual.merger.mlp.0", merged, merged, True)
  linear_shape(out, "visual.merger.mlp.2", v.out_hidden_size, merged, True)
  return out


def text_targets(text) -> Targets:
  """The decoder's (a TextModel's) parameters under their canonical checkpoint names."""
  return decoder_targets(text, lambda out, p, layer: attention_targets(
      out, p + "self_attn.", layer.self_attn))


def vision_targets(vision) -> Targets:
  """The encoder's (a VisionModel's) parameters under their canonical checkpoint names."""
  out = {"visual.patch_embed.proj.weight": (vision.patch_embed.kernel, "patch")}
  for i, block in enumerate(vision.blocks):
    p = f"visual.blocks.{i}."
    out[p + "norm1.weight"] = (block.norm1.weight, None)
    out[p + "norm2.weight"] = (block.norm2.weight, None)
    linear_target(out, p + "attn.qkv", block.attn.qkv)
    linear_target(out, p + "attn.proj", block.attn.proj)
    for name in ("gate_proj", "up_proj", "down_proj"):
      linear_target(out, p + "mlp." + name, getattr(block.mlp, name))
  out["visual.merger.ln_q.weight"] = (vision.merger.ln_q.weight, None)
  linear_target(out, "visual.merger.mlp.0", vision.merger.fc1)
  linear_target(out, "visual.merger.mlp.2", vision.merger.fc2)
  return out


def targets(model) -> Targets:
  """Every parameter of a Qwen25VL under its canonical checkpoint name, with how the torch
  tensor maps onto it (`jaxspatial.models.hf.to_param`)."""
  return checked_targets(model, {**text_targets(model.language_model),
                                 **vision_targets(model.visual)})


def _load_part(module, folder, wanted: Targets, vision: bool) -> list[str]:
  """Loads the checkpoint's vision or text tensors into `module`; returns the other keys."""
  tensors = scan(folder)  # index, headers, dtypes, duplicates, before any data is read
  part = {name: info for name, info in tensors.items() if name.startswith(VISION) == vision}
  load_weights(module, folder, part, checked_targets(module, wanted))
  return [info.key for name, info in tensors.items() if name not in part]


def load_text_weights(model, folder) -> list[str]:
  """Loads every text tensor into a TextModel; returns the skipped (vision) keys."""
  return _load_part(model, folder, text_targets(model), vision=False)


def load_vision_weights(model, folder) -> None:
  """Loads every vision tensor (`visual.*` / `model.visual.*`) into a VisionModel."""
  _load_part(model, folder, vision_targets(model), vision=True)
