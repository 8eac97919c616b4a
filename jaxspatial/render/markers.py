"""Marks drawn into rendered images: projected 3-D line segments, discs and text in a tiny
bitmap font, and with them Think3D's camera markers. Jit and vmap friendly: every shape
is static (padded marks carry an `on` mask).

Painting is deterministic on every backend: each mark pixel carries a draw-order key
(larger keys are drawn later, on top), a scatter-max keeps the top-most key per pixel
(never a scatter-set on repeated pixels), and the winner's colour is blended over the
image with its key's opacity. Marks under the winner do not show through it.

Lines are clipped to the near plane in 3-D, then to the image rectangle in 2-D, and
sampled at steps of at most half a pixel, so a line is 8-connected and its pixels are
the rounded (half away from zero) points of the projected segment.

Camera markers (`draw_cameras`) follow the global views of the public Think3D code
(spagent): for input camera i a pyramid of four lines from its centre to the corners of
a square base plus the base's outline, in the camera's colour (matplotlib's red, blue,
green, orange, purple, brown, pink, gray, cycled) at opacity 0.5 (0.65 for the anchor),
a dot at the centre (black rim, opacity 0.8, larger for the anchor), and the label
`Cam{i+1}` (with a `*` after the anchor camera's) in black on a box of the camera's
colour at opacity 0.6, placed right of and above the centre. The code puts the base
0.8 x 0.12 = 0.096 of the scene's extent *behind* the centre (it takes -z of an OpenCV
pose as the viewing direction), so the camera looks from the base towards the apex, which
is what the tool's text tells the model; `base="ahead"` draws the usual frustum with the
image plane in front. Marks are drawn on top of the points without a depth test, as the
code's matplotlib figure does (cameras are drawn after the scatter, computed_zorder off).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxspatial.geometry.camera import Camera, round_half_away, world_to_camera

Array = jax.Array

GLYPH_HEIGHT, GLYPH_WIDTH = 7, 5
FONT_CHARS = "0123456789Cam*"
_FONT_ROWS = {
    "0": (".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."),
    "1": ("..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."),
    "2": (".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"),
    "3": ("#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."),
    "4": ("...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."),
    "5": ("#####", "#....", "####.", "....#", "....#", "#...#", ".###."),
    "6": ("..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."),
    "7": ("#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."),
    "8": (".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."),
    "9": (".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."),
    "C": (".###.", "#...#", "#....", "#....", "#....", "#...#", ".###."),
    "a": (".....", ".....", ".###.", "....#", ".####", "#...#", ".####"),
    "m": (".....", ".....", "##.#.", "#.#.#", "#.#.#", "#...#", "#...#"),
    "*": (".....", "..#..", "#.#.#", ".###.", "#.#.#", "..#..", "....."),
}
# [G, 7, 5] bool, one glyph per character of FONT_CHARS.
GLYPHS = np.asarray([[[c == "#" for c in row] for row in _FONT_ROWS[ch]] for ch in FONT_CHARS])

# matplotlib's named colours the code cycles through for cameras 1, 2, ...
CAMERA_COLOURS = ((255, 0, 0), (0, 0, 255), (0, 128, 0), (255, 165, 0), (128, 0, 128),
                  (165, 42, 42), (255, 192, 203), (128, 128, 128))
_LINES, _DOT_RIM, _DOT, _LABEL_BOX, _LABEL_TEXT = range(5)
_LAYERS = 5


@dataclasses.dataclass(frozen=True)
class CameraMarkerStyle:
  """How `draw_cameras` draws input cameras; the defaults are the public code's."""

  frustum_scale: float = 0.096   # pyramid depth / the scene's largest side (code: 0.8 x 0.12)
  base_half_size: float = 0.3    # half the base's side / the pyramid's depth (code)
  base: str = "behind"           # "behind" (code: looks from base to apex) or "ahead"
  label_scale: int = 1           # pixels per font cell
  dot_radius: int = 2            # pixels; the anchor's dot is larger, as in the code
  anchor_dot_radius: int = 3
  line_opacity: float = 0.5
  anchor_line_opacity: float = 0.65
  dot_opacity: float = 0.8
  label_box_opacity: float = 0.6
  colours: tuple[tuple[int, int, int], ...] = CAMERA_COLOURS

  def check(self) -> None:
    if self.base not in ("behind", "ahead"):
      raise ValueError(f"CameraMarkerStyle.base: expected 'behind' or 'ahead', got {self.base!r}")
    if self.label_scale < 1 or self.dot_radius < 1 or self.anchor_dot_radius < 1:
      raise ValueError("CameraMarkerStyle: label_scale, dot_radius and anchor_dot_radius must "
                       f"be >= 1, got {self.label_scale}, {self.dot_radius}, "
                       f"{self.anchor_dot_radius}")
    if not self.colours or any(len(c) != 3 for c in self.colours):
      raise ValueError(f"CameraMarkerStyle.colours: expected RGB triples, got {self.colours!r}")


