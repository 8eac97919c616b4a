"""Qwen2.5-VL configuration (text decoder and vision encoder), read from a Hugging Face
`config.json`."""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import pathlib


@dataclasses.dataclass(frozen=True)
class TextConfig:
  vocab_size: int = 151936
  hidden_size: int = 2048
  intermediate_size: int = 11008
  num_hidden_layers: int = 36
  num_attention_heads: int = 16
  num_key_value_heads: int = 2
  rms_norm_eps: float = 1e-6
  rope_theta: float = 1_000_000.0
  mrope_section: tuple[int, int, int] = (16, 24, 24)
  tie_word_embeddings: bool = True

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  def check(self) -> None:
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"TextConfig.{name}: expected an integer >= 1, got {value!r}")
    if not _is_number(self.rms_norm_eps) or not math.isfinite(self.rms_norm_eps) or \
        self.rms_norm_eps <= 0:
      raise ValueError(f"TextConfig.rms_norm_eps: expected a finite number > 0, got "
                       f"{self.rms_norm_eps!r}")
    if self.hidden_size % self.num_attention_heads:
      raise ValueError(f"TextConfig: hidden_size {self.hidden_size} is not a multiple of "
                       f"num_attention_heads {self.num_attention_heads}")
    if self.num_attention_heads % self.num_key_value_heads:
      raise ValueError(f"TextConfig: num_attention_heads {self.num_attention_heads} is not a "
                       f"multiple of num_key_value_heads {self.num_key_value_heads}")
    if 2 * sum(self.mrope_section) != self.head_dim:
      raise ValueError(f"TextConfig: 2 * sum(mrope_section {self.mrope_section}) must equal "
                       f"head_dim {self.head_dim}")


@dataclasses.dataclass(frozen=True)
class VisionConfig:
  depth: int = 32
  hidden_size: int = 1280
  intermediate_size: int = 3420
  num_heads: int = 16
  out_hidden_size: int = 2048
  in_channels: int = 3
  patch_size: int = 14
  temporal_patch_size: int = 2
  spatial_merge_size: int = 2
  window_size: int = 112
  fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
  rope_theta: float = 10000.0

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def patch_dim(self) -> int:
    return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

  @classmethod
  def from_hf(cls, vision: dict, source: str = "config.json") -> "VisionConfig":
    """From a `config.json`'s `vision_config`, checked field by field (see
    `Qwen25VLConfig.from_hf`)."""
    return _vision_config(vision, source)


