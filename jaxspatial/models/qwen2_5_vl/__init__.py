"""Qwen2.5-VL in Flax NNX: vision encoder, text decoder, M-RoPE, checkpoint loading."""

from jaxspatial.errors import ModelFolderError
from jaxspatial.models.qwen2_5_vl.config import Qwen25VLConfig, TextConfig, VisionConfig
from jaxspatial.models.qwen2_5_vl.export import save_pretrained, state_dict
from jaxspatial.models.qwen2_5_vl.hf_params import (checkpoint_shapes, load_text_weights,
                                                    load_vision_weights, targets)
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.models.qwen2_5_vl.preprocess import preprocess_image, smart_resize
from jaxspatial.models.qwen2_5_vl.rope import mrope_cos_sin
from jaxspatial.models.qwen2_5_vl.text import TextModel
from jaxspatial.models.qwen2_5_vl.vision import VisionModel
from jaxspatial.models.rope import rope_index, text_position_ids

__all__ = ["ModelFolderError", "Qwen25VL", "Qwen25VLConfig", "TextConfig", "TextModel",
           "VisionConfig", "VisionModel", "checkpoint_shapes", "load_text_weights",
           "load_vision_weights", "mrope_cos_sin", "preprocess_image", "rope_index",
           "save_pretrained", "smart_resize", "state_dict", "targets", "text_position_ids"]
