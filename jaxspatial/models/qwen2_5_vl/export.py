"""Writing a Qwen25VL back to a Hugging Face folder (config.json + model.safetensors),
in the key layout transformers' `save_pretrained` writes and `from_pretrained` reads."""

from __future__ import annotations

import json
import os
import pathlib
import tempfile

import numpy as np


def _linear(prefix: str, layer, out: dict, bias: bool = True) -> None:
  out[prefix + ".weight"] = np.asarray(layer.kernel[...]).T
  if bias and layer.bias is not None:
    out[prefix + ".bias"] = np.asarray(layer.bias[...])


def state_dict(model) -> dict[str, np.ndarray]:
  """Every tensor under its checkpoint name, in torch layout ([out, in] for linears)."""
  out: dict[str, np.ndarray] = {}
  text = model.language_model
  out["model.embed_tokens.weight"] = np.asarray(text.embed_tokens.embedding[...])
  for i, layer in enumerate(text.layers):
    p = f"model.layers.{i}."
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
      _linear(p + "self_attn." + name, getattr(layer.self_attn, name), out)
    for name in ("gate_proj", "up_proj", "down_proj"):
      _linear(p + "mlp." + name, getattr(layer.mlp, name), out)
    out[p + "input_layernorm.weight"] = np.asarray(layer.input_layernorm.weight[...])
    out[p + "post_attention_layernorm.weight"] = np.asarray(
        layer.post_attention_layernorm.weight[...])
  out["model.norm.weight"] = np.asarray(text.norm.weight[...])
  if text.lm_head is not None:
    out["lm_head.weight"] = np.asarray(text.lm_head.kernel[...]).T
  vision = model.visual
  c = vision.config
  out["visual.patch_embed.proj.weight"] = np.asarray(vision.patch_embed.kernel[...]).T.reshape(
      c.hidden_size, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size)
  for i, block in enumerate(vision.blocks):
    p = f"visual.blocks.{i}."
    out[p + "norm1.weight"] = np.asarray(block.norm1.weight[...])
    out[p + "norm2.weight"] = np.asarray(block.norm2.weight[...])
    _linear(p + "attn.qkv", block.attn.qkv, out)
    _linear(p + "attn.proj", block.attn.proj, out)
    for name in ("gate_proj", "up_proj", "down_proj"):
      _linear(p + "mlp." + name, getattr(block.mlp, name), out)
  out["visual.merger.ln_q.weight"] = np.asarray(vision.merger.ln_q.weight[...])
  _linear("visual.merger.mlp.0", vision.merger.fc1, out)
  _linear("visual.merger.mlp.2", vision.merger.fc2, out)
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


def save_pretrained(model, folder) -> pathlib.Path:
  """Writes config.json and model.safetensors atomically (temporary files, then renames)."""
  from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel
  folder = pathlib.Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  config = dict(model.config.raw) or model.config.to_hf()  # built here: write ours
  for name, write in (("model.safetensors",
                       lambda path: save_file(state_dict(model), str(path),
                                              metadata={"format": "pt"})),
                      ("config.json", lambda path: path.write_text(json.dumps(config, indent=2)))):
    handle, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.")
    os.close(handle)
    try:
      write(pathlib.Path(tmp))
      os.replace(tmp, folder / name)
    except BaseException:
      pathlib.Path(tmp).unlink(missing_ok=True)
      raise
  return folder
