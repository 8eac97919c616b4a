"""Qwen3-VL (dense) configuration (text decoder and vision encoder), read from a Hugging
Face `config.json`.

Differences from Qwen2.5-VL that shape the config: `head_dim` is a field of its own (not
hidden / heads), the text decoder has QK-norm and optional attention biases, M-RoPE is
interleaved, the vision encoder has learned position embeddings and DeepStack mergers, and
the LM head is tied only where the top-level `tie_word_embeddings` says so.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import pathlib

from jaxspatial.models.qwen2_5_vl.config import _MISSING, _Fields, _error, _read_json, _show

_MAX_DIM = 2 ** 31 - 1     # a tensor dimension (int32 indexing)
_MAX_LAYERS = 10_000       # decoder layers / vision blocks
# transformers' defaults for the special ids (Qwen3VLConfig)
_TOKEN_IDS = (("image_token_id", 151655), ("video_token_id", 151656),
              ("vision_start_token_id", 151652), ("vision_end_token_id", 151653))
VISION_ACTIVATIONS = ("gelu_pytorch_tanh",)


@dataclasses.dataclass(frozen=True)
class TextConfig:
  """The Qwen3 text decoder (defaults: transformers' Qwen3VLTextConfig)."""
  vocab_size: int = 151936
  hidden_size: int = 4096
  intermediate_size: int = 22016
  num_hidden_layers: int = 32
  num_attention_heads: int = 32
  num_key_value_heads: int = 32
  head_dim: int = 128
  rms_norm_eps: float = 1e-6
  rope_theta: float = 500_000.0
  mrope_section: tuple[int, int, int] = (24, 20, 20)
  mrope_interleaved: bool = True
  attention_bias: bool = False
  tie_word_embeddings: bool = False

  def check(self) -> None:
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"TextConfig.{name}: expected an integer >= 1, got {value!r}")
    if (isinstance(self.rms_norm_eps, bool) or not isinstance(self.rms_norm_eps, numbers.Real)
        or not math.isfinite(self.rms_norm_eps) or self.rms_norm_eps <= 0):
      raise ValueError(f"TextConfig.rms_norm_eps: expected a finite number > 0, got "
                       f"{self.rms_norm_eps!r}")
    if self.num_attention_heads % self.num_key_value_heads:
      raise ValueError(f"TextConfig: num_attention_heads {self.num_attention_heads} is not a "
                       f"multiple of num_key_value_heads {self.num_key_value_heads}")
    if self.head_dim % 2 or 2 * sum(self.mrope_section) != self.head_dim:
      raise ValueError(f"TextConfig: 2 * sum(mrope_section {self.mrope_section}) must equal "
                       f"head_dim {self.head_dim}")
    if not self.mrope_interleaved:
      raise ValueError("TextConfig.mrope_interleaved: Qwen3-VL's M-RoPE is interleaved")


@dataclasses.dataclass(frozen=True)
class VisionConfig:
  """The Qwen3-VL vision encoder (defaults: transformers' Qwen3VLVisionConfig)."""
  depth: int = 27
  hidden_size: int = 1152
  intermediate_size: int = 4304
  num_heads: int = 16
  out_hidden_size: int = 3584
  in_channels: int = 3
  patch_size: int = 16
  temporal_patch_size: int = 2
  spatial_merge_size: int = 2
  num_position_embeddings: int = 2304
  deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)
  hidden_act: str = "gelu_pytorch_tanh"
  rope_theta: float = 10000.0
  # The image processor's pixel bounds (preprocessor_config.json `size`: shortest_edge /
  # longest_edge, which are pixel counts; not in config.json): smart resize keeps every
  # image within them. Defaults: the released Qwen3-VL processors'.
  min_pixels: int = 256 * 256
  max_pixels: int = 4096 * 4096

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def patch_dim(self) -> int:
    return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

  @property
  def grid_side(self) -> int:
    """Side of the square learned position table (transformers: int(n ** 0.5))."""
    return int(self.num_position_embeddings ** 0.5)

  def check(self) -> None:
    if self.hidden_act not in VISION_ACTIVATIONS:
      raise ValueError(f"VisionConfig.hidden_act: expected one of {VISION_ACTIVATIONS}, got "
                       f"{self.hidden_act!r}")
    if self.hidden_size % self.num_heads or self.head_dim % 4:
      raise ValueError(f"VisionConfig: hidden_size {self.hidden_size} / num_heads "
                       f"{self.num_heads} must be a multiple of 4 (the 2-D rope)")
    indexes = self.deepstack_visual_indexes
    if len(set(indexes)) != len(indexes) or any(not 0 <= i < self.depth for i in indexes):
      raise ValueError(f"VisionConfig.deepstack_visual_indexes: expected distinct block "
                       f"indexes in [0, {self.depth - 1}], got {indexes}")