def glyph_codes(text: str, length: int | None = None) -> np.ndarray:
  """Indices into GLYPHS for each character, padded with -1 (blank) to `length`."""
  unknown = sorted(set(text) - set(FONT_CHARS))
  if unknown:
    raise ValueError(f"glyph_codes: characters {unknown} are not in the font {FONT_CHARS!r}")
  length = len(text) if length is None else length
  if len(text) > length:
    raise ValueError(f"glyph_codes: {len(text)} characters, more than the length {length}")
  codes = np.full(length, -1, np.int32)
  codes[: len(text)] = [FONT_CHARS.index(c) for c in text]
  return codes


def _clip_to_near(a_Sx3: Array, b_Sx3: Array, near):
  """Segments in camera coordinates cut to z >= near; keep is False when wholly behind."""
  near = jnp.maximum(jnp.asarray(near, jnp.float32), 1e-6)
  za, zb = a_Sx3[..., 2], b_Sx3[..., 2]
  keep = (za >= near) | (zb >= near)
  dz = zb - za
  t = (near - za) / jnp.where(jnp.abs(dz) > 0, dz, 1.0)
  crossing = a_Sx3 + t[..., None] * (b_Sx3 - a_Sx3)
  crossing = jnp.concatenate([crossing[..., :2], jnp.broadcast_to(near, za.shape)[..., None]], -1)
  a = jnp.where((za >= near)[..., None], a_Sx3, crossing)
  b = jnp.where((zb >= near)[..., None], b_Sx3, crossing)
  return a, b, keep


def _pixel_coords(camera: Camera, p_cam_Sx3: Array) -> Array:
  z = p_cam_Sx3[..., 2]
  return jnp.stack([camera.fx * p_cam_Sx3[..., 0] / z + camera.cx,
                    camera.fy * p_cam_Sx3[..., 1] / z + camera.cy], -1)


def _clip_to_box(p0_Sx2: Array, p1_Sx2: Array, lo_2: Array, hi_2: Array):
  """Liang-Barsky: the parts of 2-D segments inside the box [lo, hi]."""
  d = p1_Sx2 - p0_Sx2
  flat = jnp.abs(d) < 1e-12
  safe = jnp.where(flat, 1.0, d)
  t_lo, t_hi = (lo_2 - p0_Sx2) / safe, (hi_2 - p0_Sx2) / safe
  enter = jnp.where(flat, -jnp.inf, jnp.minimum(t_lo, t_hi))
  leave = jnp.where(flat, jnp.inf, jnp.maximum(t_lo, t_hi))
  inside_flat = ~flat | ((p0_Sx2 >= lo_2) & (p0_Sx2 <= hi_2))
  t0 = jnp.maximum(0.0, jnp.max(enter, -1))
  t1 = jnp.minimum(1.0, jnp.min(leave, -1))
  keep = (t0 <= t1) & jnp.all(inside_flat, -1)
  return p0_Sx2 + t0[..., None] * d, p0_Sx2 + t1[..., None] * d, keep


