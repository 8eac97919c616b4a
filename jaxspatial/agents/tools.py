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
import threading
from typing import Callable, Sequence

import numpy as np

from jaxspatial.agents.scene_geometry import apply_transform, gravity_alignment
from jaxspatial.agents.segmenters import link_instances
from jaxspatial.agents.vlm_replies import locate_reply, split_thinking, strip_thinking
from jaxspatial.errors import ToolArgumentError
from jaxspatial.perception.tool_args import (frame_indices, parse_array, parse_image, parse_int,
                                             parse_number, parse_pixel_box, parse_text)

MAX_FRAMES = 64
GROUPS = {
    "perception": ("Reconstruct", "RenderView", "RenderBEV", "SAM3", "SAM3.video",
                   "SAM3.exists", "OCR"),
    "vlm": ("vlm.locate", "vlm.ask_with_thinking"),
    "utilities": ("Project", "Annotate", "MaskStats"),
}
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
    points = apply_transform(transform, geometry.points.reshape(-1, 3)).reshape(geometry.points.shape)
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
    reply = strip_thinking(self._ask(prompt, self._images([index]),
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