@dataclasses.dataclass(frozen=True)
class Qwen25VLConfig:
  text: TextConfig = TextConfig()
  vision: VisionConfig = VisionConfig()
  image_token_id: int = 151655
  video_token_id: int = 151656
  vision_start_token_id: int = 151652
  vision_end_token_id: int = 151653
  raw: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

  @classmethod
  def tiny(cls, vocab_size: int = 512) -> "Qwen25VLConfig":
    """A few hundred thousand parameters: tests and CPU demos. The last six ids are the
    vision special tokens (image, video, vision start / end)."""
    return cls(
        text=TextConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        mrope_section=(2, 3, 3), tie_word_embeddings=True),
        vision=VisionConfig(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                            out_hidden_size=64, fullatt_block_indexes=(1,)),
        image_token_id=vocab_size - 6, video_token_id=vocab_size - 5,
        vision_start_token_id=vocab_size - 4, vision_end_token_id=vocab_size - 3)

  def to_hf(self) -> dict:
    """A transformers `Qwen2_5_VLConfig` dict of this configuration (what `config.json` of
    a checkpoint built here holds): `from_hf(config.to_hf()) == config`."""
    import transformers  # pylint: disable=import-outside-toplevel
    t, v = self.text, self.vision
    text = dict(vocab_size=t.vocab_size, hidden_size=t.hidden_size,
                intermediate_size=t.intermediate_size, num_hidden_layers=t.num_hidden_layers,
                num_attention_heads=t.num_attention_heads,
                num_key_value_heads=t.num_key_value_heads, rms_norm_eps=t.rms_norm_eps,
                rope_scaling={"type": "mrope", "mrope_section": list(t.mrope_section),
                              "rope_theta": t.rope_theta},
                rope_theta=t.rope_theta, tie_word_embeddings=t.tie_word_embeddings,
                bos_token_id=None, eos_token_id=None)  # the tokenizer holds its own ids
    vision = dict(depth=v.depth, hidden_size=v.hidden_size,
                  intermediate_size=v.intermediate_size, num_heads=v.num_heads,
                  out_hidden_size=v.out_hidden_size, in_channels=v.in_channels,
                  patch_size=v.patch_size, temporal_patch_size=v.temporal_patch_size,
                  spatial_merge_size=v.spatial_merge_size, window_size=v.window_size,
                  fullatt_block_indexes=list(v.fullatt_block_indexes))
    config = transformers.Qwen2_5_VLConfig(
        text_config=text, vision_config=vision, image_token_id=self.image_token_id,
        video_token_id=self.video_token_id, vision_start_token_id=self.vision_start_token_id,
        vision_end_token_id=self.vision_end_token_id,
        tie_word_embeddings=t.tie_word_embeddings)
    return config.to_dict()

  @classmethod
  def from_hf(cls, config: dict | str | pathlib.Path) -> "Qwen25VLConfig":
    """From a `config.json` dict, file or folder (transformers 4.x or 5.x layout).

    Every field the model reads is checked (type, range, consistency) and every setting it
    does not implement is refused (another activation, rope scaling, sliding-window layers),
    with a `CheckpointError` naming the file, the field, the expected and the found value.
    """
    source = "config.json"
    if not isinstance(config, dict):
      path = pathlib.Path(config)
      path = path / "config.json" if path.is_dir() else path
      if not path.is_file():
        raise FileNotFoundError(f"Qwen2.5-VL config not found: {path}")
      source = str(path)
      config = _read_json(path)
    return _parse(config, source, cls)


# --- config.json parsing: every field checked, every unimplemented setting refused -------

_MAX_DIM = 2 ** 31 - 1     # a tensor dimension (int32 indexing)
_MAX_LAYERS = 10_000       # decoder layers / vision blocks (Qwen2.5-VL-72B has 80)
_MISSING = object()
# transformers' defaults for the special ids (Qwen2_5_VLConfig, 4.x and 5.x)
_TOKEN_IDS = (("image_token_id", 151655), ("video_token_id", 151656),
              ("vision_start_token_id", 151652), ("vision_end_token_id", 151653))


def _is_number(value) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _error(message: str) -> ValueError:
  from jaxspatial.models.qwen2_5_vl.hf_params import CheckpointError  # pylint: disable=import-outside-toplevel
  return CheckpointError(message)


def _show(value) -> str:
  if value is _MISSING:
    return "nothing (the field is missing)"
  text = repr(value)
  text = text if len(text) <= 80 else text[:77] + "..."
  return f"{text} ({type(value).__name__})"


def _read_json(path: pathlib.Path):
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
    raise _error(f"{path}: not valid JSON ({type(error).__name__}: "
                 f"{str(error)[:200]})") from None


class _Fields:
  """Typed reads of one JSON object of config.json; errors name file, field, expected, got."""

  def __init__(self, source: str, values: dict, prefix: str = ""):
    self.source, self.values, self.prefix = source, values, prefix

  def fail(self, name: str, expected: str, got) -> ValueError:
    return _error(f"{self.source}: {self.prefix}{name}: expected {expected}, got {_show(got)}")

  def get(self, name: str, default=_MISSING):
    return self.values.get(name, default)

  def integer(self, name: str, low: int, high: int, default=_MISSING, value=_MISSING) -> int:
    value = self.get(name, default) if value is _MISSING else value
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
      raise self.fail(name, f"an integer in [{low}, {high}]", value)
    return value

  def number(self, name: str, default=_MISSING, value=_MISSING) -> float:
    value = self.get(name, default) if value is _MISSING else value
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
      raise self.fail(name, "a finite number > 0", value)
    return float(value)

  def boolean(self, name: str, default=_MISSING) -> bool:
    value = self.get(name, default)
    if not isinstance(value, bool):
      raise self.fail(name, "true or false", value)
    return value

  def choice(self, name: str, allowed: tuple, why: str, default=_MISSING):
    value = self.get(name, default)
    if value not in allowed or isinstance(value, bool):
      listed = " or ".join(repr(a) for a in allowed)
      raise self.fail(name, f"{listed} ({why})", value)
    return value

  def object(self, name: str):
    """A nested object, or None where the field is missing or null."""
    value = self.get(name, None)
    if value is not None and not isinstance(value, dict):
      raise self.fail(name, "an object", value)
    return value


