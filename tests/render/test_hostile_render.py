"""Hostile inputs to the cameras and the renderer: bad values are refused in Python, before
tracing, with an error naming the argument; under jit, where values are tracers, the
renderer itself never draws a point at negative depth. A fuzz of a few hundred mutated
render calls checks each either renders a sound image (against the numpy projection) or
raises ValueError / TypeError naming what is wrong.

Every call that renders reuses the same static arguments (size, radius, footprint), so
the file compiles a few programs only."""

import numpy as np
import jax
import jax.numpy as jnp
import pytest

from jaxspatial.geometry import (Camera, PointCloud, intrinsics_from_fov, look_at,
                                 validate_camera)
from jaxspatial.render import render, render_batch
from jaxspatial.render import splat
from tests.render.numpy_splat import project_float32, splat_numpy

H, W = 8, 10


def axis_camera(fx=10.0, cx=4.5, cy=3.5) -> Camera:
  return Camera.create(fx, fx, cx, cy, jnp.eye(4))


def test_near_at_or_behind_the_camera_is_refused_and_never_draws_negative_depth():
  # Point 0 is behind the camera (z = -1) on the same ray as point 1 (z = 2). With near <=
  # 0 the old renderer kept it, and its negative depth won the z-buffer over point 1.
  xyz = np.array([[0.0, 0.0, -1.0], [0.0, 0.0, 2.0]], np.float32)
  cloud = PointCloud.create(xyz)
  for near in (0.0, -2.0, -np.inf, np.nan, np.inf):
    with pytest.raises(ValueError, match=r"render: near must be a finite distance > 0, got"):
      render(cloud, axis_camera(), H, W, splat_radius=0, near=near)
  with pytest.raises(ValueError, match=r"render: near must be a real scalar"):
    render(cloud, axis_camera(), H, W, splat_radius=0, near=np.ones(2))
  # Under jit near is a tracer, unseen by Python: the renderer keeps positive depths only.
  traced = jax.jit(lambda near: render(cloud, axis_camera(), H, W, splat_radius=0, near=near))
  out = traced(jnp.float32(-2.0))
  reference = splat_numpy(xyz, np.asarray(cloud.rgb), np.ones(2, bool), -np.ones(2, np.int32),
                          np.eye(4), 10.0, 10.0, 4.5, 3.5, H, W, radius=0, near=0.0)
  np.testing.assert_array_equal(np.asarray(out.point_index), reference["point_index"])
  assert np.asarray(out.point_index)[4, 5] == 1 and float(out.depth[4, 5]) == 2.0
  assert (np.asarray(out.depth) >= 0).all()


@pytest.mark.parametrize("fov", [-90.0, -1e-3, 0.0, 180.0, 250.0, np.nan, np.inf])
def test_fields_of_view_that_mirror_or_collapse_the_image_are_refused(fov):
  with pytest.raises(ValueError, match=r"hfov_deg: expected a field of view in \(0, 180\) "
                                       r"degrees, got"):
    intrinsics_from_fov(fov, 64, 48)
  with pytest.raises(ValueError, match=r"hfov_deg: expected a field of view"):
    Camera.from_fov(np.asarray([60.0, fov]), 64, 48, np.stack([np.eye(4)] * 2))


def test_fields_of_view_inside_the_range_give_the_pinhole_focal_length():
  for fov in (1.0, 60.0, 90.0, 179.0):
    fx, fy, cx, cy = (float(v) for v in intrinsics_from_fov(fov, 64, 48))
    np.testing.assert_allclose(fx, 32.0 / np.tan(np.radians(fov) / 2), rtol=1e-5)
    assert fx == fy and fx > 0 and (cx, cy) == (31.5, 23.5)


def test_huge_radii_and_sizes_are_refused_naming_the_argument():
  cloud = PointCloud.create(np.zeros((4, 3), np.float32))
  with pytest.raises(ValueError, match=r"render: splat_radius must be at most "
                                       r"MAX_SPLAT_RADIUS = 64 pixels, got 1000000"):
    render(cloud, axis_camera(), H, W, splat_radius=10 ** 6)
  with pytest.raises(ValueError, match=r"render: splat_radius must be at most"):
    render_batch(cloud, Camera.create(
        np.full(2, 10.0), np.full(2, 10.0), np.full(2, 4.5), np.full(2, 3.5),
        np.stack([np.eye(4)] * 2)), H, W, splat_radius=65)
  # Within the radius cap, buffers past MAX_VIEW_SLOTS (int32 slots, 1 GiB) are refused
  # before any memory is taken.
  with pytest.raises(ValueError, match=r"render: height 20000 x width 20000 with splat_radius "
                                       r"64 needs .* more than MAX_VIEW_SLOTS"):
    render(cloud, axis_camera(), 20000, 20000, splat_radius=64)
  with pytest.raises(ValueError, match=r"with splat_radius 40 needs 388942400 z-buffer slots "
                                       r"per view \(41 layer\(s\)"):  # 41 x 3080 x 3080
    render(cloud, axis_camera(), 3000, 3000, splat_radius=40, point_radius=0.1)


