"""Point cloud creation, validation and bucket padding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspatial.geometry import (PointCloud, bucket_size, concatenate, pad_to, pad_to_bucket,
                                 stack, validate_point_cloud)


def test_create_fills_defaults_and_converts_float_colours():
  cloud = PointCloud.create(np.zeros((3, 3)), rgb=np.array([[0, 0.5, 1.0]] * 3))
  assert cloud.xyz.dtype == jnp.float32
  np.testing.assert_array_equal(cloud.rgb[0], [0, 128, 255])
  assert cloud.valid.all() and (cloud.instance == -1).all()
  assert cloud.num_points == 3 and int(cloud.count_valid()) == 3


def test_bucket_size_is_the_next_power_of_two():
  assert bucket_size(0) == 1024
  assert bucket_size(1024) == 1024
  assert bucket_size(1025) == 2048
  assert bucket_size(1_000_000) == 2 ** 20
  assert bucket_size(5, min_size=4) == 8


def test_pad_keeps_points_and_marks_padding_invalid():
  cloud = PointCloud.create(np.ones((5, 3)), instance=np.arange(5))
  padded = pad_to_bucket(cloud, min_size=8)
  assert padded.num_points == 8
  np.testing.assert_array_equal(padded.valid, [True] * 5 + [False] * 3)
  np.testing.assert_array_equal(padded.instance, [0, 1, 2, 3, 4, -1, -1, -1])
  validate_point_cloud(padded)
  with pytest.raises(ValueError, match="cloud has 5 points, more than the target size 4"):
    pad_to(cloud, 4)


def test_stack_and_concatenate():
  a = PointCloud.create(np.zeros((4, 3)))
  b = PointCloud.create(np.ones((4, 3)), instance=np.full(4, 2))
  both = concatenate([a, b])
  assert both.num_points == 8 and int(both.instance[-1]) == 2
  batch = stack([a, b])
  assert batch.xyz.shape == (2, 4, 3)
  assert jax.vmap(lambda c: c.count_valid())(batch).tolist() == [4, 4]
  with pytest.raises(ValueError, match=r"different padded sizes \[4, 8\]"):
    stack([a, both])


def test_validation_names_the_field():
  with pytest.raises(ValueError, match="PointCloud.xyz: expected a float dtype, got int64"):
    PointCloud.create(np.zeros((2, 3), np.int64))
  with pytest.raises(ValueError, match=r"PointCloud.rgb: expected uint8 or floats"):
    PointCloud.create(np.zeros((2, 3)), rgb=np.zeros((2, 3), np.int32))
  with pytest.raises(ValueError, match=r"PointCloud.rgb: expected shape \(2, 3\), got \(3, 3\)"):
    PointCloud.create(np.zeros((2, 3)), rgb=np.zeros((3, 3), np.uint8))
  with pytest.raises(TypeError, match="expected a PointCloud, got dict"):
    validate_point_cloud({})


def test_sort_spatially_is_a_permutation_that_groups_neighbours():
  from jaxspatial.geometry import morton_order, sort_spatially
  rng = np.random.default_rng(0)
  xyz = rng.uniform(0, 1, (4096, 3)).astype(np.float32)
  order = morton_order(xyz)
  np.testing.assert_array_equal(np.sort(order), np.arange(4096))
  step = np.linalg.norm(np.diff(xyz[order], axis=0), axis=1)
  random_step = np.linalg.norm(np.diff(xyz, axis=0), axis=1)
  assert np.median(step) < 0.2 * np.median(random_step)
  cloud = PointCloud.create(xyz, instance=np.arange(4096))
  sorted_cloud = sort_spatially(cloud)
  np.testing.assert_array_equal(sorted_cloud.instance, order)
  np.testing.assert_array_equal(sorted_cloud.xyz, xyz[order])
  assert len(morton_order(np.zeros((0, 3)))) == 0