@functools.partial(jax.jit, static_argnames=("height", "width"))
def segment_pixels(camera: Camera, start_Sx3: Array, end_Sx3: Array, height: int, width: int,
                   near=1e-3):
  """The pixels of world segments seen by a single camera.

  Returns (x, y, on), each [S, N] with N = 2 max(height, width) + 1 samples per
  segment; `on` is False for samples off the image or behind the near plane.
  """
  a, b, keep = _clip_to_near(world_to_camera(camera, start_Sx3),
                             world_to_camera(camera, end_Sx3), near)
  lo = jnp.asarray([-0.5, -0.5], jnp.float32)
  hi = jnp.asarray([width - 0.5, height - 0.5], jnp.float32)
  q0, q1, inside = _clip_to_box(_pixel_coords(camera, a), _pixel_coords(camera, b), lo, hi)
  t = jnp.linspace(0.0, 1.0, 2 * max(height, width) + 1)
  samples = q0[:, None, :] + t[None, :, None] * (q1 - q0)[:, None, :]
  pixels = round_half_away(samples).astype(jnp.int32)
  x, y = pixels[..., 0], pixels[..., 1]
  on = (keep & inside)[:, None] & (x >= 0) & (x < width) & (y >= 0) & (y < height)
  return x, y, on


def disc_pixels(x_N: Array, y_N: Array, radius_N: Array, max_radius: int):
  """Discs (pixels with dx^2 + dy^2 <= (r + 1/2)^2) around centres: (x, y, on) [N, M]."""
  offsets = np.arange(-max_radius, max_radius + 1)
  dy, dx = (a.reshape(-1) for a in np.meshgrid(offsets, offsets, indexing="ij"))
  inside = (dx ** 2 + dy ** 2)[None, :] <= (radius_N[:, None] + 0.5) ** 2
  return x_N[:, None] + dx[None, :], y_N[:, None] + dy[None, :], inside


@functools.partial(jax.jit, static_argnames=("scale",))
def text_pixels(codes_NxL: Array, left_N: Array, bottom_N: Array, scale: int = 1):
  """Glyph pixels of N strings, each starting at column `left` with its last row at
  `bottom` (the baseline); blank codes (-1) take no space. (x, y, on) [N, L*7*5*s*s]."""
  codes_NxL = jnp.asarray(codes_NxL, jnp.int32)
  present = codes_NxL >= 0
  slot = jnp.cumsum(present, -1) - 1                              # [N, L]
  glyph = jnp.asarray(GLYPHS)[jnp.maximum(codes_NxL, 0)]          # [N, L, 7, 5]
  row = np.arange(GLYPH_HEIGHT * scale) // scale                  # cell of each pixel row
  col = np.arange(GLYPH_WIDTH * scale) // scale
  cell = glyph[:, :, row][:, :, :, col] & present[:, :, None, None]  # [N, L, 7s, 5s]
  advance = (GLYPH_WIDTH + 1) * scale
  x = (left_N[:, None, None, None] + slot[:, :, None, None] * advance
       + np.arange(GLYPH_WIDTH * scale)[None, None, None, :])
  y = (bottom_N[:, None, None, None] - GLYPH_HEIGHT * scale + 1
       + np.arange(GLYPH_HEIGHT * scale)[None, None, :, None])
  shape = cell.shape
  n = shape[0]
  return (jnp.broadcast_to(x, shape).reshape(n, -1), jnp.broadcast_to(y, shape).reshape(n, -1),
          cell.reshape(n, -1))


def text_box_pixels(codes_NxL: Array, left_N: Array, bottom_N: Array, scale: int = 1):
  """The box behind `text_pixels`' strings, one cell (scale pixels) of margin around them."""
  codes_NxL = jnp.asarray(codes_NxL, jnp.int32)
  length = codes_NxL.shape[-1]
  advance = (GLYPH_WIDTH + 1) * scale
  count = jnp.sum(codes_NxL >= 0, -1)
  box_width = count * advance + scale                             # text width + 2 margins
  cols = np.arange(length * advance + scale)
  rows = np.arange((GLYPH_HEIGHT + 2) * scale)
  x = left_N[:, None, None] - scale + cols[None, None, :]
  y = bottom_N[:, None, None] - (GLYPH_HEIGHT + 1) * scale + 1 + rows[None, :, None]
  on = cols[None, None, :] < box_width[:, None, None]
  shape = (codes_NxL.shape[0], len(rows), len(cols))
  n = shape[0]
  return (jnp.broadcast_to(x, shape).reshape(n, -1), jnp.broadcast_to(y, shape).reshape(n, -1),
          jnp.broadcast_to(on, shape).reshape(n, -1))