def test_cameras_with_unusable_values_are_refused_naming_the_field():
  cloud = PointCloud.create(np.zeros((4, 3), np.float32))
  camera = axis_camera()
  cases = [
      (camera.replace(fx=jnp.float32(np.nan)), r"Camera.fx: expected finite values, got nan"),
      (camera.replace(fy=jnp.float32(-10.0)), r"Camera.fy: expected a focal length > 0 pixels, "
                                              r"got -10.0"),
      (camera.replace(fx=jnp.float32(0.0)), r"Camera.fx: expected a focal length > 0"),
      (camera.replace(cy=jnp.float32(np.inf)), r"Camera.cy: expected finite values, got inf"),
      (camera.replace(world_from_camera=jnp.eye(4).at[0, 3].set(np.nan)),
       r"Camera.world_from_camera: expected finite values, got nan"),
      (camera.replace(world_from_camera=jnp.diag(jnp.asarray([1.0, 1.0, -1.0, 1.0]))),
       r"Camera.world_from_camera: expected a rigid pose .* det R = -1"),   # a mirror
      (camera.replace(world_from_camera=jnp.diag(jnp.asarray([2.0, 2.0, 2.0, 1.0]))),
       r"Camera.world_from_camera: expected a rigid pose .* \|R\^T R - I\| = 3"),  # a scale
  ]
  for bad, message in cases:
    with pytest.raises(ValueError, match=message):
      render(cloud, bad, H, W)
  poses = np.stack([np.eye(4)] * 3)
  poses[2, :3, :3] *= 0.5
  with pytest.raises(ValueError, match=r"Camera.world_from_camera: expected a rigid pose "
                                       r".* at \(2,\)"):
    render_batch(cloud, Camera.create(10.0, 10.0, 4.5, 3.5, poses), H, W)
  with pytest.raises(ValueError, match=r"render: point_radius must be finite and >= 0, "
                                       r"got -0.5"):
    render(cloud, camera, H, W, point_radius=-0.5)
  with pytest.raises(TypeError, match=r"render_batch: expected a Camera, got dict"):
    render_batch(cloud, {"fx": 1.0}, H, W)
  # A proper rotation from look_at, and float32 round-off, pass.
  validate_camera(Camera.create(10.0, 10.0, 4.5, 3.5, look_at([1.0, 2.0, 3.0], [0.3, 0.1, 0.0])))


# ----------------------------------------------------------------------------- fuzz

FIELD_NAMES = ("Camera.", "near", "splat_radius", "height", "width", "background",
               "point_radius", "footprint", "PointCloud.", "hfov_deg")
POINTS = 64


def _scene(rng):
  xyz = rng.normal(0.0, 1.0, (POINTS, 3)).astype(np.float32) + np.float32([0, 0, 4])
  xyz[:8, 2] = -rng.uniform(0.1, 3, 8)  # behind the camera
  rgb = rng.integers(0, 256, (POINTS, 3), dtype=np.uint8)
  return PointCloud.create(xyz, rgb, valid=rng.uniform(size=POINTS) > 0.1,
                           instance=rng.integers(-1, 4, POINTS).astype(np.int32))


BAD_FLOATS = (np.nan, np.inf, -np.inf, 0.0, -1.0, -1e30, 1e30, 1e-30)


def _one(rng, options):
  return options[rng.integers(len(options))]


