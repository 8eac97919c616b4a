"""Qwen2.5-VL configuration (text decoder and vision encoder), read from a Hugging Face
`config.json`."""

from __future__ import annotations

import dataclasses
import pathlib

from jaxspatial.models.hf.config import (ACTIVATIONS, check_decoder, decoder_dict, decoder_dims,
                                         full_attention_only, hf_config_dict, mrope_section,
                                         parse, text_rope, VisionLanguageConfig,
                                         VisionSizes, vision_dict, vision_dims,
                                         vision_rope_theta, vision_section)
from jaxspatial.models.hf.fields import MAX_LAYERS, MISSING, Fields, rope_theta


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
    check_decoder(self)
    if self.hidden_size % self.num_attention_heads:
      raise ValueError(f"TextConfig: hidden_size {self.hidden_size} is not a multiple of "
                       f"num_attention_heads {self.num_attention_heads}")
    if 2 * sum(self.mrope_section) != self.head_dim:
      raise ValueError(f"TextConfig: 2 * sum(mrope_section {self.mrope_section}) must equal "
                       f"head_dim {self.head_dim}")


@dataclasses.dataclass(frozen=True)
class VisionConfig(VisionSizes):
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

  @classmethod
  def from_hf(cls, vision: dict, source: str = "config.json") -> "VisionConfig":
    """From a `config.json`'s `vision_config`, checked field by field (see
    `Qwen25VLConfig.from_hf`)."""
    return _vision_config(vision, source)


@dataclasses.dataclass(frozen=True)
class Qwen25VLConfig(VisionLanguageConfig):
  text: TextConfig = TextConfig()
  vision: VisionConfig = VisionConfig()

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
        **cls.tiny_token_ids(vocab_size))

  def to_hf(self) -> dict:
    """A transformers `Qwen2_5_VLConfig` dict of this configuration (what `config.json` of
    a checkpoint built here holds): `from_hf(config.to_hf()) == config`."""
    import transformers  # pylint: disable=import-outside-toplevel
    t, v = self.text, self.vision
    text = dict(decoder_dict(t),
                rope_scaling={"type": "mrope", "mrope_section": list(t.mrope_section),
                              "rope_theta": t.rope_theta},
                rope_theta=t.rope_theta, tie_word_embeddings=t.tie_word_embeddings)
    vision = dict(vision_dict(v), window_size=v.window_size,
                  fullatt_block_indexes=list(v.fullatt_block_indexes))
    return hf_config_dict(transformers.Qwen2_5_VLConfig, self, text, vision)

  @classmethod
  def from_hf(cls, config: dict | str | pathlib.Path) -> "Qwen25VLConfig":
    """From a `config.json` dict, file or folder (transformers 4.x or 5.x layout).

    Every field the model reads is checked (type, range, consistency) and every setting it
    does not implement is refused (another activation, rope scaling, sliding-window layers),
    with a `ModelFolderError` naming the file, the field, the expected and the found value.
    """
    fields, _ = parse(config, "Qwen2.5-VL", cls, _text_config,
                      lambda vision, source, _: _vision_config(vision, source))
    return cls(**fields)


# --- config.json parsing: every field checked, every unimplemented setting refused -------

def _text_config(text: Fields, top: Fields) -> TextConfig:
  dims = decoder_dims(text)
  hidden_size, heads = dims["hidden_size"], dims["num_attention_heads"]
  if hidden_size % heads:
    raise text.fail("num_attention_heads", f"a divisor of hidden_size {hidden_size}", heads)
  rope = text_rope(text)
  head_dim = hidden_size // heads
  section = mrope_section(rope, MISSING, head_dim,
                          f"head_dim / 2 = {head_dim / 2:g} (hidden_size {hidden_size} / "
                          f"num_attention_heads {heads} / 2)")
  theta = rope_theta(rope, text, 1_000_000.0)
  # Sliding-window attention (not implemented): transformers slides layer i when
  # use_sliding_window, sliding_window is set and i >= max_window_layers, or where
  # layer_types says so.
  layers = dims["num_hidden_layers"]
  use_sliding = text.get("use_sliding_window", None)
  if use_sliding is not None and not isinstance(use_sliding, bool):
    raise text.fail("use_sliding_window", "true or false", use_sliding)
  if use_sliding:
    window = text.get("sliding_window", 4096)
    first = text.integer("max_window_layers", 0, MAX_LAYERS, 80)
    if window is not None and first < layers:
      raise text.fail("use_sliding_window", "false (sliding-window attention is not "
                      f"implemented; with max_window_layers {first} layers {first} to "
                      f"{layers - 1} would slide)", use_sliding)
  full_attention_only(text, layers)
  ties = [fields.boolean("tie_word_embeddings") for fields in (top, text)
          if "tie_word_embeddings" in fields.values]
  tie = any(ties) if ties else True  # transformers 5: a tie in text_config ties
  return TextConfig(rope_theta=theta, mrope_section=section, tie_word_embeddings=tie, **dims)


def _vision_config(vision: dict | None, source: str) -> VisionConfig:
  v = vision_section(vision, source)
  defaults = VisionConfig()
  ints = vision_dims(v, defaults, ("window_size",))
  v.choice("hidden_act", ACTIVATIONS, "the activation the vision MLP implements", "silu")
  unit = ints["patch_size"] * ints["spatial_merge_size"]
  if ints["window_size"] % unit:
    raise v.fail("window_size", f"a multiple of patch_size x spatial_merge_size = {unit}",
                 ints["window_size"])
  depth = ints["depth"]
  blocks = v.get("fullatt_block_indexes", list(defaults.fullatt_block_indexes))
  if (not isinstance(blocks, (list, tuple)) or
      any(isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < depth for b in blocks)):
    raise v.fail("fullatt_block_indexes", f"a list of block indexes in [0, {depth - 1}] "
                 f"(depth {depth})", blocks)
  return VisionConfig(fullatt_block_indexes=tuple(blocks),
                      rope_theta=vision_rope_theta(v, defaults.rope_theta), **ints)
