"""Camera helpers against hand-computed cases."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspatial.geometry import (Camera, fov_degrees, intrinsics_from_fov, look_at, project,
                                 rigid_inverse, rotation_about_axis, stack_cameras,
                                 world_to_camera)


def test_intrinsics_from_fov_90_degrees():
  fx, fy, cx, cy = intrinsics_from_fov(90.0, 100, 60)
  np.testing.assert_allclose([fx, fy, cx, cy], [50.0, 50.0, 49.5, 29.5], rtol=1e-6)
  assert fov_degrees(float(fx), 100) == pytest.approx(90.0, rel=1e-6)
  # Think3D's ego view: 140 degrees over 1024 pixels is 186.35 px.
  fx, *_ = intrinsics_from_fov(140.0, 1024, 768)
  assert float(fx) == pytest.approx(1024 / (2 * np.tan(np.deg2rad(70))), rel=1e-6)
  assert float(fx) == pytest.approx(186.35, abs=0.01)


def test_look_at_axis_aligned():
  pose = look_at([0.0, -4.0, 1.0], [0.0, 0.0, 1.0])  # look along +y, z up
  camera = Camera.from_fov(90.0, 100, 100, pose)
  np.testing.assert_allclose(camera.forward, [0, 1, 0], atol=1e-6)
  np.testing.assert_allclose(camera.right, [1, 0, 0], atol=1e-6)
  np.testing.assert_allclose(camera.down, [0, 0, -1], atol=1e-6)
  np.testing.assert_allclose(camera.position, [0, -4, 1], atol=1e-6)
  # A point 1 m to the right and 1 m above the target: right of centre, above it.
  u, v, z = project(camera, jnp.array([[1.0, 0.0, 2.0]]))
  np.testing.assert_allclose([u[0], v[0], z[0]], [49.5 + 50 / 4, 49.5 - 50 / 4, 4.0], rtol=1e-6)


def test_look_at_is_a_rotation_even_straight_down():
  for eye, target in [([0, 0, 5.0], [0, 0, 0.0]), ([1, 2, 3.0], [-2, 0.5, 1.0]),
                      ([0, 0, -5.0], [0, 0, 0.0])]:
    rotation = np.asarray(look_at(eye, target))[:3, :3]
    assert np.isfinite(rotation).all()
    np.testing.assert_allclose(rotation.T @ rotation, np.eye(3), atol=1e-6)
    assert np.linalg.det(rotation) == pytest.approx(1.0, abs=1e-6)
    direction = np.asarray(target) - np.asarray(eye)
    np.testing.assert_allclose(rotation[:, 2], direction / np.linalg.norm(direction), atol=1e-6)


def test_look_at_batched():
  eyes = np.array([[0, -4, 1.0], [4, 0, 1.0]])
  poses = look_at(eyes, np.zeros((2, 3)))
  chex.assert_shape(poses, (2, 4, 4))
  chex.assert_trees_all_close(poses[1], look_at(eyes[1], np.zeros(3)), atol=1e-6)


def test_rotation_about_axis():
  quarter_z = rotation_about_axis([0, 0, 1.0], np.pi / 2)
  np.testing.assert_allclose(quarter_z @ np.array([1.0, 0, 0]), [0, 1, 0], atol=1e-6)
  quarter_x = rotation_about_axis([2.0, 0, 0], np.pi / 2)  # axis need not be unit length
  np.testing.assert_allclose(quarter_x @ np.array([0, 1.0, 0]), [0, 0, 1], atol=1e-6)
  batch = rotation_about_axis(np.tile([0, 0, 1.0], (3, 1)), np.array([0.0, np.pi, 2 * np.pi]))
  np.testing.assert_allclose(batch[1], np.diag([-1.0, -1.0, 1.0]), atol=1e-6)
  np.testing.assert_allclose(batch[2], np.eye(3), atol=1e-6)


def test_rigid_inverse_and_world_to_camera():
  rng = np.random.default_rng(0)
  pose = np.asarray(look_at(rng.normal(size=3) * 3, rng.normal(size=3)))
  np.testing.assert_allclose(np.asarray(rigid_inverse(pose)) @ pose, np.eye(4), atol=1e-5)
  camera = Camera.create(100.0, 100.0, 50.0, 40.0, pose)
  points = rng.normal(size=(5, 3)).astype(np.float32)
  expected = (np.linalg.inv(pose) @ np.c_[points, np.ones(5)].T).T[:, :3]
  np.testing.assert_allclose(world_to_camera(camera, points), expected, atol=1e-5)


def test_camera_pytree_jit_and_vmap():
  poses = look_at(np.array([[0, -4, 1.0], [4, 0, 1.0], [0, 4, 2.0]]), np.zeros((3, 3)))
  cameras = Camera.from_fov(np.array([60.0, 70.0, 80.0]), 64, 48, poses)
  assert cameras.batch_shape == (3,)
  positions = jax.jit(jax.vmap(lambda c: c.position))(cameras)
  np.testing.assert_allclose(positions[2], [0, 4, 2], atol=1e-6)
  singles = [jax.tree.map(lambda x, i=i: x[i], cameras) for i in range(3)]
  chex.assert_trees_all_equal(stack_cameras(singles), cameras)
  np.testing.assert_allclose(cameras.intrinsic_matrix[1],
                             [[cameras.fx[1], 0, 31.5], [0, cameras.fy[1], 23.5], [0, 0, 1]])
  k = np.array([[100.0, 0, 31.0], [0, 90.0, 22.0], [0, 0, 1]])
  camera = Camera.from_matrices(k, np.eye(4))
  np.testing.assert_allclose(camera.intrinsic_matrix, k)


def test_camera_create_rejects_bad_shapes():
  with pytest.raises(ValueError, match=r"world_from_camera: expected shape \[\.\.\., 4, 4\], got \(3, 4\)"):
    Camera.create(1.0, 1.0, 0.0, 0.0, np.eye(4)[:3])
  with pytest.raises(ValueError, match=r"Camera.fx: expected shape \(2,\)"):
    Camera.create(np.ones(3), 1.0, 0.0, 0.0, np.tile(np.eye(4), (2, 1, 1)))
  with pytest.raises(ValueError, match="image size must be positive"):
    intrinsics_from_fov(60.0, 0, 10)
