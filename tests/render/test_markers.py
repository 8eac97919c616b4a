"""Marks drawn into images, against numpy geometry written from the pinhole model and the
public Think3D code's camera pyramids (spagent `_draw_cameras_visualization`)."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspatial.geometry import Camera, look_at
from jaxspatial.render import markers
from jaxspatial.render.markers import CameraMarkerStyle, GLYPHS, FONT_CHARS

H, W = 120, 160
VIEW = Camera.from_fov(70.0, W, H, look_at([0.0, -5.0, 1.0], [0.0, 0.0, 1.0]))
GREY = np.full((H, W, 3), 100, np.uint8)


def pinhole(camera: Camera, xyz_Nx3):
  """World points -> (u, v, z) by the OpenCV pinhole model, in numpy."""
  pose = np.asarray(camera.world_from_camera, np.float64)
  p = (np.asarray(xyz_Nx3, np.float64) - pose[:3, 3]) @ pose[:3, :3]
  z = p[:, 2]
  return (float(camera.fx) * p[:, 0] / z + float(camera.cx),
          float(camera.fy) * p[:, 1] / z + float(camera.cy), z)


def clipped_segment_2d(camera, a, b, near=1e-3):
  """The projection of the part of segment ab in front of the near plane."""
  pose = np.asarray(camera.world_from_camera, np.float64)
  pa, pb = [(np.asarray(x, np.float64) - pose[:3, 3]) @ pose[:3, :3] for x in (a, b)]
  if pa[2] < near and pb[2] < near:
    return None
  if pa[2] < near:
    pa = pa + (near - pa[2]) / (pb[2] - pa[2]) * (pb - pa)
  if pb[2] < near:
    pb = pb + (near - pb[2]) / (pa[2] - pb[2]) * (pa - pb)
  to_px = lambda p: np.array([float(camera.fx) * p[0] / p[2] + float(camera.cx),
                              float(camera.fy) * p[1] / p[2] + float(camera.cy)])
  return to_px(pa), to_px(pb)


def distance_to_segment(points_Nx2, p0, p1):
  d = p1 - p0
  t = np.clip(((points_Nx2 - p0) @ d) / max(d @ d, 1e-12), 0, 1)
  return np.linalg.norm(points_Nx2 - (p0 + t[:, None] * d), axis=1)


def painted(image, base=GREY):
  return np.any(np.asarray(image) != base, -1)


def eight_connected(mask):
  ys, xs = np.nonzero(mask)
  if len(ys) == 0:
    return True
  seen, todo = {(ys[0], xs[0])}, collections.deque([(ys[0], xs[0])])
  while todo:
    y, x = todo.popleft()
    for dy in (-1, 0, 1):
      for dx in (-1, 0, 1):
        q = (y + dy, x + dx)
        if 0 <= q[0] < H and 0 <= q[1] < W and mask[q] and q not in seen:
          seen.add(q)
          todo.append(q)
  return len(seen) == len(ys)


def draw_one_segment(a, b):
  x, y, on = markers.segment_pixels(VIEW, jnp.asarray([a], jnp.float32),
                                    jnp.asarray([b], jnp.float32), H, W)
  return markers.paint(jnp.asarray(GREY), x, y, on, jnp.zeros_like(x),
                       jnp.asarray([[255, 0, 0]]), jnp.asarray([1.0]))


@pytest.mark.parametrize("a,b", [
    ([-1.0, 0.0, 0.5], [1.0, 0.5, 1.8]),     # inside the view
    ([-9.0, 2.0, 0.0], [3.0, -1.0, 2.5]),    # leaves the image on the left
    ([0.3, 1.0, 1.2], [0.6, -8.0, 0.9]),     # passes behind the camera (y = -5)
])
def test_segments_are_the_rounded_projection_of_their_visible_part(a, b):
  image = np.asarray(draw_one_segment(a, b))
  mask = painted(image)
  ref = clipped_segment_2d(VIEW, a, b)
  p0, p1 = ref
  ys, xs = np.nonzero(mask)
  assert len(ys) > 10
  # Every pixel is the rounding of a point on the segment: within half a pixel per axis.
  distance = distance_to_segment(np.stack([xs, ys], 1).astype(float), p0, p1)
  assert distance.max() <= 0.5 * 2 ** 0.5 + 1e-3
  assert eight_connected(mask), "no gaps along the line"
  for end in (p0, p1):
    px = np.floor(end + 0.5).astype(int)
    if 0 <= px[0] < W and 0 <= px[1] < H:
      assert mask[px[1], px[0]], "the line reaches its endpoints"
  assert (image[mask] == [255, 0, 0]).all()


def test_a_segment_wholly_behind_the_camera_draws_nothing():
  image = draw_one_segment([0.0, -6.0, 1.0], [1.0, -7.0, 1.0])
  assert not painted(image).any()


def test_paint_keeps_the_largest_key_whatever_the_order_and_blends_its_opacity():
  horizontal = ([-1.0, 0.0, 1.0], [1.0, 0.0, 1.0])
  vertical = ([0.0, 0.0, 0.3], [0.0, 0.0, 1.7])
  starts = jnp.asarray([horizontal[0], vertical[0]], jnp.float32)
  ends = jnp.asarray([horizontal[1], vertical[1]], jnp.float32)
  colours = jnp.asarray([[255, 0, 0], [0, 0, 255]])
  opacity = jnp.asarray([1.0, 0.5])
  x, y, on = markers.segment_pixels(VIEW, starts, ends, H, W)
  keys = jnp.broadcast_to(jnp.asarray([[0], [1]]), x.shape)
  image = np.asarray(markers.paint(jnp.asarray(GREY), x, y, on, keys, colours, opacity))
  flipped = np.asarray(markers.paint(jnp.asarray(GREY), x[::-1], y[::-1], on[::-1], keys[::-1],
                                     colours, opacity))
  np.testing.assert_array_equal(image, flipped)
  u, v, _ = pinhole(VIEW, [[0.0, 0.0, 1.0]])      # where the two lines cross
  cross = image[int(np.floor(v[0] + 0.5)), int(np.floor(u[0] + 0.5))]
  # Blue at opacity 0.5 over grey 100: (0 + 100) / 2 = 50, (255 + 100) / 2 = 177.5 -> 178.
  np.testing.assert_array_equal(cross, [50, 50, 178])
  left = image[int(np.floor(v[0] + 0.5)), int(np.floor(pinhole(VIEW, [horizontal[0]])[0][0] + 0.5))]
  np.testing.assert_array_equal(left, [255, 0, 0])


def test_text_places_the_font_glyphs_left_to_right_and_blanks_take_no_space():
  assert len({g.tobytes() for g in GLYPHS}) == len(FONT_CHARS), "every glyph is distinct"
  codes = np.concatenate([markers.glyph_codes("Cam1"), [-1], markers.glyph_codes("2*"), [-1]])
  for scale in (1, 2):
    left, bottom = 3, 20
    x, y, on = markers.text_pixels(jnp.asarray(codes[None]), jnp.asarray([left]),
                                   jnp.asarray([bottom]), scale)
    got = np.zeros((H, W), bool)
    got[np.asarray(y)[np.asarray(on)], np.asarray(x)[np.asarray(on)]] = True
    want = np.zeros((H, W), bool)
    for slot, char in enumerate("Cam12*"):  # the blank between "1" and "2" is skipped
      cell = np.kron(GLYPHS[FONT_CHARS.index(char)], np.ones((scale, scale), bool))
      top, col = bottom - 7 * scale + 1, left + slot * 6 * scale
      want[top: top + 7 * scale, col: col + 5 * scale] = cell
    np.testing.assert_array_equal(got, want)
  with pytest.raises(ValueError, match=r"characters \['x'\] are not in the font"):
    markers.glyph_codes("Camx")


def pyramid_reference(camera_pose, length, base):
  """The public code's camera pyramid: base centre `length` behind the centre (the code
  takes -z of the OpenCV pose as forward), half side 0.3 length, corners right/up."""
  pose = np.asarray(camera_pose, np.float64)
  centre, right, down, forward = pose[:3, 3], pose[:3, 0], pose[:3, 1], pose[:3, 2]
  side = -1.0 if base == "behind" else 1.0
  base_centre = centre + side * length * forward
  h = 0.3 * length
  corners = [base_centre + h * (sr * right - su * down) for sr, su in
             ((1, 1), (-1, 1), (-1, -1), (1, -1))]
  return centre, corners


def three_cameras():
  eyes = [[-2.2, 0.0, 0.2], [0.3, 1.0, 2.2], [2.0, 1.5, -0.2], [-0.6, 1.0, -0.8]]
  poses = jnp.stack([look_at(e, [0.0, 0.0, 1.0]) for e in eyes])
  return Camera.from_fov(60.0, 32, 24, poses)


@pytest.mark.parametrize("base", ["behind", "ahead"])
def test_camera_pyramids_dots_and_labels_follow_the_code(base):
  cameras = three_cameras()
  scene_size = 10.0
  image = np.asarray(markers.draw_cameras(jnp.asarray(GREY), VIEW, cameras, 3, 1, scene_size,
                                          CameraMarkerStyle(base=base)))
  length = 0.096 * scene_size
  colours = np.asarray(markers.CAMERA_COLOURS[:3], float)
  yy, xx = np.mgrid[:H, :W]
  pixels = np.stack([xx.ravel(), yy.ravel()], 1).astype(float)
  lines, blobs = np.zeros((3, H, W), bool), np.zeros((3, H, W), bool)  # per camera
  corner_pixels = []
  for i in range(3):
    centre, corners = pyramid_reference(cameras.world_from_camera[i], length, base)
    segments = [(centre, c) for c in corners] + [(corners[k], corners[(k + 1) % 4])
                                                 for k in range(4)]
    for a, b in segments:
      p0, p1 = clipped_segment_2d(VIEW, a, b)
      lines[i] |= (distance_to_segment(pixels, p0, p1) <= 0.75).reshape(H, W)
    u, v, _ = pinhole(VIEW, [centre])
    cu, cv = int(np.floor(u[0] + 0.5)), int(np.floor(v[0] + 0.5))
    radius = 3 if i == 1 else 2  # the anchor's dot is larger
    blobs[i] |= (xx - cu) ** 2 + (yy - cv) ** 2 <= (radius + 0.5) ** 2
    # The dot's centre: the camera's colour at opacity 0.8 over the grey.
    np.testing.assert_array_equal(image[cv, cu], np.floor(0.8 * colours[i] + 0.2 * 100 + 0.5))
    # The label: its bottom-left 0.3 and 0.2 axis lengths (pyramid depth = 0.8 axis) right
    # of and above the centre; one cell of margin round 7-row glyphs; "Cam{i+1}", "*" on
    # the anchor's; black on the camera's colour at opacity 0.6.
    axis = length / 0.8
    view_right, view_down = (np.asarray(VIEW.world_from_camera)[:3, k] for k in (0, 1))
    lu, lv, _ = pinhole(VIEW, [centre + 0.3 * axis * view_right - 0.2 * axis * view_down])
    left, bottom = int(np.floor(lu[0] + 0.5)), int(np.floor(lv[0] + 0.5))
    chars = 5 if i == 1 else 4
    rows, cols = slice(bottom - 7, bottom + 2), slice(left - 1, left + chars * 6)
    blobs[i, rows, cols] = True
    box = image[rows, cols]
    box_colour = np.floor(0.6 * colours[i] + 0.4 * 100 + 0.5)
    is_text = (box == 0).all(-1)
    assert ((box == box_colour).all(-1) | is_text).all(), f"camera {i + 1}'s label box"
    label = "Cam" + str(i + 1) + ("*" if i == 1 else "")
    for slot, char in enumerate(label):
      np.testing.assert_array_equal(is_text[1:8, 1 + 6 * slot: 6 + 6 * slot],
                                    GLYPHS[FONT_CHARS.index(char)], err_msg=label)
    assert not is_text[:, 6 * len(label):].any() and not is_text[[0, -1]].any()
    alpha = 0.65 if i == 1 else 0.5
    line_colour = np.floor(alpha * colours[i] + (1 - alpha) * 100 + 0.5)
    for corner in corners:
      cu, cv = (int(np.floor(t[0] + 0.5)) for t in pinhole(VIEW, [corner])[:2])
      corner_pixels.append((i, cu, cv, line_colour))
  for i, cu, cv, line_colour in corner_pixels:  # a base corner shows camera i's line colour
    others = np.delete(lines, i, 0).any(0) | blobs.any(0)
    if 0 <= cu < W and 0 <= cv < H and not others[cv, cu]:
      np.testing.assert_array_equal(image[cv, cu], line_colour)
  mask = painted(image)
  assert mask.sum() > 100
  assert not (mask & ~(lines.any(0) | blobs.any(0))).any(), "nothing outside the reference marks"
  assert (lines.any(0) & ~blobs.any(0) & ~mask).sum() < 0.35 * lines.any(0).sum()
  # Camera 4 is padding (num_cameras = 3) and stands in front of the view: not drawn.
  u, v, z = pinhole(VIEW, [np.asarray(cameras.world_from_camera[3])[:3, 3]])
  assert z[0] > 0 and 3 <= u[0] < W - 3 and 3 <= v[0] < H - 3
  assert not mask[int(v[0]) - 3: int(v[0]) + 4, int(u[0]) - 3: int(u[0]) + 4].any()


def test_draw_cameras_agrees_under_jit_and_vmap_and_checks_its_inputs():
  cameras = three_cameras()
  images = jnp.stack([jnp.asarray(GREY), jnp.zeros((H, W, 3), jnp.uint8)])
  anchors = jnp.asarray([0, 2])
  batched = jax.vmap(lambda im, a: markers.draw_cameras(im, VIEW, cameras, 3, a, 10.0))(
      images, anchors)
  for b in range(2):
    single = markers.draw_cameras(images[b], VIEW, cameras, 3, anchors[b], 10.0)
    np.testing.assert_array_equal(np.asarray(batched[b]), np.asarray(single))
  with pytest.raises(ValueError, match="CameraMarkerStyle.base: expected 'behind' or 'ahead'"):
    markers.draw_cameras(images[0], VIEW, cameras, 3, 0, 10.0, CameraMarkerStyle(base="up"))
  with pytest.raises(ValueError, match=r"image: expected \[H, W, 3\], got \(120, 160\)"):
    markers.draw_cameras(images[0, ..., 0], VIEW, cameras, 3, 0, 10.0)
