"""Qwen3-VL image preprocessing on device: the shared functions with Qwen3-VL's settings.

transformers runs Qwen3-VL images through `Qwen2VLImageProcessor` configured by the
released `preprocessor_config.json`: 16-pixel patches merged 2 x 2 (sizes are multiples of
32), between 65536 (256 x 256) and 16777216 (4096 x 4096) pixels, mean and std 0.5, the
frame repeated over 2 temporal patches. Rows are C * T * 16 * 16 = 1536 values. At a
smart-resized size the output equals the processor's to float rounding; a resize is
`jax.image.resize` (bicubic, antialiased) on floats where the processor resizes uint8 on
the host, so resized pixels differ by about a uint8 level (see
`jaxspatial.models.preprocess`).
"""

from __future__ import annotations

import jax

from jaxspatial.models import preprocess as base

Array = jax.Array

MEAN = (0.5, 0.5, 0.5)
STD = (0.5, 0.5, 0.5)
MIN_PIXELS = 256 * 256
MAX_PIXELS = 4096 * 4096


def smart_resize(height: int, width: int, factor: int = 32, min_pixels: int = MIN_PIXELS,
                 max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
  """The processor's target size: multiples of factor, pixels within [min, max]."""
  return base.smart_resize(height, width, factor, min_pixels, max_pixels)


def preprocess_image(image_HxWx3: Array, vision=None):
  """(pixel_values [gh * gw, 3 * T * p * p] float32, grid (1, gh, gw)) of a uint8 image;
  `vision`: a Qwen3-VL VisionConfig (default: the released patch / merge / temporal sizes
  and pixel bounds)."""
  if vision is None:
    patch, merge, temporal, low, high = 16, 2, 2, MIN_PIXELS, MAX_PIXELS
  else:
    patch, merge, temporal = (vision.patch_size, vision.spatial_merge_size,
                              vision.temporal_patch_size)
    low, high = vision.min_pixels, vision.max_pixels
  return base.preprocess_image(image_HxWx3, patch, merge, temporal, low, high, MEAN, STD)


def image_grid(vision, image_size) -> tuple[int, int, int]:
  """The static (t, h, w) patch grid of an image of `image_size` (H, W) for a VisionConfig."""
  return base.image_grid(vision, image_size, vision.min_pixels, vision.max_pixels)


def batch_vision_inputs(vision, images_BxKxHxWx3: Array):
  """(pixel values of every view in token order, the static grids, per-sequence grids
  [B, K, 3]) for B sequences of K same-sized uint8 views each."""
  return base.batch_vision_inputs(images_BxKxHxWx3, lambda image: preprocess_image(image, vision),
                                  image_grid(vision, images_BxKxHxWx3.shape[2:4]))


def processor_settings(vision) -> dict:
  """The image processor config (preprocessor_config.json) of a VisionConfig: patch, merge
  and temporal sizes, pixel bounds, mean and std."""
  return dict(patch_size=vision.patch_size, merge_size=vision.spatial_merge_size,
              temporal_patch_size=vision.temporal_patch_size, image_mean=list(MEAN),
              image_std=list(STD),
              size={"shortest_edge": vision.min_pixels, "longest_edge": vision.max_pixels})
