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
      x = np.clip(x0 + (j + 0.5) * (x1 - x0) / out_w - 0.5, 0, W - 1)
      y = np.clip(y0 + (i + 0.5) * (y1 - y0) / out_h - 0.5, 0, H - 1)
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
