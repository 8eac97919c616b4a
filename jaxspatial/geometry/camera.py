"""Pinhole cameras in the OpenCV convention (x right, y down, z forward).

A `Camera` holds intrinsics in pixels and `world_from_camera`, the 4x4
camera-to-world pose. A world point `p` maps to camera coordinates
`p_cam = R^T (p - t)` with `R, t` the rotation and translation of
`world_from_camera`, and to the pixel `u = fx * x / z + cx`, `v = fy * y / z + cy`.

Every field may carry leading batch axes (`fx` of shape `[B]`, pose `[B, 4, 4]`),
so a stack of cameras is one pytree that `jax.vmap` maps over.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

Array = jax.Array


@struct.dataclass
class Camera:
  """A pinhole camera: intrinsics in pixels and the camera-to-world pose."""

  fx: Array
  fy: Array
  cx: Array
  cy: Array
  world_from_camera: Array  # [..., 4, 4] float32, camera-to-world

  @classmethod
  def create(cls, fx, fy, cx, cy, world_from_camera) -> "Camera":
    """Builds a camera, casting to float32 and checking shapes."""
    pose = jnp.asarray(world_from_camera, jnp.float32)
    if pose.ndim < 2 or pose.shape[-2:] != (4, 4):
      raise ValueError(
          f"Camera.world_from_camera: expected shape [..., 4, 4], got {pose.shape}")
    batch = pose.shape[:-2]
    fields = {}
    for name, value in (("fx", fx), ("fy", fy), ("cx", cx), ("cy", cy)):
      value = jnp.asarray(value, jnp.float32)
      if value.shape != batch:
        value = jnp.broadcast_to(value, batch) if value.ndim == 0 else value
      if value.shape != batch:
        raise ValueError(
            f"Camera.{name}: expected shape {batch} to match world_from_camera "
            f"{pose.shape}, got {value.shape}")
      fields[name] = value
    return cls(world_from_camera=pose, **fields)

  @classmethod
  def from_fov(cls, hfov_deg, width: int, height: int, world_from_camera) -> "Camera":
    """A camera with square pixels whose image spans `hfov_deg` horizontally."""
    fx, fy, cx, cy = intrinsics_from_fov(hfov_deg, width, height)
    return cls.create(fx, fy, cx, cy, world_from_camera)

  @classmethod
  def from_matrices(cls, intrinsic_3x3, world_from_camera) -> "Camera":
    """A camera from a 3x3 intrinsic matrix K and a camera-to-world pose."""
    k = jnp.asarray(intrinsic_3x3, jnp.float32)
    if k.shape[-2:] != (3, 3):
      raise ValueError(f"intrinsic matrix: expected shape [..., 3, 3], got {k.shape}")
    return cls.create(k[..., 0, 0], k[..., 1, 1], k[..., 0, 2], k[..., 1, 2],
                      world_from_camera)

  @property
  def batch_shape(self) -> tuple[int, ...]:
    return tuple(self.world_from_camera.shape[:-2])

  @property
  def intrinsic_matrix(self) -> Array:
    """K, shape [..., 3, 3]."""
    zero, one = jnp.zeros_like(self.fx), jnp.ones_like(self.fx)
    rows = [
        jnp.stack([self.fx, zero, self.cx], -1),
        jnp.stack([zero, self.fy, self.cy], -1),
        jnp.stack([zero, zero, one], -1),
    ]
    return jnp.stack(rows, -2)

  @property
  def camera_from_world(self) -> Array:
    """The world-to-camera transform (OpenCV extrinsic), shape [..., 4, 4]."""
    return rigid_inverse(self.world_from_camera)

  @property
  def position(self) -> Array:
    """Camera centre in world coordinates, shape [..., 3]."""
    return self.world_from_camera[..., :3, 3]

  @property
  def forward(self) -> Array:
    """Unit viewing direction (+z of the camera) in world coordinates, [..., 3]."""
    return self.world_from_camera[..., :3, 2]

  @property
  def right(self) -> Array:
    """+x of the camera in world coordinates, [..., 3]."""
    return self.world_from_camera[..., :3, 0]

  @property
  def down(self) -> Array:
    """+y of the camera (image down) in world coordinates, [..., 3]."""
    return self.world_from_camera[..., :3, 1]

  def with_pose(self, world_from_camera) -> "Camera":
    return self.replace(world_from_camera=jnp.asarray(world_from_camera, jnp.float32))


def round_half_away(x: Array) -> Array:
  """Rounds half away from zero (2.5 -> 3, -2.5 -> -3), as C's `round` and Open3D do."""
  return jnp.where(x >= 0, jnp.floor(x + 0.5), jnp.ceil(x - 0.5))


