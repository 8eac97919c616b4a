"""Think3D's RL cache written from a reconstructor's `Reconstruction` (no model needed)."""

import numpy as np
import pytest

from data_pipelines.caches import read_think3d_cache, write_reconstruction_cache
from jaxspatial.perception.reconstruction import Reconstruction


def reconstruction(valid):
  xyz = np.arange(15, dtype=np.float32).reshape(5, 3) / 4
  rgb = np.array([[0, 0, 0], [255, 0, 0], [7, 128, 9], [1, 2, 3], [255, 255, 255]], np.uint8)
  poses = np.tile(np.eye(4, dtype=np.float32), (2, 1, 1))
  poses[1, :3, 3] = [0.5, -1.0, 2.0]
  return Reconstruction(xyz=xyz, rgb=rgb, valid=np.asarray(valid, bool), cameras_c2w=poses,
                        intrinsics=None, image_size=(4, 6))


def test_only_valid_points_are_written_with_the_cameras(tmp_path):
  recon = reconstruction([True, False, True, True, False])
  path = write_reconstruction_cache(tmp_path / "deep" / "scene.npz", recon)
  assert path == tmp_path / "deep" / "scene.npz"
  cloud, poses, paths = read_think3d_cache(path)
  keep = recon.valid
  np.testing.assert_array_equal(np.asarray(cloud.xyz), recon.xyz[keep])
  np.testing.assert_array_equal(np.asarray(cloud.rgb), recon.rgb[keep])  # via [0, 1], exactly
  np.testing.assert_array_equal(poses, recon.cameras_c2w)
  assert paths == ["", ""]  # one (empty) image path per camera when none are given
  assert sorted(p.name for p in path.parent.iterdir()) == ["scene.npz"]  # no temporary left


def test_image_paths_must_match_the_cameras(tmp_path):
  with pytest.raises(ValueError, match=r"3 image paths for 2 camera poses"):
    write_reconstruction_cache(tmp_path / "scene.npz", reconstruction([True] * 5),
                               ["a.jpg", "b.jpg", "c.jpg"])
  assert not (tmp_path / "scene.npz").exists()