def _rope_theta(rope: _Fields | None, section: _Fields, default: float) -> float:
  if rope is not None and "rope_theta" in rope.values:
    return rope.number("rope_theta")
  return section.number("rope_theta", default)


def _text_config(text: _Fields, top: _Fields) -> TextConfig:
  def dim(name, **kw):
    return text.integer(name, 1, _MAX_DIM, **kw)

  vocab_size, hidden_size = dim("vocab_size"), dim("hidden_size")
  intermediate_size = dim("intermediate_size")
  layers = text.integer("num_hidden_layers", 1, _MAX_LAYERS)
  heads = dim("num_attention_heads")
  kv_heads = text.get("num_key_value_heads")
  # transformers: null means one key/value head per attention head (its default, 8, when
  # the field is missing, rarely fits, so a missing field is refused).
  kv_heads = heads if kv_heads is None else dim("num_key_value_heads")
  eps = text.number("rms_norm_eps")  # the default differs between transformers versions
  text.choice("hidden_act", ("silu", "swish"), "the activation the decoder implements",
              "silu")
  if hidden_size % heads:
    raise text.fail("num_attention_heads", f"a divisor of hidden_size {hidden_size}", heads)
  if heads % kv_heads:
    raise text.fail("num_key_value_heads", f"a divisor of num_attention_heads {heads}",
                    kv_heads)
  # Rope: transformers reads `rope_scaling` first, then `rope_parameters`.
  rope_name = "rope_scaling" if text.get("rope_scaling", None) else "rope_parameters"
  rope_values = text.object(rope_name) or {}
  rope = _Fields(text.source, rope_values, f"{text.prefix}{rope_name}.")
  for key in ("type", "rope_type"):
    if key in rope_values:
      rope.choice(key, ("default", "mrope"), "the multimodal rope this model implements; "
                  "rope scaling is not implemented")
  section = rope_values.get("mrope_section", _MISSING)
  if (not isinstance(section, (list, tuple)) or len(section) != 3 or
      any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in section)):
    raise rope.fail("mrope_section", "a list of three integers >= 0", section)
  head_dim = hidden_size // heads
  if 2 * sum(section) != head_dim:
    raise rope.fail("mrope_section", f"sections summing to head_dim / 2 = {head_dim / 2:g} "
                    f"(hidden_size {hidden_size} / num_attention_heads {heads} / 2)", section)
  theta = _rope_theta(rope, text, 1_000_000.0)
  # Sliding-window attention (not implemented): transformers slides layer i when
  # use_sliding_window, sliding_window is set and i >= max_window_layers, or where
  # layer_types says so.
  use_sliding = text.get("use_sliding_window", None)
  if use_sliding is not None and not isinstance(use_sliding, bool):
    raise text.fail("use_sliding_window", "true or false", use_sliding)
  if use_sliding:
    window = text.get("sliding_window", 4096)
    first = text.integer("max_window_layers", 0, _MAX_LAYERS, 80)
    if window is not None and first < layers:
      raise text.fail("use_sliding_window", "false (sliding-window attention is not "
                      f"implemented; with max_window_layers {first} layers {first} to "
                      f"{layers - 1} would slide)", use_sliding)
  layer_types = text.get("layer_types", None)
  if layer_types is not None and (
      not isinstance(layer_types, list) or len(layer_types) != layers or
      any(kind != "full_attention" for kind in layer_types)):
    raise text.fail("layer_types", f"{layers} x 'full_attention' (sliding-window attention "
                    "is not implemented)", layer_types)
  ties = [fields.boolean("tie_word_embeddings") for fields in (top, text)
          if "tie_word_embeddings" in fields.values]
  tie = any(ties) if ties else True  # transformers 5: a tie in text_config ties
  return TextConfig(vocab_size=vocab_size, hidden_size=hidden_size,
                    intermediate_size=intermediate_size, num_hidden_layers=layers,
                    num_attention_heads=heads, num_key_value_heads=kv_heads, rms_norm_eps=eps,
                    rope_theta=theta, mrope_section=tuple(section), tie_word_embeddings=tie)


