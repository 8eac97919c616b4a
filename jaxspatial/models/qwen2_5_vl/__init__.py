"""Qwen2.5-VL in Flax NNX (text decoder now; vision encoder, sampler and LoRA to come)."""

from jaxspatial.models.qwen2_5_vl.config import Qwen25VLConfig, TextConfig
from jaxspatial.models.qwen2_5_vl.hf_params import CheckpointError, load_text_weights
from jaxspatial.models.qwen2_5_vl.rope import mrope_cos_sin, rope_index, text_position_ids
from jaxspatial.models.qwen2_5_vl.text import TextModel

__all__ = ["CheckpointError", "Qwen25VLConfig", "TextConfig", "TextModel", "load_text_weights",
           "mrope_cos_sin", "rope_index", "text_position_ids"]