@dataclasses.dataclass(frozen=True)
class Qwen3VLConfig:
  text: TextConfig = TextConfig()
  vision: VisionConfig = VisionConfig()
  image_token_id: int = 151655
  video_token_id: int = 151656
  vision_start_token_id: int = 151652
  vision_end_token_id: int = 151653
  raw: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

  @classmethod
  def tiny(cls, vocab_size: int = 512) -> "Qwen3VLConfig":
    """A few hundred thousand parameters: tests and CPU demos. Two DeepStack blocks; the
    last six ids are the vision special tokens (image, video, vision start / end)."""
    return cls(
        text=TextConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, rope_theta=10000.0, mrope_section=(2, 3, 3),
                        tie_word_embeddings=True),
        vision=VisionConfig(depth=3, hidden_size=32, intermediate_size=64, num_heads=2,
                            out_hidden_size=64, num_position_embeddings=64,
                            deepstack_visual_indexes=(0, 1), min_pixels=64 * 64),
        image_token_id=vocab_size - 6, video_token_id=vocab_size - 5,
        vision_start_token_id=vocab_size - 4, vision_end_token_id=vocab_size - 3)

  def to_hf(self) -> dict:
    """A transformers `Qwen3VLConfig` dict of this configuration (what `config.json` of a
    checkpoint built here holds): `from_hf(config.to_hf()) == config`."""
    import transformers  # pylint: disable=import-outside-toplevel
    t, v = self.text, self.vision
    text = dict(vocab_size=t.vocab_size, hidden_size=t.hidden_size,
                intermediate_size=t.intermediate_size, num_hidden_layers=t.num_hidden_layers,
                num_attention_heads=t.num_attention_heads,
                num_key_value_heads=t.num_key_value_heads, head_dim=t.head_dim,
                rms_norm_eps=t.rms_norm_eps, attention_bias=t.attention_bias,
                rope_parameters={"rope_type": "default", "mrope_section": list(t.mrope_section),
                                 "mrope_interleaved": t.mrope_interleaved,
                                 "rope_theta": t.rope_theta},
                bos_token_id=None, eos_token_id=None)  # the tokenizer holds its own ids
    vision = dict(depth=v.depth, hidden_size=v.hidden_size,
                  intermediate_size=v.intermediate_size, num_heads=v.num_heads,
                  out_hidden_size=v.out_hidden_size, in_channels=v.in_channels,
                  patch_size=v.patch_size, temporal_patch_size=v.temporal_patch_size,
                  spatial_merge_size=v.spatial_merge_size,
                  num_position_embeddings=v.num_position_embeddings,
                  deepstack_visual_indexes=list(v.deepstack_visual_indexes),
                  hidden_act=v.hidden_act,
                  rope_parameters={"rope_type": "axial", "rope_theta": v.rope_theta})
    config = transformers.Qwen3VLConfig(
        text_config=text, vision_config=vision, image_token_id=self.image_token_id,
        video_token_id=self.video_token_id, vision_start_token_id=self.vision_start_token_id,
        vision_end_token_id=self.vision_end_token_id,
        tie_word_embeddings=t.tie_word_embeddings)
    return config.to_dict()

  @classmethod
  def from_hf(cls, config: dict | str | pathlib.Path) -> "Qwen3VLConfig":
    """From a `config.json` dict, file or folder.

    Every field the model reads is checked (type, range, consistency) and every setting it
    does not implement is refused (another activation, rope scaling, sliding windows,
    attention dropout, DeepStack indexes outside the encoder), with a `CheckpointError`
    naming the file, the field, the expected and the found value.
    """
    source = "config.json"
    bounds = {}
    if not isinstance(config, dict):
      path = pathlib.Path(config)
      path = path / "config.json" if path.is_dir() else path
      if not path.is_file():
        raise FileNotFoundError(f"Qwen3-VL config not found: {path}")
      source = str(path)
      config = _read_json(path)
      bounds = pixel_bounds(path.parent / "preprocessor_config.json")
    parsed = _parse(config, source, cls)
    if not bounds:
      return parsed
    return dataclasses.replace(parsed, vision=dataclasses.replace(parsed.vision, **bounds))


