"""Qwen2-VL / Qwen2.5-VL image preprocessing on device: the shared functions
(`jaxspatial.models.preprocess`) with the processor's defaults, 14-pixel patches merged
2 x 2 (sizes are multiples of 28), CLIP's mean and std, the frame repeated over 2 temporal
patches."""

from __future__ import annotations

import jax

from jaxspatial.models import preprocess as base

Array = jax.Array

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 1280


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = MIN_PIXELS,
                 max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
  """The processor's target size: multiples of factor, pixels within [min, max]."""
  return base.smart_resize(height, width, factor, min_pixels, max_pixels)


def preprocess_image(image_HxWx3: Array, patch_size: int = 14, merge_size: int = 2,
                     temporal_patch_size: int = 2, min_pixels: int = MIN_PIXELS,
                     max_pixels: int = MAX_PIXELS, mean=CLIP_MEAN, std=CLIP_STD):
  """(pixel_values [gh * gw, 3 * T * p * p] float32, grid (1, gh, gw)) of a uint8 image."""
  return base.preprocess_image(image_HxWx3, patch_size, merge_size, temporal_patch_size,
                               min_pixels, max_pixels, mean, std)


def image_grid(vision, image_size) -> tuple[int, int, int]:
  """The static (t, h, w) patch grid of an image of `image_size` (H, W) for a VisionConfig."""
  return base.image_grid(vision, image_size, MIN_PIXELS, MAX_PIXELS)


def batch_vision_inputs(vision, images_BxKxHxWx3: Array):
  """(pixel values of every view in token order, the static grids, per-sequence grids
  [B, K, 3]) for B sequences of K same-sized uint8 views each."""
  one = lambda image: preprocess_image(image, vision.patch_size, vision.spatial_merge_size,
                                       vision.temporal_patch_size)
  return base.batch_vision_inputs(images_BxKxHxWx3, one,
                                  image_grid(vision, images_BxKxHxWx3.shape[2:4]))
