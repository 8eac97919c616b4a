"""Qwen2.5-VL configuration (text decoder and vision encoder), read from a Hugging Face
`config.json`."""

from __future__ import annotations

import dataclasses
import json
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
  def from_hf(cls, vision: dict) -> "VisionConfig":
    fields = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in vision.items() if k in fields}
    if "fullatt_block_indexes" in values:
      values["fullatt_block_indexes"] = tuple(values["fullatt_block_indexes"])
    rope = vision.get("rope_parameters") or {}
    if "rope_theta" in rope:
      values["rope_theta"] = float(rope["rope_theta"])
    return cls(**values)


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
    """From a `config.json` dict, file or folder (transformers 4.x or 5.x layout)."""
    if not isinstance(config, dict):
      path = pathlib.Path(config)
      path = path / "config.json" if path.is_dir() else path
      if not path.is_file():
        raise FileNotFoundError(f"Qwen2.5-VL config not found: {path}")
      config = json.loads(path.read_text())
    text = dict(config.get("text_config") or config)
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    section = rope.get("mrope_section")
    if section is None:
      raise ValueError("Qwen2.5-VL config: text rope parameters have no 'mrope_section'")
    fields = {f.name for f in dataclasses.fields(TextConfig)}
    values = {k: v for k, v in text.items() if k in fields and k not in ("mrope_section",)}
    values["rope_theta"] = float(rope.get("rope_theta", text.get("rope_theta", 1e6)))
    values["mrope_section"] = tuple(section)
    values["tie_word_embeddings"] = bool(config.get("tie_word_embeddings",
                                                    text.get("tie_word_embeddings", True)))
    text_config = TextConfig(**values)
    text_config.check()
    ids = {k: config[k] for k in ("image_token_id", "video_token_id", "vision_start_token_id",
                                  "vision_end_token_id") if k in config}
    vision = VisionConfig.from_hf(config.get("vision_config") or {})
    return cls(text=text_config, vision=vision, raw=config, **ids)
