"""Open3D reconstruction of a rendered synthetic room lies close to the ground truth."""

import numpy as np
import pytest
from scipy.spatial import cKDTree

from data_pipelines.synthetic import make_room, orbit_cameras
from jaxspatial.render import render_batch

pytest.importorskip("open3d")
from data_pipelines.reconstruct import reconstruct  # noqa: E402


def chamfer(a: np.ndarray, b: np.ndarray) -> float:
  """Symmetric mean nearest-neighbour distance."""
  return 0.5 * (cKDTree(b).query(a)[0].mean() + cKDTree(a).query(b)[0].mean())


@pytest.fixture(scope="module")
def rendered_room():
  room = make_room(5, 150_000, num_objects=5)
  centre = np.array(room.bounds_max) / 2
  cameras = orbit_cameras((centre[0], centre[1], 0.6), (2.0, 1.6), 1.6, 8, 320, 240, 80.0)
  # Per-pixel depth like a sensor's: one point per pixel, no splat footprint.
  views = render_batch(room.cloud, cameras, 240, 320, splat_radius=0)
  return room, cameras, views


# Measured: unproject 0.86 cm, tsdf 1.53 cm (2 cm voxels; truth points 2-3 cm apart).
@pytest.mark.slow
@pytest.mark.parametrize("method,limit", [("unproject", 0.015), ("tsdf", 0.025)])
def test_fused_cloud_is_near_the_ground_truth(rendered_room, method, limit):
  room, cameras, views = rendered_room
  cloud = reconstruct(np.asarray(views.rgb), np.asarray(views.depth), cameras, method=method,
                      voxel_size=0.02)
  xyz = np.asarray(cloud.xyz)[np.asarray(cloud.valid)]
  assert len(xyz) > 5000 and cloud.num_points % 1024 == 0
  # Ground truth: the room's points that some camera saw.
  seen = np.unique(np.asarray(views.point_index))
  truth = np.asarray(room.cloud.xyz)[seen[seen >= 0]]
  distance = chamfer(xyz, truth)
  print(f"{method}: {len(xyz)} points, chamfer {distance * 100:.2f} cm")
  assert distance < limit
  # Colours come along: the fused cloud is not grey.
  assert np.asarray(cloud.rgb)[np.asarray(cloud.valid)].std() > 10


def test_bad_inputs(rendered_room):
  _, cameras, views = rendered_room
  with pytest.raises(ValueError, match=r"depths must be \[V, H, W\]"):
    reconstruct(np.asarray(views.rgb), np.asarray(views.depth)[:, :10], cameras)
  with pytest.raises(ValueError, match=r"images must be \[V, H, W, 3\] uint8"):
    reconstruct(np.asarray(views.rgb).astype(np.float32), np.asarray(views.depth), cameras)
  with pytest.raises(ValueError, match="method must be 'unproject' or 'tsdf'"):
    reconstruct(np.asarray(views.rgb), np.asarray(views.depth), cameras, method="poisson")
