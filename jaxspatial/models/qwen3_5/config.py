"""Qwen3.5 (dense) configuration, read from a Hugging Face `config.json` (model_type
"qwen3_5").

The vision encoder is Qwen3-VL's without DeepStack. The text decoder is hybrid:
`layer_types` names each layer "linear_attention" (Gated DeltaNet) or "full_attention"
(gated attention); transformers' default, with `full_attention_interval` 4, is three linear
layers then one full one. Full attention has an output gate (q_proj is twice as wide), QK-
norm and interleaved M-RoPE over the first `partial_rotary_factor` of each head; every
RMSNorm but the linear layers' gated one is zero-centred (weight + 1).
"""

from __future__ import annotations

import dataclasses
import pathlib

from jaxspatial.models.hf.config import (ACTIVATIONS, check_decoder, check_sizes, decoder_dict,
                                         hf_config_dict, mrope_section, no_attention_dropout,
                                         parse, text_rope, VisionLanguageConfig,
                                         vision_dict)
from jaxspatial.models.hf.fields import MAX_DIM, MAX_LAYERS, Fields, rope_theta
from jaxspatial.models.qwen3_vl.config import (VisionConfig, checked_width, text_dict,
                                               vision_hf_dict, with_pixel_bounds)

LAYER_TYPES = ("linear_attention", "full_attention")
LINEAR_DIMS = ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
               "linear_num_key_heads", "linear_num_value_heads")


def default_layer_types(layers: int, interval: int = 4) -> tuple[str, ...]:
  """transformers' pattern: every `interval`-th layer full attention, the others linear."""
  return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention"
               for i in range(layers))


@dataclasses.dataclass(frozen=True)
class TextConfig:
  """The hybrid decoder (defaults: transformers' Qwen3_5TextConfig, the 9B shape)."""
  vocab_size: int = 248320
  hidden_size: int = 4096
  intermediate_size: int = 12288
  num_hidden_layers: int = 32
  num_attention_heads: int = 16
  num_key_value_heads: int = 4
  head_dim: int = 256
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10_000_000.0
  mrope_section: tuple[int, int, int] = (11, 11, 10)
  partial_rotary_factor: float = 0.25
  attention_bias: bool = False
  tie_word_embeddings: bool = False
  layer_types: tuple[str, ...] = default_layer_types(32)
  linear_conv_kernel_dim: int = 4
  linear_key_head_dim: int = 128
  linear_value_head_dim: int = 128
  linear_num_key_heads: int = 16
  linear_num_value_heads: int = 32

  @property
  def rotary_dim(self) -> int:
    """The leading head dimensions the rotary turns (transformers: int(head_dim * factor))."""
    return int(self.head_dim * self.partial_rotary_factor)

  @property
  def conv_dim(self) -> int:
    """Channels of the linear layers' convolution: queries, keys and values."""
    return 2 * self.linear_num_key_heads * self.linear_key_head_dim + self.value_dim

  @property
  def value_dim(self) -> int:
    return self.linear_num_value_heads * self.linear_value_head_dim

  def check(self) -> None:
    check_decoder(self, ("head_dim",))
    check_sizes(self, LINEAR_DIMS)
    if self.linear_num_value_heads % self.linear_num_key_heads:
      raise ValueError(f"TextConfig: linear_num_value_heads {self.linear_num_value_heads} "
                       f"is not a multiple of linear_num_key_heads "
                       f"{self.linear_num_key_heads}")
    if (self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim
        or 2 * sum(self.mrope_section) != self.rotary_dim):
      raise ValueError(f"TextConfig: 2 * sum(mrope_section {self.mrope_section}) must equal "
                       f"the rotary dimension head_dim x partial_rotary_factor = "
                       f"{self.head_dim} x {self.partial_rotary_factor}")
    if (len(self.layer_types) != self.num_hidden_layers
        or any(kind not in LAYER_TYPES for kind in self.layer_types)):
      raise ValueError(f"TextConfig.layer_types: expected {self.num_hidden_layers} entries "
                       f"of {LAYER_TYPES}, got {self.layer_types!r}")