@jax.jit
def paint(image_HxWx3: Array, x: Array, y: Array, on: Array, key: Array, colours_Kx3: Array,
          opacity_K: Array) -> Array:
  """Paints mark pixels into an image. x, y, on, key broadcast together; `key` indexes
  `colours` and `opacity` and orders the marks: at each pixel the largest key wins."""
  height, width = image_HxWx3.shape[:2]
  x, y, on, key = jnp.broadcast_arrays(x, y, on, key)
  on = on & (x >= 0) & (x < width) & (y >= 0) & (y < height)
  slot = jnp.where(on, y * width + x, height * width).reshape(-1)   # off-image: a sentinel
  top = jnp.full(height * width + 1, -1, jnp.int32).at[slot].max(
      jnp.where(on, key, -1).astype(jnp.int32).reshape(-1))[:-1].reshape(height, width)
  winner = jnp.maximum(top, 0)
  alpha = jnp.where(top >= 0, jnp.asarray(opacity_K, jnp.float32)[winner], 0.0)[..., None]
  base = image_HxWx3.astype(jnp.float32)
  colour = jnp.asarray(colours_Kx3, jnp.float32)[winner]
  blended = base + alpha * (colour - base)
  return jnp.clip(jnp.floor(blended + 0.5), 0, 255).astype(jnp.uint8)


def camera_pyramids(cameras: Camera, length, half_size, base: str = "behind"):
  """World segments of each camera's pyramid: [K, 8, 3] starts and ends (centre to the
  four base corners, then the base's outline)."""
  centre = cameras.position                                        # [K, 3]
  forward, right, up = cameras.forward, cameras.right, -cameras.down
  side = -1.0 if base == "behind" else 1.0
  base_centre = centre + side * length * forward
  signs = ((1, 1), (-1, 1), (-1, -1), (1, -1))                     # a cycle round the base
  corners = jnp.stack([base_centre + half_size * (sr * right + su * up) for sr, su in signs], 1)
  starts = jnp.concatenate([jnp.broadcast_to(centre[:, None], corners.shape), corners], 1)
  ends = jnp.concatenate([corners, jnp.roll(corners, -1, axis=1)], 1)
  return starts, ends


def camera_label_codes(num_cameras: int, anchor: Array) -> Array:
  """`Cam{i+1}` for each of K cameras, with `*` after the anchor's: [K, L] glyph codes."""
  length = 3 + len(str(num_cameras)) + 1
  names = np.stack([glyph_codes(f"Cam{i + 1}", length) for i in range(num_cameras)])
  starred = np.stack([glyph_codes(f"Cam{i + 1}*", length) for i in range(num_cameras)])
  is_anchor = jnp.arange(num_cameras) == anchor
  return jnp.where(is_anchor[:, None], starred, names).astype(jnp.int32)


def draw_cameras(image_HxWx3: Array, view: Camera, cameras: Camera, num_cameras: Array,
                 anchor: Array, scene_size: Array, style: CameraMarkerStyle = CameraMarkerStyle(),
                 near=1e-3) -> Array:
  """Draws the first `num_cameras` of K cameras (pose [K, 4, 4]) as seen by `view`.

  scene_size: the scene's largest side, which sizes the pyramids (`style.frustum_scale`).
  anchor: the 0-based camera whose label gets the `*`. Marks behind `near` are cut.
  Jit-compiled (eager callers get one program, not op-by-op dispatch).
  """
  style.check()
  if image_HxWx3.ndim != 3 or image_HxWx3.shape[-1] != 3:
    raise ValueError(f"draw_cameras: image: expected [H, W, 3], got {tuple(image_HxWx3.shape)}")
  if cameras.world_from_camera.ndim != 3:
    raise ValueError("draw_cameras: cameras: expected pose [K, 4, 4], got "
                     f"{tuple(cameras.world_from_camera.shape)}")
  return _draw_cameras(image_HxWx3, view, cameras, num_cameras, anchor, scene_size, near,
                       style=style)


