"""Qwen2.5-VL: the vision encoder's tokens placed at the image tokens of the text decoder."""

from __future__ import annotations

import jax
from flax import nnx

from jaxspatial.models.qwen2_5_vl import hf_params
from jaxspatial.models.qwen2_5_vl.config import Qwen25VLConfig
from jaxspatial.models.qwen2_5_vl.preprocess import batch_vision_inputs, image_grid
from jaxspatial.models.qwen2_5_vl.text import TextModel
from jaxspatial.models.qwen2_5_vl.vision import VisionModel
from jaxspatial.models.qwen_vl import QwenVLMethods
from jaxspatial.models.vision import Grids, VisionOutput

Array = jax.Array


class Qwen25VL(QwenVLMethods, nnx.Module):
  """Construction, `from_pretrained` and the options: `QwenVLMethods`. Implements the policy
  interface (`jaxspatial.models.policy`)."""

  family = "qwen2_5_vl"
  config_class = Qwen25VLConfig
  vision_class = VisionModel
  text_class = TextModel
  checkpoint_shapes = staticmethod(hf_params.checkpoint_shapes)
  checkpoint_targets = staticmethod(hf_params.targets)

  grid_of = staticmethod(image_grid)
  batch_inputs = staticmethod(batch_vision_inputs)

  def image_processor_settings(self) -> dict:
    """The image processor config it runs with: the processor's defaults."""
    return {}

  def encode_images(self, pixel_values: Array, grids: Grids) -> VisionOutput:
    """The vision tokens [N, C] of the images, in order (no DeepStack)."""
    return VisionOutput(self.visual(pixel_values, grids))
