"""PERIA's interaction tools against numpy references written from their definitions."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspatial.envs import image_tools as tools

H, W = 40, 56


def random_image(seed=0):
  return np.random.default_rng(seed).integers(0, 256, (H, W, 3), dtype=np.uint8)


def numpy_crop(image, box, out_h, out_w):
  x0, y0, x1, y1 = box
  out = np.zeros((out_h, out_w, 3))
  for i in range(out_h):
    for j in range(out_w):
      # Resizing the cropped pixels: samples clamp to the box's own pixel centres.
      x = np.clip(x0 + (j + 0.5) * (x1 - x0) / out_w - 0.5, x0, x1 - 1)
      y = np.clip(y0 + (i + 0.5) * (y1 - y0) / out_h - 0.5, y0, y1 - 1)
      xl, yl = int(np.floor(x)), int(np.floor(y))
      xh, yh = min(xl + 1, W - 1), min(yl + 1, H - 1)
      fx, fy = x - xl, y - yl
      out[i, j] = ((1 - fy) * ((1 - fx) * image[yl, xl] + fx * image[yl, xh])
                   + fy * ((1 - fx) * image[yh, xl] + fx * image[yh, xh]))
  return out


def test_crop_matches_bilinear_reference_and_copies_unscaled_crops_exactly():
  image = random_image()
  crop, valid = tools.image_crop(jnp.asarray(image), (10, 5, 30, 25), 20, 20)
  assert bool(valid)
  np.testing.assert_array_equal(np.asarray(crop), image[5:25, 10:30])
  for box, size in [((3.3, 7.1, 50.2, 33.9), (16, 24)), ((0, 0, W, H), (64, 80)),
                    ((20, 10, 22, 12), (9, 9))]:
    crop, valid = tools.image_crop(jnp.asarray(image), box, *size)
    assert bool(valid)
    reference = numpy_crop(image.astype(np.float64), box, *size)
    assert np.abs(np.asarray(crop).astype(float) - reference).max() <= 0.51


def test_crop_normalised_and_bad_boxes():
  image = jnp.asarray(random_image(1))
  # Separately compiled programs may round a .5 differently: compare to within 1.
  a, _ = tools.image_crop(image, (0.25, 0.5, 0.75, 1.0), 10, 14, scale=1.0)
  b, _ = tools.image_crop(image, (14, 20, 42, 40), 10, 14)
  chex.assert_trees_all_close(a.astype(int), b.astype(int), atol=1)
  qwen, _ = tools.image_crop(image, (250, 500, 750, 1000), 10, 14, scale=1000.0)
  chex.assert_trees_all_close(qwen.astype(int), b.astype(int), atol=1)
  clipped, valid = tools.image_crop(image, (-10, -5, 20, 60), 8, 8)
  assert not bool(valid)
  chex.assert_trees_all_close(clipped.astype(int),
                              tools.image_crop(image, (0, 0, 20, 40), 8, 8)[0].astype(int), atol=1)
  for bad in [(np.nan, 0, 10, 10), (10, 10, 10, 30), (30, 5, 10, 20)]:
    out, valid = tools.image_crop(image, bad, 8, 8)
    assert not bool(valid) and out.shape == (8, 8, 3)


def segment_distance(x, y, a, b):
  d = np.subtract(b, a)
  t = np.clip(((x - a[0]) * d[0] + (y - a[1]) * d[1]) / max(d @ d, 1e-12), 0, 1)
  return np.hypot(x - a[0] - t * d[0], y - a[1] - t * d[1])


def paint(image, mask, color, alpha=1.0):
  out = image.copy()
  out[mask] = np.round((1 - alpha) * image[mask] + alpha * np.asarray(color, float))
  return out


YY, XX = np.mgrid[0:H, 0:W].astype(np.float64)


@pytest.mark.parametrize("seed", range(5))
def test_line_and_path_match_reference(seed):
  rng = np.random.default_rng(seed)
  image = random_image(seed)
  a, b = rng.uniform(0, [W - 1, H - 1]), rng.uniform(0, [W - 1, H - 1])
  thickness = rng.uniform(1, 5)
  out, valid = tools.draw_line(jnp.asarray(image), a, b, (1, 2, 3), thickness)
  expected = paint(image, segment_distance(XX, YY, a, b) <= thickness / 2, (1, 2, 3))
  assert bool(valid)
  np.testing.assert_array_equal(np.asarray(out), expected)

  points = rng.uniform(0, [W - 1, H - 1], (6, 2))
  count = int(rng.integers(2, 7))
  out, valid = tools.draw_path(jnp.asarray(image), points, count, (9, 8, 7), thickness)
  mask = np.zeros((H, W), bool)
  for k in range(count - 1):
    mask |= segment_distance(XX, YY, points[k], points[k + 1]) <= thickness / 2
  assert bool(valid)
  np.testing.assert_array_equal(np.asarray(out), paint(image, mask, (9, 8, 7)))


def test_box_highlight_and_label_match_reference():
  image = random_image(3)
  out, valid = tools.bounding_box(jnp.asarray(image), (10, 5, 30, 25), (0, 255, 0), 2)
  mask = np.zeros((H, W), bool)
  mask[5:26, 10:31] = True
  mask[7:24, 12:29] = False
  assert bool(valid)
  np.testing.assert_array_equal(np.asarray(out), paint(image, mask, (0, 255, 0)))

  out, valid = tools.image_highlight(jnp.asarray(image), (10, 5, 30, 25), (255, 255, 0), 0.4)
  inside = np.zeros((H, W), bool)
  inside[5:26, 10:31] = True
  np.testing.assert_array_equal(np.asarray(out), paint(image, inside, (255, 255, 0), 0.4))

  out, valid = tools.image_label(jnp.asarray(image), (20.3, 15.7), (255, 0, 0), 4.0)
  distance = np.hypot(XX - 20.3, YY - 15.7)
  expected = paint(paint(image, distance <= 5.0, (255, 255, 255)), distance <= 4.0, (255, 0, 0))
  np.testing.assert_allclose(np.asarray(out), expected, atol=0)


def test_out_of_range_arguments_are_clipped_and_flagged():
  image = jnp.asarray(random_image(4))
  out, valid = tools.draw_line(image, (-5, 10), (20, 10))
  assert not bool(valid)
  chex.assert_trees_all_equal(out, tools.draw_line(image, (0, 10), (20, 10))[0])
  assert not bool(tools.draw_line(image, (np.nan, 1), (2, 2))[1])
  assert not bool(tools.bounding_box(image, (10, 5, 300, 25))[1])
  assert not bool(tools.bounding_box(image, (30, 5, 10, 25))[1])  # x1 < x0
  assert not bool(tools.image_highlight(image, (0, 0, np.inf, 5))[1])
  assert not bool(tools.image_label(image, (70, 10))[1])
  points = np.array([[1, 1], [10, 10], [np.nan, 3]], np.float32)
  assert bool(tools.draw_path(image, points, 2)[1]), "unused points do not matter"
  assert not bool(tools.draw_path(image, points, 3)[1])
  assert not bool(tools.draw_path(image, points, 1)[1])
  with pytest.raises(ValueError, match=r"expected an image \[H, W, 3\] uint8"):
    tools.draw_line(image.astype(jnp.float32), (0, 0), (1, 1))


def test_tools_jit_and_vmap_like_single_calls():
  images = jnp.asarray(np.stack([random_image(s) for s in range(3)]))
  boxes = jnp.asarray([[1.0, 2, 30, 20], [5, 5, 50, 39], [-3, 0, 10, 10]])
  crop = lambda im, b: tools.image_crop(im, b, 12, 12)
  batched = jax.jit(jax.vmap(crop))(images, boxes)
  for i in range(3):
    chex.assert_trees_all_equal(jax.tree.map(lambda x: x[i], batched), crop(images[i], boxes[i]))
  box = lambda im, b: tools.bounding_box(im, b, (0, 0, 255), 3)
  batched = jax.vmap(box)(images, boxes)
  for i in range(3):
    chex.assert_trees_all_equal(jax.tree.map(lambda x: x[i], batched),
                                jax.jit(box)(images[i], boxes[i]))


# The public tool server (PEDIA train_tool_server, pedia/tool_definitions/functions) maps a
# coordinate c in [0, 1000] to the pixel int(c * size / 1000) and hands it to PIL, which
# clips whatever falls off the canvas: [0, 0, 1000, 1000] is the whole image for every tool.
PUBLIC_H, PUBLIC_W = 480, 640


def public_pixels(coords, width=PUBLIC_W, height=PUBLIC_H):
  return [int(int(c) * (width if i % 2 == 0 else height) / 1000) for i, c in enumerate(coords)]


def pil_drawn(image, draw):
  from PIL import Image, ImageDraw
  out = Image.fromarray(image)
  draw(ImageDraw.Draw(out))
  return np.asarray(out)


def pil_highlight(image, coords, alpha):
  from PIL import Image, ImageDraw
  base = Image.fromarray(image).convert("RGBA")
  overlay = Image.new("RGBA", base.size, (255, 255, 255, 0))
  ImageDraw.Draw(overlay).rectangle(public_pixels(coords), fill=(255, 255, 0, alpha))
  return np.asarray(Image.alpha_composite(base, overlay).convert("RGB"))


@pytest.mark.slow
@pytest.mark.parametrize("coords", [(0, 0, 1000, 1000), (123, 456, 789, 1000), (0, 310, 997, 590)])
def test_qwen_coordinates_reach_the_image_edges_like_the_public_tools(coords):
  image = np.random.default_rng(7).integers(0, 256, (PUBLIC_H, PUBLIC_W, 3), dtype=np.uint8)
  x0, y0, x1, y1 = public_pixels(coords)
  out, valid = tools.bounding_box(jnp.asarray(image), coords, (0, 128, 0), 3, scale=1000)
  assert bool(valid)
  np.testing.assert_array_equal(np.asarray(out), pil_drawn(
      image, lambda d: d.rectangle((x0, y0, x1, y1), outline=(0, 128, 0), width=3)))

  out, valid = tools.image_highlight(jnp.asarray(image), coords, (255, 255, 0), 100 / 255,
                                     scale=1000)
  assert bool(valid)
  np.testing.assert_allclose(np.asarray(out, int), pil_highlight(image, coords, 100), atol=1)

  out, valid = tools.draw_line(jnp.asarray(image), coords[:2], coords[2:], (0, 0, 255), 3,
                               scale=1000)
  assert bool(valid)
  ours = (np.asarray(out) != image).any(-1)
  pil = (pil_drawn(image, lambda d: d.line((x0, y0, x1, y1), fill=(0, 0, 255), width=3))
         != image).any(-1)
  # PIL rasterises wide lines its own way (thinner on shallow slopes than the pixels within
  # 1.5 of the segment): the same segment, between the same end pixels.
  assert (ours & pil).sum() > 0.85 * pil.sum() and ours.sum() < 1.5 * pil.sum()
  assert ours[y0, min(x0, PUBLIC_W - 1)] and ours[min(y1, PUBLIC_H - 1), min(x1, PUBLIC_W - 1)]

  out, valid = tools.image_crop(jnp.asarray(image), coords, y1 - y0, x1 - x0, scale=1000)
  assert bool(valid)
  np.testing.assert_array_equal(np.asarray(out), image[y0:y1, x0:x1])


def test_whole_image_box_is_valid_for_every_tool_at_the_papers_size():
  image = jnp.zeros((PUBLIC_H, PUBLIC_W, 3), jnp.uint8)
  whole = (0, 0, 1000, 1000)
  assert bool(tools.image_crop(image, whole, 48, 64, scale=1000)[1])
  assert bool(tools.bounding_box(image, whole, scale=1000)[1])
  assert bool(tools.image_highlight(image, whole, scale=1000)[1])
  assert bool(tools.draw_line(image, whole[:2], whole[2:], scale=1000)[1])
  assert bool(tools.draw_path(image, [[0, 0], [1000, 1000], [0, 1000]], 3, scale=1000)[1])
  assert bool(tools.image_label(image, (1000, 1000), scale=1000)[1])
  assert not bool(tools.image_label(image, (1001, 0), scale=1000)[1])
  assert bool(tools.image_label(image, (PUBLIC_W, PUBLIC_H))[1])  # pixels: the far edges
  assert not bool(tools.image_label(image, (PUBLIC_W + 0.5, 0))[1])


def test_pixel_centre_mapping_puts_the_scale_on_the_last_pixel():
  image = jnp.asarray(random_image(5))
  out, valid = tools.image_label(jnp.zeros_like(image), (1000, 1000), (1, 2, 3), 0.5,
                                 (9, 9, 9), scale=1000, pixel_map="centres")
  assert bool(valid)
  np.testing.assert_array_equal(np.argwhere(np.asarray(out)[..., 0] == 1), [[H - 1, W - 1]])
  crop, valid = tools.image_crop(image, (0, 0, 500, 500), H // 2, W // 2, scale=1000,
                                 pixel_map="centres")
  np.testing.assert_array_equal(np.asarray(crop), np.asarray(image)[:H // 2, :W // 2])
  with pytest.raises(ValueError, match="pixel_map must be one of"):
    tools.draw_line(image, (0, 0), (1, 1), scale=1000, pixel_map="round")


def test_path_waypoint_markers_match_reference():
  image = random_image(6)
  points = np.array([[5.0, 5.0], [40.0, 8.0], [30.0, 30.0], [0.0, 0.0]], np.float32)
  out, valid = tools.draw_path(jnp.asarray(image), points, 3, (0, 0, 255), 3.0,
                               marker_radius=4.0, marker_color=(255, 0, 0))
  assert bool(valid)
  line = np.zeros((H, W), bool)
  for k in range(2):
    line |= segment_distance(XX, YY, points[k], points[k + 1]) <= 1.5
  dots = np.zeros((H, W), bool)
  for k in range(3):  # the unused fourth point gets no marker
    dots |= np.hypot(XX - points[k, 0], YY - points[k, 1]) <= 4.0
  expected = paint(paint(image, line, (0, 0, 255)), dots, (255, 0, 0))
  np.testing.assert_array_equal(np.asarray(out), expected)
