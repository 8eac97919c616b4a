"""Writing a Qwen25VL back to a Hugging Face folder (config.json + model.safetensors),
in the key layout transformers' `save_pretrained` writes and `from_pretrained` reads."""

from __future__ import annotations

import json
import os
import pathlib
import re
import secrets

import numpy as np

from jaxspatial.models.qwen2_5_vl.hf_params import INDEX, SINGLE, CheckpointError

_SHARD = re.compile(r"model-\d+-of-\d+\.safetensors")
_OWNED = re.compile(r"model[^/\\]*\.safetensors")


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


def _config_dict(model) -> dict:
  """config.json's content: the one the model was loaded from while it still describes the
  model (keeping fields this library does not read), else `config.to_hf()`."""
  from jaxspatial.models.qwen2_5_vl.config import Qwen25VLConfig  # pylint: disable=import-outside-toplevel
  raw = dict(model.config.raw)
  if raw:
    try:
      if Qwen25VLConfig.from_hf(raw) == model.config:
        return raw
    except CheckpointError:
      pass
  return model.config.to_hf()  # built here, or changed since loading: write ours


def stale_files(folder) -> list[pathlib.Path]:
  """The files of an earlier (sharded) save that a new model.safetensors must not sit next
  to: the index, the `model*.safetensors` shards it names, and `model-NNNNN-of-NNNNN`
  shards. Nothing else in the folder is touched."""
  folder = pathlib.Path(folder)
  out = []
  index = folder / INDEX
  if index.is_file() or index.is_symlink():
    out.append(index)
    try:
      names = list(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
      names = []  # a malformed index: still removed, its shards found by name below
    out += [folder / n for n in names
            if isinstance(n, str) and _OWNED.fullmatch(n) and n != SINGLE]
  out += [f for f in folder.iterdir() if _SHARD.fullmatch(f.name)]
  return sorted(f for f in set(out) if f.is_symlink() or f.is_file())


def _temporary(folder: pathlib.Path, name: str) -> pathlib.Path:
  """An empty hidden sibling, created like an ordinary file (mode 0666 less the umask)."""
  while True:
    path = folder / f".{name}.{secrets.token_hex(6)}.tmp"
    try:
      os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
      return path
    except FileExistsError:
      continue


def _fsync(path: pathlib.Path, directory: bool = False) -> None:
  try:
    handle = os.open(path, os.O_RDONLY)
  except OSError:
    if directory:
      return  # some systems cannot open folders
    raise
  try:
    os.fsync(handle)
  except OSError:
    if not directory:
      raise
  finally:
    os.close(handle)


def save_pretrained(model, folder) -> pathlib.Path:
  """Writes config.json and model.safetensors so that `from_pretrained` (ours and
  transformers') loads exactly this model (see `write_folder`)."""
  return write_folder(folder, _config_dict(model), state_dict(model))


def write_folder(folder, config: dict, tensors: dict[str, np.ndarray]) -> pathlib.Path:
  """Writes `config` as config.json and `tensors` as model.safetensors: any family's export.

  Both are written to hidden temporary siblings first (normal permissions: 0666 less the
  umask). Then config.json is removed, a stale index and its shards (`stale_files`) are
  removed, model.safetensors is replaced and config.json comes back last: a crash at any
  point leaves the old model, or a folder without config.json that loads nothing, never a
  mix. Other files in the folder (tokenizer, processor, ...) are left as they are."""
  from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel
  folder = pathlib.Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  temporary = []
  try:
    weights = _temporary(folder, SINGLE)
    temporary.append(weights)
    mode = weights.stat().st_mode & 0o777  # 0666 less the umask
    save_file(tensors, str(weights), metadata={"format": "pt"})
    os.chmod(weights, mode)  # safetensors writes through a file of its own (mode 0600)
    _fsync(weights)
    config_file = _temporary(folder, "config.json")
    temporary.append(config_file)
    config_file.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    _fsync(config_file)
    # From here until config.json is back the folder loads nothing (no half-new model).
    (folder / "config.json").unlink(missing_ok=True)
    for stale in stale_files(folder):
      stale.unlink(missing_ok=True)
    os.replace(weights, folder / SINGLE)
    os.replace(config_file, folder / "config.json")
    _fsync(folder, directory=True)
  except BaseException:
    for path in temporary:
      path.unlink(missing_ok=True)
    raise
  return folder