def _mutate(rng, cloud):
  """(kwargs for render, what was mutated): one to three fields of a good call mutated.
  Static arguments (size, radius, footprint) take only the base value or bad ones, so the
  calls that render share one compiled program per point_radius mode."""
  fx, fy, cx, cy = 12.0, 11.0, 4.5, 3.5
  eye = rng.normal(size=3) * 0.3
  pose = np.asarray(look_at(eye, eye + np.float32([0, 0, 1]) + rng.normal(size=3) * 0.2,
                            up=(0.0, -1.0, 0.0)))
  call = dict(cloud=cloud, fx=fx, fy=fy, cx=cx, cy=cy, pose=pose, height=H, width=W,
              splat_radius=1, background=(255, 255, 255), point_radius=None,
              footprint="square", near=1e-3)
  mutated = []
  for _ in range(rng.integers(1, 3)):
    field = str(rng.choice(["fx", "fy", "cx", "cy", "pose", "near", "height", "width",
                            "splat_radius", "background", "point_radius", "footprint",
                            "xyz", "cx_large"]))
    mutated.append(field)
    if field in ("fx", "fy", "cx", "cy"):
      call[field] = float(rng.choice(BAD_FLOATS + tuple(rng.uniform(-50, 50, 4))))
    elif field == "cx_large":
      call["cx"] = float(rng.uniform(-1e6, 1e6))  # finite: everything off-screen is fine
    elif field == "pose":
      choice = rng.integers(5)
      pose = call["pose"].copy()
      if choice == 0:
        pose[rng.integers(3), rng.integers(4)] = rng.choice([np.nan, np.inf])
      elif choice == 1:
        pose[:3, :3] *= rng.uniform(0.2, 3.0)  # a scale
      elif choice == 2:
        pose[:3, 0] *= -1  # a mirror
      elif choice == 3:
        pose[:3, 3] = rng.choice([1e30, -1e30, 1e6])  # far away, finite
      else:
        pose[:3, :3] += rng.normal(size=(3, 3)) * 1e-4  # float round-off: accepted
      call["pose"] = pose
    elif field == "near":
      call["near"] = _one(rng, [np.nan, np.inf, 0.0, -1.0, -1e-9, 1e-6, 2.0, 50.0, "far", None,
                                np.ones(2)])
    elif field in ("height", "width"):
      call[field] = _one(rng, [0, -3, 8.0, 10 ** 9, "8", None, True])
    elif field == "splat_radius":
      call["splat_radius"] = _one(rng, [-1, 65, 10 ** 9, 1.5, True, "1", None])
    elif field == "background":
      call["background"] = _one(rng, [(0, 0), (256, 0, 0), (-1, 0, 0), (np.nan, 0, 0),
                                      (0.5, 0, 0), 7, None, "red", (0, 0, 0)])
    elif field == "point_radius":
      call["point_radius"] = _one(rng, [-1.0, np.nan, np.inf, np.ones(3), np.full(POINTS, -0.1),
                                        "big", 0.05, np.full(POINTS, 0.02, np.float32)])
    elif field == "footprint":
      call["footprint"] = _one(rng, ["round", None, 3, "SQUARE"])
    elif field == "xyz":
      xyz = np.asarray(cloud.xyz).copy()
      xyz[rng.integers(POINTS, size=4)] = rng.choice([np.nan, np.inf, -np.inf, 1e30], (4, 3))
      call["cloud"] = cloud.replace(xyz=jnp.asarray(xyz))  # bad points are dropped, not errors
  return call, mutated


def _raised_here(error) -> bool:
  """Whether the error was raised by our validation, not deep inside JAX or NumPy."""
  tb = error.__traceback__
  while tb.tb_next is not None:
    tb = tb.tb_next
  return "/jaxspatial/" in tb.tb_frame.f_code.co_filename


def test_fuzz_render_calls_render_soundly_or_raise_naming_the_argument():
  rng = np.random.default_rng(0)
  cloud = _scene(rng)
  rendered = raised = 0
  programs = splat._render_jit._cache_size()
  for case in range(300):
    call, mutated = _mutate(rng, cloud)
    camera = Camera(fx=jnp.float32(call["fx"]), fy=jnp.float32(call["fy"]),
                    cx=jnp.float32(call["cx"]), cy=jnp.float32(call["cy"]),
                    world_from_camera=jnp.asarray(call["pose"], jnp.float32))
    try:
      out = render(call["cloud"], camera, call["height"], call["width"], call["splat_radius"],
                   call["background"], point_radius=call["point_radius"],
                   footprint=call["footprint"], near=call["near"])
    except (ValueError, TypeError) as error:
      message = str(error)
      assert any(name in message for name in FIELD_NAMES), (case, mutated, message)
      assert _raised_here(error), (case, mutated, message)
      raised += 1
      continue
    rendered += 1
    index, depth = np.asarray(out.point_index), np.asarray(out.depth)
    assert index.shape == (H, W) and np.isfinite(depth).all(), (case, mutated)
    covered = index >= 0
    assert (index < POINTS).all() and ((depth > 0) == covered).all(), (case, mutated)
    # Each drawn pixel shows a valid point in front of the near plane, at its camera depth.
    xyz = np.asarray(call["cloud"].xyz)
    with np.errstate(all="ignore"):  # the bad points' own NaN and overflow
      z, _, _ = project_float32(xyz, np.asarray(camera.camera_from_world), call["fx"],
                                call["fy"], call["cx"], call["cy"])
    hit = index[covered]
    assert np.asarray(call["cloud"].valid)[hit].all(), (case, mutated)
    np.testing.assert_allclose(depth[covered], z[hit], rtol=1e-5, err_msg=str(mutated))
    assert (z[hit] > float(call["near"])).all(), (case, mutated)
    np.testing.assert_array_equal(np.asarray(out.rgb)[covered], np.asarray(cloud.rgb)[hit])
    assert (np.asarray(out.rgb)[~covered] == call["background"]).all(), (case, mutated)
  # The fuzz exercised both outcomes, and compiled only the base programs (no point
  # radius, a scalar one, one per point).
  print(f"{rendered} rendered, {raised} refused")
  assert rendered > 60 and raised > 120, (rendered, raised)
  assert splat._render_jit._cache_size() - programs <= 3
