"""Qwen3-VL (dense) in Flax NNX: vision encoder with DeepStack, Qwen3 text decoder with
QK-norm and interleaved M-RoPE, checkpoint loading and export. The model has the same
method surface as Qwen2.5-VL's, so the shared sampler, rollout and trainer run either."""

from jaxspatial.errors import ModelFolderError
from jaxspatial.models.qwen3_vl.config import Qwen3VLConfig, TextConfig, VisionConfig
from jaxspatial.models.qwen3_vl.export import save_pretrained, state_dict
from jaxspatial.models.qwen3_vl.hf_params import checkpoint_shapes, targets
from jaxspatial.models.qwen3_vl.model import Qwen3VL
from jaxspatial.models.qwen3_vl.preprocess import (batch_vision_inputs, image_grid,
                                                   preprocess_image, smart_resize)
from jaxspatial.models.qwen3_vl.rope import mrope_cos_sin
from jaxspatial.models.qwen3_vl.text import TextModel
from jaxspatial.models.qwen3_vl.vision import VisionModel
from jaxspatial.models.rope import rope_index, text_position_ids

__all__ = ["ModelFolderError", "Qwen3VL", "Qwen3VLConfig", "TextConfig", "TextModel",
           "VisionConfig", "VisionModel", "batch_vision_inputs", "checkpoint_shapes",
           "image_grid", "mrope_cos_sin", "preprocess_image", "rope_index", "save_pretrained",
           "smart_resize", "state_dict", "targets", "text_position_ids"]
