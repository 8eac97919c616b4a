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
import math
import numbers
import pathlib

from jaxspatial.models.qwen2_5_vl.config import _Fields, _error, _read_json, _show
from jaxspatial.models.qwen3_vl.config import (_MAX_DIM, _MAX_LAYERS, VisionConfig,
                                               _rope_theta, _vision_config, pixel_bounds)

LAYER_TYPES = ("linear_attention", "full_attention")
# transformers' defaults for the special ids (Qwen3_5Config)
_TOKEN_IDS = (("image_token_id", 248056), ("video_token_id", 248057),
              ("vision_start_token_id", 248053), ("vision_end_token_id", 248054))


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
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim",
                 "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                 "linear_num_key_heads", "linear_num_value_heads"):
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
class Qwen35Config:
  text: TextConfig = TextConfig()
  vision: VisionConfig = VisionConfig(out_hidden_size=4096, deepstack_visual_indexes=())
  image_token_id: int = 248056
  video_token_id: int = 248057
  vision_start_token_id: int = 248053
  vision_end_token_id: int = 248054
  raw: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

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
        image_token_id=vocab_size - 6, video_token_id=vocab_size - 5,
        vision_start_token_id=vocab_size - 4, vision_end_token_id=vocab_size - 3)

  def to_hf(self) -> dict:
    """A transformers `Qwen3_5Config` dict of this configuration: `from_hf(config.to_hf())
    == config`."""
    import transformers  # pylint: disable=import-outside-toplevel
    t, v = self.text, self.vision
    text = dict(vocab_size=t.vocab_size, hidden_size=t.hidden_size,
                intermediate_size=t.intermediate_size, num_hidden_layers=t.num_hidden_layers,
                num_attention_heads=t.num_attention_heads,
                num_key_value_heads=t.num_key_value_heads, head_dim=t.head_dim,
                rms_norm_eps=t.rms_norm_eps, attention_bias=t.attention_bias,
                layer_types=list(t.layer_types),
                linear_conv_kernel_dim=t.linear_conv_kernel_dim,
                linear_key_head_dim=t.linear_key_head_dim,
                linear_value_head_dim=t.linear_value_head_dim,
                linear_num_key_heads=t.linear_num_key_heads,
                linear_num_value_heads=t.linear_num_value_heads,
                rope_parameters={"rope_type": "default", "mrope_section": list(t.mrope_section),
                                 "mrope_interleaved": True, "rope_theta": t.rope_theta,
                                 "partial_rotary_factor": t.partial_rotary_factor},
                bos_token_id=None, eos_token_id=None)
    vision = dict(depth=v.depth, hidden_size=v.hidden_size,
                  intermediate_size=v.intermediate_size, num_heads=v.num_heads,
                  out_hidden_size=v.out_hidden_size, in_channels=v.in_channels,
                  patch_size=v.patch_size, temporal_patch_size=v.temporal_patch_size,
                  spatial_merge_size=v.spatial_merge_size,
                  num_position_embeddings=v.num_position_embeddings, hidden_act=v.hidden_act,
                  rope_parameters={"rope_type": "axial", "rope_theta": v.rope_theta})
    config = transformers.Qwen3_5Config(
        text_config=text, vision_config=vision, image_token_id=self.image_token_id,
        video_token_id=self.video_token_id, vision_start_token_id=self.vision_start_token_id,
        vision_end_token_id=self.vision_end_token_id,
        tie_word_embeddings=t.tie_word_embeddings)
    return config.to_dict()

  @classmethod
  def from_hf(cls, config: dict | str | pathlib.Path) -> "Qwen35Config":
    """From a `config.json` dict, file or folder. Every field the model reads is checked and
    every setting it does not implement refused (rope scaling, non-interleaved M-RoPE,
    another activation, attention dropout, unknown layer types), with a `CheckpointError`
    naming the file, the field, the expected and the found value."""
    source, bounds = "config.json", {}
    if not isinstance(config, dict):
      path = pathlib.Path(config)
      path = path / "config.json" if path.is_dir() else path
      if not path.is_file():
        raise FileNotFoundError(f"Qwen3.5 config not found: {path}")
      source = str(path)
      config = _read_json(path)
      bounds = pixel_bounds(path.parent / "preprocessor_config.json")
    parsed = _parse(config, source, cls)
    if not bounds:
      return parsed
    return dataclasses.replace(parsed, vision=dataclasses.replace(parsed.vision, **bounds))


