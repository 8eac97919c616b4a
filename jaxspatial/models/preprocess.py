"""Qwen-VL image preprocessing on device, each family's sizes and statistics given: smart
resize, rescale and normalise, and patchify into the processor's `pixel_values` layout.

The layout equals transformers' `Qwen2VLImageProcessor`: a [H, W, 3] image becomes
(gh * gw) rows of C * T * p * p values, merge units of m x m patches contiguous, the frame
repeated T times. Rendered observations can be rendered at the smart-resized size, and then
the output equals the processor's to float rounding. When a resize is needed it is
`jax.image.resize` (bicubic, antialiased) on floats, where the processor resizes with PIL on
uint8: pixel values then differ by under one uint8 level (measured on a smooth 75 x 100
image: median 0.24, max 0.94 levels), the price of staying on device.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp

Array = jax.Array


def smart_resize(height: int, width: int, factor: int, min_pixels: int,
                 max_pixels: int) -> tuple[int, int]:
  """The processor's target size: multiples of factor, pixels within [min, max]."""
  if min(height, width) <= 0:
    raise ValueError(f"smart_resize: image size must be positive, got {height}x{width}")
  if max(height, width) / min(height, width) > 200:
    raise ValueError(f"smart_resize: aspect ratio must be under 200, got {height}x{width}")
  h_bar = round(height / factor) * factor
  w_bar = round(width / factor) * factor
  if h_bar * w_bar > max_pixels:
    beta = math.sqrt(height * width / max_pixels)
    h_bar = max(factor, math.floor(height / beta / factor) * factor)
    w_bar = max(factor, math.floor(width / beta / factor) * factor)
  elif h_bar * w_bar < min_pixels:
    beta = math.sqrt(min_pixels / (height * width))
    h_bar = math.ceil(height * beta / factor) * factor
    w_bar = math.ceil(width * beta / factor) * factor
  return h_bar, w_bar


def preprocess_image(image_HxWx3: Array, patch_size: int, merge_size: int,
                     temporal_patch_size: int, min_pixels: int, max_pixels: int, mean, std):
  """(pixel_values [gh * gw, 3 * T * p * p] float32, grid (1, gh, gw)) of a uint8 image."""
  height, width, channels = image_HxWx3.shape
  if channels != 3:
    raise ValueError(f"preprocess_image: expected [H, W, 3], got {image_HxWx3.shape}")
  target_h, target_w = smart_resize(height, width, patch_size * merge_size, min_pixels,
                                    max_pixels)
  image = image_HxWx3.astype(jnp.float32)
  if (target_h, target_w) != (height, width):
    image = jnp.clip(jax.image.resize(image, (target_h, target_w, 3), "bicubic"), 0.0, 255.0)
  image = (image / 255.0 - jnp.asarray(mean, jnp.float32)) / jnp.asarray(std, jnp.float32)
  gh, gw = target_h // patch_size, target_w // patch_size
  patches = jnp.moveaxis(image, -1, 0).reshape(3, gh // merge_size, merge_size, patch_size,
                                               gw // merge_size, merge_size, patch_size)
  patches = patches.transpose(1, 4, 2, 5, 0, 3, 6)  # (gh/m, gw/m, m, m, C, p, p)
  patches = jnp.broadcast_to(patches[:, :, :, :, :, None],
                             patches.shape[:5] + (temporal_patch_size,) + patches.shape[5:])
  return patches.reshape(gh * gw, 3 * temporal_patch_size * patch_size ** 2), (1, gh, gw)


def image_grid(vision, image_size, min_pixels: int, max_pixels: int) -> tuple[int, int, int]:
  """The static (t, h, w) patch grid of an image of `image_size` (H, W) for a VisionConfig."""
  height, width = smart_resize(*image_size, vision.patch_size * vision.spatial_merge_size,
                               min_pixels, max_pixels)
  return (1, height // vision.patch_size, width // vision.patch_size)


def batch_vision_inputs(images_BxKxHxWx3: Array, preprocess_one: Callable, grid):
  """(pixel values of every view in token order, the static grids, per-sequence grids
  [B, K, 3]) for B sequences of K same-sized uint8 views each; `preprocess_one` (one image
  -> (pixel values, grid)) and `grid` are the family's."""
  batch, views = images_BxKxHxWx3.shape[:2]
  flat = images_BxKxHxWx3.reshape((batch * views,) + images_BxKxHxWx3.shape[2:])
  pixels, _ = jax.vmap(preprocess_one)(flat)
  sequence_grids = jnp.broadcast_to(jnp.asarray(grid, jnp.int32), (batch, views, 3))
  return pixels.reshape(-1, pixels.shape[-1]), (grid,) * (batch * views), sequence_grids
