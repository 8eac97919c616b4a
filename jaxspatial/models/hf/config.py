"""The parts of a Qwen-VL `config.json` the families read alike: the file, its sections and
special token ids, the decoder's dimensions and rope block, the vision encoder's dimensions;
and the dataclass checks and transformers dicts built from them. Field errors are
ModelFolderError (`fields.Fields`); a config built in code fails `check` with ValueError."""

from __future__ import annotations

import dataclasses
import math
import numbers
import pathlib
from typing import Callable

from jaxspatial.errors import ModelFolderError
from jaxspatial.models.hf.fields import (MAX_DIM, MAX_LAYERS, MISSING, Fields, read_json,
                                         rope_theta, show)

DECODER_DIMS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads")
VISION_DIMS = ("depth", "hidden_size", "intermediate_size", "num_heads", "out_hidden_size",
               "in_channels", "patch_size", "temporal_patch_size", "spatial_merge_size")
ACTIVATIONS = ("silu", "swish")


# --- the dataclasses' shared parts ------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class VisionLanguageConfig:
  """The top-level fields of every family's config: the vision special token ids (defaults:
  transformers' Qwen2.5-VL and Qwen3-VL ids; a family with others redeclares them) and the
  config.json values it was read from (`raw`)."""
  image_token_id: int = 151655
  video_token_id: int = 151656
  vision_start_token_id: int = 151652
  vision_end_token_id: int = 151653
  raw: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

  @classmethod
  def token_defaults(cls) -> tuple[tuple[str, int], ...]:
    """(name, default) of each special id: what `parse` gives a config.json without it."""
    return tuple((field.name, field.default) for field in dataclasses.fields(cls)
                 if field.name.endswith("_token_id"))

  @staticmethod
  def tiny_token_ids(vocab_size: int) -> dict[str, int]:
    """A tiny vocabulary's special ids: image, video, vision start / end are the last six
    ids' first four."""
    names = ("image_token_id", "video_token_id", "vision_start_token_id",
             "vision_end_token_id")
    return {name: vocab_size - 6 + i for i, name in enumerate(names)}


class VisionSizes:
  """The sizes a vision encoder config derives from its VISION_DIMS fields."""

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def patch_dim(self) -> int:
    """Values in one flattened patch: channels x frames x patch side squared."""
    return self.in_channels * self.temporal_patch_size * self.patch_size ** 2


# --- config.json ------------------------------------------------------------------------

def read_config(config, label: str) -> tuple[dict, str, pathlib.Path | None]:
  """(values, source for messages, folder) of a config.json dict, file or folder; the folder
  is None for a dict. `label` names the family in a missing file's error."""
  if isinstance(config, dict):
    return config, "config.json", None
  path = pathlib.Path(config)
  path = path / "config.json" if path.is_dir() else path
  if not path.is_file():
    raise FileNotFoundError(f"{label} config not found: {path}")
  return read_json(path), str(path), path.parent


def parse(config, label: str, config_class: type[VisionLanguageConfig], text_config: Callable,
          vision_config: Callable) -> tuple[dict, pathlib.Path | None]:
  """(the family config's fields, the folder or None) of a config.json dict, file or folder:
  `text_config(text, top)` and `vision_config(vision_config's values, source, text)` are the
  family's parsers; `config_class` gives the special ids' defaults."""
  values, source, folder = read_config(config, label)
  top, text = sections(values, source)
  text = text_config(text, top)
  ids = token_ids(top, config_class.token_defaults(), text.vocab_size)
  vision = vision_config(top.object("vision_config"), source, text)
  return dict(text=text, vision=vision, raw=values, **ids), folder


def sections(config, source: str) -> tuple[Fields, Fields]:
  """(top level, text section): `text_config` where there is one (transformers 5), else the
  top level (4.x)."""
  if not isinstance(config, dict):
    raise ModelFolderError(f"{source}: expected a JSON object at the top level, got "
                           f"{show(config)}")
  top = Fields(source, config)
  return top, top.nested("text_config") or top


def token_ids(top: Fields, defaults: tuple, vocab_size: int) -> dict[str, int]:
  """The special ids, a missing one taking transformers' default; the image id (the only
  one the model reads) must lie in the vocabulary."""
  ids = {}
  for name, default in defaults:
    if name != "image_token_id":
      ids[name] = top.integer(name, 0, MAX_DIM, default)
      continue
    value = top.get(name)
    if value is MISSING and not 0 <= default < vocab_size:
      raise top.fail(name, f"an id in the vocabulary [0, {vocab_size - 1}] (transformers' "
                     f"default {default} lies outside it)", value)
    ids[name] = top.integer(name, 0, vocab_size - 1, default)
  return ids


# --- the text decoder -------------------------------------------------------------------

def decoder_dims(text: Fields) -> dict:
  """The decoder's sizes and norm epsilon, checked; a null num_key_value_heads is one per
  attention head (transformers' default when it is missing rarely fits: refused)."""
  out = {name: text.integer(name, 1, MAX_LAYERS if name == "num_hidden_layers" else MAX_DIM)
         for name in DECODER_DIMS if name != "num_key_value_heads"}
  heads = out["num_attention_heads"]
  kv_heads = text.get("num_key_value_heads")
  kv_heads = heads if kv_heads is None else text.integer("num_key_value_heads", 1, MAX_DIM)
  if heads % kv_heads:
    raise text.fail("num_key_value_heads", f"a divisor of num_attention_heads {heads}",
                    kv_heads)
  text.choice("hidden_act", ACTIVATIONS, "the activation the decoder implements", "silu")
  # the epsilon's default differs between transformers versions: required
  return dict(out, num_key_value_heads=kv_heads, rms_norm_eps=text.number("rms_norm_eps"))


