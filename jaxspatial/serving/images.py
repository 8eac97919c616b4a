"""Images of a chat request: data URLs (base64 PNG, JPEG or WebP) decoded with PIL, as RGB
uint8, resized on the host to the size the policy's processor would give them (its
smart-resize grid, PIL bicubic, as transformers' Qwen2-VL image processor does), so the
on-device preprocessing (`model.vision_inputs`) only normalises and patchifies.

Remote URLs (http, https, file, ...) are refused with a 400 naming them: the server never
reaches the network."""

from __future__ import annotations

import base64
import binascii
import io
import re

import numpy as np

from jaxspatial.serving.protocol import invalid

FORMATS = ("PNG", "JPEG", "WEBP")
MAX_IMAGE_PIXELS = 8192 * 8192
_DATA_URL = re.compile(r"^data:(?P<media>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?);base64,",
                       re.I)


def decode_data_url(url: str, where: str, max_pixels: int = MAX_IMAGE_PIXELS) -> np.ndarray:
  """The image of a base64 data URL as uint8 [H, W, 3] (RGB; alpha dropped), or a 400."""
  from PIL import Image  # pylint: disable=import-outside-toplevel
  match = _DATA_URL.match(url)
  if match is None:
    scheme = url.split(":", 1)[0][:20] if ":" in url[:20] else "no scheme"
    raise invalid(f"{where}: only base64 data URLs (data:image/png;base64,...) are accepted; "
                  f"this server does not fetch URLs ({scheme}: {url[:80]!r})", where,
                  "image_url_not_supported")
  try:
    data = base64.b64decode(url[match.end():], validate=True)
  except (binascii.Error, ValueError) as error:
    raise invalid(f"{where}: the data URL is not valid base64 ({error})", where) from None
  try:
    with Image.open(io.BytesIO(data)) as image:
      if image.format not in FORMATS:
        raise invalid(f"{where}: image format {image.format} is not accepted ("
                      f"{', '.join(FORMATS)})", where)
      width, height = image.size
      if width * height > max_pixels or min(width, height) < 1:
        raise invalid(f"{where}: a {width} x {height} image is outside 1 ... {max_pixels} "
                      "pixels", where)
      return np.asarray(image.convert("RGB"), np.uint8)
  except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
    raise invalid(f"{where}: the image cannot be decoded ({type(error).__name__}: "
                  f"{str(error)[:200]})", where) from None


def decode_limit(model, factor: int = 4) -> int:
  """The pixels an image may have to be decoded at all: `factor` x the most the policy's
  processor keeps (its smart resize of a very large image), at most MAX_IMAGE_PIXELS.
  Bigger ones are refused from their header, before PIL spends memory on them (an
  8192 x 8192 PNG of 287 kB costs 600 MB to decode)."""
  _, grid_h, grid_w = model.image_grid((16384, 16384))
  patch = model.config.vision.patch_size
  return int(min(MAX_IMAGE_PIXELS, factor * grid_h * patch * grid_w * patch))


def check_pixels(image, where: str, max_pixels: int = MAX_IMAGE_PIXELS) -> np.ndarray:
  """An in-process image as uint8 [H, W, 3], or a 400 naming what is wrong with it."""
  image = np.asarray(image)
  if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
    raise invalid(f"{where}: expected a uint8 [H, W, 3] image, got {image.dtype} "
                  f"{list(image.shape)}", where)
  height, width = image.shape[:2]
  if width * height > max_pixels or min(width, height) < 1:
    raise invalid(f"{where}: a {width} x {height} image is outside 1 ... {max_pixels} "
                  "pixels", where)
  return image


def resize_for(model, image_HxWx3: np.ndarray) -> np.ndarray:
  """The image resized (PIL bicubic) to the size the policy's smart resize gives it, so
  the policy's own preprocessing leaves its size as is."""
  from PIL import Image  # pylint: disable=import-outside-toplevel
  height, width = image_HxWx3.shape[:2]
  try:
    _, grid_h, grid_w = model.image_grid((height, width))
  except ValueError as error:  # an aspect ratio over 200, ...
    raise invalid(f"image of {width} x {height}: {error}") from None
  patch = model.config.vision.patch_size
  target_h, target_w = grid_h * patch, grid_w * patch
  if (target_h, target_w) == (height, width):
    return image_HxWx3
  resized = Image.fromarray(image_HxWx3).resize((target_w, target_h), Image.BICUBIC)
  return np.asarray(resized, np.uint8)
