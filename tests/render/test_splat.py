"""The renderer against Open3D and against a direct numpy splatter."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspatial.geometry import Camera, PointCloud, look_at, pad_to_bucket, stack
from jaxspatial.render import Rendered, render, render_batch
from tests.render.numpy_splat import project_float32, splat_numpy

H, W = 48, 64


def random_scene(seed: int, num_points: int = 6000):
  """A blob in front of random cameras, with some points behind them and some invalid."""
  rng = np.random.default_rng(seed)
  xyz = rng.normal(0.0, 1.0, (num_points, 3)).astype(np.float32)
  xyz[: num_points // 4] *= 4.0  # a sparse halo, partly behind the cameras and off-screen
  rgb = rng.integers(0, 256, (num_points, 3), dtype=np.uint8)
  instance = rng.integers(-1, 5, num_points).astype(np.int32)
  valid = rng.uniform(size=num_points) > 0.05
  return xyz, rgb, instance, valid


def random_camera(rng: np.random.Generator) -> Camera:
  eye = rng.normal(size=3) * 1.0 + np.array([0.0, -4.0, 1.0])
  pose = look_at(eye, rng.normal(size=3) * 0.3)
  return Camera.create(rng.uniform(30, 60), rng.uniform(30, 60), rng.uniform(28, 36),
                       rng.uniform(20, 28), pose)


def unambiguous(xyz, camera: Camera, margin_px=2e-3):
  """False for points whose pixel sits within `margin_px` of a rounding boundary.

  Those may land on either pixel depending on float32 operation order, in any
  two implementations; the tests drop them rather than loosen the comparison.
  """
  e = np.asarray(camera.camera_from_world, np.float64)
  p = np.asarray(xyz, np.float64) @ e[:3, :3].T + e[:3, 3]
  with np.errstate(divide="ignore", invalid="ignore"):
    u = float(camera.fx) * p[:, 0] / p[:, 2] + float(camera.cx)
    v = float(camera.fy) * p[:, 1] / p[:, 2] + float(camera.cy)
  frac_u, frac_v = np.abs(u - np.floor(u) - 0.5), np.abs(v - np.floor(v) - 0.5)
  return (frac_u > margin_px) & (frac_v > margin_px)


def assert_rendered_equal(ours: Rendered, reference: dict):
  np.testing.assert_array_equal(np.asarray(ours.point_index), reference["point_index"])
  # Same winners; depths agree to float32 rounding (XLA may fuse multiply-adds).
  np.testing.assert_allclose(np.asarray(ours.depth), reference["depth"], rtol=1e-6, atol=0)
  np.testing.assert_array_equal(np.asarray(ours.rgb), reference["rgb"])
  np.testing.assert_array_equal(np.asarray(ours.instance), reference["instance"])


def camera_args(camera: Camera):
  return (np.asarray(camera.camera_from_world), float(camera.fx), float(camera.fy),
          float(camera.cx), float(camera.cy))


@pytest.mark.parametrize("seed", range(4))
def test_radius0_matches_open3d_project_to_depth_image(seed):
  o3d = pytest.importorskip("open3d")
  rng = np.random.default_rng(100 + seed)
  xyz, rgb, instance, valid = random_scene(seed, 20000)
  camera = random_camera(rng)
  valid &= unambiguous(xyz, camera)
  cloud = PointCloud.create(xyz, rgb, valid=valid, instance=instance)
  ours = render(cloud, camera, H, W, splat_radius=0)

  o3d_cloud = o3d.t.geometry.PointCloud(o3d.core.Tensor(xyz[valid]))
  depth_o3d = o3d_cloud.project_to_depth_image(
      W, H, o3d.core.Tensor(np.asarray(camera.intrinsic_matrix)),
      o3d.core.Tensor(np.asarray(camera.camera_from_world)), depth_scale=1.0, depth_max=1e6)
  depth_o3d = depth_o3d.as_tensor().numpy()[..., 0]

  lit_o3d = depth_o3d > 0
  assert lit_o3d.sum() > 200, "the scene should light a good part of the image"
  np.testing.assert_array_equal(np.asarray(ours.point_index) >= 0, lit_o3d)
  np.testing.assert_allclose(np.asarray(ours.depth), depth_o3d, rtol=1e-6, atol=0)


@pytest.mark.parametrize("radius", [0, 1, 2, 3])
@pytest.mark.parametrize("footprint", ["square", "disc"])
def test_matches_numpy_splatter(radius, footprint):
  rng = np.random.default_rng(radius * 10 + len(footprint))
  xyz, rgb, instance, valid = random_scene(radius, 5000)
  camera = random_camera(rng)
  valid &= unambiguous(xyz, camera)
  cloud = PointCloud.create(xyz, rgb, valid=valid, instance=instance)
  ours = render(cloud, camera, H, W, splat_radius=radius, footprint=footprint,
                background=(10, 20, 30))
  reference = splat_numpy(xyz, rgb, valid, instance, *camera_args(camera), H, W,
                          radius=radius, footprint=footprint, background=(10, 20, 30))
  assert (reference["point_index"] >= 0).sum() > 200
  assert_rendered_equal(ours, reference)


@pytest.mark.parametrize("footprint", ["square", "disc"])
def test_depth_dependent_footprint_matches_numpy_splatter(footprint):
  rng = np.random.default_rng(7)
  xyz, rgb, instance, valid = random_scene(7, 5000)
  camera = random_camera(rng)
  valid &= unambiguous(xyz, camera)
  # Per-point radii straddle the rounding thresholds of fx * r / z.
  point_radius = rng.uniform(0.0, 0.3, len(xyz)).astype(np.float32)
  z, _, _ = project_float32(xyz, *camera_args(camera))
  radius_px = np.float32(float(camera.fx)) * point_radius / z
  valid &= np.abs(radius_px - np.floor(radius_px) - 0.5) > 1e-3
  cloud = PointCloud.create(xyz, rgb, valid=valid, instance=instance)
  ours = render(cloud, camera, H, W, splat_radius=4, point_radius=point_radius,
                footprint=footprint)
  reference = splat_numpy(xyz, rgb, valid, instance, *camera_args(camera), H, W, radius=4,
                          point_radius=point_radius, footprint=footprint)
  radii = np.clip(np.round(radius_px[valid & (z > 0)]), 0, 4)
  assert len(np.unique(radii)) == 5, "the test should exercise every layer"
  assert_rendered_equal(ours, reference)


def axis_camera(fx=10.0, cx=4.5, cy=3.5) -> Camera:
  """Identity pose: camera coordinates equal world coordinates, so depths are exact."""
  return Camera.create(fx, fx, cx, cy, jnp.eye(4))


def test_nearest_point_wins_and_ties_go_to_the_lower_index():
  # u = 10 x / z + 4.5 and v = 3.5 round half away from zero: points 0-2 land on
  # (row 4, column 5), point 3 on (row 4, column 6).
  xyz = np.array([
      [0.0, 0.0, 3.0],   # 0: far
      [0.0, 0.0, 2.0],   # 1: nearest at the centre pixel, tied with 2
      [0.0, 0.0, 2.0],   # 2: same depth, higher index: loses
      [0.2, 0.0, 2.0],   # 3: same depth one pixel right: its footprint ties with 1's
  ], np.float32)
  cloud = PointCloud.create(xyz, np.arange(12, dtype=np.uint8).reshape(4, 3) * 20)
  camera = axis_camera()
  out = render(cloud, camera, 8, 10, splat_radius=0)
  assert int(out.point_index[4, 5]) == 1
  assert int(out.point_index[4, 6]) == 3
  assert float(out.depth[4, 5]) == 2.0
  np.testing.assert_array_equal(np.asarray(out.rgb[4, 5]), [60, 80, 100])
  # With 3x3 footprints the two tied points overlap on columns 5 and 6: the lower index wins.
  out = render(cloud, camera, 8, 10, splat_radius=1)
  np.testing.assert_array_equal(np.asarray(out.point_index[3:6, 4:8]),
                                [[1, 1, 1, 3]] * 3)


def test_footprint_of_points_just_outside_the_image_is_drawn():
  xyz = np.array([[-0.55, 0.0, 1.0]], np.float32)  # u = -5.5 + 4.5 = -1.0
  out = render(PointCloud.create(xyz), axis_camera(), 8, 10, splat_radius=1)
  lit = np.asarray(out.point_index) == 0
  assert lit[:, 0].sum() == 3 and lit.sum() == 3  # only column 0, rows 2-4


def test_dropped_points_behind_near_nonfinite_and_invalid():
  xyz = np.array([[0, 0, -1.0], [0, 0, 1e-4], [np.nan, 0, 1.0], [0, 0, np.inf],
                  [0.1, 0, 1.0], [0, 0, 1.0]], np.float32)
  valid = np.array([True, True, True, True, True, False])
  cloud = PointCloud.create(xyz, valid=valid)
  out = render(cloud, axis_camera(), 8, 10, splat_radius=0)
  np.testing.assert_array_equal(np.unique(np.asarray(out.point_index)), [-1, 4])


@pytest.mark.parametrize("num_points", [0, 5])
def test_empty_or_fully_invalid_cloud_renders_background(num_points):
  cloud = PointCloud.create(np.ones((num_points, 3), np.float32),
                            valid=np.zeros(num_points, bool))
  out = render(cloud, axis_camera(), 8, 10, splat_radius=2, background=(1, 2, 3))
  chex.assert_shape(out.rgb, (8, 10, 3))
  assert (np.asarray(out.rgb) == [1, 2, 3]).all()
  assert (np.asarray(out.depth) == 0).all()
  assert (np.asarray(out.point_index) == -1).all()
  assert (np.asarray(out.instance) == -1).all()


def batch_of_cameras(num: int, seed: int = 0) -> Camera:
  rng = np.random.default_rng(seed)
  cams = [random_camera(rng) for _ in range(num)]
  return jax.tree.map(lambda *x: jnp.stack(x), *cams)


def single(tree, i):
  return jax.tree.map(lambda x: x[i], tree)


@pytest.mark.parametrize("kwargs", [dict(splat_radius=0), dict(splat_radius=1),
                                    dict(splat_radius=3, point_radius=0.05, footprint="disc")])
@pytest.mark.slow
@pytest.mark.xla_default
def test_vmap_jit_and_batch_equal_single_calls(kwargs):
  xyz, rgb, instance, valid = random_scene(3, 3000)
  clouds = stack([PointCloud.create(xyz + k, rgb, valid=valid, instance=instance)
                  for k in range(3)])
  cameras = batch_of_cameras(3)
  expected = [[render(single(clouds, c), single(cameras, v), H, W, **kwargs)
               for v in range(3)] for c in range(3)]

  def check(batched, pairs):
    for out_index, (c, v) in enumerate(pairs):
      chex.assert_trees_all_equal(single(batched, out_index), expected[c][v])

  one_cloud = single(clouds, 0)
  draw = lambda cloud, cam: render(cloud, cam, H, W, **kwargs)
  check(jax.vmap(draw, in_axes=(None, 0))(one_cloud, cameras), [(0, v) for v in range(3)])
  check(jax.vmap(draw)(clouds, cameras), [(i, i) for i in range(3)])
  check(jax.jit(jax.vmap(draw, in_axes=(0, None)))(clouds, single(cameras, 1)),
        [(c, 1) for c in range(3)])
  check(render_batch(one_cloud, cameras, H, W, **kwargs), [(0, v) for v in range(3)])
  check(render_batch(clouds, cameras, H, W, **kwargs), [(i, i) for i in range(3)])
  chex.assert_trees_all_equal(jax.jit(draw)(one_cloud, single(cameras, 2)), expected[0][2])
  # Nested: every cloud from every camera, in either order of the vmaps.
  grid = jax.vmap(jax.vmap(draw, in_axes=(None, 0)), in_axes=(0, None))(clouds, cameras)
  for c in range(3):
    check(single(grid, c), [(c, v) for v in range(3)])
  # A vmap over render_batch folds into the same program.
  grid = jax.vmap(lambda cam: render_batch(clouds, jax.tree.map(lambda x: jnp.stack([x] * 3),
                                                                cam), H, W, **kwargs))(cameras)
  for v in range(3):
    check(single(grid, v), [(c, v) for c in range(3)])


def test_bad_inputs_name_what_is_wrong():
  cloud = PointCloud.create(np.zeros((4, 3), np.float32))
  camera = axis_camera()
  with pytest.raises(ValueError, match=r"PointCloud.xyz: expected shape \[\.\.\., P, 3\], got \(4, 2\)"):
    PointCloud.create(np.zeros((4, 2), np.float32))
  with pytest.raises(ValueError, match="PointCloud.rgb: expected dtype uint8, got int32"):
    render(cloud.replace(rgb=jnp.zeros((4, 3), jnp.int32)), camera, 8, 8)
  with pytest.raises(ValueError, match=r"PointCloud.valid: expected shape \(4,\), got \(5,\)"):
    render(cloud.replace(valid=jnp.ones(5, bool)), camera, 8, 8)
  with pytest.raises(ValueError, match="PointCloud.instance: expected dtype int32, got float32"):
    render(cloud.replace(instance=jnp.zeros(4, jnp.float32)), camera, 8, 8)
  with pytest.raises(ValueError, match=r"one camera with world_from_camera \[4, 4\], got \(2, 4, 4\)"):
    render(cloud, batch_of_cameras(2), 8, 8)
  with pytest.raises(ValueError, match="height must be a positive int, got 0"):
    render(cloud, camera, 0, 8)
  with pytest.raises(ValueError, match="splat_radius must be an int >= 0, got -1"):
    render(cloud, camera, 8, 8, splat_radius=-1)
  with pytest.raises(ValueError, match="footprint must be 'square' or 'disc', got 'round'"):
    render(cloud, camera, 8, 8, footprint="round")
  with pytest.raises(ValueError, match=r"point_radius must be a scalar or \[P\]=4, got shape \(3,\)"):
    render(cloud, camera, 8, 8, point_radius=np.ones(3))
  with pytest.raises(ValueError, match="background must be 3 values"):
    render(cloud, camera, 8, 8, background=(0, 0))
  with pytest.raises(ValueError, match=r"3 clouds for 2 cameras"):
    render_batch(stack([cloud] * 3), batch_of_cameras(2), 8, 8)
  with pytest.raises(ValueError, match=r"render_batch: expected cameras with pose \[V, 4, 4\]"):
    render_batch(cloud, camera, 8, 8)


def test_compiles_once_per_bucket():
  """Clouds padded to one size share a compiled program; a new size compiles anew."""
  from jaxspatial.render import splat
  camera = axis_camera()
  splat._render_jit.clear_cache()
  for n in (10, 20, 30):
    cloud = PointCloud.create(np.random.default_rng(n).normal(size=(n, 3)).astype(np.float32))
    render(pad_to_bucket(cloud, min_size=64), camera, 8, 8)
  assert splat._render_jit._cache_size() == 1
  render(pad_to_bucket(PointCloud.create(np.ones((65, 3), np.float32)), min_size=64),
         camera, 8, 8)
  assert splat._render_jit._cache_size() == 2


@pytest.mark.xla_default
def test_view_groups_give_the_same_images(monkeypatch):
  """Accelerators render big batches as groups of one flat scatter; any grouping is exact."""
  from jaxspatial.render import splat
  assert splat._views_per_scatter(12, 100) == 12
  monkeypatch.setattr(splat, "MAX_SCATTER_SLOTS", 401)
  assert splat._views_per_scatter(12, 100) == 4
  assert splat._views_per_scatter(7, 100) == 1
  xyz, rgb, instance, valid = random_scene(5, 2000)
  cloud = PointCloud.create(xyz, rgb, valid=valid, instance=instance)
  cameras = batch_of_cameras(6, seed=5)
  views, points = splat._core_args(cloud, cameras, (255, 255, 255), 1e-3, None, 6)
  render_views = functools.partial(splat._render_views, height=H, width=W, splat_radius=1,
                                   depth_dependent=False, footprint="square")
  expected = render_batch(cloud, cameras, H, W, splat_radius=1)
  for group_size in (1, 2, 3, 6):
    out = jax.jit(functools.partial(splat._map_over_view_groups, render_views,
                                    group_size=group_size))(views, points)
    chex.assert_trees_all_equal(out, expected)
  per_view = stack([cloud] * 6)
  views, points = splat._core_args(per_view, cameras, (255, 255, 255), 1e-3, None, 6)
  out = splat._map_over_view_groups(render_views, views, points, group_size=3)
  chex.assert_trees_all_equal(out, expected)
