"""Think3D point-cloud caches and 3DThinker VGGT feature files: round trips and named errors."""

import numpy as np
import pytest

from data_pipelines.caches import (CacheFormatError, read_think3d_cache, read_vggt_features,
                                   vggt_feature_path, write_think3d_cache, write_vggt_features)
from data_pipelines.synthetic import make_room, orbit_cameras


def test_think3d_cache_round_trip(tmp_path):
  room = make_room(0, 3000, 3)
  cameras = orbit_cameras((3.0, 2.5, 0.5), 2.0, 1.5, 3, 32, 24)
  path = tmp_path / "scene.npz"
  write_think3d_cache(path, room.cloud, cameras.world_from_camera, ["a.png", "b.png", "c.png"])
  with np.load(path) as raw:  # the published keys and dtypes
    assert raw["points"].dtype == np.float32 and raw["points"].shape == (3000, 3)
    assert raw["colors"].max() <= 1.0 and raw["camera_poses"].shape == (3, 4, 4)
  cloud, poses, images = read_think3d_cache(path)
  np.testing.assert_array_equal(cloud.xyz, room.cloud.xyz)
  np.testing.assert_array_equal(cloud.rgb, room.cloud.rgb)
  np.testing.assert_allclose(poses, cameras.world_from_camera)
  assert images == ["a.png", "b.png", "c.png"]
  assert [p.name for p in tmp_path.iterdir()] == ["scene.npz"], "no temporary files left"


def test_think3d_cache_errors(tmp_path):
  path = tmp_path / "bad.npz"
  np.savez(path, points=np.zeros((5, 2)), colors=np.zeros((5, 3)),
           camera_poses=np.zeros((1, 4, 4)), image_paths=np.array(["x"]))
  with pytest.raises(CacheFormatError, match=r"bad.npz: key 'points' has shape \(5, 2\), "
                                             r"expected \('N', 3\)"):
    read_think3d_cache(path)
  np.savez(path, points=np.zeros((5, 3)), colors=np.zeros((5, 3)))
  with pytest.raises(CacheFormatError, match=r"missing key\(s\) \['camera_poses', 'image_paths'\]"):
    read_think3d_cache(path)
  np.savez(path, points=np.zeros((5, 3)), colors=np.full((5, 3), 200.0),
           camera_poses=np.zeros((1, 4, 4)), image_paths=np.array(["x"]))
  with pytest.raises(CacheFormatError, match=r"'colors' must lie in \[0, 1\]"):
    read_think3d_cache(path)
  (tmp_path / "junk.npz").write_bytes(b"not a zip")
  with pytest.raises(CacheFormatError, match="not a readable .npz file"):
    read_think3d_cache(tmp_path / "junk.npz")
  with pytest.raises(FileNotFoundError, match="cache file not found"):
    read_think3d_cache(tmp_path / "none.npz")


def test_vggt_features_round_trip_and_errors(tmp_path):
  rng = np.random.default_rng(0)
  feature = rng.normal(size=(2, 1374, 2048)).astype(np.float32)
  path = write_vggt_features(tmp_path, 17, feature)
  assert path == tmp_path / "feature_vggt" / "17" / "vggt.npz"
  with np.load(path) as raw:
    assert raw["feature"].shape == (1, 2, 1374, 2048)
  np.testing.assert_allclose(read_vggt_features(tmp_path, 17), feature, rtol=1e-3, atol=1e-3)
  write_vggt_features(tmp_path, 18, np.zeros((1, 1, 1041, 2048)))
  with pytest.raises(CacheFormatError, match=r"key 'feature' has shape \(1, 1, 1041, 2048\), "
                                             r"expected \(1, 'N', 1374, 2048\)"):
    read_vggt_features(tmp_path, 18)
  assert read_vggt_features(tmp_path, 18, tokens=1041).shape == (1, 1041, 2048)
  with pytest.raises(FileNotFoundError, match=str(vggt_feature_path(tmp_path, 99))):
    read_vggt_features(tmp_path, 99)
