"""Writing a Qwen3VL back to a Hugging Face folder (config.json + model.safetensors), in the
key layout transformers 5.x's `save_pretrained` writes and `from_pretrained` reads."""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

from jaxspatial.models.qwen2_5_vl.export import write_folder
from jaxspatial.models.qwen2_5_vl.hf_params import CheckpointError
from jaxspatial.models.qwen3_vl.hf_params import checkpoint_shapes, from_param, hf_key, targets


def state_dict(model, shapes_of=checkpoint_shapes, targets_of=targets) -> dict[str, np.ndarray]:
  """Every tensor under its transformers 5.x name, in torch layout ([out, in] for linears,
  [C, in, T, P, P] for the patch embedding). `shapes_of` / `targets_of`: the family's
  checkpoint layout (Qwen3.5 passes its own)."""
  shapes = shapes_of(model.config)
  out = {}
  for name, (param, how) in targets_of(model).items():
    value = from_param(np.asarray(param[...]), how, shapes[name])
    if value.shape != tuple(shapes[name]):
      raise ValueError(f"state_dict: {name} has shape {value.shape}, expected "
                       f"{tuple(shapes[name])} (from the config)")
    out[hf_key(name)] = np.ascontiguousarray(value)
  return out


def config_dict(model) -> dict:
  """config.json's content: the one the model was loaded from while it still describes the
  model (keeping fields this library does not read), else `config.to_hf()`."""
  raw = dict(model.config.raw)
  if raw:
    try:
      # The pixel bounds are the image processor's, not config.json's.
      loaded = type(model.config).from_hf(raw)
      ours = model.config.vision
      loaded = dataclasses.replace(loaded, vision=dataclasses.replace(
          loaded.vision, min_pixels=ours.min_pixels, max_pixels=ours.max_pixels))
      if loaded == model.config:
        return raw
    except CheckpointError:
      pass
  return model.config.to_hf()  # built here, or changed since loading: write ours


def save_pretrained(model, folder) -> pathlib.Path:
  """Writes config.json and model.safetensors so that `from_pretrained` (ours and
  transformers') loads exactly this model (atomically: see Qwen2.5-VL's `write_folder`)."""
  return write_folder(folder, config_dict(model), state_dict(model))
