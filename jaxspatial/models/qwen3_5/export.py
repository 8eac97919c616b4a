"""Writing a Qwen35 back to a Hugging Face folder (config.json + model.safetensors), in the
key layout transformers 5.x's `save_pretrained` writes and `from_pretrained` reads."""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

from jaxspatial.models.qwen2_5_vl.export import write_folder
from jaxspatial.models.qwen2_5_vl.hf_params import CheckpointError
from jaxspatial.models.qwen3_5.config import Qwen35Config
from jaxspatial.models.qwen3_5.hf_params import checkpoint_shapes, targets
from jaxspatial.models.qwen3_vl.hf_params import from_param, hf_key


def state_dict(model) -> dict[str, np.ndarray]:
  """Every tensor under its transformers 5.x name, in torch layout."""
  shapes = checkpoint_shapes(model.config)
  out = {}
  for name, (param, how) in targets(model).items():
    value = from_param(np.asarray(param[...]), how, shapes[name])
    if value.shape != tuple(shapes[name]):
      raise ValueError(f"state_dict: {name} has shape {value.shape}, expected "
                       f"{tuple(shapes[name])} (from the config)")
    out[hf_key(name)] = np.ascontiguousarray(value)
  return out


def _config_dict(model) -> dict:
  """The config.json the model was loaded from while it still describes the model (fields
  this library does not read kept), else `config.to_hf()`."""
  raw = dict(model.config.raw)
  if raw:
    try:
      loaded = Qwen35Config.from_hf(raw)
      ours = model.config.vision
      loaded = dataclasses.replace(loaded, vision=dataclasses.replace(
          loaded.vision, min_pixels=ours.min_pixels, max_pixels=ours.max_pixels))
      if loaded == model.config:
        return raw
    except CheckpointError:
      pass
  return model.config.to_hf()


def save_pretrained(model, folder) -> pathlib.Path:
  """Writes config.json and model.safetensors (atomically: Qwen2.5-VL's `write_folder`) so
  that transformers' and our `from_pretrained` load exactly this model."""
  return write_folder(folder, _config_dict(model), state_dict(model))
