"""Writing a Qwen35 back to a Hugging Face folder (config.json + model.safetensors), in the
key layout transformers 5.x's `save_pretrained` writes and `from_pretrained` reads: Qwen3-VL's
writer over Qwen3.5's checkpoint layout."""

from __future__ import annotations

import pathlib

import numpy as np

from jaxspatial.models.qwen2_5_vl.export import write_folder
from jaxspatial.models.qwen3_5.hf_params import checkpoint_shapes, targets
from jaxspatial.models.qwen3_vl import export as qwen3_vl_export


def state_dict(model) -> dict[str, np.ndarray]:
  """Every tensor under its transformers 5.x name, in torch layout."""
  return qwen3_vl_export.state_dict(model, checkpoint_shapes, targets)


def save_pretrained(model, folder) -> pathlib.Path:
  """Writes config.json and model.safetensors (atomically: Qwen2.5-VL's `write_folder`) so
  that transformers' and our `from_pretrained` load exactly this model."""
  return write_folder(folder, qwen3_vl_export.config_dict(model), state_dict(model))
