"""Writing a model to a Hugging Face folder (config.json + model.safetensors): its tensors
from the family's name map, its config.json, and the atomic folder writer any family uses."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import secrets
from typing import Callable

import numpy as np
from safetensors.numpy import save_file

from jaxspatial.errors import ModelFolderError
from jaxspatial.models.hf.names import Shapes, Targets, from_param, hf_key
from jaxspatial.models.hf.shards import INDEX, SINGLE

_SHARD = re.compile(r"model-\d+-of-\d+\.safetensors")
_OWNED = re.compile(r"model[^/\\]*\.safetensors")
# Vision fields that come from preprocessor_config.json, not config.json.
PROCESSOR_FIELDS = ("min_pixels", "max_pixels")


def state_dict(model, shapes: Shapes, targets: Targets,
               key: Callable[[str], str] = hf_key) -> dict[str, np.ndarray]:
  """Every parameter (`targets`, the family's name map) under its checkpoint name `key(...)`
  (default: transformers 5.x's), in torch layout of `shapes` (the family's
  `checkpoint_shapes(model.config)`)."""
  out = {}
  for name, (param, how) in targets.items():
    value = from_param(np.asarray(param[...]), how, shapes[name])
    if value.shape != tuple(shapes[name]):
      raise ValueError(f"state_dict: {name} has shape {value.shape}, expected "
                       f"{tuple(shapes[name])} (from the config)")
    out[key(name)] = np.ascontiguousarray(value)
  return out


def config_dict(model) -> dict:
  """config.json's content: the one the model was loaded from while it still describes the
  model (keeping fields this library does not read), else `config.to_hf()`."""
  raw = dict(model.config.raw)
  if raw:
    try:
      loaded = type(model.config).from_hf(raw)
      ours = model.config.vision
      kept = {name: getattr(ours, name) for name in PROCESSOR_FIELDS if hasattr(ours, name)}
      loaded = dataclasses.replace(loaded, vision=dataclasses.replace(loaded.vision, **kept))
      if loaded == model.config:
        return raw
    except ModelFolderError:
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


def write_folder(folder, config: dict, tensors: dict[str, np.ndarray]) -> pathlib.Path:
  """Writes `config` as config.json and `tensors` as model.safetensors: any family's export.

  Both are written to hidden temporary siblings first (normal permissions: 0666 less the
  umask). Then config.json is removed, a stale index and its shards (`stale_files`) are
  removed, model.safetensors is replaced and config.json comes back last: a crash at any
  point leaves the old model, or a folder without config.json that loads nothing, never a
  mix. Other files in the folder (tokenizer, processor, ...) are left as they are."""
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