def _vision_config(vision: dict | None, source: str) -> VisionConfig:
  if vision is None:
    vision = {}
  if not isinstance(vision, dict):
    raise _error(f"{source}: vision_config: expected an object, got {_show(vision)}")
  v = _Fields(source, vision, "vision_config.")
  defaults = VisionConfig()
  ints = {name: v.integer(name, 1, _MAX_DIM, getattr(defaults, name))
          for name in ("hidden_size", "intermediate_size", "num_heads", "out_hidden_size",
                       "in_channels", "patch_size", "temporal_patch_size",
                       "spatial_merge_size", "window_size")}
  depth = v.integer("depth", 1, _MAX_LAYERS, defaults.depth)
  v.choice("hidden_act", ("silu", "swish"), "the activation the vision MLP implements",
           "silu")
  if ints["hidden_size"] % ints["num_heads"]:
    raise v.fail("num_heads", f"a divisor of hidden_size {ints['hidden_size']}",
                 ints["num_heads"])
  if (ints["hidden_size"] // ints["num_heads"]) % 4:
    raise v.fail("hidden_size", "hidden_size / num_heads a multiple of 4 (the 2-D rope)",
                 ints["hidden_size"])
  unit = ints["patch_size"] * ints["spatial_merge_size"]
  if ints["window_size"] % unit:
    raise v.fail("window_size", f"a multiple of patch_size x spatial_merge_size = {unit}",
                 ints["window_size"])
  blocks = v.get("fullatt_block_indexes", list(defaults.fullatt_block_indexes))
  if (not isinstance(blocks, (list, tuple)) or
      any(isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < depth for b in blocks)):
    raise v.fail("fullatt_block_indexes", f"a list of block indexes in [0, {depth - 1}] "
                 f"(depth {depth})", blocks)
  rope_values = v.object("rope_parameters")
  rope = None
  if rope_values is not None:
    rope = _Fields(source, rope_values, "vision_config.rope_parameters.")
    if "rope_type" in rope_values:
      rope.choice("rope_type", ("default", "axial"), "the 2-D rope the encoder implements")
  theta = _rope_theta(rope, v, defaults.rope_theta)
  return VisionConfig(depth=depth, fullatt_block_indexes=tuple(blocks), rope_theta=theta,
                      **ints)


def _parse(config, source: str, cls) -> "Qwen25VLConfig":
  if not isinstance(config, dict):
    raise _error(f"{source}: expected a JSON object at the top level, got {_show(config)}")
  top = _Fields(source, config)
  nested = top.object("text_config")
  text = _Fields(source, nested, "text_config.") if nested is not None else top
  text_config = _text_config(text, top)
  ids = {}
  for name, default in _TOKEN_IDS:  # a missing id takes transformers' default
    if name != "image_token_id":  # the model reads only the image id (no video, and the
      ids[name] = top.integer(name, 0, 2 ** 31 - 1, default)  # groups come from image ids)
      continue
    value = config.get(name, _MISSING)
    if value is _MISSING and not 0 <= default < text_config.vocab_size:
      raise top.fail(name, f"an id in the vocabulary [0, {text_config.vocab_size - 1}] "
                     f"(transformers' default {default} lies outside it)", value)
    ids[name] = top.integer(name, 0, text_config.vocab_size - 1, default)
  vision = _vision_config(top.object("vision_config"), source)
  return cls(text=text_config, vision=vision, raw=config, **ids)
