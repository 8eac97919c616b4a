"""Qwen3-VL (dense) configuration (text decoder and vision encoder), read from a Hugging
Face `config.json`.

Differences from Qwen2.5-VL that shape the config: `head_dim` is a field of its own (not
hidden / heads), the text decoder has QK-norm and optional attention biases, M-RoPE is
interleaved, the vision encoder has learned position embeddings and DeepStack mergers, and
the LM head is tied only where the top-level `tie_word_embeddings` says so.
"""

from __future__ import annotations

import dataclasses
import pathlib

from jaxspatial.errors import ModelFolderError
from jaxspatial.models.hf.config import (check_decoder, decoder_dict, decoder_dims,
                                         full_attention_only, hf_config_dict, mrope_section,
                                         no_attention_dropout, parse, text_rope,
                                         VisionLanguageConfig, VisionSizes, vision_dict,
                                         vision_dims, vision_rope_theta, vision_section)
from jaxspatial.models.hf.fields import MAX_DIM, Fields, read_json, rope_theta, show

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
    check_decoder(self, ("head_dim",))
    if self.head_dim % 2 or 2 * sum(self.mrope_section) != self.head_dim:
      raise ValueError(f"TextConfig: 2 * sum(mrope_section {self.mrope_section}) must equal "
                       f"head_dim {self.head_dim}")
    if not self.mrope_interleaved:
      raise ValueError("TextConfig.mrope_interleaved: Qwen3-VL's M-RoPE is interleaved")


@dataclasses.dataclass(frozen=True)
class VisionConfig(VisionSizes):
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
  def grid_side(self) -> int:
    """Side of the square learned position table (transformers: int(n ** 0.5))."""
    return int(self.num_position_embeddings ** 0.5)

  @classmethod
  def from_hf(cls, vision: dict | None, source: str = "config.json") -> "VisionConfig":
    """From a `config.json`'s `vision_config`, checked field by field (see
    `Qwen3VLConfig.from_hf`)."""
    return _vision_config(vision, source)

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
class Qwen3VLConfig(VisionLanguageConfig):
  """Special ids: transformers' Qwen3VLConfig defaults (Qwen2.5-VL's)."""
  text: TextConfig = TextConfig()
  vision: VisionConfig = VisionConfig()

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
        **cls.tiny_token_ids(vocab_size))

  def to_hf(self) -> dict:
    """A transformers `Qwen3VLConfig` dict of this configuration (what `config.json` of a
    checkpoint built here holds): `from_hf(config.to_hf()) == config`."""
    import transformers  # pylint: disable=import-outside-toplevel
    t, v = self.text, self.vision
    text = text_dict(t, mrope_interleaved=t.mrope_interleaved)
    vision = vision_hf_dict(v, deepstack_visual_indexes=list(v.deepstack_visual_indexes))
    return hf_config_dict(transformers.Qwen3VLConfig, self, text, vision)

  @classmethod
  def from_hf(cls, config: dict | str | pathlib.Path) -> "Qwen3VLConfig":
    """From a `config.json` dict, file or folder (and the folder's
    preprocessor_config.json, for the pixel bounds).

    Every field the model reads is checked (type, range, consistency) and every setting it
    does not implement is refused (another activation, rope scaling, sliding windows,
    attention dropout, DeepStack indexes outside the encoder), with a `ModelFolderError`
    naming the file, the field, the expected and the found value.
    """
    fields, folder = parse(config, "Qwen3-VL", cls, _text_config,
                           lambda vision, source, text: checked_width(
                               VisionConfig.from_hf(vision, source), text, source))
    return with_pixel_bounds(cls(**fields), folder)


def text_dict(t, **rope) -> dict:
  """transformers' text config of a Qwen3 decoder config (`rope`: more rope_parameters)."""
  return dict(decoder_dict(t), head_dim=t.head_dim, attention_bias=t.attention_bias,
              rope_parameters={"rope_type": "default", "mrope_section": list(t.mrope_section),
                               "rope_theta": t.rope_theta, **rope})


def vision_hf_dict(v, **extra) -> dict:
  """transformers' vision config of a VisionConfig (`extra`: more fields)."""
  return dict(vision_dict(v), num_position_embeddings=v.num_position_embeddings,
              hidden_act=v.hidden_act, **extra,
              rope_parameters={"rope_type": "axial", "rope_theta": v.rope_theta})


def checked_width(vision, text, source: str):
  """`vision`, once its out_hidden_size is the decoder's width."""
  if vision.out_hidden_size != text.hidden_size:
    raise ModelFolderError(f"{source}: vision_config.out_hidden_size: expected the text "
                           f"hidden_size {text.hidden_size} (vision tokens replace token "
                           f"embeddings), got {show(vision.out_hidden_size)}")
  return vision


