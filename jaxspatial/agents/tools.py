"""SpatialClaw's host tools: the callables a `Kernel` is given as `tools=`, which the
model's code reaches by the paper's names (kernel_program.kernel_path): `tools.Reconstruct`,
`tools.SAM3`, `tools.SAM3.video`, `vlm.locate`, ... Each runs here, on the host, with the
episode's frames; arguments arrive as JSON values and numpy arrays and are checked before
any work (a `ToolArgumentError` says what is wrong; the kernel shows it to the model).

Groups (the ablations switch them off together):
  perception  Reconstruct, RenderView, RenderBEV, SAM3 (one frame by text, box or points),
              SAM3.video (objects through frames), SAM3.exists (a concept present?), OCR
  vlm         vlm.locate (boxes and points from the loop's own model),
              vlm.ask_with_thinking (a sub-question answered after reasoning)
  utilities   Project, Annotate, MaskStats

SAM3.video: a segmenter with its own `segment_video` (InstanceMasks: stored instance ids)
tracks with it; otherwise each frame is segmented alone and identity is carried from
frame to frame by mask IoU (`link_instances`), which holds for video-like frame sequences,
not for views far apart. SAM3Segmenter takes that path: transformers ships Sam3VideoModel
(SAM 3's memory-based propagation), but its processor needs torchvision, which does not
import beside this torch, and no SAM 3 weights are here to check a native path against.

World frame of `Reconstruct` (ours, after SpatialClaw's): gravity-aligned, +Y up, the
first requested frame's camera at X = Z = 0 looking along -Z (its forward direction
projected on the ground plane), the ground at Y = 0; right-handed, so +X is that camera's
right. Extrinsics are 4x4 camera-to-world in OpenCV axes (columns: right, down, forward).
How "up" and "ground" are known depends on the geometry source:
  DepthGeometry   a scene's stored depth and cameras (the synthetic set: world +Z up,
                  floor at z = 0, metres): exact, metric
  CloudGeometry   a stored cloud and input cameras (a benchmark built with Think3D caches):
                  per-frame depth rendered from the cloud; up estimated from the cameras
  ModelGeometry   a learned reconstructor (perception.reconstruct: da3, the paper's
                  default (DA3NESTED-GIANT-LARGE), pi3 (frames resized to multiples of 14
                  within 255,000 pixels, as Pi3's own loader), vggt, or any object with
                  reconstruct(frames)): depth rendered from its fused cloud into its
                  cameras; up estimated from the cameras
Estimated up is minus the mean of the cameras' down axes (cameras held upright, as
people film rooms); the estimated ground is the 2nd percentile of the points' heights.
`scale` is metres per world unit (1.0, with `metric` False, when the source is
scale-free). Each call is one reconstruction with its own world frame; the render tools
draw the last one.

Resource bounds: at most `max_frames` (64) frames a call and `max_output_bytes` per
result, render sizes up to 1024 x 1024, `max_vlm_calls` sub-questions per episode,
`max_images` images per sub-question, `max_video_objects` (20) objects per SAM3.video call,
16 point prompts per SAM3 call.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import threading
from typing import Callable, Sequence

import numpy as np

from jaxspatial.errors import ToolArgumentError
from jaxspatial.geometry.unproject import unproject_depth
from jaxspatial.perception.tool_args import (frame_indices, parse_array, parse_image, parse_int,
                                             parse_number, parse_pixel_box, parse_text)

MAX_FRAMES = 64
GROUPS = {
    "perception": ("Reconstruct", "RenderView", "RenderBEV", "SAM3", "SAM3.video",
                   "SAM3.exists", "OCR"),
    "vlm": ("vlm.locate", "vlm.ask_with_thinking"),
    "utilities": ("Project", "Annotate", "MaskStats"),
}
PI3_PIXELS = 255_000       # Pi3's input budget (its own loader's)
DA3_MODEL = "DA3NESTED-GIANT-LARGE"   # the paper's Reconstruct model
MAX_POINT_PROMPTS = 16
MAX_RENDER_SIDE = 1024
MAX_TEXT_CHARS = 2000


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
  vlm_max_tokens: int = 1024       # vlm.locate's reply
  vlm_thinking_max_tokens: int = 8192  # vlm.ask_with_thinking's reasoning and answer
  max_points: int = 1_000_000      # points kept for rendering a reconstruction
  max_project_points: int = 5_000_000
  max_video_objects: int = 20      # objects SAM3.video follows
  video_min_iou: float = 0.3       # mask IoU that carries an identity to the next frame


def mask_iou(a_KxHxW: np.ndarray, b_MxHxW: np.ndarray) -> np.ndarray:
  """IoU [K, M] of two stacks of boolean masks (0 where both are empty)."""
  a = np.asarray(a_KxHxW, bool).reshape(len(a_KxHxW), -1).astype(np.float32)
  b = np.asarray(b_MxHxW, bool).reshape(len(b_MxHxW), -1).astype(np.float32)
  inter = a @ b.T
  union = a.sum(1)[:, None] + b.sum(1)[None, :] - inter
  return np.where(union > 0, inter / np.maximum(union, 1.0), 0.0)


def link_instances(per_frame: Sequence[Sequence[np.ndarray]], start: int, grow: bool,
                   min_iou: float = 0.3) -> list[list[int | None]]:
  """Identity through a frame sequence by mask IoU: tracks[k][t] is the index into
  per_frame[t] of track k's instance (None: not found there). The tracks begin as the
  instances at position `start`; matching runs from `start` to the end, then from `start`
  back to the beginning, each frame's instances against the tracks' latest masks (one-to-one,
  the assignment with the largest total IoU; pairs under `min_iou` stay apart). With `grow`
  an instance that matches no track starts a new one (a text prompt finds objects that
  enter later); without it only the starting instances are followed (a box or points)."""
  from scipy.optimize import linear_sum_assignment  # pylint: disable=import-outside-toplevel
  count = len(per_frame)
  tracks: list[list[int | None]] = []
  for k in range(len(per_frame[start])):
    tracks.append([None] * count)
    tracks[k][start] = k
  for order in (range(start + 1, count), range(start - 1, -1, -1)):
    latest = {k: per_frame[start][k] for k in range(len(per_frame[start]))}
    for t in order:
      found = list(per_frame[t])
      matched = set()
      if latest and found:
        ids = list(latest)
        iou = mask_iou(np.stack([latest[k] for k in ids]), np.stack(found))
        for r, c in zip(*linear_sum_assignment(-iou)):
          if iou[r, c] >= min_iou:
            tracks[ids[r]][t] = int(c)
            latest[ids[r]] = found[c]
            matched.add(int(c))
      if grow:
        for c in range(len(found)):
          if c not in matched:
            tracks.append([None] * count)
            tracks[-1][t] = c
            latest[len(tracks) - 1] = found[c]
  return tracks


class InstanceMasks:
  """A segmenter from stored instance maps [N, H, W] (-1 = none) and object names
  {name: instance id}: a text prompt selects the objects whose name contains it (or the
  other way round); a box, the instances covering most of it; points, the instances under
  the positive points and not under a negative one; several prompts, the objects all of
  them select; none, every object. Identity through frames is the stored ids. For scenes
  whose instance ids are known (the synthetic set); SAM 3 does this on real images."""

  def __init__(self, instance_NxHxW, names: dict[str, int]):
    self.instance = np.asarray(instance_NxHxW, np.int32)
    self.names = {str(k).lower(): int(v) for k, v in names.items()}

  def _chosen(self, frame: int, text, box, points, labels) -> list[int]:
    ids = self.instance[frame]
    chosen = sorted(set(int(v) for v in np.unique(ids) if v >= 0))
    if text is not None:
      want = " ".join(text.lower().split())
      named = {i for n, i in self.names.items() if n and (want in n or n in want)}
      chosen = [i for i in chosen if i in named]
    if box is not None:
      x1, y1, x2, y2 = (int(round(c)) for c in box)
      inside = ids[y1:y2, x1:x2]
      values, counts = np.unique(inside[inside >= 0], return_counts=True)
      boxed = {int(v) for v, c in zip(values, counts) if c >= 0.2 * inside.size}
      chosen = [i for i in chosen if i in boxed]
    if points is not None:
      under = [int(ids[min(int(y), ids.shape[0] - 1), min(int(x), ids.shape[1] - 1)])
               for x, y in points]
      positive = {u for u, l in zip(under, labels) if l and u >= 0}
      negative = {u for u, l in zip(under, labels) if not l}
      chosen = [i for i in chosen if i in positive and i not in negative]
    return chosen

  def segment(self, frame: int, image: np.ndarray, text: str | None, box, points=None,
              labels=None) -> list[dict]:
    del image
    out = []
    for instance in self._chosen(frame, text, box, points, labels):
      mask = self.instance[frame] == instance
      if mask.any():
        out.append({"mask": mask, "score": 1.0})
    return out

  def exists(self, frame: int, image: np.ndarray, text: str) -> tuple[bool, float]:
    present = bool(self.segment(frame, image, text, None))
    return present, float(present)

  def segment_video(self, frames: Sequence[int], images, prompt_frame: int, text, box,
                    points=None, labels=None) -> tuple[list[dict], str]:
    """([{"masks": {frame: (mask, score)}}] per object, the method's name): the stored ids
    of the objects the prompts select (in every frame for text alone, else in
    `prompt_frame`)."""
    del images
    if box is None and points is None:
      ids = sorted({i for f in frames for i in self._chosen(f, text, None, None, None)})
    else:
      ids = self._chosen(prompt_frame, text, box, points, labels)
    out = []
    for instance in ids:
      masks = {}
      for f in frames:
        mask = self.instance[f] == instance
        if mask.any():
          masks[f] = (mask, 1.0)
      out.append({"masks": masks})
    return out, "stored instance ids"


class SAM3Segmenter:
  """SAM 3 (`perception.segmentation.SAM3Backend`) from a model folder or a backend.
  Text and a box go to SAM 3 as prompts (a box alone: SAM 3's exemplar prompt, every
  instance like the boxed one); points pick, among SAM 3's instances for the text or box
  (or every object, the backend's auto prompt), those whose mask holds every positive
  point and no negative one (SAM3Backend takes no point prompts). `exists`: any instance
  scoring above the threshold."""

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

  def _padded(self, image: np.ndarray, text, box, mask_size) -> dict:
    from jaxspatial.perception.segmentation import GRID  # pylint: disable=import-outside-toplevel
    backend = self.backend()
    height, width = image.shape[:2]
    config = dataclasses.replace(backend.config, mask_size=mask_size)
    grid_box = None
    if box is not None:
      grid_box = np.asarray([[box[0] * GRID / width, box[1] * GRID / height,
                              box[2] * GRID / width, box[3] * GRID / height]])
    return backend.with_config(config).segment_padded(image[None], text_prompt=text,
                                                      boxes_grid_Bx4=grid_box,
                                                      score_threshold=self.score_threshold)

  def segment(self, frame: int, image: np.ndarray, text: str | None, box, points=None,
              labels=None) -> list[dict]:
    del frame
    out = self._padded(image, text, box, image.shape[:2])
    found = [{"mask": out["masks"][0, k], "score": float(out["scores"][0, k])}
             for k in range(int(out["count"][0]))]
    if points is not None:
      def picked(mask):
        inside = [bool(mask[min(int(y), mask.shape[0] - 1), min(int(x), mask.shape[1] - 1)])
                  for x, y in points]
        return all(h for h, l in zip(inside, labels) if l) and not any(
            h for h, l in zip(inside, labels) if not l)
      found = [item for item in found if picked(item["mask"])]
    return found

  def exists(self, frame: int, image: np.ndarray, text: str) -> tuple[bool, float]:
    del frame
    out = self._padded(image, text, None, (8, 8))
    count = int(out["count"][0])
    return count > 0, float(out["scores"][0, :count].max()) if count else 0.0


class EpisodeTools:
  """The host tools of one episode over its frames (uint8 [N, H, W, 3]).

  geometry: DepthGeometry / CloudGeometry / ModelGeometry or None (Reconstruct then
  explains that none is configured); segmenter: InstanceMasks / SAM3Segmenter or None;
  ocr: an OCR backend (`perception.ocr`; None: the process's PP-OCRv4); ask: the loop's
  sub-question function `ask(question, images, thinking=False) -> str` (the reply as
  written; `thinking=True` for ask_with_thinking, whose request asks the model to reason
  first) or None; groups: which of GROUPS are offered. A tool's dotted name is its
  method's with "_" for ".": SAM3.video is `SAM3_video`."""

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
    return {name: getattr(self, name.replace(".", "_")) for name in self.names()}

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
      raise ToolArgumentError("Reconstruct: no reconstruction is configured for this run (no "
                      "stored geometry and no reconstruction backend)")
    n, (height, width) = len(indices), self.frames.shape[1:3]
    size = n * height * width * (3 * 4 + 4 + 1)
    if size > self.limits.max_output_bytes:
      raise ToolArgumentError(f"Reconstruct: {n} frames of {width} x {height} give {size >> 20} MB, "
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
      raise ToolArgumentError(f"{name}: nothing to render yet; call tools.Reconstruct(...) first")
    if not len(last["xyz"]):
      raise ToolArgumentError(f"{name}: the last reconstruction has no points")
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
    return (parse_int(width, "width", 16, MAX_RENDER_SIDE), parse_int(height, "height", 16,
                                                            MAX_RENDER_SIDE))

  def RenderView(self, eye=None, target=None, extrinsics=None, width=512, height=384,
                 fov=60.0) -> dict:
    """A novel view of the last reconstruction: a camera at `eye` looking at `target`
    (world coordinates, +Y up), or a given 4x4 camera-to-world `extrinsics`."""
    from jaxspatial.geometry import intrinsics_from_fov, look_at  # pylint: disable=import-outside-toplevel
    width, height = self._size(width, height)
    fov = parse_number(fov, "fov", 1.0, 170.0)
    if extrinsics is not None:
      c2w = parse_array(extrinsics, "extrinsics", (4, 4)).astype(np.float64)
      rotation = c2w[:3, :3]
      if (not np.allclose(rotation @ rotation.T, np.eye(3), atol=1e-3)
          or np.linalg.det(rotation) < 0 or not np.allclose(c2w[3], [0, 0, 0, 1])):
        raise ToolArgumentError("extrinsics: expected a rigid 4x4 camera-to-world pose")
    else:
      if eye is None or target is None:
        raise ToolArgumentError("RenderView: give eye=[x, y, z] and target=[x, y, z], or extrinsics")
      eye_v, target_v = parse_array(eye, "eye", (3,)), parse_array(target, "target", (3,))
      if np.linalg.norm(target_v - eye_v) < 1e-6:
        raise ToolArgumentError("RenderView: eye and target coincide")
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
    side = parse_int(size, "size", 64, MAX_RENDER_SIDE)
    margin = parse_number(margin, "margin", 0.0, 1.0)
    if not isinstance(cameras, (bool, np.bool_)):
      raise ToolArgumentError("cameras: expected True or False")
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

  def _prompts(self, name: str, index: int, text, box, points, point_labels,
               need: bool = True):
    """The checked prompts of a SAM3 call on frame `index`: (text, box, points, labels)."""
    height, width = self.frames.shape[1:3]
    if need and text is None and box is None and points is None:
      raise ToolArgumentError(f"{name}: give text='...', box=[x1, y1, x2, y2] or points=[[x, y], "
                      "...] (pixels)")
    text = None if text is None else parse_text(text, "text", 200)
    box = None if box is None else parse_pixel_box(box, height, width)
    labels = None
    if points is not None:
      points = parse_array(points, "points", (None, 2)).astype(np.float64)
      if not 1 <= len(points) <= MAX_POINT_PROMPTS:
        raise ToolArgumentError(f"points: expected 1 to {MAX_POINT_PROMPTS} points [[x, y], ...], "
                        f"got {len(points)}")
      if not ((points[:, 0] >= 0).all() and (points[:, 0] < width).all()
              and (points[:, 1] >= 0).all() and (points[:, 1] < height).all()):
        raise ToolArgumentError(f"points: pixels [x, y] with 0 <= x < {width} and 0 <= y < {height}, "
                        f"got {points.tolist()}")
      if point_labels is None:
        labels = [1] * len(points)
      else:
        labels = [parse_int(v, f"point_labels[{k}]", 0, 1) for k, v in
                  enumerate(parse_array(point_labels, "point_labels", (len(points),), "iub"))]
      if not any(labels):
        raise ToolArgumentError("point_labels: at least one point must be positive (1)")
    elif point_labels is not None:
      raise ToolArgumentError("point_labels: given without points")
    if self.segmenter is None:
      raise ToolArgumentError(f"{name}: no segmentation model is configured for this run (SAM 3 "
                      "needs a model folder)")
    return text, box, points, labels

  def _segment(self, index: int, text, box, points, labels) -> list[dict]:
    image = self.frames[index]
    if points is None:  # segmenters that take no points keep working
      return list(self.segmenter.segment(index, image, text, box))
    return list(self.segmenter.segment(index, image, text, box, points=points, labels=labels))

  def SAM3(self, frame, text=None, box=None, points=None, point_labels=None) -> dict:
    """Instance masks in one frame, prompted by text (a concept: every instance of it), a
    pixel box [x1, y1, x2, y2] and / or pixel points [[x, y], ...] (point_labels 1 keep,
    0 exclude; default all 1): {masks [K, H, W] bool, scores [K], boxes [K, 4] pixels,
    count}."""
    index = parse_int(frame, "frame", 0, len(self.frames) - 1)
    text, box, points, labels = self._prompts("SAM3", index, text, box, points, point_labels)
    found = self._segment(index, text, box, points, labels)
    height, width = self.frames.shape[1:3]
    masks = np.zeros((len(found), height, width), bool)
    scores = np.zeros(len(found), np.float32)
    for k, item in enumerate(found):
      masks[k] = item["mask"]
      scores[k] = item["score"]
    return {"masks": masks, "scores": scores, "boxes": _mask_boxes(masks), "count": len(found)}

  def SAM3_video(self, frames=None, text=None, box=None, points=None, point_labels=None,
                 prompt_frame=None) -> dict:
    """Objects segmented and followed through frames (a video's; default all): those a text
    names, in every frame, or the one a box / points pick in `prompt_frame` (default the
    first of `frames`). {frames [n], ids [K], masks [K, n, H, W] bool, present [K, n] bool,
    scores [K, n], boxes [K, n, 4] pixels, method}."""
    indices = frame_indices(frames, len(self.frames), self.limits.max_frames)
    start = indices[0] if prompt_frame is None else parse_int(prompt_frame, "prompt_frame", 0,
                                                         len(self.frames) - 1)
    if start not in indices:
      raise ToolArgumentError(f"prompt_frame: {start} is not one of frames {indices}")
    text, box, points, labels = self._prompts("SAM3.video", start, text, box, points,
                                              point_labels)
    height, width = self.frames.shape[1:3]
    if hasattr(self.segmenter, "segment_video"):
      objects, method = self.segmenter.segment_video(indices, self.frames, start, text, box,
                                                     points, labels)
    else:
      objects, method = self._video_by_iou(indices, start, text, box, points, labels)
    objects = [o for o in objects if o["masks"]][:self.limits.max_video_objects]
    size = len(objects) * len(indices) * height * width
    if size > self.limits.max_output_bytes:
      raise ToolArgumentError(f"SAM3.video: {len(objects)} objects in {len(indices)} frames of "
                      f"{width} x {height} give {size >> 20} MB, over the limit of "
                      f"{self.limits.max_output_bytes >> 20} MB; pass fewer frames")
    masks = np.zeros((len(objects), len(indices), height, width), bool)
    scores = np.zeros((len(objects), len(indices)), np.float32)
    for k, item in enumerate(objects):
      for j, f in enumerate(indices):
        if f in item["masks"]:
          masks[k, j], scores[k, j] = item["masks"][f][0], item["masks"][f][1]
    present = masks.any(axis=(2, 3))
    boxes = _mask_boxes(masks.reshape(-1, height, width)).reshape(len(objects), len(indices), 4)
    return {"frames": np.asarray(indices, np.int32), "ids": np.arange(len(objects), dtype=np.int32),
            "masks": masks, "present": present, "scores": np.where(present, scores, 0.0),
            "boxes": boxes, "method": method}

  def _video_by_iou(self, indices, start, text, box, points, labels):
    """Each frame alone (the prompts on `start`; text alone, or every object for a box /
    points, elsewhere), identity by mask IoU from frame to frame (link_instances)."""
    geometric = box is not None or points is not None
    per_frame = []
    for f in indices:
      if f == start:
        found = self._segment(f, text, box, points, labels)
      else:
        found = self._segment(f, None if geometric else text, None, None, None)
      per_frame.append(found)
    tracks = link_instances([[item["mask"] for item in found] for found in per_frame],
                            indices.index(start), grow=not geometric,
                            min_iou=self.limits.video_min_iou)
    objects = []
    for track in tracks:
      masks = {}
      for j, c in enumerate(track):
        if c is not None:
          item = per_frame[j][c]
          masks[indices[j]] = (np.asarray(item["mask"], bool), float(item["score"]))
      objects.append({"masks": masks})
    return objects, "per-frame segmentation, identity by mask IoU"

  def SAM3_exists(self, frame, text) -> dict:
    """Whether a concept (text) is present in one frame, without masks: {present, score}."""
    index = parse_int(frame, "frame", 0, len(self.frames) - 1)
    text = parse_text(text, "text", 200)
    if self.segmenter is None:
      raise ToolArgumentError("SAM3.exists: no segmentation model is configured for this run (SAM 3 "
                      "needs a model folder)")
    if hasattr(self.segmenter, "exists"):
      present, score = self.segmenter.exists(index, self.frames[index], text)
    else:
      found = self._segment(index, text, None, None, None)
      present, score = bool(found), max((float(f["score"]) for f in found), default=0.0)
    return {"present": bool(present), "score": round(float(score), 4)}

  def OCR(self, frame, box=None) -> dict:
    """Text lines read in one frame (optionally inside a pixel box)."""
    index = parse_int(frame, "frame", 0, len(self.frames) - 1)
    image = self.frames[index]
    left = top = 0
    if box is not None:
      x1, y1, x2, y2 = parse_pixel_box(box, *image.shape[:2])
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
      raise ToolArgumentError("images: expected a list of frame indices or image arrays")
    if len(images) > self.limits.max_images:
      raise ToolArgumentError(f"images: {len(images)} images, over the limit of "
                      f"{self.limits.max_images}")
    out = []
    for k, item in enumerate(images):
      if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
        image = self.frames[parse_int(item, f"images[{k}]", 0, len(self.frames) - 1)]
      else:
        image = parse_image(item, f"images[{k}]")
      out.append(resize_long_edge(np.ascontiguousarray(image), self.limits.image_long_edge))
    return out

  def _ask(self, question: str, images: list, record: str, thinking: bool = False) -> str:
    if self.ask is None:
      raise ToolArgumentError("the VLM tools are not available in this run")
    with self._lock:
      if self._vlm_calls >= self.limits.max_vlm_calls:
        raise ToolArgumentError(f"the limit of {self.limits.max_vlm_calls} VLM sub-questions in an "
                        "episode is reached")
      self._vlm_calls += 1
    reply = (self.ask(question, images, thinking=True) if thinking
             else self.ask(question, images))
    return reply if isinstance(reply, str) else str(reply)

  def _record(self, question: str, answer: str) -> None:
    with self._lock:
      self._queries.append((question, answer))

  def vlm_ask_with_thinking(self, question, images=None) -> dict:
    """A sub-question to the model about frames (indices) or image arrays; it reasons first,
    then answers: {answer, thinking}."""
    question = parse_text(question, "question", MAX_TEXT_CHARS)
    thinking, answer = split_thinking(self._ask(question, self._images(images), question,
                                                thinking=True))
    self._record(question, answer)
    return {"answer": answer, "thinking": thinking}

  def vlm_locate(self, frame, description) -> dict:
    """Where `description` is in one frame, as the model sees it: {visible, boxes [[x1, y1,
    x2, y2]], points [[x, y]] (0-1000 grid over width and height), pixel_boxes,
    pixel_points}."""
    index = parse_int(frame, "frame", 0, len(self.frames) - 1)
    description = parse_text(description, "description", 300)
    image = self.frames[index]
    prompt = (f"Find this in the image: {description}\nFor each instance write one line: "
              "box [x1, y1, x2, y2] point (x, y), on a 0-1000 grid over the image's width "
              "and height (x to the right, y down), e.g. box [100, 220, 380, 600] point "
              "(240, 410). If it is not in the image, reply NOT VISIBLE. Reply with nothing "
              "else.")
    reply = _strip_thinking(self._ask(prompt, self._images([index]),
                                      f"locate in frame {index}: {description}"))
    boxes, points = locate_reply(reply)
    self._record(f"vlm.locate in frame {index}: {description}",
                 reply[:500] if boxes or points else "not visible")
    height, width = image.shape[:2]
    scale = np.array([width, height], np.float64) / 1000.0
    out = {"visible": bool(boxes or points), "boxes": boxes, "points": points,
           "pixel_boxes": [[round(float(v), 1) for v in np.asarray(b) * np.tile(scale, 2)]
                           for b in boxes],
           "pixel_points": [[round(float(v), 1) for v in np.asarray(p) * scale]
                            for p in points]}
    if not out["visible"]:
      out["reply"] = reply[:200]
    return out

  # -- utilities --

  def Project(self, points, extrinsics, intrinsics) -> dict:
    """World points [M, 3] into a camera (4x4 camera-to-world, 3x3 K): pixels [M, 2]
    (x, y), depth [M] and in_front [M]."""
    xyz = parse_array(points, "points", (None, 3)).astype(np.float64)
    if len(xyz) > self.limits.max_project_points:
      raise ToolArgumentError(f"points: {len(xyz)} points, over the limit of "
                      f"{self.limits.max_project_points}")
    c2w = parse_array(extrinsics, "extrinsics", (4, 4)).astype(np.float64)
    k = parse_array(intrinsics, "intrinsics", (3, 3)).astype(np.float64)
    rotation = c2w[:3, :3]
    if not np.allclose(rotation @ rotation.T, np.eye(3), atol=1e-3):
      raise ToolArgumentError("extrinsics: the rotation part is not orthonormal")
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
      base = self.frames[parse_int(image, "image", 0, len(self.frames) - 1)]
    else:
      base = parse_image(image, "image")
    pts = np.zeros((0, 2)) if points is None else parse_array(points, "points", (None, 2))
    bxs = np.zeros((0, 4)) if boxes is None else parse_array(boxes, "boxes", (None, 4))
    if len(pts) + len(bxs) > 256:
      raise ToolArgumentError("Annotate: at most 256 points and boxes")
    names = [] if labels is None else list(labels)
    if len(names) not in (0, len(pts) + len(bxs)):
      raise ToolArgumentError(f"labels: expected {len(pts) + len(bxs)} labels (points, then boxes), "
                      f"got {len(names)}")
    names = [str(n)[:40] for n in names]
    colour = tuple(int(c) for c in parse_array(color, "color", (3,)).clip(0, 255))
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
      raise ToolArgumentError(f"mask: expected a boolean [H, W] mask, got {array.dtype} "
                      f"{list(array.shape)}")
    rows, cols = np.nonzero(array)
    if not len(rows):
      return {"area": 0, "centroid": None, "box": None}
    return {"area": int(len(rows)), "centroid": [float(cols.mean()), float(rows.mean())],
            "box": [int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1]}


def _mask_boxes(masks_KxHxW: np.ndarray) -> np.ndarray:
  """Pixel boxes [K, 4] (x1, y1, x2, y2; x2, y2 exclusive) of masks; zeros for empty ones."""
  boxes = np.zeros((len(masks_KxHxW), 4), np.float32)
  for k, mask in enumerate(masks_KxHxW):
    rows, cols = np.nonzero(mask)
    if len(rows):
      boxes[k] = [cols.min(), rows.min(), cols.max() + 1, rows.max() + 1]
  return boxes


_NUMBER = r"(\d{1,4}(?:\.\d{1,3})?)"
_BOX = re.compile(r"[\[(]\s*" + r"\s*,\s*".join([_NUMBER] * 4) + r"\s*[\])]")
_POINT = re.compile(r"[\[(]\s*" + _NUMBER + r"\s*,\s*" + _NUMBER + r"\s*[\])]")
MAX_LOCATED = 20


def locate_reply(reply: str) -> tuple[list, list]:
  """(boxes [[x1, y1, x2, y2]], points [[x, y]]) on the 0-1000 grid from a vlm.locate reply
  (both empty: "not visible" or unreadable). A line with a box and no point gives the
  box's centre as its point."""
  text = reply[:4000] if isinstance(reply, str) else ""
  if "not visible" in text.lower():
    return [], []
  boxes, points = [], []
  for line in text.split("\n"):
    line_boxes, rest, last = [], [], 0
    for match in _BOX.finditer(line):
      rest.append(line[last:match.start()])
      last = match.end()
      x1, y1, x2, y2 = (float(v) for v in match.groups())
      if 0 <= x1 < x2 <= 1000 and 0 <= y1 < y2 <= 1000:
        line_boxes.append([x1, y1, x2, y2])
    rest.append(line[last:])
    line_points = [[float(m.group(1)), float(m.group(2))]
                   for m in _POINT.finditer(" ".join(rest))]
    line_points = [p for p in line_points if 0 <= p[0] <= 1000 and 0 <= p[1] <= 1000]
    if line_boxes and not line_points:
      line_points = [[(b[0] + b[2]) / 2, (b[1] + b[3]) / 2] for b in line_boxes]
    boxes += line_boxes
    points += line_points
  return boxes[:MAX_LOCATED], points[:MAX_LOCATED]


_FINAL = re.compile(r"^[ \t>*#_]*final answer[ \t*_]*[:：]", re.IGNORECASE | re.MULTILINE)


def split_thinking(reply: str) -> tuple[str, str]:
  """(thinking, answer) of a vlm.ask_with_thinking reply: a <think>...</think> block is the
  thinking and what follows the answer; else text up to the last "Final answer:" line is
  the thinking; else the whole reply is the answer."""
  text = reply[:200_000] if isinstance(reply, str) else ""
  lower = text.lower()
  end = lower.rfind("</think>")
  if end != -1:
    thinking = text[:end]
    opening = thinking.lower().find("<think>")
    thinking = thinking[opening + len("<think>"):] if opening != -1 else thinking
    text, answer_part = thinking, text[end + len("</think>"):]
    final = list(_FINAL.finditer(answer_part))
    answer = answer_part[final[-1].end():] if final else answer_part
    return text.strip(), answer.strip()
  final = list(_FINAL.finditer(text))
  if final:
    return text[:final[-1].start()].strip(), text[final[-1].end():].strip()
  opening = lower.find("<think>")
  if opening != -1:  # never closed: all thinking, no answer
    return text[opening + len("<think>"):].strip(), ""
  return "", text.strip()


def _strip_thinking(reply: str) -> str:
  return split_thinking(reply)[1]


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
    "SAM3": (
        "tools.SAM3(frame=i, text='red chair') -> {masks [K, H, W] bool, scores [K], boxes "
        "[K, 4] pixels, count}: SAM 3 instance masks in one frame. Prompts: text (every "
        "instance of a concept), box=[x1, y1, x2, y2] and / or points=[[x, y], ...] "
        "(pixels; point_labels=[1, 0, ...]: 1 on the object, 0 off it); combine them to "
        "narrow the result."),
    "SAM3.video": (
        "tools.SAM3.video(frames=[i, ...], text='chair') or tools.SAM3.video(frames=[...], "
        "box=[x1, y1, x2, y2] or points=[[x, y]], prompt_frame=i) -> {frames [n], ids [K], "
        "masks [K, n, H, W] bool, present [K, n], scores [K, n], boxes [K, n, 4], method}: "
        "objects segmented and followed through the frames of a video, each keeping its id "
        "(best on consecutive frames)."),
    "SAM3.exists": (
        "tools.SAM3.exists(frame=i, text='a red chair') -> {present, score}: whether a "
        "concept is in one frame (no masks; fast)."),
    "OCR": (
        "tools.OCR(frame=i, box=None) -> {lines: [{text, box [x1, y1, x2, y2] pixels, "
        "score}]}: text read in one frame."),
    "vlm.locate": (
        "vlm.locate(frame=i, description='the lamp') -> {visible, boxes [[x1, y1, x2, y2]], "
        "points [[x, y]] (0-1000 grid over width and height), pixel_boxes, pixel_points}: "
        "where the vision-language model sees something in one frame."),
    "vlm.ask_with_thinking": (
        "vlm.ask_with_thinking(question, images=[i, ...]) -> {answer, thinking}: a focused "
        "sub-question to the vision-language model about frames (indices) or image arrays "
        "(up to 64); it reasons first and gives its final answer separately."),
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
