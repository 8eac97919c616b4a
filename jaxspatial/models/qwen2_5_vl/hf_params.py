"""Loading Qwen2.5-VL weights from a local Hugging Face folder, tensor by tensor.

Reads `*.safetensors` (with or without `model.safetensors.index.json`) one tensor at a
time into the NNX parameters, so peak host memory stays near the largest tensor. Both
key layouts are accepted: transformers 5.x (`model.language_model.*`) and 4.x
(`model.layers.*`, `model.embed_tokens.*`). Vision weights (`model.visual.*`, `visual.*`)
are left to the vision encoder's loader.
"""

from __future__ import annotations

import json
import pathlib
import re


from jaxspatial.models import sharding
from jaxspatial.models.qwen2_5_vl.text import TextModel

_TEXT_PREFIXES = ("model.language_model.", "model.")
_VISION_PREFIXES = ("model.visual.", "visual.")
_LAYER = re.compile(r"layers\.(\d+)\.(.+)$")


class CheckpointError(ValueError):
  """A checkpoint that does not fit the model: missing, unexpected or mis-shaped keys."""


def safetensors_files(folder) -> list[pathlib.Path]:
  folder = pathlib.Path(folder)
  if not folder.is_dir():
    raise FileNotFoundError(f"checkpoint folder not found: {folder}")
  index = folder / "model.safetensors.index.json"
  if index.is_file():
    names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    files = [folder / name for name in names]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
      raise FileNotFoundError(f"{index} names shard(s) that are missing: {missing}")
    return files
  files = sorted(folder.glob("*.safetensors"))
  if not files:
    raise FileNotFoundError(f"no *.safetensors in {folder}")
  return files


def _text_target(model: TextModel, key: str):
  """(parameter, transpose) for a checkpoint key, or None if it is not a text key."""
  if key.startswith(_VISION_PREFIXES):
    return None
  if key == "lm_head.weight":
    if model.lm_head is None:
      raise CheckpointError("checkpoint has lm_head.weight but the config ties embeddings")
    return model.lm_head.kernel, True
  for prefix in _TEXT_PREFIXES:
    if key.startswith(prefix):
      name = key[len(prefix):]
      break
  else:
    raise CheckpointError(f"unexpected checkpoint key {key!r}")
  if name == "embed_tokens.weight":
    return model.embed_tokens.embedding, False
  if name == "norm.weight":
    return model.norm.weight, False
  match = _LAYER.match(name)
  if not match or int(match.group(1)) >= len(model.layers):
    raise CheckpointError(f"unexpected checkpoint key {key!r}")
  layer = model.layers[int(match.group(1))]
  parts = match.group(2).split(".")
  module = layer
  for part in parts[:-1]:
    if not hasattr(module, part):
      raise CheckpointError(f"unexpected checkpoint key {key!r}")
    module = getattr(module, part)
  if parts[-1] == "weight" and hasattr(module, "kernel"):
    return module.kernel, True
  if parts[-1] in ("weight", "bias") and hasattr(module, parts[-1]):
    return getattr(module, parts[-1]), False
  raise CheckpointError(f"unexpected checkpoint key {key!r}")


def load_text_weights(model: TextModel, folder) -> list[str]:
  """Loads every text tensor of the checkpoint; returns the skipped (vision) keys."""
  from safetensors import safe_open  # pylint: disable=import-outside-toplevel
  expected = {id(v): path for path, v in _named_params(model)}
  loaded, skipped = set(), []
  for file in safetensors_files(folder):
    with safe_open(str(file), framework="numpy") as reader:
      for key in reader.keys():
        target = _text_target(model, key)
        if target is None:
          skipped.append(key)
          continue
        param, transpose = target
        value = reader.get_tensor(key)
        value = value.T if transpose else value
        current = param.get_value()  # an array, or a ShapeDtypeStruct on an abstract model
        if value.shape != current.shape:
          raise CheckpointError(f"{file.name}: {key} has shape {value.shape[::-1] if transpose else value.shape}, "
                                f"expected {current.shape[::-1] if transpose else current.shape}")
        sharding.place(param, value)
        loaded.add(id(param))
  missing = [path for pid, path in expected.items() if pid not in loaded]
  if missing:
    raise CheckpointError(f"checkpoint in {folder} lacks {len(missing)} text parameter(s), "
                          f"e.g. {missing[:5]}")
  return skipped


def _named_params(model: TextModel):
  from flax import nnx  # pylint: disable=import-outside-toplevel
  for path, value in nnx.iter_graph(model):
    if isinstance(value, nnx.Param):
      yield ".".join(str(p) for p in path), value