@functools.partial(jax.jit, static_argnames=("style",))
def _draw_cameras(image_HxWx3, view, cameras, num_cameras, anchor, scene_size, near, *,
                  style: CameraMarkerStyle) -> Array:
  height, width = image_HxWx3.shape[:2]
  count = cameras.fx.shape[0]
  length = style.frustum_scale * jnp.asarray(scene_size, jnp.float32)
  starts, ends = camera_pyramids(cameras, length, style.base_half_size * length, style.base)
  line_x, line_y, line_on = segment_pixels(view, starts.reshape(-1, 3), ends.reshape(-1, 3),
                                           height, width, near)
  real = jnp.arange(count) < num_cameras
  is_anchor = jnp.arange(count) == anchor
  line_x, line_y = line_x.reshape(count, -1), line_y.reshape(count, -1)
  line_on = line_on.reshape(count, -1) & real[:, None]

  centre = world_to_camera(view, cameras.position)
  centre_px = round_half_away(_pixel_coords(view, centre)).astype(jnp.int32)
  centre_seen = real & (centre[:, 2] >= near)
  radius = jnp.where(is_anchor, style.anchor_dot_radius, style.dot_radius)
  max_radius = max(style.dot_radius, style.anchor_dot_radius)
  rim_x, rim_y, rim_on = disc_pixels(centre_px[:, 0], centre_px[:, 1], radius, max_radius)
  dot_x, dot_y, dot_on = disc_pixels(centre_px[:, 0], centre_px[:, 1], radius - 1, max_radius)

  # The code offsets the label by 0.3 and 0.2 axis lengths (axis = depth / 0.8) right and up.
  axis = length / 0.8
  label_at = cameras.position + 0.3 * axis * view.right - 0.2 * axis * view.down
  label = world_to_camera(view, label_at)
  label_px = round_half_away(_pixel_coords(view, label)).astype(jnp.int32)
  label_seen = centre_seen & (label[:, 2] >= near)
  codes = camera_label_codes(count, anchor)
  scale = style.label_scale
  box_x, box_y, box_on = text_box_pixels(codes, label_px[:, 0], label_px[:, 1], scale)
  text_x, text_y, text_on = text_pixels(codes, label_px[:, 0], label_px[:, 1], scale)

  parts = [(line_x, line_y, line_on, _LINES),
           (rim_x, rim_y, rim_on & centre_seen[:, None], _DOT_RIM),
           (dot_x, dot_y, dot_on & centre_seen[:, None], _DOT),
           (box_x, box_y, box_on & label_seen[:, None], _LABEL_BOX),
           (text_x, text_y, text_on & label_seen[:, None], _LABEL_TEXT)]
  camera_key = jnp.arange(count, dtype=jnp.int32)[:, None] * _LAYERS
  xs, ys, ons, keys = zip(*[(x, y, on, jnp.broadcast_to(camera_key + layer, x.shape))
                            for x, y, on, layer in parts])
  colours, opacity = _marker_palette(count, is_anchor, style)
  return paint(image_HxWx3, jnp.concatenate(xs, 1), jnp.concatenate(ys, 1),
               jnp.concatenate(ons, 1), jnp.concatenate(keys, 1), colours, opacity)


def _marker_palette(count: int, is_anchor: Array, style: CameraMarkerStyle):
  """Colour and opacity per (camera, layer) key: [K * 5, 3] and [K * 5]."""
  own = np.asarray([style.colours[i % len(style.colours)] for i in range(count)], np.float32)
  black = np.zeros_like(own)
  colours = np.stack([own, black, own, own, black], 1).reshape(-1, 3)       # layer order
  line_opacity = jnp.where(is_anchor, style.anchor_line_opacity, style.line_opacity)
  opacity = jnp.stack([line_opacity, jnp.full(count, style.dot_opacity),
                       jnp.full(count, style.dot_opacity),
                       jnp.full(count, style.label_box_opacity), jnp.ones(count)], 1)
  return jnp.asarray(colours), opacity.reshape(-1).astype(jnp.float32)
