"""Tiles rendered views (and their depth and instance maps) into one PNG."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

_PALETTE = np.random.default_rng(7).integers(40, 255, size=(256, 3)).astype(np.uint8)


def depth_to_rgb(depth_HxW: np.ndarray) -> np.ndarray:
  """Near = bright, far = dark, empty = black; scaled per image."""
  depth = np.asarray(depth_HxW, np.float32)
  lit = depth > 0
  out = np.zeros(depth.shape + (3,), np.uint8)
  if lit.any():
    lo, hi = np.percentile(depth[lit], [1, 99])
    scaled = 1.0 - np.clip((depth - lo) / max(hi - lo, 1e-6), 0, 1)
    out[lit] = (40 + 215 * scaled[lit])[:, None].astype(np.uint8)
  return out


def instance_to_rgb(instance_HxW: np.ndarray) -> np.ndarray:
  """A fixed colour per object id, grey for points without one, black for empty."""
  instance = np.asarray(instance_HxW)
  out = _PALETTE[np.mod(instance, 256)]
  out[instance == -1] = 90
  return out


def contact_sheet(rows: list[list[np.ndarray]], labels: list[str] | None = None,
                  gap: int = 4) -> Image.Image:
  """A grid image: rows of HxWx3 uint8 tiles of one size, each row optionally labelled."""
  if not rows or not rows[0]:
    raise ValueError("contact_sheet: no tiles given")
  tile_h, tile_w = rows[0][0].shape[:2]
  label_h = 16 if labels else 0
  cols = max(len(r) for r in rows)
  sheet = Image.new("RGB", (cols * (tile_w + gap) + gap,
                            len(rows) * (tile_h + gap + label_h) + gap), (30, 30, 30))
  draw = ImageDraw.Draw(sheet)
  for i, row in enumerate(rows):
    top = gap + i * (tile_h + gap + label_h)
    if labels:
      draw.text((gap, top), labels[i], fill=(230, 230, 230))
    for j, tile in enumerate(row):
      if tile.shape[:2] != (tile_h, tile_w):
        raise ValueError(f"contact_sheet: tile ({i}, {j}) is {tile.shape[:2]}, "
                         f"expected {(tile_h, tile_w)}")
      sheet.paste(Image.fromarray(np.asarray(tile, np.uint8)),
                  (gap + j * (tile_w + gap), top + label_h))
  return sheet
