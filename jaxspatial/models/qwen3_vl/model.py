"""Qwen3-VL: the vision encoder's tokens placed at the image tokens of the text decoder, its
DeepStack features added to the decoder's first hidden states at the same positions."""

from __future__ import annotations

import jax
from flax import nnx

from jaxspatial.models.qwen3_vl import hf_params, preprocess
from jaxspatial.models.qwen3_vl.config import Qwen3VLConfig
from jaxspatial.models.qwen3_vl.text import TextModel
from jaxspatial.models.qwen3_vl.vision import VisionModel
from jaxspatial.models.qwen_vl import QwenVLMethods
from jaxspatial.models.vision import Grids, VisionOutput

Array = jax.Array


class Qwen3VL(QwenVLMethods, nnx.Module):
  """Construction, `from_pretrained` and the options: `QwenVLMethods`. Implements the policy
  interface (`jaxspatial.models.policy`)."""

  family = "qwen3_vl"
  config_class = Qwen3VLConfig
  vision_class = VisionModel
  text_class = TextModel
  checkpoint_shapes = staticmethod(hf_params.checkpoint_shapes)
  checkpoint_targets = staticmethod(hf_params.targets)

  grid_of = staticmethod(preprocess.image_grid)
  batch_inputs = staticmethod(preprocess.batch_vision_inputs)

  def image_processor_settings(self) -> dict:
    """The image processor config it runs with (sizes, pixel bounds, mean and std)."""
    return preprocess.processor_settings(self.config.vision)

  def encode_images(self, pixel_values: Array, grids: Grids) -> VisionOutput:
    """The vision tokens [N, C] of the images, in order, and the DeepStack features
    [K, N, C] (K blocks, in block order; None without DeepStack blocks)."""
    tokens, deepstack = self.visual(pixel_values, grids)
    return VisionOutput(tokens, deepstack if deepstack.shape[0] else None)
