"""What a benchmark builder yields: one `BenchmarkScene` per scene (a ScanNet scan, or one
question's image set), holding the scene's geometry, its input views and its questions.

`BenchmarkScene.example()` is the stored record (`builders/spatial_benchmark.py`), the
synthetic set's fields plus `benchmark`, `scene_id` and `geometry`, so `loader.task_batches`
turns both into `Task`s. Questions are JSON objects:

    question_id  str    the benchmark's id
    question     str    the text the model sees (options written in, as the benchmark does)
    options      [str]  multiple-choice options in letter order ([] for open questions)
    answer       str    the correct letter, or the first reference answer
    answer_text  str    the chosen option's text, or the first reference answer
    answers      [str]  every accepted answer (ScanQA lists several)
    category     str    the raw category the papers report by (data_pipelines.protocols)
    answer_objects [int]  instance ids of the answer's objects in the cloud ([] unknown)
    initial_view int    the view the episode starts from (index into the scene's cameras)
    views        [int]  the views the question shows (its input images)
    needs_exploration bool
    order        int    its place in the split's question file (`launch.eval --limit N`: the
                        first N); absent in benchmarks prepared before it was stored

`geometry` says where the cloud and cameras come from: "scan" (a ScanNet-format scan),
"reconstruction" (Think3D's cache files, or a reconstruction at build time), "none" (the
images alone: an empty cloud, cameras with a nominal focal length and identity poses;
for agents that answer from the images or reconstruct online).
"""

from __future__ import annotations

import dataclasses
import io
import json

import numpy as np
from PIL import Image

GEOMETRY = ("scan", "reconstruction", "none")
# The focal length of a "none" scene's nominal cameras, in units of the image's larger side
# (a 53-degree field of view): only the image size matters to agents without geometry.
NOMINAL_FOCAL = 1.0


def png(image: np.ndarray) -> bytes:
  buffer = io.BytesIO()
  Image.fromarray(image).save(buffer, format="PNG")
  return buffer.getvalue()


def nominal_cameras(views: int, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
  """(intrinsics [V, 4] fx fy cx cy, world_from_camera [V, 4, 4] identity) for images of
  width x height: the principal point at the centre."""
  focal = NOMINAL_FOCAL * max(width, height)
  intrinsics = np.tile(np.array([[focal, focal, (width - 1) / 2, (height - 1) / 2]],
                                np.float32), (views, 1))
  return intrinsics, np.tile(np.eye(4, dtype=np.float32), (views, 1, 1))


@dataclasses.dataclass
class BenchmarkScene:
  """One stored example. Per-point arrays share N (0 for geometry "none"); cameras, images
  share V (1..8); instance ids lie in -1..len(object_names) - 1."""

  benchmark: str
  scene_id: str
  geometry: str
  questions: list[dict]
  images: list[np.ndarray]              # V x [H, W, 3] uint8, one shape
  intrinsics: np.ndarray                # [V, 4] float32 fx, fy, cx, cy
  world_from_camera: np.ndarray         # [V, 4, 4] float32 camera-to-world (OpenCV)
  xyz: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 3), np.float32))
  rgb: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 3), np.uint8))
  instance: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0,), np.int32))
  scene_min: np.ndarray | None = None   # [3]; default the cloud's bounds (zeros when empty)
  scene_max: np.ndarray | None = None
  object_names: list[str] = dataclasses.field(default_factory=list)
  object_centres: np.ndarray = dataclasses.field(
      default_factory=lambda: np.zeros((0, 3), np.float32))

  def example(self, index: int) -> dict:
    """The TFDS record; `index` becomes its scene_seed (the scene's number in the build)."""
    if self.geometry not in GEOMETRY:
      raise ValueError(f"{self.benchmark} scene {self.scene_id}: geometry: expected one of "
                       f"{GEOMETRY}, got {self.geometry!r}")
    xyz = np.asarray(self.xyz, np.float32).reshape(-1, 3)
    low = self.scene_min if self.scene_min is not None else (
        xyz.min(0) if len(xyz) else np.zeros(3))
    high = self.scene_max if self.scene_max is not None else (
        xyz.max(0) if len(xyz) else np.zeros(3))
    return {
        "scene_seed": np.int64(index),
        "benchmark": self.benchmark,
        "scene_id": self.scene_id,
        "geometry": self.geometry,
        "xyz": xyz,
        "rgb": np.asarray(self.rgb, np.uint8).reshape(-1, 3),
        "instance": np.asarray(self.instance, np.int32).reshape(-1),
        "scene_min": np.asarray(low, np.float32),
        "scene_max": np.asarray(high, np.float32),
        "images": [png(np.asarray(i, np.uint8)) for i in self.images],
        "intrinsics": np.asarray(self.intrinsics, np.float32).reshape(-1, 4),
        "world_from_camera": np.asarray(self.world_from_camera, np.float32).reshape(-1, 4, 4),
        "object_names": list(self.object_names),
        "object_centres": np.asarray(self.object_centres, np.float32).reshape(-1, 3),
        "questions": json.dumps(self.questions),
    }


def letterbox(image: np.ndarray, width: int, height: int) -> tuple[np.ndarray, float,
                                                                     tuple[int, int]]:
  """The image scaled (PIL bicubic) to fit width x height with its aspect kept and centred
  on black: (image [height, width, 3] uint8, scale, (x0, y0) offset of the scaled image).
  A camera's intrinsics map as fx' = scale fx, cx' = scale (cx + 0.5) - 0.5 + x0."""
  image = np.asarray(image)
  if image.ndim == 2:
    image = np.repeat(image[..., None], 3, -1)
  if image.ndim != 3 or image.shape[-1] not in (3, 4) or 0 in image.shape:
    raise ValueError(f"letterbox: expected an [H, W, 3] image, got shape {image.shape}")
  image = image[..., :3].astype(np.uint8)
  h, w = image.shape[:2]
  scale = min(width / w, height / h)
  new_w, new_h = max(1, round(w * scale)), max(1, round(h * scale))
  if (new_w, new_h) != (w, h):
    image = np.asarray(Image.fromarray(image).resize((new_w, new_h), Image.BICUBIC))
  out = np.zeros((height, width, 3), np.uint8)
  x0, y0 = (width - new_w) // 2, (height - new_h) // 2
  out[y0:y0 + new_h, x0:x0 + new_w] = image
  return out, scale, (x0, y0)


def read_image(path) -> np.ndarray:
  """An image file as [H, W, 3] uint8 RGB."""
  with Image.open(path) as image:
    return np.asarray(image.convert("RGB"))
