"""SpatialClaw's host tools: the callables a `Kernel` is given as `tools=`, which the
model's code reaches as `tools.<Name>(...)`. Each runs here, on the host, with the
episode's frames; arguments arrive as JSON values and numpy arrays and are checked before
any work (a `ToolError` says what is wrong; the kernel shows it to the model).

Groups (the ablations switch them off together):
  perception  Reconstruct, RenderView, RenderBEV, Segment, OCR
  vlm         VLM (a sub-question to the loop's own model), Locate
  utilities   Project, Annotate, MaskStats

World frame of `Reconstruct` (ours, after SpatialClaw's): gravity-aligned, +Y up, the
first requested frame's camera at X = Z = 0 looking along -Z (its forward direction
projected on the ground plane), the ground at Y = 0; right-handed, so +X is that camera's
right. Extrinsics are 4x4 camera-to-world in OpenCV axes (columns: right, down, forward).
How "up" and "ground" are known depends on the geometry source:
  DepthGeometry   a scene's stored depth and cameras (the synthetic set: world +Z up,
                  floor at z = 0, metres): exact, metric
  CloudGeometry   a stored cloud and input cameras (a benchmark built with Think3D caches):
                  per-frame depth rendered from the cloud; up estimated from the cameras
  ModelGeometry   a learned reconstructor (perception.reconstruct: pi3, vggt, da3, or any
                  object with reconstruct(frames)): depth rendered from its fused cloud
                  into its cameras; up estimated from the cameras
Estimated up is minus the mean of the cameras' down axes (cameras held upright, as
people film rooms); the estimated ground is the 2nd percentile of the points' heights.
`scale` is metres per world unit (1.0, with `metric` False, when the source is
scale-free). Each call is one reconstruction with its own world frame; the render tools
draw the last one.

Resource bounds: at most `max_frames` (64) frames a call and `max_output_bytes` per
result, render sizes up to 1024 x 1024, `max_vlm_calls` sub-questions per episode,
`max_images` images per sub-question.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import threading
from typing import Any, Callable, Sequence

import numpy as np

MAX_FRAMES = 64
GROUPS = {
    "perception": ("Reconstruct", "RenderView", "RenderBEV", "Segment", "OCR"),
    "vlm": ("VLM", "Locate"),
    "utilities": ("Project", "Annotate", "MaskStats"),
}
MAX_RENDER_SIDE = 1024
MAX_TEXT_CHARS = 2000


class ToolError(ValueError):
  """A tool call the tool refuses; the message is for the model."""


# --- argument checks ----------------------------------------------------------------------

def _int(value: Any, name: str, low: int | None = None, high: int | None = None) -> int:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iu":
      value = int(value)
    else:
      raise ToolError(f"{name}: expected an integer, got {type(value).__name__}")
  value = int(value)
  if (low is not None and value < low) or (high is not None and value > high):
    raise ToolError(f"{name}: {value} is out of range [{low}, {high}]")
  return value


def _float(value: Any, name: str, low: float | None = None, high: float | None = None) -> float:
  if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
    raise ToolError(f"{name}: expected a number, got {type(value).__name__}")
  value = float(value)
  if not math.isfinite(value):
    raise ToolError(f"{name}: expected a finite number, got {value}")
  if (low is not None and value < low) or (high is not None and value > high):
    raise ToolError(f"{name}: {value:g} is out of range [{low}, {high}]")
  return value


def _text(value: Any, name: str, limit: int = MAX_TEXT_CHARS) -> str:
  if not isinstance(value, str) or not value.strip():
    raise ToolError(f"{name}: expected a non-empty string")
  if len(value) > limit:
    raise ToolError(f"{name}: {len(value)} characters, over the limit of {limit}")
  return value.strip()


def _array(value: Any, name: str, shape: tuple, dtype_kind: str = "fiu") -> np.ndarray:
  """A numeric array whose shape matches `shape` (None: any size on that axis)."""
  try:
    array = np.asarray(value)
  except (ValueError, TypeError) as error:
    raise ToolError(f"{name}: not an array ({error})") from None
  if array.dtype.kind not in dtype_kind or array.ndim != len(shape) or any(
      s is not None and s != a for s, a in zip(shape, array.shape)):
    want = "x".join("N" if s is None else str(s) for s in shape)
    raise ToolError(f"{name}: expected a numeric array of shape [{want}], got "
                    f"{array.dtype} {list(array.shape)}")
  if array.dtype.kind == "f" and not np.isfinite(array).all():
    raise ToolError(f"{name}: holds NaN or infinite values")
  return array


def _image(value: Any, name: str) -> np.ndarray:
  """An RGB image as uint8 [H, W, 3] (gray [H, W] and floats in [0, 1] accepted)."""
  array = np.asarray(value)
  if array.ndim == 2:
    array = np.repeat(array[..., None], 3, axis=-1)
  if array.ndim != 3 or array.shape[-1] not in (3, 4) or min(array.shape[:2]) < 1:
    raise ToolError(f"{name}: expected an image [H, W, 3], got shape {list(array.shape)}")
  if array.shape[0] * array.shape[1] > 4096 * 4096:
    raise ToolError(f"{name}: {array.shape[1]} x {array.shape[0]} is over 4096 x 4096 pixels")
  array = array[..., :3]
  if array.dtype == np.uint8:
    return array
  if array.dtype.kind == "f":
    if not np.isfinite(array).all():
      raise ToolError(f"{name}: holds NaN or infinite values")
    scale = 255.0 if array.max(initial=0.0) <= 1.0 else 1.0
    return np.clip(np.rint(array * scale), 0, 255).astype(np.uint8)
  if array.dtype.kind in "iub":
    return np.clip(array, 0, 255).astype(np.uint8)
  raise ToolError(f"{name}: expected a numeric image, got {array.dtype}")


def frame_indices(value: Any, count: int, limit: int = MAX_FRAMES,
                  name: str = "frames") -> list[int]:
  """Distinct frame indices in [0, count): an int, a list, or None (all, if <= limit)."""
  if value is None:
    if count > limit:
      raise ToolError(f"{name}: this task has {count} frames, over the limit of {limit} "
                      f"a call; pass frames=[...] (e.g. every {math.ceil(count / limit)}th)")
    return list(range(count))
  if isinstance(value, np.ndarray):
    value = value.tolist()
  if isinstance(value, (list, tuple)):
    if not value:
      raise ToolError(f"{name}: expected at least one frame index")
    if len(value) > limit:
      raise ToolError(f"{name}: {len(value)} frames, over the limit of {limit} a call")
    out = [_int(v, f"{name}[{k}]", 0, count - 1) for k, v in enumerate(value)]
  else:
    out = [_int(value, name, 0, count - 1)]
  if len(set(out)) != len(out):
    raise ToolError(f"{name}: repeated frame indices {out}")
  return out


def _pixel_box(value: Any, height: int, width: int, name: str = "box") -> np.ndarray:
  box = _array(value, name, (4,)).astype(np.float64)
  x1, y1, x2, y2 = box
  if not (0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height):
    raise ToolError(f"{name}: expected pixels [x1, y1, x2, y2] with 0 <= x1 < x2 <= {width} "
                    f"and 0 <= y1 < y2 <= {height}, got {box.tolist()}")
  return box


def resize_long_edge(image: np.ndarray, long_edge: int | None) -> np.ndarray:
  """The image scaled (PIL bicubic, aspect kept) so its long edge is at most `long_edge`."""
  if not long_edge or max(image.shape[:2]) <= long_edge:
    return image
  from PIL import Image  # pylint: disable=import-outside-toplevel
  height, width = image.shape[:2]
  scale = long_edge / max(height, width)
  size = (max(1, round(width * scale)), max(1, round(height * scale)))
  return np.asarray(Image.fromarray(image).resize(size, Image.BICUBIC), np.uint8)


# --- geometry ------------------------------------------------------------------------------

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


def unproject(depth_NxHxW: np.ndarray, intrinsics_Nx3x3: np.ndarray,
              c2w_Nx4x4: np.ndarray) -> np.ndarray:
  """World points [N, H, W, 3] of depth maps (pixel centres at integer coordinates)."""
  n, height, width = depth_NxHxW.shape
  v, u = np.meshgrid(np.arange(height, dtype=np.float32), np.arange(width, dtype=np.float32),
                     indexing="ij")
  out = np.empty((n, height, width, 3), np.float32)
  for i in range(n):
    k = intrinsics_Nx3x3[i]
    z = depth_NxHxW[i]
    cam = np.stack([(u - k[0, 2]) / k[0, 0] * z, (v - k[1, 2]) / k[1, 1] * z, z], -1)
    out[i] = cam @ c2w_Nx4x4[i, :3, :3].T + c2w_Nx4x4[i, :3, 3]
    out[i][z <= 0] = 0.0
  return out


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
      raise ToolError("Reconstruct: the stored depth maps do not match the frames' size")
    index = np.asarray(indices)
    depth = np.where(np.isfinite(self.depths[index]), self.depths[index], 0.0).astype(
        np.float32)
    k = _intrinsic_matrices(self.cameras)[index]
    c2w = np.asarray(self.cameras.world_from_camera, np.float32)[index]
    return FrameGeometry(depth, unproject(depth, k, c2w), k, c2w, self.up, self.floor,
                         self.metric)


class CloudGeometry:
  """A stored cloud (`PointCloud`) and the frames' cameras (`Camera` [N]): each frame's
  depth and point map are the cloud rendered into its camera (nearest point per pixel)."""

  def __init__(self, cloud, cameras, metric: bool = False, splat_radius: int = 1):
    self.cloud, self.cameras, self.metric = cloud, cameras, bool(metric)
    self.splat_radius = int(splat_radius)

  def frames(self, frames_NxHxWx3: np.ndarray, indices: Sequence[int]) -> FrameGeometry:
    if not bool(np.asarray(self.cloud.valid).any()):
      raise ToolError("Reconstruct: this task's stored point cloud is empty")
    height, width = frames_NxHxWx3.shape[1:3]
    cameras = _take_cameras(self.cameras, indices)
    index, depth = _render_cloud(self.cloud, cameras, height, width, self.splat_radius)
    points = _cloud_points(self.cloud, index, depth)
    return FrameGeometry(depth, points, _intrinsic_matrices(cameras),
                         np.asarray(cameras.world_from_camera, np.float32), None, None,
                         self.metric)


class ModelGeometry:
  """A reconstructor run on the requested frames (`perception.reconstruct`): a named
  backend ("pi3", "vggt", "da3") from `checkpoint`, or an object with
  reconstruct(frames) -> Reconstruction. Its fused cloud is rendered into its cameras
  for per-frame depth and points."""

  def __init__(self, backend="pi3", checkpoint=None, device: str = "cpu", metric: bool = False,
               splat_radius: int = 1, **options):
    self.backend, self.checkpoint, self.device = backend, checkpoint, device
    self.metric, self.splat_radius, self.options = bool(metric), int(splat_radius), options

  def frames(self, frames_NxHxWx3: np.ndarray, indices: Sequence[int]) -> FrameGeometry:
    from jaxspatial.perception.reconstruction import reconstruct  # pylint: disable=import-outside-toplevel
    chosen = np.ascontiguousarray(frames_NxHxWx3[np.asarray(indices)])
    keywords = dict(self.options)
    if isinstance(self.backend, str):
      keywords.update(checkpoint=self.checkpoint, device=self.device)
    cloud, cameras = reconstruct(chosen, self.backend, **keywords)
    height, width = chosen.shape[1:3]
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


def _apply(transform: np.ndarray, points: np.ndarray) -> np.ndarray:
  return (points @ transform[:3, :3].T.astype(np.float32)
          + transform[:3, 3].astype(np.float32)).astype(np.float32)


# --- the episode's tools -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ToolLimits:
  max_frames: int = MAX_FRAMES
  max_output_bytes: int = 1 << 30
  max_vlm_calls: int = 32
  max_images: int = 64             # images per sub-question
  image_long_edge: int = 768       # sub-question images are resized to this
  vlm_max_tokens: int = 1024
  max_points: int = 1_000_000      # points kept for rendering a reconstruction
  max_project_points: int = 5_000_000


class InstanceMasks:
  """A segmenter from stored instance maps [N, H, W] (-1 = none) and object names
  {name: instance id}: a text prompt selects the objects whose name contains it (or the
  other way round); a box, the instances covering most of it. For scenes whose instance
  ids are known (the synthetic set); SAM 3 does this on real images."""

  def __init__(self, instance_NxHxW, names: dict[str, int]):
    self.instance = np.asarray(instance_NxHxW, np.int32)
    self.names = {str(k).lower(): int(v) for k, v in names.items()}

  def segment(self, frame: int, image: np.ndarray, text: str | None, box) -> list[dict]:
    del image
    ids = self.instance[frame]
    if text is not None:
      want = " ".join(text.lower().split())
      chosen = [i for n, i in self.names.items() if n and (want in n or n in want)]
    else:
      x1, y1, x2, y2 = (int(round(c)) for c in box)
      inside = ids[y1:y2, x1:x2]
      values, counts = np.unique(inside[inside >= 0], return_counts=True)
      chosen = [int(v) for v, c in zip(values, counts) if c >= 0.2 * inside.size]
    out = []
    for instance in chosen:
      mask = ids == instance
      if mask.any():
        out.append({"mask": mask, "score": 1.0})
    return out


class SAM3Segmenter:
  """SAM 3 (`perception.segmentation.SAM3Backend`) from a model folder or a backend."""

  def __init__(self, source, device: str = "cpu", score_threshold: float | None = None):
    self.source, self.device, self.score_threshold = source, device, score_threshold
    self._backend = None
    self._lock = threading.Lock()

  def backend(self):
    from jaxspatial.perception import tools as perception_tools  # pylint: disable=import-outside-toplevel
    with self._lock:
      if self._backend is None:
        if isinstance(self.source, (str, bytes)) or hasattr(self.source, "__fspath__"):
          self._backend = perception_tools.load_backend("sam3", self.source,
                                                        device=self.device)
        else:
          self._backend = self.source
      return self._backend

  def segment(self, frame: int, image: np.ndarray, text: str | None, box) -> list[dict]:
    del frame
    from jaxspatial.perception.segmentation import GRID  # pylint: disable=import-outside-toplevel
    backend = self.backend()
    height, width = image.shape[:2]
    config = dataclasses.replace(backend.config, mask_size=(height, width))
    grid_box = None
    if box is not None:
      grid_box = np.asarray([[box[0] * GRID / width, box[1] * GRID / height,
                              box[2] * GRID / width, box[3] * GRID / height]])
    out = backend.with_config(config).segment_padded(image[None], text_prompt=text,
                                                     boxes_grid_Bx4=grid_box,
                                                     score_threshold=self.score_threshold)
    return [{"mask": out["masks"][0, k], "score": float(out["scores"][0, k])}
            for k in range(int(out["count"][0]))]


class EpisodeTools:
  """The host tools of one episode over its frames (uint8 [N, H, W, 3]).

  geometry: DepthGeometry / CloudGeometry / ModelGeometry or None (Reconstruct then
  explains that none is configured); segmenter: InstanceMasks / SAM3Segmenter or None;
  ocr: an OCR backend (`perception.ocr`; None: the process's PP-OCRv4); ask: the loop's
  sub-question function `ask(question, images) -> str` or None; groups: which of GROUPS
  are offered."""

  def __init__(self, frames_NxHxWx3, *, geometry=None, segmenter=None, ocr=None,
               ask: Callable[[str, list], str] | None = None,
               groups: Sequence[str] = tuple(GROUPS), limits: ToolLimits = ToolLimits()):
    self.frames = np.asarray(frames_NxHxWx3)
    if self.frames.ndim != 4 or self.frames.shape[-1] != 3 or self.frames.dtype != np.uint8:
      raise ValueError(f"EpisodeTools: frames must be uint8 [N, H, W, 3], got "
                       f"{self.frames.dtype} {self.frames.shape}")
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
      raise ValueError(f"EpisodeTools: unknown tool groups {unknown}; expected {list(GROUPS)}")
    self.geometry, self.segmenter, self.ocr, self.ask = geometry, segmenter, ocr, ask
    self.groups, self.limits = tuple(groups), limits
    self._lock = threading.Lock()
    self._queries: list[tuple[str, str]] = []
    self._vlm_calls = 0
    self._last: dict | None = None   # the last reconstruction: cloud, cameras, bounds

  # pylint: disable=invalid-name (the tools' public names are capitalised)

  # -- what the kernel gets --

  def names(self) -> list[str]:
    return [name for group in self.groups for name in GROUPS[group]]

  def mapping(self) -> dict[str, Callable]:
    return {name: getattr(self, name) for name in self.names()}

  def take_queries(self) -> list[tuple[str, str]]:
    """The sub-questions asked since the last call (question, answer)."""
    with self._lock:
      out, self._queries = self._queries, []
    return out

  # -- perception --

  def Reconstruct(self, frames=None) -> dict:
    """Per-frame geometry of the chosen frames in a gravity-aligned world."""
    indices = frame_indices(frames, len(self.frames), self.limits.max_frames)
    if self.geometry is None:
      raise ToolError("Reconstruct: no reconstruction is configured for this run (no "
                      "stored geometry and no reconstruction backend)")
    n, (height, width) = len(indices), self.frames.shape[1:3]
    size = n * height * width * (3 * 4 + 4 + 1)
    if size > self.limits.max_output_bytes:
      raise ToolError(f"Reconstruct: {n} frames of {width} x {height} give {size >> 20} MB, "
                      f"over the limit of {self.limits.max_output_bytes >> 20} MB; pass fewer "
                      "frames")
    geometry = self.geometry.frames(self.frames, indices)
    valid = geometry.depth > 0
    sample = geometry.points[valid]
    if len(sample) > 200_000:
      sample = sample[:: len(sample) // 200_000 + 1]
    transform = gravity_alignment(geometry.c2w, sample, geometry.up, geometry.floor)
    points = _apply(transform, geometry.points.reshape(-1, 3)).reshape(geometry.points.shape)
    points[~valid] = 0.0
    c2w = (transform @ geometry.c2w.astype(np.float64)).astype(np.float32)
    colours = self.frames[np.asarray(indices)]
    # A point stands for about one pixel of its frame: its footprint in a rendered view.
    spacing = (float(np.median(geometry.depth[valid]) / np.median(geometry.intrinsics[:, 0, 0]))
               if valid.any() else 0.01)
    self._remember(points[valid], colours[valid], c2w, geometry.intrinsics, spacing)
    return {"frames": np.asarray(indices, np.int32), "points": points,
            "depth": geometry.depth.astype(np.float32), "valid": valid,
            "extrinsics": c2w, "intrinsics": geometry.intrinsics.astype(np.float32),
            "scale": 1.0, "metric": bool(geometry.metric),
            "world": "gravity-aligned: +Y up, ground at Y=0, first frame's camera at X=Z=0 "
                     "facing -Z; extrinsics camera-to-world, OpenCV axes"}

  def _remember(self, xyz, rgb, c2w, intrinsics, spacing: float) -> None:
    if len(xyz) > self.limits.max_points:
      keep = np.linspace(0, len(xyz) - 1, self.limits.max_points).astype(np.int64)
      xyz, rgb = xyz[keep], rgb[keep]
    with self._lock:
      self._last = {"xyz": np.ascontiguousarray(xyz, np.float32),
                    "rgb": np.ascontiguousarray(rgb, np.uint8), "c2w": c2w,
                    "intrinsics": intrinsics, "spacing": spacing}

  def _cloud(self, name: str):
    from jaxspatial.geometry import PointCloud, pad_to_bucket  # pylint: disable=import-outside-toplevel
    with self._lock:
      last = self._last
    if last is None:
      raise ToolError(f"{name}: nothing to render yet; call tools.Reconstruct(...) first")
    if not len(last["xyz"]):
      raise ToolError(f"{name}: the last reconstruction has no points")
    return pad_to_bucket(PointCloud.create(last["xyz"], last["rgb"])), last

  def _render(self, cloud, c2w, k, height, width, spacing: float, splat_radius: int = 6):
    from jaxspatial.geometry import Camera  # pylint: disable=import-outside-toplevel
    from jaxspatial.render import render  # pylint: disable=import-outside-toplevel
    camera = Camera.from_matrices(np.asarray(k, np.float32), np.asarray(c2w, np.float32))
    out = render(cloud, camera, height, width, splat_radius=splat_radius,
                 point_radius=float(spacing))
    return np.asarray(out.rgb), np.asarray(out.depth, np.float32)

  @staticmethod
  def _size(width, height) -> tuple[int, int]:
    return (_int(width, "width", 16, MAX_RENDER_SIDE), _int(height, "height", 16,
                                                            MAX_RENDER_SIDE))

  def RenderView(self, eye=None, target=None, extrinsics=None, width=512, height=384,
                 fov=60.0) -> dict:
    """A novel view of the last reconstruction: a camera at `eye` looking at `target`
    (world coordinates, +Y up), or a given 4x4 camera-to-world `extrinsics`."""
    from jaxspatial.geometry import intrinsics_from_fov, look_at  # pylint: disable=import-outside-toplevel
    width, height = self._size(width, height)
    fov = _float(fov, "fov", 1.0, 170.0)
    if extrinsics is not None:
      c2w = _array(extrinsics, "extrinsics", (4, 4)).astype(np.float64)
      rotation = c2w[:3, :3]
      if (not np.allclose(rotation @ rotation.T, np.eye(3), atol=1e-3)
          or np.linalg.det(rotation) < 0 or not np.allclose(c2w[3], [0, 0, 0, 1])):
        raise ToolError("extrinsics: expected a rigid 4x4 camera-to-world pose")
    else:
      if eye is None or target is None:
        raise ToolError("RenderView: give eye=[x, y, z] and target=[x, y, z], or extrinsics")
      eye_v, target_v = _array(eye, "eye", (3,)), _array(target, "target", (3,))
      if np.linalg.norm(target_v - eye_v) < 1e-6:
        raise ToolError("RenderView: eye and target coincide")
      c2w = np.asarray(look_at(eye_v, target_v, up=(0.0, 1.0, 0.0)), np.float64)
      # look_at keeps the image's down along -up: with +Y up that is our convention.
    cloud, last = self._cloud("RenderView")
    fx, fy, cx, cy = intrinsics_from_fov(fov, width, height)
    k = np.array([[float(fx), 0, float(cx)], [0, float(fy), float(cy)], [0, 0, 1]], np.float32)
    rgb, depth = self._render(cloud, c2w, k, height, width, last["spacing"])
    return {"image": rgb, "depth": depth, "intrinsics": k,
            "extrinsics": c2w.astype(np.float32)}

  def RenderBEV(self, size=512, margin=0.1, cameras=True) -> dict:
    """A top-down view of the last reconstruction: image up = -Z (the first camera's
    facing), right = +X; the input cameras drawn when `cameras`."""
    from jaxspatial.geometry import Camera, look_at  # pylint: disable=import-outside-toplevel
    side = _int(size, "size", 64, MAX_RENDER_SIDE)
    margin = _float(margin, "margin", 0.0, 1.0)
    if not isinstance(cameras, (bool, np.bool_)):
      raise ToolError("cameras: expected True or False")
    cloud, last = self._cloud("RenderBEV")
    xyz = last["xyz"]
    lo = np.minimum(xyz.min(0), last["c2w"][:, :3, 3].min(0))
    hi = np.maximum(xyz.max(0), last["c2w"][:, :3, 3].max(0))
    centre = (lo + hi) / 2
    extent = float(max(hi[0] - lo[0], hi[2] - lo[2], 1e-3)) * (1.0 + 2 * margin)
    fov = 20.0
    focal = side / 2 / math.tan(math.radians(fov) / 2)
    distance = extent / 2 / math.tan(math.radians(fov) / 2)
    eye = np.array([centre[0], hi[1] + distance, centre[2]])
    target = np.array([centre[0], hi[1], centre[2]])
    c2w = np.asarray(look_at(eye, target, up=(0.0, 0.0, -1.0)), np.float64)
    k = np.array([[focal, 0, (side - 1) / 2], [0, focal, (side - 1) / 2], [0, 0, 1]],
                 np.float32)
    rgb, depth = self._render(cloud, c2w, k, side, side, last["spacing"], splat_radius=2)
    if cameras:
      from jaxspatial.render import draw_cameras  # pylint: disable=import-outside-toplevel
      view = Camera.from_matrices(k, c2w.astype(np.float32))
      inputs = Camera.from_matrices(np.asarray(last["intrinsics"], np.float32),
                                    np.asarray(last["c2w"], np.float32))
      rgb = np.asarray(draw_cameras(rgb, view, inputs, len(last["c2w"]), 0,
                                    float(np.max(hi - lo))))
    return {"image": rgb, "depth": depth, "intrinsics": k, "extrinsics": c2w.astype(np.float32)}

  def Segment(self, frame, text=None, box=None) -> dict:
    """Instance masks in one frame by a text prompt or a pixel box [x1, y1, x2, y2]."""
    index = _int(frame, "frame", 0, len(self.frames) - 1)
    if (text is None) == (box is None):
      raise ToolError("Segment: give exactly one of text=... or box=[x1, y1, x2, y2]")
    image = self.frames[index]
    height, width = image.shape[:2]
    text = None if text is None else _text(text, "text", 200)
    box = None if box is None else _pixel_box(box, height, width)
    if self.segmenter is None:
      raise ToolError("Segment: no segmentation model is configured for this run (SAM 3 "
                      "needs a model folder)")
    found = self.segmenter.segment(index, image, text, box)
    masks = np.zeros((len(found), height, width), bool)
    scores = np.zeros(len(found), np.float32)
    boxes = np.zeros((len(found), 4), np.float32)
    for k, item in enumerate(found):
      masks[k] = item["mask"]
      scores[k] = item["score"]
      rows, cols = np.nonzero(masks[k])
      if len(rows):
        boxes[k] = [cols.min(), rows.min(), cols.max() + 1, rows.max() + 1]
    return {"masks": masks, "scores": scores, "boxes": boxes, "count": len(found)}

  def OCR(self, frame, box=None) -> dict:
    """Text lines read in one frame (optionally inside a pixel box)."""
    index = _int(frame, "frame", 0, len(self.frames) - 1)
    image = self.frames[index]
    left = top = 0
    if box is not None:
      x1, y1, x2, y2 = _pixel_box(box, *image.shape[:2])
      left, top = int(x1), int(y1)
      image = image[top:int(math.ceil(y2)), left:int(math.ceil(x2))]
    backend = self.ocr
    if backend is None:
      from jaxspatial.perception.tools import default_ocr_backend  # pylint: disable=import-outside-toplevel
      backend = default_ocr_backend()
    lines = []
    for line in backend.read(np.ascontiguousarray(image)):
      x0, y0, x1, y1 = line.bounds
      lines.append({"text": line.text[:500],
                    "box": [x0 + left, y0 + top, x1 + left, y1 + top],
                    "score": round(float(line.score), 3)})
    return {"lines": lines[:200]}

  # -- the model itself --

  def _images(self, images) -> list[np.ndarray]:
    if images is None:
      return []
    if isinstance(images, (int, np.integer)) and not isinstance(images, bool):
      images = [images]
    if isinstance(images, np.ndarray):
      images = [images] if images.ndim in (2, 3) else list(images)
    if not isinstance(images, (list, tuple)):
      raise ToolError("images: expected a list of frame indices or image arrays")
    if len(images) > self.limits.max_images:
      raise ToolError(f"images: {len(images)} images, over the limit of "
                      f"{self.limits.max_images}")
    out = []
    for k, item in enumerate(images):
      if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
        image = self.frames[_int(item, f"images[{k}]", 0, len(self.frames) - 1)]
      else:
        image = _image(item, f"images[{k}]")
      out.append(resize_long_edge(np.ascontiguousarray(image), self.limits.image_long_edge))
    return out

  def _ask(self, question: str, images: list, record: str) -> str:
    if self.ask is None:
      raise ToolError("the VLM tools are not available in this run")
    with self._lock:
      if self._vlm_calls >= self.limits.max_vlm_calls:
        raise ToolError(f"the limit of {self.limits.max_vlm_calls} VLM sub-questions in an "
                        "episode is reached")
      self._vlm_calls += 1
    answer = self.ask(question, images)
    answer = answer if isinstance(answer, str) else str(answer)
    with self._lock:
      self._queries.append((record, answer))
    return answer

  def VLM(self, question, images=None) -> str:
    """A sub-question to the model about some frames or images; its text reply."""
    question = _text(question, "question")
    return self._ask(question, self._images(images), question)

  def Locate(self, frame, description) -> dict:
    """Where `description` is in one frame: {"visible", "point" (0-1000 grid), "pixel"}."""
    index = _int(frame, "frame", 0, len(self.frames) - 1)
    description = _text(description, "description", 300)
    image = self.frames[index]
    prompt = (f"Find this in the image: {description}\nReply with its centre as (x, y) on "
              "a 0-1000 grid over the image's width and height, e.g. (512, 300), or with "
              "NOT VISIBLE if it is not in the image. Reply with nothing else.")
    answer = self._ask(prompt, self._images([index]), f"Locate in frame {index}: {description}")
    point = locate_point(answer)
    if point is None:
      return {"visible": False, "point": None, "pixel": None, "reply": answer[:200]}
    height, width = image.shape[:2]
    return {"visible": True, "point": [point[0], point[1]],
            "pixel": [point[0] * width / 1000.0, point[1] * height / 1000.0]}

  # -- utilities --

  def Project(self, points, extrinsics, intrinsics) -> dict:
    """World points [M, 3] into a camera (4x4 camera-to-world, 3x3 K): pixels [M, 2]
    (x, y), depth [M] and in_front [M]."""
    xyz = _array(points, "points", (None, 3)).astype(np.float64)
    if len(xyz) > self.limits.max_project_points:
      raise ToolError(f"points: {len(xyz)} points, over the limit of "
                      f"{self.limits.max_project_points}")
    c2w = _array(extrinsics, "extrinsics", (4, 4)).astype(np.float64)
    k = _array(intrinsics, "intrinsics", (3, 3)).astype(np.float64)
    rotation = c2w[:3, :3]
    if not np.allclose(rotation @ rotation.T, np.eye(3), atol=1e-3):
      raise ToolError("extrinsics: the rotation part is not orthonormal")
    cam = (xyz - c2w[:3, 3]) @ rotation
    z = cam[:, 2]
    safe = np.where(np.abs(z) < 1e-9, 1e-9, z)
    pixels = np.stack([k[0, 0] * cam[:, 0] / safe + k[0, 2],
                       k[1, 1] * cam[:, 1] / safe + k[1, 2]], -1)
    return {"pixels": pixels.astype(np.float32), "depth": z.astype(np.float32),
            "in_front": z > 1e-6}

  def Annotate(self, image, points=None, boxes=None, labels=None, color=(255, 0, 0)) -> dict:
    """A copy of `image` (a frame index or an array) with pixel points [[x, y], ...] as
    discs and boxes [[x1, y1, x2, y2], ...] drawn, each with its label."""
    from PIL import Image, ImageDraw  # pylint: disable=import-outside-toplevel
    if isinstance(image, (int, np.integer)) and not isinstance(image, bool):
      base = self.frames[_int(image, "image", 0, len(self.frames) - 1)]
    else:
      base = _image(image, "image")
    pts = np.zeros((0, 2)) if points is None else _array(points, "points", (None, 2))
    bxs = np.zeros((0, 4)) if boxes is None else _array(boxes, "boxes", (None, 4))
    if len(pts) + len(bxs) > 256:
      raise ToolError("Annotate: at most 256 points and boxes")
    names = [] if labels is None else list(labels)
    if len(names) not in (0, len(pts) + len(bxs)):
      raise ToolError(f"labels: expected {len(pts) + len(bxs)} labels (points, then boxes), "
                      f"got {len(names)}")
    names = [str(n)[:40] for n in names]
    colour = tuple(int(c) for c in _array(color, "color", (3,)).clip(0, 255))
    canvas = Image.fromarray(np.ascontiguousarray(base))
    draw = ImageDraw.Draw(canvas)
    radius = max(2, round(max(base.shape[:2]) / 150))
    for k, (x, y) in enumerate(pts):
      draw.ellipse([x - radius, y - radius, x + radius, y + radius], outline=colour,
                   width=2)
      if names:
        draw.text((x + radius + 1, y - radius), names[k], fill=colour)
    for k, (x1, y1, x2, y2) in enumerate(bxs):
      draw.rectangle([min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2)], outline=colour,
                     width=2)
      if names:
        draw.text((min(x1, x2) + 2, min(y1, y2) + 2), names[len(pts) + k], fill=colour)
    return {"image": np.asarray(canvas, np.uint8)}

  def MaskStats(self, mask) -> dict:
    """Area (pixels), centroid [x, y] and box [x1, y1, x2, y2] of a boolean mask [H, W]."""
    array = np.asarray(mask)
    if array.ndim != 2 or array.dtype.kind not in "bui" or array.size > 4096 * 4096:
      raise ToolError(f"mask: expected a boolean [H, W] mask, got {array.dtype} "
                      f"{list(array.shape)}")
    rows, cols = np.nonzero(array)
    if not len(rows):
      return {"area": 0, "centroid": None, "box": None}
    return {"area": int(len(rows)), "centroid": [float(cols.mean()), float(rows.mean())],
            "box": [int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1]}


def locate_point(reply: str) -> tuple[float, float] | None:
  """(x, y) on the 0-1000 grid from a Locate reply, or None ("not visible", unreadable)."""
  import re  # pylint: disable=import-outside-toplevel
  text = reply[:2000] if isinstance(reply, str) else ""
  if "not visible" in text.lower():
    return None
  match = re.search(r"\(?\s*(\d{1,4}(?:\.\d{1,3})?)\s*,\s*(\d{1,4}(?:\.\d{1,3})?)\s*\)?", text)
  if match is None:
    return None
  x, y = float(match.group(1)), float(match.group(2))
  if not (0 <= x <= 1000 and 0 <= y <= 1000):
    return None
  return x, y


# --- documentation for the prompts ---------------------------------------------------------

DOCS = {
    "Reconstruct": (
        "tools.Reconstruct(frames=[i, ...]) -> dict: 3D geometry of up to 64 frames (8-32 "
        "is usually enough; default: all). Keys: frames [n]; points [n, H, W, 3] world "
        "coordinates per pixel; depth [n, H, W] (0 = unknown); valid [n, H, W] bool; "
        "extrinsics [n, 4, 4] camera-to-world, OpenCV axes (x right, y down, z forward); "
        "intrinsics [n, 3, 3]; scale (metres per unit) and metric (bool). World: +Y up, "
        "ground at Y=0, the first requested frame's camera at X=Z=0 facing -Z, +X to its "
        "right."),
    "RenderView": (
        "tools.RenderView(eye=[x, y, z], target=[x, y, z], width=512, height=384, fov=60) "
        "or tools.RenderView(extrinsics=4x4) -> {image, depth, intrinsics, extrinsics}: a "
        "new view of the last reconstruction."),
    "RenderBEV": (
        "tools.RenderBEV(size=512, cameras=True) -> {image, depth, intrinsics, "
        "extrinsics}: a top-down view of the last reconstruction (image up = -Z, right = "
        "+X), input cameras drawn; project points with its intrinsics and extrinsics."),
    "Segment": (
        "tools.Segment(frame=i, text='red chair') or tools.Segment(frame=i, box=[x1, y1, "
        "x2, y2]) -> {masks [K, H, W] bool, scores [K], boxes [K, 4] pixels, count}: "
        "instance masks in one frame."),
    "OCR": (
        "tools.OCR(frame=i, box=None) -> {lines: [{text, box [x1, y1, x2, y2] pixels, "
        "score}]}: text read in one frame."),
    "VLM": (
        "tools.VLM(question, images=[i, ...]) -> str: ask the vision-language model a "
        "focused sub-question about frames (indices) or image arrays (up to 64)."),
    "Locate": (
        "tools.Locate(frame=i, description='the lamp') -> {visible, point [x, y] on a "
        "0-1000 grid, pixel [x, y]}: where something is in one frame (the VLM's estimate)."),
    "Project": (
        "tools.Project(points [M, 3], extrinsics 4x4, intrinsics 3x3) -> {pixels [M, 2], "
        "depth [M], in_front [M]}: world points into a camera."),
    "Annotate": (
        "tools.Annotate(image, points=[[x, y], ...], boxes=[[x1, y1, x2, y2], ...], "
        "labels=[...]) -> {image}: draw marks on a frame index or image array (then "
        "show(...) it)."),
    "MaskStats": (
        "tools.MaskStats(mask) -> {area, centroid [x, y], box [x1, y1, x2, y2]}: a "
        "boolean mask's area, centroid and box."),
}


def documentation(names: Sequence[str]) -> str:
  """The prompt's tool list for the offered tools (one line each)."""
  return "\n".join(f"- {DOCS[name]}" for name in names if name in DOCS)