def with_pixel_bounds(config, folder: pathlib.Path | None):
  """`config` with the pixel bounds of the folder's preprocessor_config.json, if any."""
  bounds = {} if folder is None else pixel_bounds(folder / "preprocessor_config.json")
  if not bounds:
    return config
  return dataclasses.replace(config, vision=dataclasses.replace(config.vision, **bounds))


def pixel_bounds(path: pathlib.Path) -> dict:
  """{min_pixels, max_pixels} from an image processor's preprocessor_config.json (`size`'s
  shortest_edge / longest_edge, or the older top-level min_pixels / max_pixels); {} when
  the file is absent."""
  if not path.is_file():
    return {}
  values = read_json(path)
  if not isinstance(values, dict):
    raise ModelFolderError(f"{path}: expected a JSON object at the top level, got "
                           f"{show(values)}")
  fields = Fields(str(path), values)
  size = fields.nested("size")
  out = {}
  for name, key in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
    if size is not None and key in size.values:
      out[name] = size.integer(key, 1, MAX_DIM)
    elif name in values:
      out[name] = fields.integer(name, 1, MAX_DIM)
  if out.get("min_pixels", 1) > out.get("max_pixels", MAX_DIM):
    raise fields.fail("size", "shortest_edge (min pixels) <= longest_edge (max pixels)",
                      size.values if size is not None else values)
  return out


# --- config.json parsing: every field checked, every unimplemented setting refused -------

def _text_config(text: Fields, top: Fields) -> TextConfig:
  dims = decoder_dims(text)
  head_dim = text.integer("head_dim", 1, MAX_DIM, 128)  # its own field; transformers' default
  bias = text.boolean("attention_bias", False)
  no_attention_dropout(text)
  rope = text_rope(text)
  section = mrope_section(rope, [24, 20, 20], head_dim,  # transformers' default sections
                          f"head_dim / 2 = {head_dim / 2:g}")
  # transformers' Qwen3-VL interleaves whatever this flag says; a checkpoint that asks for
  # the chunked layout was not trained with what the model computes.
  interleaved = rope.boolean("mrope_interleaved", True)
  if not interleaved:
    raise rope.fail("mrope_interleaved", "true (Qwen3-VL's M-RoPE is interleaved; "
                    "transformers ignores this flag)", interleaved)
  theta = rope_theta(rope, text, 500_000.0)
  # Sliding windows: transformers' Qwen3-VL decoder ignores these fields (it always masks
  # causally); a config that asks for them is refused rather than silently run in full.
  use_sliding = text.get("use_sliding_window", None)
  if use_sliding is not None and not isinstance(use_sliding, bool):
    raise text.fail("use_sliding_window", "true or false", use_sliding)
  if use_sliding and text.get("sliding_window", None) is not None:
    raise text.fail("use_sliding_window", "false (sliding-window attention is not "
                    "implemented)", use_sliding)
  full_attention_only(text, dims["num_hidden_layers"])
  # transformers ties Qwen3-VL's head only where the top-level field says so (default
  # false); text_config.tie_word_embeddings is not read.
  tie = top.boolean("tie_word_embeddings", False)
  return TextConfig(head_dim=head_dim, rope_theta=theta, mrope_section=section,
                    mrope_interleaved=interleaved, attention_bias=bias,
                    tie_word_embeddings=tie, **dims)


def _vision_config(vision: dict | None, source: str) -> VisionConfig:
  v = vision_section(vision, source)
  defaults = VisionConfig()
  ints = vision_dims(v, defaults, ("num_position_embeddings",))
  act = v.choice("hidden_act", VISION_ACTIVATIONS, "the activation the vision MLP implements",
                 defaults.hidden_act)
  depth = ints["depth"]
  indexes = v.get("deepstack_visual_indexes", list(defaults.deepstack_visual_indexes))
  # Distinct: transformers builds a merger per entry but runs only the first of a repeat.
  if (not isinstance(indexes, (list, tuple)) or
      any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < depth
          for i in indexes) or len(set(indexes)) != len(indexes)):
    raise v.fail("deepstack_visual_indexes", f"a list of distinct block indexes in "
                 f"[0, {depth - 1}] (depth {depth})", indexes)
  return VisionConfig(deepstack_visual_indexes=tuple(indexes), hidden_act=act,
                      rope_theta=vision_rope_theta(v, defaults.rope_theta), **ints)
