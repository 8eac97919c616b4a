"""Qwen2.5-VL in Flax NNX: vision encoder, text decoder, M-RoPE, checkpoint loading."""

from jaxspatial.models.qwen2_5_vl.config import Qwen25VLConfig, TextConfig, VisionConfig
from jaxspatial.models.qwen2_5_vl.hf_params import CheckpointError, load_text_weights
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.models.qwen2_5_vl.preprocess import preprocess_image, smart_resize
from jaxspatial.models.qwen2_5_vl.rope import mrope_cos_sin, rope_index, text_position_ids
from jaxspatial.models.qwen2_5_vl.text import TextModel
from jaxspatial.models.qwen2_5_vl.vision import VisionModel, load_vision_weights

__all__ = ["CheckpointError", "Qwen25VL", "Qwen25VLConfig", "TextConfig", "TextModel", "load_text_weights",
           "mrope_cos_sin", "rope_index", "text_position_ids", "VisionConfig", "VisionModel",
           "load_vision_weights", "preprocess_image", "smart_resize"]