@dataclasses.dataclass(frozen=True)
class Qwen35Config(VisionLanguageConfig):
  """Special ids: transformers' Qwen3_5Config defaults."""
  image_token_id: int = 248056
  video_token_id: int = 248057
  vision_start_token_id: int = 248053
  vision_end_token_id: int = 248054
  text: TextConfig = TextConfig()
  vision: VisionConfig = VisionConfig(out_hidden_size=4096, deepstack_visual_indexes=())

  @classmethod
  def tiny(cls, vocab_size: int = 512) -> "Qwen35Config":
    """A few hundred thousand parameters: tests and CPU demos. Four layers (three Gated
    DeltaNet, one full attention); the last six ids are the vision special tokens."""
    return cls(
        text=TextConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, rope_theta=10000.0, mrope_section=(1, 1, 2),
                        partial_rotary_factor=0.5, tie_word_embeddings=True,
                        layer_types=default_layer_types(4), linear_key_head_dim=8,
                        linear_value_head_dim=16, linear_num_key_heads=2,
                        linear_num_value_heads=4),
        vision=VisionConfig(depth=3, hidden_size=32, intermediate_size=64, num_heads=2,
                            out_hidden_size=64, num_position_embeddings=64,
                            deepstack_visual_indexes=(), min_pixels=64 * 64),
        **cls.tiny_token_ids(vocab_size))

  def to_hf(self) -> dict:
    """A transformers `Qwen3_5Config` dict of this configuration: `from_hf(config.to_hf())
    == config`."""
    import transformers  # pylint: disable=import-outside-toplevel
    t = self.text
    text = dict(text_dict(t, mrope_interleaved=True,
                          partial_rotary_factor=t.partial_rotary_factor),
                layer_types=list(t.layer_types), **{name: getattr(t, name) for name in LINEAR_DIMS})
    vision = vision_hf_dict(self.vision)
    return hf_config_dict(transformers.Qwen3_5Config, self, text, vision)

  @classmethod
  def from_hf(cls, config: dict | str | pathlib.Path) -> "Qwen35Config":
    """From a `config.json` dict, file or folder (and the folder's preprocessor_config.json,
    for the pixel bounds). Every field the model reads is checked and every setting it does
    not implement refused (rope scaling, non-interleaved M-RoPE, another activation,
    attention dropout, unknown layer types), with a `ModelFolderError` naming the file, the
    field, the expected and the found value."""
    fields, folder = parse(config, "Qwen3.5", cls, _text_config, _vision_config)
    return with_pixel_bounds(cls(**fields), folder)


def _vision_config(vision: dict | None, source: str, text: TextConfig) -> VisionConfig:
  # Qwen3.5's encoder has no DeepStack mergers (transformers drops the field).
  parsed = VisionConfig.from_hf({**(vision or {}), "deepstack_visual_indexes": []}, source)
  return checked_width(parsed, text, source)


def _text_config(text: Fields, top: Fields) -> TextConfig:
  defaults = TextConfig()
  ints = {name: text.integer(name, 1, MAX_DIM, getattr(defaults, name))
          for name in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                       "num_key_value_heads", "head_dim") + LINEAR_DIMS}
  layers = text.integer("num_hidden_layers", 1, MAX_LAYERS, defaults.num_hidden_layers)
  eps = text.number("rms_norm_eps", defaults.rms_norm_eps)
  text.choice("hidden_act", ACTIVATIONS, "the activation the decoder implements", "silu")
  bias = text.boolean("attention_bias", False)
  no_attention_dropout(text)
  for heads, groups in (("num_attention_heads", "num_key_value_heads"),
                        ("linear_num_value_heads", "linear_num_key_heads")):
    if ints[heads] % ints[groups]:
      raise text.fail(groups, f"a divisor of {heads} {ints[heads]}", ints[groups])
  rope = text_rope(text)
  # transformers reads partial_rotary_factor from rope_parameters (default 0.25).
  factor = rope.number("partial_rotary_factor", text.number("partial_rotary_factor", 0.25))
  if not 0 < factor <= 1:
    raise rope.fail("partial_rotary_factor", "a number in (0, 1]", factor)
  # the sections' default: transformers'
  section = mrope_section(rope, [11, 11, 10], int(ints["head_dim"] * factor),
                          f"the rotary dimension / 2 = head_dim {ints['head_dim']} x "
                          f"partial_rotary_factor {factor:g} / 2")
  interleaved = rope.boolean("mrope_interleaved", True)
  if not interleaved:
    raise rope.fail("mrope_interleaved", "true (Qwen3.5's M-RoPE is interleaved)", interleaved)
  theta = rope_theta(rope, text, defaults.rope_theta)
  kinds = text.get("layer_types", None)
  if kinds is None:
    interval = text.integer("full_attention_interval", 1, MAX_LAYERS, 4)
    kinds = list(default_layer_types(layers, interval))
  if (not isinstance(kinds, list) or len(kinds) != layers
      or any(kind not in LAYER_TYPES for kind in kinds)):
    raise text.fail("layer_types", f"{layers} entries (num_hidden_layers), each one of "
                    f"{LAYER_TYPES}", kinds)
  tie = top.boolean("tie_word_embeddings", False)
  return TextConfig(num_hidden_layers=layers, rms_norm_eps=eps, rope_theta=theta,
                    mrope_section=section, partial_rotary_factor=float(factor),
                    attention_bias=bias, tie_word_embeddings=tie, layer_types=tuple(kinds),
                    **ints)
