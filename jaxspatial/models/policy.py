"""The policy interface: what the sampler, the rollouts, the trainer, the reference policy,
LoRA, sharding, loading and export need of a model family, and the family registry.

A family's model class (`Qwen25VL`, `Qwen3VL`, `Qwen35`) implements:

  family                      class attribute: config.json's `model_type`
  config                      `.text` (vocab_size, hidden_size, ...), `.vision`,
                              `.image_token_id`, `.raw` (the loaded config.json)
  from_pretrained(folder, *, dtype, param_dtype, seed, attention, remat)   classmethod
  vision_inputs(images_BxKxHxWx3 uint8) -> (pixel_values, grids, sequence_grids_BxKx3)
                              on-device preprocessing of B sequences of K same-sized views
  image_grid(image_size) -> (t, h, w) patch grid;  image_tokens(image_size) -> int
  encode_images(pixel_values, grids) -> VisionOutput (tokens, DeepStack features or None)
  decoder_inputs(input_ids_BxL, pixel_values, grids, vision) -> (embeds_BxLxC, residuals)
                              token embeddings with the vision tokens at the image
                              placeholders; `residuals` is what the family adds inside the
                              decoder (Qwen3-VL's DeepStack features), None when nothing
  embed(...) -> embeds_BxLxC  decoder_inputs' embeddings alone
  position_ids(input_ids_BxL, attention_mask_BxL, sequence_grids_BxKx3 | None) -> [3, B, L]
  __call__(input_ids_BxL, attention_mask_BxL, pixel_values, grids, sequence_grids_BxKx3,
           images_by_row=False) -> float32 logits [B, L, V] (by row: K images per sequence,
                              its image tokens take its own even where it shows fewer)
  language_model              embed_tokens, init_cache(batch, length, dtype) (a per-layer
                              pytree the family owns: keys and values, or Qwen3.5's
                              convolution inputs and delta-rule state),
                              hidden_states(embeds, positions, mask, residuals),
                              extend(embeds, positions, valid_BxS, cache, index, residuals)
                              -> (hidden, cache), logits(hidden)

and a module-level `save_pretrained(model, folder)` in its `export` module. The family of a
checkpoint is read from its config.json's `model_type`, so a checkpoint path picks it.
"""

from __future__ import annotations

import importlib
import pathlib

import jax.numpy as jnp

from jaxspatial.errors import ModelFolderError
from jaxspatial.models.hf import read_json
from jaxspatial.models.qwen2_5_vl.tokenizer import load_processor
from jaxspatial.models.vision import VisionOutput

__all__ = ["FAMILIES", "VisionOutput", "export", "load_model", "load_policy", "model_type",
           "policy_class"]

# model_type -> (module of the model class, class name, module of save_pretrained)
FAMILIES = {
    "qwen2_5_vl": ("jaxspatial.models.qwen2_5_vl.model", "Qwen25VL",
                   "jaxspatial.models.qwen2_5_vl.export"),
    "qwen3_vl": ("jaxspatial.models.qwen3_vl.model", "Qwen3VL",
                 "jaxspatial.models.qwen3_vl.export"),
    "qwen3_5": ("jaxspatial.models.qwen3_5.model", "Qwen35",
                "jaxspatial.models.qwen3_5.export"),
}


def model_type(folder) -> str:
  """config.json's `model_type` of a checkpoint folder (or of a config file), checked
  against the families jaxspatial implements."""
  path = pathlib.Path(folder)
  path = path / "config.json" if path.is_dir() else path
  if not path.is_file():
    raise FileNotFoundError(f"no model config: {path} does not exist")
  config = read_json(path)
  if not isinstance(config, dict):
    raise ModelFolderError(f"{path}: expected a JSON object at the top level, got "
                           f"{type(config).__name__}")
  kind = config.get("model_type")
  if kind not in FAMILIES:
    raise ModelFolderError(f"{path}: model_type: expected one of {sorted(FAMILIES)} (the "
                           f"policy families jaxspatial implements), got {kind!r}")
  return kind


def policy_class(kind: str):
  """The model class of a family (`model_type`)."""
  if kind not in FAMILIES:
    raise ValueError(f"policy family: expected one of {sorted(FAMILIES)}, got {kind!r}")
  module, name, _ = FAMILIES[kind]
  return getattr(importlib.import_module(module), name)


def load_model(folder, *, dtype=jnp.float32, param_dtype=jnp.float32, seed: int = 0,
               attention: str = "auto", remat: bool = False):
  """The model of a Hugging Face checkpoint folder, its family read from config.json."""
  cls = policy_class(model_type(folder))
  return cls.from_pretrained(folder, dtype=dtype, param_dtype=param_dtype, seed=seed,
                             attention=attention, remat=remat)


def load_policy(folder, *, dtype=jnp.float32, param_dtype=jnp.float32, seed: int = 0,
                attention: str = "auto", remat: bool = False):
  """(processor or tokenizer, model) of a checkpoint folder; the family comes from
  config.json's `model_type` (`qwen2_5_vl`, `qwen3_vl`, `qwen3_5`)."""
  model = load_model(folder, dtype=dtype, param_dtype=param_dtype, seed=seed,
                     attention=attention, remat=remat)
  return load_processor(folder), model


def export(model, folder) -> pathlib.Path:
  """Writes `model` to `folder` as a Hugging Face checkpoint of its family (config.json and
  model.safetensors) that transformers and `load_policy` load."""
  kind = getattr(type(model), "family", None)
  if kind not in FAMILIES:
    raise TypeError(f"export: {type(model).__name__} is not a policy family "
                    f"({sorted(FAMILIES)})")
  return importlib.import_module(FAMILIES[kind][2]).save_pretrained(model, folder)
