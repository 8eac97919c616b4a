"""Coloured point clouds with instance ids, padded to static bucket sizes.

Reconstructions and scenes have different numbers of points. Every cloud is
padded to a bucket size (a power of two by default) with `valid=False` rows, so
one compiled program serves all clouds of a bucket.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

Array = jax.Array

MIN_BUCKET = 1024


@struct.dataclass
class PointCloud:
  """A padded point cloud.

  xyz:      [..., P, 3] float32 world coordinates
  rgb:      [..., P, 3] uint8 colours
  valid:    [..., P]    bool, False for padding
  instance: [..., P]    int32 object id, -1 for none
  """

  xyz: Array
  rgb: Array
  valid: Array
  instance: Array

  @classmethod
  def create(cls, xyz, rgb=None, valid=None, instance=None) -> "PointCloud":
    """Builds a cloud from arrays, filling defaults (grey, all valid, no instance).

    Colours may be uint8 or floats in [0, 1]. Raises ValueError naming the
    field on a wrong shape or dtype.
    """
    xyz = np.asarray(xyz) if not isinstance(xyz, jax.Array) else xyz
    if xyz.ndim < 2 or xyz.shape[-1] != 3:
      raise ValueError(f"PointCloud.xyz: expected shape [..., P, 3], got {tuple(xyz.shape)}")
    if not jnp.issubdtype(xyz.dtype, jnp.floating):
      raise ValueError(f"PointCloud.xyz: expected a float dtype, got {xyz.dtype}")
    lead = tuple(xyz.shape[:-1])
    if rgb is None:
      rgb = jnp.full(lead + (3,), 128, jnp.uint8)
    else:
      rgb = _colours_to_uint8(rgb)
    valid = jnp.ones(lead, bool) if valid is None else jnp.asarray(valid)
    instance = (jnp.full(lead, -1, jnp.int32) if instance is None
                else jnp.asarray(instance))
    if instance.dtype != jnp.int32 and jnp.issubdtype(instance.dtype, jnp.integer):
      instance = instance.astype(jnp.int32)
    cloud = cls(xyz=jnp.asarray(xyz, jnp.float32), rgb=rgb, valid=valid, instance=instance)
    validate_point_cloud(cloud)
    return cloud

  @property
  def num_points(self) -> int:
    """The padded (static) number of points P."""
    return self.xyz.shape[-2]

  def count_valid(self) -> Array:
    return jnp.sum(self.valid, axis=-1)


def _colours_to_uint8(rgb) -> Array:
  rgb = jnp.asarray(rgb)
  if rgb.dtype == jnp.uint8:
    return rgb
  if jnp.issubdtype(rgb.dtype, jnp.floating):
    return jnp.round(jnp.clip(rgb, 0.0, 1.0) * 255.0).astype(jnp.uint8)
  raise ValueError(f"PointCloud.rgb: expected uint8 or floats in [0, 1], got {rgb.dtype}")


def validate_point_cloud(cloud: PointCloud) -> None:
  """Raises ValueError naming the field whose shape or dtype is wrong."""
  if not isinstance(cloud, PointCloud):
    raise TypeError(f"expected a PointCloud, got {type(cloud).__name__}")
  xyz_shape = tuple(cloud.xyz.shape)
  if len(xyz_shape) < 2 or xyz_shape[-1] != 3:
    raise ValueError(f"PointCloud.xyz: expected shape [..., P, 3], got {xyz_shape}")
  lead = xyz_shape[:-1]
  expected = {
      "xyz": (xyz_shape, jnp.float32),
      "rgb": (lead + (3,), jnp.uint8),
      "valid": (lead, jnp.bool_),
      "instance": (lead, jnp.int32),
  }
  for name, (shape, dtype) in expected.items():
    value = getattr(cloud, name)
    if tuple(value.shape) != shape:
      raise ValueError(f"PointCloud.{name}: expected shape {shape}, got {tuple(value.shape)}")
    if value.dtype != dtype:
      raise ValueError(f"PointCloud.{name}: expected dtype {jnp.dtype(dtype).name}, "
                       f"got {value.dtype}")


def bucket_size(num_points: int, min_size: int = MIN_BUCKET) -> int:
  """The smallest power of two >= num_points (and >= min_size)."""
  if num_points < 0:
    raise ValueError(f"num_points must be >= 0, got {num_points}")
  size = max(int(min_size), 1)
  while size < num_points:
    size *= 2
  return size


def pad_to(cloud: PointCloud, size: int) -> PointCloud:
  """Pads (never truncates) the last point axis to `size` with invalid points."""
  n = cloud.num_points
  if size < n:
    raise ValueError(f"pad_to: cloud has {n} points, more than the target size {size}")
  extra = size - n
  if extra == 0:
    return cloud
  lead = tuple(cloud.xyz.shape[:-2])

  def pad(x, fill):
    widths = [(0, 0)] * len(lead) + [(0, extra)] + [(0, 0)] * (x.ndim - len(lead) - 1)
    return jnp.pad(x, widths, constant_values=fill)

  return PointCloud(xyz=pad(cloud.xyz, 0.0), rgb=pad(cloud.rgb, 0),
                    valid=pad(cloud.valid, False), instance=pad(cloud.instance, -1))


def pad_to_bucket(cloud: PointCloud, min_size: int = MIN_BUCKET) -> PointCloud:
  """Pads to `bucket_size(P)` so that clouds of similar size share one compile."""
  return pad_to(cloud, bucket_size(cloud.num_points, min_size))


def morton_order(xyz: np.ndarray, bits: int = 10) -> np.ndarray:
  """The permutation that sorts points along a Z-order (Morton) curve over their box.

  Neighbouring points in that order project to neighbouring pixels, so the
  renderer's scatters hit cache: 20-30% faster on CPU at 1M points than an
  unordered cloud. Host-side, once per scene.
  """
  xyz = np.asarray(xyz, np.float64)
  if len(xyz) == 0:
    return np.zeros(0, np.int64)
  finite = np.where(np.isfinite(xyz), xyz, 0.0)
  low, high = finite.min(0), finite.max(0)
  cells = ((finite - low) / np.maximum(high - low, 1e-12) * (2 ** bits - 1)).astype(np.uint64)
  code = np.zeros(len(xyz), np.uint64)
  for bit in range(bits):
    for axis in range(3):
      code |= ((cells[:, axis] >> np.uint64(bit)) & np.uint64(1)) << np.uint64(3 * bit + axis)
  return np.argsort(code, kind="stable")


def sort_spatially(cloud: PointCloud) -> PointCloud:
  """The same cloud with its points in Morton order (see `morton_order`)."""
  order = morton_order(np.asarray(cloud.xyz))
  return jax.tree.map(lambda x: x[order], cloud)


def concatenate(clouds: list[PointCloud]) -> PointCloud:
  """Joins clouds along the point axis (e.g. objects into a scene)."""
  if not clouds:
    raise ValueError("concatenate: got an empty list of clouds")
  return PointCloud(
      xyz=jnp.concatenate([c.xyz for c in clouds], axis=-2),
      rgb=jnp.concatenate([c.rgb for c in clouds], axis=-2),
      valid=jnp.concatenate([c.valid for c in clouds], axis=-1),
      instance=jnp.concatenate([c.instance for c in clouds], axis=-1))

def stack(clouds: list[PointCloud]) -> PointCloud:
  """Stacks clouds of equal padded size along a new leading axis (for vmap)."""
  if not clouds:
    raise ValueError("stack: got an empty list of clouds")
  sizes = {c.num_points for c in clouds}
  if len(sizes) != 1:
    raise ValueError(f"stack: clouds have different padded sizes {sorted(sizes)}; "
                     "pad them to one bucket with pad_to first")
  return jax.tree.map(lambda *xs: jnp.stack(xs), *clouds)
