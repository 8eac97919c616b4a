"""Line charts as PNG with PIL (reward curves), no plotting library needed."""

from __future__ import annotations

import io

import numpy as np
from etils import epath
from PIL import Image, ImageDraw

PALETTE = ((31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14))


def line_chart(series: dict, path, title: str = "", width: int = 720, height: int = 400,
               x_label: str = "step") -> epath.Path:
  """`series`: name -> (x values, y values). Axes span the data; a legend names the lines."""
  image = Image.new("RGB", (width, height), "white")
  draw = ImageDraw.Draw(image)
  left, right, top, bottom = 60, width - 20, 30, height - 40
  xs = np.concatenate([np.asarray(x, float) for x, _ in series.values()] or [np.zeros(1)])
  ys = np.concatenate([np.asarray(y, float) for _, y in series.values()] or [np.zeros(1)])
  ys = ys[np.isfinite(ys)] if np.isfinite(ys).any() else np.zeros(1)
  x0, x1 = float(xs.min()), float(max(xs.max(), xs.min() + 1))
  y0, y1 = float(ys.min()), float(ys.max())
  if y1 - y0 < 1e-9:
    y0, y1 = y0 - 0.5, y1 + 0.5
  to_px = lambda x, y: (left + (x - x0) / (x1 - x0) * (right - left),
                        bottom - (y - y0) / (y1 - y0) * (bottom - top))
  draw.rectangle([left, top, right, bottom], outline=(0, 0, 0))
  for k in range(5):
    y = y0 + (y1 - y0) * k / 4
    _, py = to_px(x0, y)
    draw.line([left - 4, py, left, py], fill=(0, 0, 0))
    draw.text((4, py - 6), f"{y:.2f}", fill=(0, 0, 0))
  for k in range(5):
    x = x0 + (x1 - x0) * k / 4
    px, _ = to_px(x, y0)
    draw.line([px, bottom, px, bottom + 4], fill=(0, 0, 0))
    draw.text((px - 10, bottom + 8), f"{x:.0f}", fill=(0, 0, 0))
  draw.text((width // 2 - 20, height - 16), x_label, fill=(0, 0, 0))
  draw.text((left, 8), title, fill=(0, 0, 0))
  for index, (name, (x, y)) in enumerate(series.items()):
    colour = PALETTE[index % len(PALETTE)]
    points = [to_px(a, b) for a, b in zip(np.asarray(x, float), np.asarray(y, float))
              if np.isfinite(b)]
    if len(points) > 1:
      draw.line(points, fill=colour, width=2)
    elif points:
      draw.ellipse([points[0][0] - 2, points[0][1] - 2, points[0][0] + 2, points[0][1] + 2],
                   fill=colour)
    draw.text((right - 150, top + 6 + 14 * index), name, fill=colour)
  path = epath.Path(path)  # a local or a remote (gs://) file
  path.parent.mkdir(parents=True, exist_ok=True)
  buffer = io.BytesIO()
  image.save(buffer, format="PNG")
  path.write_bytes(buffer.getvalue())
  return path