def no_attention_dropout(text: Fields) -> None:
  dropout = text.get("attention_dropout", 0.0)
  if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or dropout != 0:
    raise text.fail("attention_dropout", "0 (attention dropout is not implemented)", dropout)


def full_attention_only(text: Fields, layers: int) -> None:
  """Refuses `layer_types` naming sliding-window layers."""
  layer_types = text.get("layer_types", None)
  if layer_types is not None and (
      not isinstance(layer_types, list) or len(layer_types) != layers or
      any(kind != "full_attention" for kind in layer_types)):
    raise text.fail("layer_types", f"{layers} x 'full_attention' (sliding-window attention "
                    "is not implemented)", layer_types)


def text_rope(text: Fields) -> Fields:
  """The decoder's rope block (transformers reads `rope_scaling` first, then
  `rope_parameters`), refusing rope scaling."""
  name = "rope_scaling" if text.get("rope_scaling", None) else "rope_parameters"
  rope = text.nested(name) or Fields(text.source, {}, f"{text.prefix}{name}.")
  for key in ("type", "rope_type"):
    if key in rope.values:
      rope.choice(key, ("default", "mrope"), "the multimodal rope this model implements; "
                  "rope scaling is not implemented")
  return rope


def mrope_section(rope: Fields, default, rotary_dim: int, why: str) -> tuple[int, int, int]:
  """The M-RoPE (t, h, w) sections, summing to half the rotary dimension (`why` says what
  that is)."""
  section = rope.get("mrope_section", default)
  if (not isinstance(section, (list, tuple)) or len(section) != 3 or
      any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in section)):
    raise rope.fail("mrope_section", "a list of three integers >= 0", section)
  if rotary_dim % 2 or 2 * sum(section) != rotary_dim:
    raise rope.fail("mrope_section", f"sections summing to {why}", section)
  return tuple(section)


# --- the vision encoder -----------------------------------------------------------------

def vision_section(vision, source: str) -> Fields:
  """`vision_config` as Fields (missing or null: every field takes its default)."""
  if vision is None:
    vision = {}
  if not isinstance(vision, dict):
    raise ModelFolderError(f"{source}: vision_config: expected an object, got {show(vision)}")
  return Fields(source, vision, "vision_config.")


def vision_dims(v: Fields, defaults, extra: tuple[str, ...] = ()) -> dict[str, int]:
  """The encoder's sizes (`VISION_DIMS` and `extra`), missing ones from `defaults`; the head
  width a multiple of 4 (the 2-D rope)."""
  out = {name: v.integer(name, 1, MAX_LAYERS if name == "depth" else MAX_DIM,
                         getattr(defaults, name)) for name in VISION_DIMS + extra}
  if out["hidden_size"] % out["num_heads"]:
    raise v.fail("num_heads", f"a divisor of hidden_size {out['hidden_size']}",
                 out["num_heads"])
  if (out["hidden_size"] // out["num_heads"]) % 4:
    raise v.fail("hidden_size", "hidden_size / num_heads a multiple of 4 (the 2-D rope)",
                 out["hidden_size"])
  return out


def vision_rope_theta(v: Fields, default: float) -> float:
  rope = v.nested("rope_parameters")
  if rope is not None and "rope_type" in rope.values:
    rope.choice("rope_type", ("default", "axial"), "the 2-D rope the encoder implements")
  return rope_theta(rope, v, default)


# --- configs built in code --------------------------------------------------------------

def check_sizes(config, names: tuple[str, ...]) -> None:
  """Integers >= 1 (ValueError naming the dataclass and field)."""
  for name in names:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
      raise ValueError(f"{type(config).__name__}.{name}: expected an integer >= 1, got "
                       f"{value!r}")


def check_decoder(config, extra: tuple[str, ...] = ()) -> None:
  """A decoder config's sizes, epsilon and head groups."""
  check_sizes(config, DECODER_DIMS + extra)
  eps = config.rms_norm_eps
  if (isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps)
      or eps <= 0):
    raise ValueError(f"{type(config).__name__}.rms_norm_eps: expected a finite number > 0, "
                     f"got {eps!r}")
  if config.num_attention_heads % config.num_key_value_heads:
    raise ValueError(f"{type(config).__name__}: num_attention_heads "
                     f"{config.num_attention_heads} is not a multiple of num_key_value_heads "
                     f"{config.num_key_value_heads}")


# --- transformers' dicts ----------------------------------------------------------------

def decoder_dict(t) -> dict:
  """The text config fields every family writes (the tokenizer holds its own bos / eos)."""
  return dict({name: getattr(t, name) for name in DECODER_DIMS}, rms_norm_eps=t.rms_norm_eps,
              bos_token_id=None, eos_token_id=None)


def vision_dict(v) -> dict:
  return {name: getattr(v, name) for name in VISION_DIMS}


def hf_config_dict(hf_class, config, text: dict, vision: dict) -> dict:
  """transformers' `hf_class` (e.g. Qwen2_5_VLConfig) of a family config, as a dict."""
  ids = {field.name: getattr(config, field.name) for field in dataclasses.fields(config)
         if field.name.endswith("_token_id")}
  return hf_class(text_config=text, vision_config=vision,
                  tie_word_embeddings=config.text.tie_word_embeddings, **ids).to_dict()
