"""On-disk caches in the papers' formats.

Think3D's RL cache (`.npz`, produced before training, read by the environment):
  points (N, 3) float32 world points; colors (N, 3) floats in [0, 1];
  camera_poses (M, 4, 4) camera-to-world, OpenCV axes; image_paths (M,) strings.
`write_reconstruction_cache` writes one from a reconstructor's output
(`jaxspatial.perception.reconstruction.Reconstruction`: Pi3, VGGT, Depth-Anything-3, RGB-D).

3DThinker's VGGT target features: `<root>/feature_vggt/{idx}/vggt.npz` with key `feature`
of shape [1, N_images, tokens, channels] (reference: tokens 1374, channels 2048), written in
float16 by default since features are large.

Both writers write atomically (a temporary file in the same folder, then a rename), so a
crash never leaves a half-written cache. Readers name the file, the key and the expected
against the actual shape on bad input.
"""

from __future__ import annotations

import os
import pathlib
import tempfile
from typing import TYPE_CHECKING

import numpy as np

from jaxspatial.geometry import PointCloud
from jaxspatial import errors

if TYPE_CHECKING:  # only the annotation: writing a cache needs none of the model adapters
  from jaxspatial.perception.reconstruction import Reconstruction


class CacheFormatError(errors.InputError):
  """A cache file that does not hold what its format promises."""


def _atomic_savez(path: pathlib.Path, **arrays) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".npz")
  try:
    with os.fdopen(handle, "wb") as f:
      np.savez(f, **arrays)
    os.replace(tmp, path)
  except BaseException:
    pathlib.Path(tmp).unlink(missing_ok=True)
    raise


def _load(path: pathlib.Path, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
  if not path.is_file():
    raise FileNotFoundError(f"cache file not found: {path}")
  try:
    with np.load(path, allow_pickle=False) as data:
      missing = [k for k in keys if k not in data.files]
      if missing:
        raise CacheFormatError(f"{path}: missing key(s) {missing}; found {sorted(data.files)}")
      return {k: data[k] for k in keys}
  except (OSError, ValueError) as e:
    if isinstance(e, CacheFormatError):
      raise
    raise CacheFormatError(f"{path}: not a readable .npz file ({e})") from e


def _check_shape(path, key: str, array: np.ndarray, expected: tuple) -> None:
  """expected: a tuple of ints or None (any)."""
  ok = array.ndim == len(expected) and all(e is None or e == s
                                           for e, s in zip(expected, array.shape))
  if not ok:
    shown = tuple("N" if e is None else e for e in expected)
    raise CacheFormatError(f"{path}: key {key!r} has shape {array.shape}, expected {shown}")


def write_think3d_cache(path, cloud: PointCloud, camera_poses, image_paths=()) -> None:
  """Writes the valid points of `cloud` with the input cameras' camera-to-world poses."""
  valid = np.asarray(cloud.valid)
  poses = np.asarray(camera_poses, np.float32)
  _check_shape(path, "camera_poses", poses, (None, 4, 4))
  image_paths = np.asarray(list(image_paths) or [""] * len(poses), dtype=str)
  if len(image_paths) != len(poses):
    raise ValueError(f"write_think3d_cache: {len(image_paths)} image paths for "
                     f"{len(poses)} camera poses")
  _atomic_savez(pathlib.Path(path), points=np.asarray(cloud.xyz, np.float32)[valid],
                colors=np.asarray(cloud.rgb, np.float32)[valid] / 255.0,
                camera_poses=poses, image_paths=image_paths)


def write_reconstruction_cache(path, reconstruction: Reconstruction,
                               image_paths=()) -> pathlib.Path:
  """Writes a reconstruction's valid points (colours in [0, 1]) and its input views'
  camera-to-world poses as Think3D's RL cache, atomically; returns the path."""
  valid = np.asarray(reconstruction.valid, bool)
  cloud = PointCloud.create(np.asarray(reconstruction.xyz)[valid].reshape(-1, 3),
                            np.asarray(reconstruction.rgb)[valid].reshape(-1, 3))
  write_think3d_cache(path, cloud, reconstruction.cameras_c2w, image_paths)
  return pathlib.Path(path)


def read_think3d_cache(path) -> tuple[PointCloud, np.ndarray, list[str]]:
  """(cloud, camera_poses [M, 4, 4] camera-to-world, image paths)."""
  path = pathlib.Path(path)
  data = _load(path, ("points", "colors", "camera_poses", "image_paths"))
  points, colors, poses = data["points"], data["colors"], data["camera_poses"]
  _check_shape(path, "points", points, (None, 3))
  _check_shape(path, "colors", colors, (len(points), 3))
  _check_shape(path, "camera_poses", poses, (None, 4, 4))
  if colors.size and (colors.min() < 0 or colors.max() > 1):
    raise CacheFormatError(f"{path}: key 'colors' must lie in [0, 1], got "
                           f"[{colors.min()}, {colors.max()}]")
  cloud = PointCloud.create(points.astype(np.float32), colors.astype(np.float32))
  return cloud, poses.astype(np.float32), [str(p) for p in data["image_paths"]]


def vggt_feature_path(root, idx) -> pathlib.Path:
  return pathlib.Path(root) / "feature_vggt" / str(idx) / "vggt.npz"


def write_vggt_features(root, idx, feature, dtype=np.float16) -> pathlib.Path:
  """Writes features [N_images, tokens, channels] (or with the leading 1) for sample idx."""
  feature = np.asarray(feature)
  if feature.ndim == 3:
    feature = feature[None]
  _check_shape(vggt_feature_path(root, idx), "feature", feature, (1, None, None, None))
  path = vggt_feature_path(root, idx)
  _atomic_savez(path, feature=feature.astype(dtype))
  return path


def read_vggt_features(root, idx, tokens: int | None = 1374,
                       channels: int | None = 2048) -> np.ndarray:
  """The features of sample idx as float32 [N_images, tokens, channels]."""
  path = vggt_feature_path(root, idx)
  feature = _load(path, ("feature",))["feature"]
  _check_shape(path, "feature", feature, (1, None, tokens, channels))
  return feature[0].astype(np.float32)