def pixel_bounds(path: pathlib.Path) -> dict:
  """{min_pixels, max_pixels} from an image processor's preprocessor_config.json (`size`'s
  shortest_edge / longest_edge, or the older top-level min_pixels / max_pixels); {} when
  the file is absent."""
  if not path.is_file():
    return {}
  values = _read_json(path)
  if not isinstance(values, dict):
    raise _error(f"{path}: expected a JSON object at the top level, got {_show(values)}")
  fields = _Fields(str(path), values)
  size = fields.object("size")
  out = {}
  for name, key in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
    if size is not None and key in size:
      out[name] = _Fields(str(path), size, "size.").integer(key, 1, _MAX_DIM)
    elif name in values:
      out[name] = fields.integer(name, 1, _MAX_DIM)
  if out.get("min_pixels", 1) > out.get("max_pixels", _MAX_DIM):
    raise fields.fail("size", "shortest_edge (min pixels) <= longest_edge (max pixels)",
                      size if size is not None else values)
  return out


# --- config.json parsing: every field checked, every unimplemented setting refused -------

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
  # transformers: null means one key/value head per attention head (its default, 32, when
  # the field is missing, rarely fits, so a missing field is refused).
  kv_heads = heads if kv_heads is None else dim("num_key_value_heads")
  head_dim = dim("head_dim", default=128)  # a field of its own; transformers' default
  eps = text.number("rms_norm_eps")
  text.choice("hidden_act", ("silu", "swish"), "the activation the decoder implements",
              "silu")
  bias = text.boolean("attention_bias", False)
  dropout = text.get("attention_dropout", 0.0)
  if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or dropout != 0:
    raise text.fail("attention_dropout", "0 (attention dropout is not implemented)", dropout)
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
  section = rope_values.get("mrope_section", [24, 20, 20])  # transformers' default
  if (not isinstance(section, (list, tuple)) or len(section) != 3 or
      any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in section)):
    raise rope.fail("mrope_section", "a list of three integers >= 0", section)
  if 2 * sum(section) != head_dim:
    raise rope.fail("mrope_section", f"sections summing to head_dim / 2 = {head_dim / 2:g}",
                    section)
  # transformers' Qwen3-VL interleaves whatever this flag says; a checkpoint that asks for
  # the chunked layout was not trained with what the model computes.
  interleaved = rope.boolean("mrope_interleaved", True)
  if not interleaved:
    raise rope.fail("mrope_interleaved", "true (Qwen3-VL's M-RoPE is interleaved; "
                    "transformers ignores this flag)", interleaved)
  theta = _rope_theta(rope, text, 500_000.0)
  # Sliding windows: transformers' Qwen3-VL decoder ignores these fields (it always masks
  # causally); a config that asks for them is refused rather than silently run in full.
  use_sliding = text.get("use_sliding_window", None)
  if use_sliding is not None and not isinstance(use_sliding, bool):
    raise text.fail("use_sliding_window", "true or false", use_sliding)
  if use_sliding and text.get("sliding_window", None) is not None:
    raise text.fail("use_sliding_window", "false (sliding-window attention is not "
                    "implemented)", use_sliding)
  layer_types = text.get("layer_types", None)
  if layer_types is not None and (
      not isinstance(layer_types, list) or len(layer_types) != layers or
      any(kind != "full_attention" for kind in layer_types)):
    raise text.fail("layer_types", f"{layers} x 'full_attention' (sliding-window attention "
                    "is not implemented)", layer_types)
  # transformers ties Qwen3-VL's head only where the top-level field says so (default
  # false); text_config.tie_word_embeddings is not read.
  tie = top.boolean("tie_word_embeddings", False)
  return TextConfig(vocab_size=vocab_size, hidden_size=hidden_size,
                    intermediate_size=intermediate_size, num_hidden_layers=layers,
                    num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                    rms_norm_eps=eps, rope_theta=theta, mrope_section=tuple(section),
                    mrope_interleaved=interleaved, attention_bias=bias,
                    tie_word_embeddings=tie)


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
                       "spatial_merge_size", "num_position_embeddings")}
  depth = v.integer("depth", 1, _MAX_LAYERS, defaults.depth)
  act = v.choice("hidden_act", VISION_ACTIVATIONS, "the activation the vision MLP implements",
                 defaults.hidden_act)
  if ints["hidden_size"] % ints["num_heads"]:
    raise v.fail("num_heads", f"a divisor of hidden_size {ints['hidden_size']}",
                 ints["num_heads"])
  if (ints["hidden_size"] // ints["num_heads"]) % 4:
    raise v.fail("hidden_size", "hidden_size / num_heads a multiple of 4 (the 2-D rope)",
                 ints["hidden_size"])
  indexes = v.get("deepstack_visual_indexes", list(defaults.deepstack_visual_indexes))
  # Distinct: transformers builds a merger per entry but runs only the first of a repeat.
  if (not isinstance(indexes, (list, tuple)) or
      any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < depth
          for i in indexes) or len(set(indexes)) != len(indexes)):
    raise v.fail("deepstack_visual_indexes", f"a list of distinct block indexes in "
                 f"[0, {depth - 1}] (depth {depth})", indexes)
  rope_values = v.object("rope_parameters")
  rope = None
  if rope_values is not None:
    rope = _Fields(source, rope_values, "vision_config.rope_parameters.")
    if "rope_type" in rope_values:
      rope.choice("rope_type", ("default", "axial"), "the 2-D rope the encoder implements")
  theta = _rope_theta(rope, v, defaults.rope_theta)
  return VisionConfig(depth=depth, deepstack_visual_indexes=tuple(indexes), hidden_act=act,
                      rope_theta=theta, **ints)


