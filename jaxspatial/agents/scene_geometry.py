"""Where SpatialClaw's `Reconstruct` gets its scene: per-frame depth and camera geometry from
a scene's stored depth (`DepthGeometry`), a stored cloud (`CloudGeometry`) or a learned
reconstructor (`ModelGeometry`), and the gravity-aligned world frame (`gravity_alignment`)
the tools report in (agents/tools.py's docstring gives the frame)."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Sequence

import numpy as np

from jaxspatial.errors import ToolArgumentError
from jaxspatial.geometry.unproject import unproject_depth

PI3_PIXELS = 255_000       # Pi3's input budget (its own loader's)
DA3_MODEL = "DA3NESTED-GIANT-LARGE"   # the paper's Reconstruct model

@dataclasses.dataclass(frozen=True)
class FrameGeometry:
  """Per-frame geometry in a source's own world: depth [n, H, W] (0 = unknown), points
  [n, H, W, 3] (world), intrinsics [n, 3, 3], c2w [n, 4, 4] (OpenCV axes)."""
  depth: np.ndarray
  points: np.ndarray
  intrinsics: np.ndarray
  c2w: np.ndarray
  up: np.ndarray | None        # the source's up axis, when known
  floor: float | None          # the ground's height along `up`, when known
  metric: bool


def _intrinsic_matrices(cameras) -> np.ndarray:
  fx, fy = np.asarray(cameras.fx, np.float32), np.asarray(cameras.fy, np.float32)
  cx, cy = np.asarray(cameras.cx, np.float32), np.asarray(cameras.cy, np.float32)
  k = np.zeros(fx.shape + (3, 3), np.float32)
  k[..., 0, 0], k[..., 1, 1], k[..., 0, 2], k[..., 1, 2], k[..., 2, 2] = fx, fy, cx, cy, 1.0
  return k


def _take_cameras(cameras, indices: Sequence[int]):
  import jax  # pylint: disable=import-outside-toplevel
  index = np.asarray(indices)
  return jax.tree.map(lambda x: np.asarray(x)[index], cameras)


def _render_cloud(cloud, cameras, height: int, width: int, splat_radius: int = 1):
  """(point_index [n, H, W], depth [n, H, W]) of a PointCloud seen by cameras [n]."""
  from jaxspatial.render import render_batch  # pylint: disable=import-outside-toplevel
  out = render_batch(cloud, cameras, height, width, splat_radius=splat_radius)
  return np.array(out.point_index), np.array(out.depth, np.float32)  # writable copies


def _cloud_points(cloud, index_NxHxW: np.ndarray, depth: np.ndarray) -> np.ndarray:
  xyz = np.asarray(cloud.xyz, np.float32)
  points = xyz[np.maximum(index_NxHxW, 0)]
  points[index_NxHxW < 0] = 0.0
  depth[index_NxHxW < 0] = 0.0
  return points


class DepthGeometry:
  """Stored depth maps and cameras of the task's frames (the synthetic scenes'). `up` and
  `floor`: the world's up axis and the floor's height along it (the synthetic set: +z,
  0); `metric`: depths in metres."""

  def __init__(self, depths_NxHxW, cameras, up=(0.0, 0.0, 1.0), floor: float | None = 0.0,
               metric: bool = True):
    self.depths = np.asarray(depths_NxHxW, np.float32)
    self.cameras = cameras
    self.up = None if up is None else np.asarray(up, np.float64)
    self.floor, self.metric = floor, bool(metric)
    if self.depths.ndim != 3:
      raise ValueError(f"DepthGeometry: depths must be [N, H, W], got {self.depths.shape}")
    if tuple(np.shape(cameras.world_from_camera)) != (len(self.depths), 4, 4):
      raise ValueError(f"DepthGeometry: expected {len(self.depths)} cameras, got pose shape "
                       f"{tuple(np.shape(cameras.world_from_camera))}")

  def frames(self, frames_NxHxWx3: np.ndarray, indices: Sequence[int]) -> FrameGeometry:
    if self.depths.shape[1:] != frames_NxHxWx3.shape[1:3]:
      raise ToolArgumentError("Reconstruct: the stored depth maps do not match the frames' size")
    index = np.asarray(indices)
    depth = np.where(np.isfinite(self.depths[index]), self.depths[index], 0.0).astype(
        np.float32)
    k = _intrinsic_matrices(self.cameras)[index]
    c2w = np.asarray(self.cameras.world_from_camera, np.float32)[index]
    points = np.empty(depth.shape + (3,), np.float32)
    for i, z in enumerate(depth):
      points[i] = unproject_depth(z, k[i], c2w[i])
      points[i][z <= 0] = 0.0  # no depth: 0, as in the other sources
    return FrameGeometry(depth, points, k, c2w, self.up, self.floor, self.metric)


class CloudGeometry:
  """A stored cloud (`PointCloud`) and the frames' cameras (`Camera` [N]): each frame's
  depth and point map are the cloud rendered into its camera (nearest point per pixel)."""

  def __init__(self, cloud, cameras, metric: bool = False, splat_radius: int = 1):
    self.cloud, self.cameras, self.metric = cloud, cameras, bool(metric)
    self.splat_radius = int(splat_radius)

  def frames(self, frames_NxHxWx3: np.ndarray, indices: Sequence[int]) -> FrameGeometry:
    if not bool(np.asarray(self.cloud.valid).any()):
      raise ToolArgumentError("Reconstruct: this task's stored point cloud is empty")
    height, width = frames_NxHxWx3.shape[1:3]
    cameras = _take_cameras(self.cameras, indices)
    index, depth = _render_cloud(self.cloud, cameras, height, width, self.splat_radius)
    points = _cloud_points(self.cloud, index, depth)
    return FrameGeometry(depth, points, _intrinsic_matrices(cameras),
                         np.asarray(cameras.world_from_camera, np.float32), None, None,
                         self.metric)


def pi3_input_size(height: int, width: int, pixels: int = PI3_PIXELS,
                   patch: int = 14) -> tuple[int, int]:
  """(H, W) Pi3 is fed for a frame of (height, width), as Pi3's own loader sizes it: the
  frame scaled to `pixels` (up or down), each side rounded to a multiple of `patch`, then
  the side whose rounding overshot the aspect ratio trimmed by a patch until the area fits."""
  scale = math.sqrt(pixels / (height * width))
  target_w, target_h = width * scale, height * scale
  cols, rows = max(1, round(target_w / patch)), max(1, round(target_h / patch))
  while cols * rows * patch * patch > pixels and (cols > 1 or rows > 1):
    if rows == 1 or (cols > 1 and cols / rows > target_w / target_h):
      cols -= 1
    else:
      rows -= 1
  return rows * patch, cols * patch


def check_model_folder(backend: str, checkpoint) -> str:
  """The local model folder (or file) of a named reconstruction backend; a clear error
  when it is not set or not there, naming what to download and the options that run."""
  model = {"da3": f"Depth Anything 3 ({DA3_MODEL}, the paper's Reconstruct model: "
                  f"huggingface.co/depth-anything/{DA3_MODEL})",
           "pi3": "Pi3 (huggingface.co/yyfz233/Pi3)",
           "vggt": "VGGT (huggingface.co/facebook/VGGT-1B)"}.get(backend, repr(backend))
  path = "" if checkpoint is None else os.fspath(checkpoint)
  where = ("no model folder is set" if not path else
           f"its model folder {path} does not exist")
  if path and os.path.exists(path):
    return path
  error = FileNotFoundError if path else ValueError
  raise error(
      f"tools.Reconstruct: backend {backend!r} needs {model}, but {where}. Download it and "
      f"pass its folder (reconstruction.checkpoint=..., ModelGeometry(checkpoint=...)), or "
      f"pick a backend that runs without it: reconstruction.backend='stored' (the "
      f"benchmark's stored clouds and cameras), 'pi3' with a Pi3 checkpoint, or 'none'")


class ModelGeometry:
  """A reconstructor run on the requested frames (`perception.reconstruct`): a named
  backend ("da3", the paper's default, "pi3", "vggt") from the local `checkpoint` (checked
  here: a missing folder is a clear error at once, not at the first call), or an object
  with reconstruct(frames) -> Reconstruction. Its fused cloud is rendered into its cameras
  for per-frame depth and points.

  Pi3 is fed frames resized (PIL Lanczos) to `pi3_input_size` within `pi3_pixels`
  (255,000, Pi3's own loader) in RGB, as Pi3 itself reads images; `pi3_pixels=None` and
  `channel_order="bgr"` give Think3D's feed (sides rounded up to multiples of 14, BGR).
  Cameras come back at the frames' own size either way."""

  def __init__(self, backend="da3", checkpoint=None, device: str = "cpu", metric: bool = False,
               splat_radius: int = 1, pi3_pixels: int | None = PI3_PIXELS, **options):
    if isinstance(backend, str):
      checkpoint = check_model_folder(backend, checkpoint)
    self.backend, self.checkpoint, self.device = backend, checkpoint, device
    self.metric, self.splat_radius, self.options = bool(metric), int(splat_radius), options
    self.pi3_pixels = pi3_pixels
    if backend == "pi3":
      self.options.setdefault("channel_order", "rgb")

  def frames(self, frames_NxHxWx3: np.ndarray, indices: Sequence[int]) -> FrameGeometry:
    # pylint: disable-next=import-outside-toplevel
    from jaxspatial.perception.reconstruction import frame_intrinsics, reconstruct
    from jaxspatial.geometry import Camera  # pylint: disable=import-outside-toplevel
    chosen = np.ascontiguousarray(frames_NxHxWx3[np.asarray(indices)])
    height, width = chosen.shape[1:3]
    keywords = dict(self.options)
    if isinstance(self.backend, str):
      keywords.update(checkpoint=self.checkpoint, device=self.device)
    fed = chosen
    if self.backend == "pi3" and self.pi3_pixels:
      size = pi3_input_size(height, width, self.pi3_pixels)
      if size != (height, width):
        from PIL import Image  # pylint: disable=import-outside-toplevel
        fed = np.stack([np.asarray(Image.fromarray(f).resize(size[::-1], Image.LANCZOS),
                                   np.uint8) for f in chosen])
    cloud, cameras = reconstruct(fed, self.backend, **keywords)
    if fed is not chosen:  # the cameras at the frames' own size
      k = frame_intrinsics(_intrinsic_matrices(cameras), (height, width),
                           (*fed.shape[1:3], 0, 0))
      cameras = Camera.from_matrices(k, np.asarray(cameras.world_from_camera, np.float32))
    index, depth = _render_cloud(cloud, cameras, height, width, self.splat_radius)
    points = _cloud_points(cloud, index, depth)
    return FrameGeometry(depth, points, _intrinsic_matrices(cameras),
                         np.asarray(cameras.world_from_camera, np.float32), None, None,
                         self.metric)


def _unit(v: np.ndarray) -> np.ndarray | None:
  norm = float(np.linalg.norm(v))
  return None if norm < 1e-9 or not math.isfinite(norm) else v / norm


def gravity_alignment(c2w_Nx4x4: np.ndarray, points_Mx3: np.ndarray | None = None,
                      up=None, floor: float | None = None) -> np.ndarray:
  """The 4x4 transform from a source's world to ours (+Y up, the first camera at X = Z = 0
  facing -Z, the ground at Y = 0; see the module doc)."""
  c2w = np.asarray(c2w_Nx4x4, np.float64)
  up_v = _unit(np.asarray(up, np.float64)) if up is not None else None
  if up_v is None:
    up_v = _unit(-c2w[:, :3, 1].sum(0))
  if up_v is None:
    up_v = -c2w[0, :3, 1]
  forward = c2w[0, :3, 2] - (c2w[0, :3, 2] @ up_v) * up_v
  forward = _unit(forward)
  if forward is None:  # looking straight up or down: the camera's own down axis instead
    forward = _unit(c2w[0, :3, 1] - (c2w[0, :3, 1] @ up_v) * up_v)
  if forward is None:
    helper = np.eye(3)[int(np.argmin(np.abs(up_v)))]
    forward = _unit(helper - (helper @ up_v) * up_v)
  z_axis = -forward
  x_axis = np.cross(up_v, z_axis)
  rotation = np.stack([x_axis, up_v, z_axis])  # rows: new axes in old coordinates
  origin = c2w[0, :3, 3]
  if floor is None:
    if points_Mx3 is not None and len(points_Mx3):
      floor = float(np.percentile(points_Mx3 @ up_v, 2.0))
    else:
      floor = float(origin @ up_v)
  origin = origin - (origin @ up_v - floor) * up_v
  transform = np.eye(4)
  transform[:3, :3] = rotation
  transform[:3, 3] = -rotation @ origin
  return transform


def apply_transform(transform: np.ndarray, points: np.ndarray) -> np.ndarray:
  return (points @ transform[:3, :3].T.astype(np.float32)
          + transform[:3, 3].astype(np.float32)).astype(np.float32)