def _text_config(text: _Fields, top: _Fields) -> TextConfig:
  def dim(name, **kw):
    return text.integer(name, 1, _MAX_DIM, **kw)

  defaults = TextConfig()
  ints = {name: dim(name, default=getattr(defaults, name))
          for name in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                       "num_key_value_heads", "head_dim", "linear_conv_kernel_dim",
                       "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
                       "linear_num_value_heads")}
  layers = text.integer("num_hidden_layers", 1, _MAX_LAYERS, defaults.num_hidden_layers)
  eps = text.number("rms_norm_eps", defaults.rms_norm_eps)
  text.choice("hidden_act", ("silu", "swish"), "the activation the decoder implements",
              "silu")
  bias = text.boolean("attention_bias", False)
  dropout = text.get("attention_dropout", 0.0)
  if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or dropout != 0:
    raise text.fail("attention_dropout", "0 (attention dropout is not implemented)", dropout)
  for heads, groups in (("num_attention_heads", "num_key_value_heads"),
                        ("linear_num_value_heads", "linear_num_key_heads")):
    if ints[heads] % ints[groups]:
      raise text.fail(groups, f"a divisor of {heads} {ints[heads]}", ints[groups])
  rope_name = "rope_scaling" if text.get("rope_scaling", None) else "rope_parameters"
  rope_values = text.object(rope_name) or {}
  rope = _Fields(text.source, rope_values, f"{text.prefix}{rope_name}.")
  for key in ("type", "rope_type"):
    if key in rope_values:
      rope.choice(key, ("default", "mrope"), "the multimodal rope this model implements; "
                  "rope scaling is not implemented")
  # transformers reads partial_rotary_factor from rope_parameters (default 0.25).
  factor = rope.number("partial_rotary_factor", text.number("partial_rotary_factor", 0.25))
  if not 0 < factor <= 1:
    raise rope.fail("partial_rotary_factor", "a number in (0, 1]", factor)
  rotary = int(ints["head_dim"] * factor)
  section = rope_values.get("mrope_section", [11, 11, 10])  # transformers' default
  if (not isinstance(section, (list, tuple)) or len(section) != 3 or
      any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in section)):
    raise rope.fail("mrope_section", "a list of three integers >= 0", section)
  if rotary % 2 or 2 * sum(section) != rotary:
    raise rope.fail("mrope_section", f"sections summing to the rotary dimension / 2 = "
                    f"head_dim {ints['head_dim']} x partial_rotary_factor {factor:g} / 2",
                    section)
  interleaved = rope.boolean("mrope_interleaved", True)
  if not interleaved:
    raise rope.fail("mrope_interleaved", "true (Qwen3.5's M-RoPE is interleaved)", interleaved)
  theta = _rope_theta(rope, text, defaults.rope_theta)
  kinds = text.get("layer_types", None)
  if kinds is None:
    interval = text.integer("full_attention_interval", 1, _MAX_LAYERS, 4)
    kinds = list(default_layer_types(layers, interval))
  if (not isinstance(kinds, list) or len(kinds) != layers
      or any(kind not in LAYER_TYPES for kind in kinds)):
    raise text.fail("layer_types", f"{layers} entries (num_hidden_layers), each one of "
                    f"{LAYER_TYPES}", kinds)
  tie = top.boolean("tie_word_embeddings", False)
  return TextConfig(num_hidden_layers=layers, rms_norm_eps=eps, rope_theta=theta,
                    mrope_section=tuple(section), partial_rotary_factor=float(factor),
                    attention_bias=bias, tie_word_embeddings=tie, layer_types=tuple(kinds),
                    **ints)


def _parse(config, source: str, cls) -> Qwen35Config:
  if not isinstance(config, dict):
    raise _error(f"{source}: expected a JSON object at the top level, got {_show(config)}")
  top = _Fields(source, config)
  nested = top.object("text_config")
  text = _Fields(source, nested, "text_config.") if nested is not None else top
  text_config = _text_config(text, top)
  ids = {}
  for name, default in _TOKEN_IDS:
    high = text_config.vocab_size - 1 if name == "image_token_id" else _MAX_DIM
    if name == "image_token_id" and name not in config and not 0 <= default <= high:
      raise top.fail(name, f"an id in the vocabulary [0, {high}] (transformers' default "
                     f"{default} lies outside it)", None)
    ids[name] = top.integer(name, 0, high, default)
  vision_values = top.object("vision_config") or {}
  # Qwen3.5's encoder has no DeepStack mergers (transformers drops the field).
  vision = _vision_config({**vision_values, "deepstack_visual_indexes": []}, source)
  if vision.out_hidden_size != text_config.hidden_size:
    raise _error(f"{source}: vision_config.out_hidden_size: expected the text hidden_size "
                 f"{text_config.hidden_size} (vision tokens replace token embeddings), got "
                 f"{_show(vision.out_hidden_size)}")
  return cls(text=text_config, vision=vision, raw=config, **ids)
