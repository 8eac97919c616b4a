"""Procedural rooms: deterministic, points on the objects they claim, inside the room."""

import numpy as np
import pytest

from data_pipelines.synthetic import make_room


def test_room_is_deterministic_and_well_formed():
  a, b = make_room(3, 20_000, 5), make_room(3, 20_000, 5)
  np.testing.assert_array_equal(a.cloud.xyz, b.cloud.xyz)
  assert [o.name for o in a.objects] == [o.name for o in b.objects]
  assert a.cloud.num_points == 20_000 and len(a.objects) == 5
  xyz = np.asarray(a.cloud.xyz)
  assert (xyz >= np.array(a.bounds_min) - 1e-5).all()
  assert (xyz <= np.array(a.bounds_max) + 1e-5).all()
  instance = np.asarray(a.cloud.instance)
  assert set(np.unique(instance)) == {-1, 0, 1, 2, 3, 4}
  for obj in a.objects:
    points = xyz[instance == obj.instance]
    # Every object point lies within the object's bounding sphere around its centre.
    reach = 0.5 * np.linalg.norm(obj.size) + 1e-4
    assert np.linalg.norm(points - np.array(obj.centre), axis=1).max() <= reach + 0.06, obj
  assert not np.array_equal(make_room(4, 20_000, 5).cloud.xyz, a.cloud.xyz)


def test_room_rejects_bad_object_counts():
  with pytest.raises(ValueError, match=r"num_objects must be in \[1, 12\], got 0"):
    make_room(0, 1000, 0)


def test_orbit_cameras_look_at_the_target():
  from data_pipelines.synthetic import orbit_cameras
  cameras = orbit_cameras((1.0, 2.0, 0.5), (2.0, 1.0), 1.5, 4, 64, 48, hfov_deg=90.0)
  assert cameras.batch_shape == (4,)
  np.testing.assert_allclose(cameras.position[1], [1.0, 3.0, 1.5], atol=1e-6)
  to_target = np.array([1.0, 2.0, 0.5]) - np.asarray(cameras.position)
  to_target /= np.linalg.norm(to_target, axis=1, keepdims=True)
  np.testing.assert_allclose(cameras.forward, to_target, atol=1e-6)
  np.testing.assert_allclose(cameras.fx, 32.0, rtol=1e-6)
