"""PERIA's interaction tools as pure JAX functions on fixed-shape images.

Every tool takes an image [H, W, 3] uint8 and returns `(image, valid)`. Bad
arguments never raise inside jit: NaNs become 0, coordinates are clipped into their
range, and `valid` is False so the environment can report an invalid call.

Coordinates are pixels, x right and y down, in the convention of PIL, which
PERIA's tool server uses: a crop box `(x0, y0, x1, y1)` is in edge coordinates
(pixel j spans [j, j + 1), so the crop of an integer box keeps columns
x0 .. x1 - 1); drawn boxes and points address pixel centres (pixel j is at x = j,
and a box covers columns x0 .. x1 inclusive, like `ImageDraw.rectangle`). A pixel
coordinate is valid inside the image's edge box [0, W] x [0, H]: what a drawing puts
beyond the last pixel falls off the canvas, as PIL clips it.

With `scale=s`, coordinates are given in [0, s] along each axis instead (1 for
normalised, 1000 for Qwen-VL's grounding coordinates; valid in [0, s]), mapped to
pixels by `pixel_map`:
  "floor"    the public tool server's int(c * size / s) for crop edges and drawn points
             alike, so [0, 0, 1000, 1000] is the whole image for every tool (default)
  "centres"  c / s * (size - 1) for drawn points (0 and s at the first and last pixel
             centres), c / s * size for crop edges

`image_label` draws a filled disc marker with an outline; text is not rendered
on device: the label's text stays in the episode's text.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array
PIXEL_MAPS = ("floor", "centres")


def _to_pixels(xy: Array, height: int, width: int, scale: float | None, pixel_map: str,
               edges: bool) -> Array:
  """[2k] coordinates (x, y, x, y, ...) in pixels; `edges`: crop-box edges."""
  if scale is None:
    return xy
  size = jnp.tile(jnp.asarray([width, height], jnp.float32), xy.shape[-1] // 2)
  if pixel_map == "floor":
    # Multiply first: c * size is exact for integer c, so an integer quotient stays one.
    return jnp.floor(xy * size / scale)
  return xy / scale * (size if edges else size - 1.0)


def _coordinates(xy, height: int, width: int, scale: float | None, pixel_map: str,
                 edges: bool = False) -> tuple[Array, Array]:
  """(pixels [2k], ok [2k]): each coordinate with NaN -> 0, clipped into its range (the
  edge box [0, W] x [0, H], or [0, scale] when scaled) and mapped to pixels; ok where
  nothing had to change."""
  if pixel_map not in PIXEL_MAPS:
    raise ValueError(f"image tools: pixel_map must be one of {PIXEL_MAPS}, got {pixel_map!r}")
  xy = jnp.asarray(xy, jnp.float32).reshape(-1)
  high = (jnp.full(xy.shape, scale, jnp.float32) if scale is not None else
          jnp.tile(jnp.asarray([width, height], jnp.float32), xy.shape[0] // 2))
  finite = jnp.isfinite(xy)
  fixed = jnp.clip(jnp.where(finite, xy, 0.0), 0.0, high)
  return _to_pixels(fixed, height, width, scale, pixel_map, edges), finite & (fixed == xy)


def _grid(height: int, width: int) -> tuple[Array, Array]:
  rows, cols = jnp.meshgrid(jnp.arange(height, dtype=jnp.float32),
                            jnp.arange(width, dtype=jnp.float32), indexing="ij")
  return cols, rows  # x, y of every pixel centre


def _paint(image: Array, mask: Array, color, alpha: float = 1.0) -> Array:
  color = jnp.asarray(color, jnp.float32)
  blended = jnp.round((1.0 - alpha) * image.astype(jnp.float32) + alpha * color)
  return jnp.where(mask[..., None], blended.astype(jnp.uint8), image)


def _check_image(image) -> None:
  if image.ndim != 3 or image.shape[-1] != 3 or image.dtype != jnp.uint8:
    raise ValueError(f"image tools: expected an image [H, W, 3] uint8, got "
                     f"{tuple(image.shape)} {image.dtype}")


def image_crop(image: Array, box, out_height: int, out_width: int,
               scale: float | None = None, pixel_map: str = "floor") -> tuple[Array, Array]:
  """Crops the box and resizes it to (out_height, out_width) with bilinear sampling.

  A box outside the image is clipped; one thinner than a pixel is widened to one.
  """
  _check_image(image)
  height, width = image.shape[:2]
  box, ok = _coordinates(jnp.asarray(box, jnp.float32).reshape(4), height, width, scale,
                         pixel_map, edges=True)
  valid = jnp.all(ok)
  x0, y0, x1, y1 = box
  valid &= (x1 - x0 >= 1.0) & (y1 - y0 >= 1.0)
  x1 = jnp.clip(jnp.maximum(x1, x0 + 1.0), 1.0, width)
  x0 = jnp.minimum(x0, x1 - 1.0)
  y1 = jnp.clip(jnp.maximum(y1, y0 + 1.0), 1.0, height)
  y0 = jnp.minimum(y0, y1 - 1.0)
  # Output pixel j samples the box at edge coordinate x0 + (j + 1/2) (x1 - x0) / out_width,
  # the pixel-centre coordinate 1/2 less: an unscaled crop copies pixels exactly. Samples
  # stay on the box's own pixel centres, as resizing the cropped image would.
  xs = x0 + (jnp.arange(out_width) + 0.5) * (x1 - x0) / out_width - 0.5
  ys = y0 + (jnp.arange(out_height) + 0.5) * (y1 - y0) / out_height - 0.5
  xs = jnp.clip(xs, x0, x1 - 1.0)
  ys = jnp.clip(ys, y0, y1 - 1.0)
  return _bilinear(image, ys, xs), valid


def _bilinear(image: Array, ys: Array, xs: Array) -> Array:
  height, width = image.shape[:2]
  ys = jnp.clip(ys, 0.0, height - 1.0)
  xs = jnp.clip(xs, 0.0, width - 1.0)
  y_lo = jnp.floor(ys).astype(jnp.int32)
  x_lo = jnp.floor(xs).astype(jnp.int32)
  y_hi = jnp.minimum(y_lo + 1, height - 1)
  x_hi = jnp.minimum(x_lo + 1, width - 1)
  wy = (ys - y_lo)[:, None, None]
  wx = (xs - x_lo)[None, :, None]
  pixels = image.astype(jnp.float32)
  top = pixels[y_lo][:, x_lo] * (1 - wx) + pixels[y_lo][:, x_hi] * wx
  bottom = pixels[y_hi][:, x_lo] * (1 - wx) + pixels[y_hi][:, x_hi] * wx
  return jnp.round(top * (1 - wy) + bottom * wy).astype(jnp.uint8)


def _segment_distance(x: Array, y: Array, start: Array, end: Array) -> Array:
  """Distance from every pixel centre (x, y) to the segment start-end."""
  d = end - start
  length2 = jnp.maximum(jnp.sum(d * d), 1e-12)
  t = jnp.clip(((x - start[0]) * d[0] + (y - start[1]) * d[1]) / length2, 0.0, 1.0)
  return jnp.hypot(x - (start[0] + t * d[0]), y - (start[1] + t * d[1]))


def draw_line(image: Array, start, end, color=(255, 0, 0), thickness: float = 2.0,
              scale: float | None = None, pixel_map: str = "floor") -> tuple[Array, Array]:
  """Paints pixels whose centre lies within thickness / 2 of the segment."""
  _check_image(image)
  height, width = image.shape[:2]
  points, ok = _coordinates(jnp.concatenate([jnp.asarray(start, jnp.float32).reshape(2),
                                             jnp.asarray(end, jnp.float32).reshape(2)]),
                            height, width, scale, pixel_map)
  valid = jnp.all(ok)
  x, y = _grid(height, width)
  near = _segment_distance(x, y, points[:2], points[2:]) <= jnp.maximum(thickness, 1.0) / 2
  return _paint(image, near, color), valid


def draw_path(image: Array, points, num_points, color=(255, 0, 0), thickness: float = 2.0,
              scale: float | None = None, marker_radius: float = 0.0,
              marker_color=(255, 0, 0), pixel_map: str = "floor") -> tuple[Array, Array]:
  """A polyline through the first `num_points` of points [K, 2]; needs at least 2. With
  `marker_radius` > 0 a disc of that radius marks every waypoint, drawn over the line
  (the public tool's red dots)."""
  _check_image(image)
  height, width = image.shape[:2]
  points = jnp.asarray(points, jnp.float32)
  count = points.shape[0]
  num_points = jnp.asarray(num_points, jnp.int32)
  fixed, ok = _coordinates(points, height, width, scale, pixel_map)
  used = jnp.repeat(jnp.arange(count) < num_points, 2)
  # Only the points in use count towards validity.
  valid = jnp.all(jnp.where(used, ok, True)) & (num_points >= 2) & (num_points <= count)
  fixed = fixed.reshape(count, 2)
  x, y = _grid(height, width)
  half = jnp.maximum(thickness, 1.0) / 2
  near = jnp.zeros((height, width), bool)
  for k in range(count - 1):
    segment = _segment_distance(x, y, fixed[k], fixed[k + 1]) <= half
    near |= segment & (k + 1 < num_points)
  image = _paint(image, near, color)
  if marker_radius > 0:
    dots = jnp.zeros((height, width), bool)
    for k in range(count):
      dots |= (jnp.hypot(x - fixed[k, 0], y - fixed[k, 1]) <= marker_radius) & (k < num_points)
    image = _paint(image, dots, marker_color)
  return image, valid


def _box_masks(image: Array, box, thickness: float, scale: float | None, pixel_map: str):
  """(inside, core, valid): pixels of the box (x0..x1 inclusive) and those more than
  `thickness` pixels inside its border."""
  _check_image(image)
  height, width = image.shape[:2]
  box, ok = _coordinates(jnp.asarray(box, jnp.float32).reshape(4), height, width, scale,
                         pixel_map)
  valid = jnp.all(ok) & (box[2] >= box[0]) & (box[3] >= box[1])
  x0, x1 = jnp.minimum(box[0], box[2]) - 0.5, jnp.maximum(box[0], box[2]) + 0.5
  y0, y1 = jnp.minimum(box[1], box[3]) - 0.5, jnp.maximum(box[1], box[3]) + 0.5
  x, y = _grid(height, width)
  inside = (x >= x0) & (x <= x1) & (y >= y0) & (y <= y1)
  t = jnp.maximum(thickness, 1.0)
  core = (x > x0 + t) & (x < x1 - t) & (y > y0 + t) & (y < y1 - t)
  return inside, core, valid


def bounding_box(image: Array, box, color=(255, 0, 0), thickness: float = 2.0,
                 scale: float | None = None, pixel_map: str = "floor") -> tuple[Array, Array]:
  """The outline of the box (x0, y0, x1, y1), `thickness` pixels wide, drawn inward."""
  inside, core, valid = _box_masks(image, box, thickness, scale, pixel_map)
  return _paint(image, inside & ~core, color), valid


def image_highlight(image: Array, box, color=(255, 255, 0), alpha: float = 0.4,
                    scale: float | None = None, pixel_map: str = "floor") -> tuple[Array, Array]:
  """Blends `color` over the box with opacity alpha."""
  inside, _, valid = _box_masks(image, box, 1.0, scale, pixel_map)
  return _paint(image, inside, color, alpha), valid


def image_label(image: Array, point, color=(255, 0, 0), radius: float = 6.0,
                outline=(255, 255, 255), scale: float | None = None,
                pixel_map: str = "floor") -> tuple[Array, Array]:
  """A filled disc of `radius` pixels at the point, ringed by a 1-pixel outline."""
  _check_image(image)
  height, width = image.shape[:2]
  point, ok = _coordinates(jnp.asarray(point, jnp.float32).reshape(2), height, width, scale,
                           pixel_map)
  valid = jnp.all(ok)
  x, y = _grid(height, width)
  distance = jnp.hypot(x - point[0], y - point[1])
  image = _paint(image, distance <= radius + 1.0, outline)
  return _paint(image, distance <= radius, color), valid
