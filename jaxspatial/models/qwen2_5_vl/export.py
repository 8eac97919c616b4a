"""Writing a Qwen25VL back to a Hugging Face folder (config.json + model.safetensors),
through its name map, in the 4.x key layout (`model.*`, `visual.*`) that transformers'
`from_pretrained` reads."""

from __future__ import annotations

import pathlib

import numpy as np

from jaxspatial.models.hf import config_dict, write_folder
from jaxspatial.models.hf import state_dict as named_state_dict
from jaxspatial.models.qwen2_5_vl.hf_params import checkpoint_shapes, targets


def state_dict(model) -> dict[str, np.ndarray]:
  """Every tensor under its canonical checkpoint name, in torch layout ([out, in] for
  linears)."""
  return named_state_dict(model, checkpoint_shapes(model.config), targets(model),
                          key=lambda name: name)


def save_pretrained(model, folder) -> pathlib.Path:
  """Writes config.json and model.safetensors so that `from_pretrained` (ours and
  transformers') loads exactly this model (atomically: `jaxspatial.models.hf.write_folder`)."""
  return write_folder(folder, config_dict(model), state_dict(model))