def _parse(config, source: str, cls) -> "Qwen3VLConfig":
  if not isinstance(config, dict):
    raise _error(f"{source}: expected a JSON object at the top level, got {_show(config)}")
  top = _Fields(source, config)
  nested = top.object("text_config")
  text = _Fields(source, nested, "text_config.") if nested is not None else top
  text_config = _text_config(text, top)
  ids = {}
  for name, default in _TOKEN_IDS:  # a missing id takes transformers' default
    if name != "image_token_id":  # the model reads only the image id
      ids[name] = top.integer(name, 0, _MAX_DIM, default)
      continue
    value = config.get(name, _MISSING)
    if value is _MISSING and not 0 <= default < text_config.vocab_size:
      raise top.fail(name, f"an id in the vocabulary [0, {text_config.vocab_size - 1}] "
                     f"(transformers' default {default} lies outside it)", value)
    ids[name] = top.integer(name, 0, text_config.vocab_size - 1, default)
  vision = _vision_config(top.object("vision_config"), source)
  if vision.out_hidden_size != text_config.hidden_size:
    raise _error(f"{source}: vision_config.out_hidden_size: expected the text hidden_size "
                 f"{text_config.hidden_size} (vision tokens replace token embeddings), got "
                 f"{_show(vision.out_hidden_size)}")
  return cls(text=text_config, vision=vision, raw=config, **ids)