def intrinsics_from_fov(hfov_deg, width: int, height: int):
  """(fx, fy, cx, cy) for square pixels and a horizontal field of view.

  The image spans the pixel edges `[-0.5, width - 0.5]`, so the principal point
  is the geometric centre `((width - 1) / 2, (height - 1) / 2)` and
  `fx = width / (2 tan(hfov / 2))`.
  """
  if width <= 0 or height <= 0:
    raise ValueError(f"image size must be positive, got width={width}, height={height}")
  check_fov("hfov_deg", hfov_deg)
  hfov = jnp.deg2rad(jnp.asarray(hfov_deg, jnp.float32))
  fx = width / (2.0 * jnp.tan(hfov / 2.0))
  return fx, fx, jnp.full_like(fx, (width - 1) / 2.0), jnp.full_like(fx, (height - 1) / 2.0)


def concrete(value) -> np.ndarray | None:
  """`value` as a numpy array when it is known on the host, None for a tracer (under jit or
  vmap values are checked on device, if at all, never pulled back to the host)."""
  if isinstance(value, jax.core.Tracer):
    return None
  if isinstance(value, jax.Array) and not value.is_fully_addressable:
    return None  # a multi-host global array: each process holds only its part
  try:
    return np.asarray(value)
  except (TypeError, ValueError):
    return None


def check_fov(name: str, fov_deg) -> None:
  """A field of view must lie in (0, 180) degrees: 0 or less collapses or mirrors the
  image, 180 or more puts the focal length at 0 or below. Concrete values only."""
  value = concrete(fov_deg)
  if value is None:
    return
  if not np.issubdtype(value.dtype, np.number) or np.issubdtype(value.dtype, np.complexfloating):
    raise TypeError(f"{name}: expected a real number of degrees, got dtype {value.dtype}")
  bad = ~(np.isfinite(value) & (value > 0) & (value < 180))
  if bad.any():
    raise ValueError(f"{name}: expected a field of view in (0, 180) degrees, got "
                     f"{value[bad].reshape(-1)[0].item()!r}")


ROTATION_TOLERANCE = 1e-2  # |R^T R - I| and |det R - 1|; float32 poses are far closer


def validate_camera(camera: "Camera", name: str = "Camera") -> None:
  """Raises ValueError naming the field when a camera's concrete values are unusable:
  non-finite numbers, focal lengths <= 0 (a mirrored or collapsed image), or a pose whose
  rotation is not a proper rotation (a mirror or a scale: `world_to_camera` inverts it as
  rigid). Fields that are tracers (under jit or vmap) are skipped."""
  if not isinstance(camera, Camera):
    raise TypeError(f"{name}: expected a Camera, got {type(camera).__name__}")
  for field in ("fx", "fy", "cx", "cy", "world_from_camera"):
    value = concrete(getattr(camera, field))
    if value is None:
      continue
    if not np.issubdtype(value.dtype, np.floating):
      raise ValueError(f"{name}.{field}: expected a float dtype, got {value.dtype}")
    finite = np.isfinite(value)
    if not finite.all():
      raise ValueError(f"{name}.{field}: expected finite values, got "
                       f"{value[~finite].reshape(-1)[0].item()!r}")
    if field in ("fx", "fy") and not (value > 0).all():
      raise ValueError(f"{name}.{field}: expected a focal length > 0 pixels, got "
                       f"{value[~(value > 0)].reshape(-1)[0].item()!r}")
    if field == "world_from_camera":
      if value.ndim < 2 or value.shape[-2:] != (4, 4):
        raise ValueError(f"{name}.world_from_camera: expected shape [..., 4, 4], got "
                         f"{value.shape}")
      rotation = value[..., :3, :3].astype(np.float64)
      gram = np.einsum("...ji,...jk->...ik", rotation, rotation)
      error = np.abs(gram - np.eye(3)).max(axis=(-1, -2))
      det = np.linalg.det(rotation)
      bad = (error > ROTATION_TOLERANCE) | (np.abs(det - 1.0) > ROTATION_TOLERANCE)
      if bad.any():
        where = np.argwhere(np.atleast_1d(bad))[0]
        at = "" if bad.ndim == 0 else f" at {tuple(int(i) for i in where)}"
        raise ValueError(
            f"{name}.world_from_camera: expected a rigid pose (rotation with R^T R = I, "
            f"det R = +1, within {ROTATION_TOLERANCE}){at}, got |R^T R - I| = "
            f"{np.atleast_1d(error)[tuple(where)]:.3g}, det R = "
            f"{np.atleast_1d(det)[tuple(where)]:.3g}")


def matmul(a: Array, b: Array) -> Array:
  """a @ b in full float32: on TPU and H100/H200 a default-precision float32 matmul runs in
  bf16 / TF32 passes, which moves a composed camera pose by ~1e-3."""
  return jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)


def rigid_inverse(transform_4x4: Array) -> Array:
  """Inverse of rigid transforms [..., 4, 4] without a general matrix inverse."""
  rotation = transform_4x4[..., :3, :3]
  translation = transform_4x4[..., :3, 3]
  rotation_t = jnp.swapaxes(rotation, -1, -2)
  inv_translation = -jnp.einsum("...ij,...j->...i", rotation_t, translation,
                                precision=jax.lax.Precision.HIGHEST)
  return make_transform(rotation_t, inv_translation)


def make_transform(rotation_3x3: Array, translation_3: Array) -> Array:
  """Stacks a rotation [..., 3, 3] and translation [..., 3] into [..., 4, 4]."""
  rotation_3x3 = jnp.asarray(rotation_3x3, jnp.float32)
  translation_3 = jnp.asarray(translation_3, jnp.float32)
  top = jnp.concatenate([rotation_3x3, translation_3[..., None]], -1)
  bottom = jnp.broadcast_to(jnp.asarray([0.0, 0.0, 0.0, 1.0], jnp.float32),
                            top.shape[:-2] + (1, 4))
  return jnp.concatenate([top, bottom], -2)


def _normalize(v: Array, eps: float = 1e-12) -> Array:
  return v / jnp.maximum(jnp.linalg.norm(v, axis=-1, keepdims=True), eps)


def look_at(eye, target, up=(0.0, 0.0, 1.0)) -> Array:
  """Camera-to-world pose of a camera at `eye` looking at `target`.

  The image's down axis points along `-up` as far as possible (no roll). When
  the view direction is parallel to `up`, the camera's down axis is taken from
  the world axis least aligned with the view direction, so the result is always
  a proper rotation (never NaN).
  """
  eye = jnp.asarray(eye, jnp.float32)
  target = jnp.asarray(target, jnp.float32)
  up = jnp.broadcast_to(jnp.asarray(up, jnp.float32), eye.shape)
  forward = _normalize(target - eye)
  right = jnp.cross(forward, up)
  right_norm = jnp.linalg.norm(right, axis=-1, keepdims=True)
  # Fallback for a vertical view: any axis not parallel to `forward` fixes the roll.
  least_aligned = jax.nn.one_hot(jnp.argmin(jnp.abs(forward), axis=-1), 3, dtype=jnp.float32)
  fallback_right = jnp.cross(forward, least_aligned)
  right = jnp.where(right_norm > 1e-6, right, fallback_right)
  right = _normalize(right)
  down = jnp.cross(forward, right)
  rotation = jnp.stack([right, down, forward], axis=-1)
  return make_transform(rotation, eye)


def rotation_about_axis(axis, angle_rad) -> Array:
  """Right-handed rotation matrix [..., 3, 3] by `angle_rad` about `axis` (Rodrigues)."""
  axis = _normalize(jnp.asarray(axis, jnp.float32))
  angle = jnp.asarray(angle_rad, jnp.float32)
  axis, angle = jnp.broadcast_arrays(axis, angle[..., None])
  angle = angle[..., 0]
  x, y, z = axis[..., 0], axis[..., 1], axis[..., 2]
  c, s = jnp.cos(angle), jnp.sin(angle)
  one_c = 1.0 - c
  rows = [
      jnp.stack([c + x * x * one_c, x * y * one_c - z * s, x * z * one_c + y * s], -1),
      jnp.stack([y * x * one_c + z * s, c + y * y * one_c, y * z * one_c - x * s], -1),
      jnp.stack([z * x * one_c - y * s, z * y * one_c + x * s, c + z * z * one_c], -1),
  ]
  return jnp.stack(rows, -2)


def world_to_camera(camera: Camera, xyz_world: Array) -> Array:
  """World points [..., P, 3] in the camera frame: `E[:3, :3] p + E[:3, 3]`, E the extrinsic.

  Written as multiply-adds rather than a matmul: XLA fuses them into one pass
  over the points, where a [P, 3] x [3, 3] dot runs ~10x slower on CPU.
  """
  extrinsic = camera.camera_from_world[..., None, :, :]  # [..., 1, 4, 4]
  x, y, z = xyz_world[..., 0], xyz_world[..., 1], xyz_world[..., 2]
  rows = [extrinsic[..., i, 0] * x + extrinsic[..., i, 1] * y + extrinsic[..., i, 2] * z
          + extrinsic[..., i, 3] for i in range(3)]
  return jnp.stack(rows, axis=-1)


def project(camera: Camera, xyz_world: Array):
  """Continuous pixel coordinates and depth of world points.

  Returns `(u [..., P], v [..., P], z [..., P])`; `u = fx * x / z + cx` without
  any rounding or visibility test.
  """
  p_cam = world_to_camera(camera, xyz_world)
  z = p_cam[..., 2]
  u = camera.fx[..., None] * p_cam[..., 0] / z + camera.cx[..., None]
  v = camera.fy[..., None] * p_cam[..., 1] / z + camera.cy[..., None]
  return u, v, z


def fov_degrees(focal_px: float, size_px: int) -> float:
  """Field of view in degrees that a focal length spans over `size_px` pixels."""
  return math.degrees(2.0 * math.atan(size_px / (2.0 * focal_px)))


def stack_cameras(cameras: list[Camera]) -> Camera:
  """Stacks single cameras into one batched `Camera` (leading axis)."""
  if not cameras:
    raise ValueError("stack_cameras: got an empty list")
  return jax.tree.map(lambda *xs: jnp.stack(xs), *cameras)

