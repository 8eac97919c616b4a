"""ScanQA and SQA3D (Act3D's ScanNet evaluations) -> one BenchmarkScene per ScanNet scene.

Each scene holds the scan's cloud (`data_pipelines.readers.scannet.read_scan`, axis-aligned,
uniformly subsampled to at most `points` vertices by a generator seeded with (seed, CRC-32 of
the scene id), then put in Morton order), its instance ids, object names and centres, the
scan's bounds, every question asked about it, and the episode's initial camera (OpenCV,
camera-to-world) with its render (`jaxspatial.render.render` of that cloud: square splats of
radius 1, white background, `hfov_deg` = 90 as `Act3DParams`, width x height = 640 x 480).

Act3D starts each episode "from one fixed initial viewpoint per task" without saying how it
is chosen. Ours, the documented choice (`ViewRule` holds its numbers):

- ScanQA. One viewpoint per scene, shared by its questions and chosen from the scan alone
  (never from the questions or their answer objects, which would leak the answer). The eye
  is 1.5 m above the floor (the aligned scan's lowest z; ScanNet is z-up; in a room under
  1.8 m tall, half its height). Candidates: a grid over the scan's x-y bounds shrunk by
  0.3 m, at most 0.5 m apart and at most 12 per axis (both ends included; the centre when
  a side is shorter than 0.6 m), each with 8 horizontal view directions (yaw 0, 45, ...,
  315 degrees from +x towards +y). A position must be at least 0.3 m from every scan point
  (when none is, the positions with the largest clearance stay). Every candidate view is
  rendered from the subsampled cloud at 160 x 120 (a quarter of 640 x 480; the same
  horizontal field of view) and scored by the number of distinct objects it shows (an
  object counts when its points win at least 8 pixels there; floor and walls are objects
  too when the aggregation labels them), then by the number of distinct points it shows;
  the best wins, ties going to the first in grid order (x, then y, then yaw).
- SQA3D. The situation's pose is the agent's: its position, and the facing direction SQA3D's
  visualisation draws (R(q) (-1, 0, 0), in the raw mesh frame centred on its bounding box;
  see data_pipelines.readers.sqa3d), both mapped through the axis alignment, the direction
  made horizontal, the eye 1.5 m above the floor (as above). Used as given: no clearance
  rule. A scene's questions come in groups of up to `max_views` (8) distinct situations;
  each group is one BenchmarkScene whose camera k is situation k, and a question starts
  from (and shows) its situation's camera.

Question fields (scene.py): ScanQA: answers = every annotated answer, answer = answer_text =
the first, options [], category "open", answer_objects = our instance indices of its
object_ids (ids absent from the scan, or whose points all fell out of the subsampled cloud,
dropped), initial_view 0, views [0], needs_exploration true; object_ids / object_names as
written. SQA3D: question = situation + " " + question (what SQA3D's models read), answers =
its annotated answers, category = SQA3D's question type (what / is / how / can / which /
others), answer_objects [] (SQA3D names none), initial_view = views[0] = its situation's
camera, needs_exploration true; situation, position, rotation as written. An answer over
MAX_ANSWER_BYTES or a question over MAX_QUESTION_BYTES (UTF-8) is a BenchmarkFormatError.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Iterator

import jax
import numpy as np

from data_pipelines.benchmarks.scene import BenchmarkScene
from data_pipelines.readers.common import BenchmarkFormatError, BenchmarkQuestion
from data_pipelines.readers.scannet import Scan, quaternion_matrix, read_scan
from data_pipelines.readers.scanqa import read_scanqa
from data_pipelines.readers.sqa3d import read_sqa3d
from jaxspatial.geometry import Camera, PointCloud, intrinsics_from_fov, look_at
from jaxspatial.geometry.pointcloud import bucket_size, morton_order
from jaxspatial.render import render, render_batch

MAX_ANSWER_BYTES = 192
MAX_QUESTION_BYTES = 1024
SQA3D_FORWARD = (-1.0, 0.0, 0.0)  # the agent's facing in its own frame (SQA3D's arrow)


@dataclasses.dataclass(frozen=True)
class ViewRule:
  """The numbers of the initial-viewpoint rule (see the module docstring)."""

  eye_height: float = 1.5         # metres above the floor
  clearance: float = 0.3          # metres from every scan point
  grid_step: float = 0.5          # metres between candidate positions, at most
  max_grid: int = 12              # candidate positions per axis, at most
  yaws: int = 8                   # horizontal directions per position
  search_width: int = 160         # render size of the candidate views
  search_height: int = 120
  min_object_pixels: int = 8      # pixels an object must win in a candidate view
  batch: int = 64                 # candidate views per render call (one compile)

  def __post_init__(self):
    for name in ("eye_height", "clearance", "grid_step"):
      value = getattr(self, name)
      if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"ViewRule.{name}: expected a finite number > 0, got {value!r}")
    for name in ("max_grid", "yaws", "search_width", "search_height", "min_object_pixels",
                 "batch"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"ViewRule.{name}: expected an int >= 1, got {value!r}")


@dataclasses.dataclass(frozen=True)
class RenderSettings:
  """How the scene's images are rendered (Act3DParams' defaults)."""

  width: int = 640
  height: int = 480
  hfov_deg: float = 90.0
  splat_radius: int = 1
  background: tuple[int, int, int] = (255, 255, 255)

  def intrinsics(self, width: int | None = None, height: int | None = None) -> np.ndarray:
    fx, fy, cx, cy = intrinsics_from_fov(self.hfov_deg, width or self.width,
                                         height or self.height)
    return np.asarray([fx, fy, cx, cy], np.float32)


# --- the cloud ---------------------------------------------------------------------------


def subsample(scan: Scan, points: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(xyz, rgb, instance) of at most `points` of the scan's points, drawn uniformly without
  replacement by a generator seeded with (seed, CRC-32 of the scene id), in Morton order."""
  if not isinstance(points, int) or isinstance(points, bool) or points < 1:
    raise ValueError(f"points: expected an int >= 1, got {points!r}")
  keep = np.arange(scan.num_points)
  if scan.num_points > points:
    rng = np.random.default_rng([seed, zlib.crc32(scan.scene_id.encode("utf-8"))])
    keep = np.sort(rng.choice(scan.num_points, points, replace=False))
  xyz = scan.xyz[keep]
  order = keep[morton_order(xyz)]
  return scan.xyz[order], scan.rgb[order], scan.instance[order]


def _cloud(xyz, rgb, instance) -> PointCloud:
  """The cloud padded to its bucket size (padded in numpy: jnp.pad would compile again for
  every new number of points)."""
  n = len(xyz)
  size = bucket_size(n)
  pad = lambda a, fill: np.concatenate([a, np.full((size - n,) + a.shape[1:], fill, a.dtype)])
  return PointCloud.create(pad(np.asarray(xyz, np.float32), 0.0),
                           pad(np.asarray(rgb, np.uint8), 0),
                           valid=np.arange(size) < n,
                           instance=pad(np.asarray(instance, np.int32), -1))


def eye_z(scan: Scan, rule: ViewRule) -> float:
  """Eye height above the floor (the scan's lowest z), half the room's height when the room
  is under eye_height + 0.3 m tall."""
  floor, top = float(scan.bounds[0, 2]), float(scan.bounds[1, 2])
  if top - floor < rule.eye_height + 0.3:
    return (floor + top) / 2.0
  return floor + rule.eye_height


def camera_pose(eye, forward) -> np.ndarray:
  """Camera-to-world pose [4, 4] at `eye` looking along `forward` (no roll, z up)."""
  eye = np.asarray(eye, np.float32)
  return np.asarray(look_at(eye, eye + np.asarray(forward, np.float32)), np.float32)


def _level_poses(eyes: np.ndarray, forwards: np.ndarray) -> np.ndarray:
  """`look_at`'s poses [V, 4, 4] for horizontal view directions, in numpy (eager jnp would
  compile its ops again for every new number of views)."""
  forwards = forwards / np.linalg.norm(forwards, axis=-1, keepdims=True)
  right = np.cross(forwards, np.asarray([0.0, 0.0, 1.0]))
  right /= np.linalg.norm(right, axis=-1, keepdims=True)
  down = np.cross(forwards, right)
  poses = np.zeros((len(eyes), 4, 4), np.float32)
  poses[:, :3, :3] = np.stack([right, down, forwards], -1)
  poses[:, :3, 3], poses[:, 3, 3] = eyes, 1.0
  return poses


def _yaw_directions(yaws: int) -> np.ndarray:
  angles = 2.0 * np.pi * np.arange(yaws) / yaws
  return np.stack([np.cos(angles), np.sin(angles), np.zeros(yaws)], -1)


def _axis(low: float, high: float, rule: ViewRule) -> np.ndarray:
  low, high = low + rule.clearance, high - rule.clearance
  if high <= low or rule.max_grid == 1:
    return np.asarray([(low + high) / 2.0])
  steps = int(math.ceil((high - low) / rule.grid_step - 1e-9))
  return np.linspace(low, high, min(rule.max_grid, max(steps, 1) + 1))


def _clearances(xyz: np.ndarray, candidates: np.ndarray, limit: float) -> np.ndarray:
  """Distance from each candidate to its nearest point, capped at `limit` (only points
  within `limit` in z can be closer)."""
  near = xyz[np.abs(xyz[:, 2] - candidates[0, 2]) < limit].astype(np.float64)
  out = np.full(len(candidates), limit)
  step = max(1, 2_000_000 // len(candidates))  # ~50 MB of float64 differences at a time
  for start in range(0, len(near), step):
    chunk = near[start:start + step]
    d2 = ((candidates[:, None, :] - chunk[None, :, :]) ** 2).sum(-1).min(1)
    out = np.minimum(out, np.sqrt(d2))
  return out


def choose_viewpoint(scan: Scan, cloud: PointCloud, render_settings: RenderSettings,
                     rule: ViewRule) -> tuple[np.ndarray, np.ndarray, dict]:
  """(eye [3], forward [3], stats) by the ScanQA rule of the module docstring. `cloud` is
  the subsampled cloud the views are rendered from; clearance is checked against every
  point of the scan."""
  z = eye_z(scan, rule)
  xs = _axis(float(scan.bounds[0, 0]), float(scan.bounds[1, 0]), rule)
  ys = _axis(float(scan.bounds[0, 1]), float(scan.bounds[1, 1]), rule)
  grid = np.stack(np.meshgrid(xs, ys, indexing="ij"), -1).reshape(-1, 2)
  positions = np.concatenate([grid, np.full((len(grid), 1), z)], 1)
  clear = _clearances(scan.xyz, positions, rule.clearance)
  ok = cleared = clear >= rule.clearance
  if not ok.any():
    ok = clear >= clear.max() - 1e-9
  positions = positions[ok]
  directions = _yaw_directions(rule.yaws)
  eyes = np.repeat(positions, rule.yaws, 0)
  forwards = np.tile(directions, (len(positions), 1))
  objects, points = _score_views(cloud, eyes, forwards, render_settings, rule,
                                 len(scan.object_ids))
  best = int(np.lexsort((np.arange(len(eyes)), -points, -objects))[0])
  stats = {"objects": int(objects[best]), "points": int(points[best]),
           "positions": int(len(grid)), "clear_positions": int(cleared.sum()),
           "views_scored": int(len(eyes))}
  return eyes[best], forwards[best], stats


def _score_views(cloud: PointCloud, eyes: np.ndarray, forwards: np.ndarray,
                 settings: RenderSettings, rule: ViewRule, num_objects: int):
  """(distinct objects, distinct points) each candidate view shows."""
  w, h = rule.search_width, rule.search_height
  fx, fy, cx, cy = settings.intrinsics(w, h)
  poses = _level_poses(eyes, forwards)
  objects = np.zeros(len(eyes), np.int64)
  points = np.zeros(len(eyes), np.int64)
  size = rule.batch
  for start in range(0, len(eyes), size):
    chunk = poses[start:start + size]
    n = len(chunk)
    if n < size:  # pad to one shape, so every chunk runs the same compiled program
      chunk = np.concatenate([chunk, np.repeat(chunk[:1], size - n, 0)])
    cameras = Camera.create(np.full(size, fx), np.full(size, fy), np.full(size, cx),
                            np.full(size, cy), chunk)
    views = render_batch(cloud, cameras, h, w, settings.splat_radius, settings.background)
    instance, index = jax.device_get((views.instance, views.point_index))
    instance = np.asarray(instance[:n]).reshape(n, -1)
    index = np.asarray(index[:n]).reshape(n, -1)
    if num_objects:
      rows = np.repeat(np.arange(n), instance.shape[1])
      flat = instance.reshape(-1)
      hit = flat >= 0
      counts = np.bincount(rows[hit] * num_objects + flat[hit],
                           minlength=n * num_objects).reshape(n, num_objects)
      objects[start:start + n] = (counts >= rule.min_object_pixels).sum(1)
    ordered = np.sort(index, axis=1)
    distinct = ((ordered[:, 1:] != ordered[:, :-1]) & (ordered[:, 1:] >= 0)).sum(1)
    points[start:start + n] = distinct + (ordered[:, 0] >= 0)
  return objects, points


def sqa3d_pose(scan: Scan, position, rotation, rule: ViewRule = ViewRule()
               ) -> tuple[np.ndarray, np.ndarray]:
  """(eye [3], forward [3]) of an SQA3D situation in the scan's frame: position (x, y, _)
  from the raw mesh's bounding-box centre, facing R(q) (-1, 0, 0), both through the scan's
  alignment; the direction made horizontal; the eye at eye height."""
  x, y, _ = (float(v) for v in position)
  raw = np.asarray([scan.raw_centre[0] + x, scan.raw_centre[1] + y, scan.raw_centre[2]])
  at = scan.alignment[:3, :3] @ raw + scan.alignment[:3, 3]
  forward = scan.alignment[:3, :3] @ (quaternion_matrix(*rotation) @ np.asarray(SQA3D_FORWARD))
  forward[2] = 0.0
  norm = float(np.linalg.norm(forward))
  if norm < 1e-6:
    raise ValueError(f"{scan.scene_id}: the situation's rotation {list(rotation)} faces "
                     "straight up or down; expected a horizontal facing")
  return np.asarray([at[0], at[1], eye_z(scan, rule)]), forward / norm


# --- questions ---------------------------------------------------------------------------


def _check_text(path, row: int, question: BenchmarkQuestion, text: str) -> None:
  size = len(text.encode("utf-8"))
  if size > MAX_QUESTION_BYTES:
    raise BenchmarkFormatError(path, row, question.question_id, "question", f"{size} bytes "
                               f"of UTF-8, more than MAX_QUESTION_BYTES {MAX_QUESTION_BYTES}")


def _check_answers(path, row: int, question: BenchmarkQuestion) -> None:
  for k, answer in enumerate(question.answers):
    size = len(answer.encode("utf-8"))
    if size > MAX_ANSWER_BYTES:
      raise BenchmarkFormatError(path, row, question.question_id, f"answers[{k}]",
                                 f"{size} bytes of UTF-8, more than MAX_ANSWER_BYTES "
                                 f"{MAX_ANSWER_BYTES}: {answer[:60]!r}")


def _by_scene(questions) -> dict[str, list]:
  scenes: dict[str, list] = {}
  for item in questions:
    scenes.setdefault(item[1].scene_id, []).append(item)
  return scenes


def _render_view(cloud: PointCloud, pose: np.ndarray, settings: RenderSettings) -> np.ndarray:
  fx, fy, cx, cy = settings.intrinsics()
  camera = Camera.create(fx, fy, cx, cy, pose)
  view = render(cloud, camera, settings.height, settings.width, settings.splat_radius,
                settings.background)
  return np.asarray(jax.device_get(view.rgb), np.uint8)


def _settings(width, height, hfov_deg) -> RenderSettings:
  for name, value in (("width", width), ("height", height)):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
  return RenderSettings(width=width, height=height, hfov_deg=hfov_deg)


def scanqa_scenes(questions_path, scene_root, *, points: int = 200_000, width: int = 640,
                  height: int = 480, seed: int = 0, hfov_deg: float = 90.0,
                  rule: ViewRule = ViewRule(), align: bool = True) -> Iterator[BenchmarkScene]:
  """One BenchmarkScene per ScanNet scene of a ScanQA file (in the order scenes first appear
  in it) with all its questions; `scene_root/<scene_id>/` holds each scan."""
  settings = _settings(width, height, hfov_deg)
  rows = list(enumerate(read_scanqa(questions_path, scene_root), 1))
  for row, question in rows:
    _check_text(questions_path, row, question, question.question)
    _check_answers(questions_path, row, question)
  for scene_id, items in _by_scene(rows).items():
    scan = read_scan(scene_root, scene_id, align=align)
    xyz, rgb, instance = subsample(scan, points, seed)
    cloud = _cloud(xyz, rgb, instance)
    eye, forward, stats = choose_viewpoint(scan, cloud, settings, rule)
    pose = camera_pose(eye, forward)
    present = set(np.unique(instance).tolist())
    questions = []
    for row, q in items:
      objects = [scan.instance_of(i) for i in q.object_ids]
      objects = sorted({k for k in objects if k is not None and k in present})
      questions.append({
          "question_id": q.question_id, "question": q.question, "options": [],
          "answer": q.answer, "answer_text": q.answer, "answers": list(q.answers),
          "category": "open", "answer_objects": objects, "initial_view": 0, "views": [0],
          "needs_exploration": True, "order": row - 1, "object_ids": list(q.object_ids),
          "object_names": list(q.object_names)})
    yield BenchmarkScene(
        benchmark="scanqa", scene_id=scene_id, geometry="scan", questions=questions,
        images=[_render_view(cloud, pose, settings)],
        intrinsics=settings.intrinsics()[None], world_from_camera=pose[None],
        xyz=xyz, rgb=rgb, instance=instance, scene_min=scan.bounds[0],
        scene_max=scan.bounds[1], object_names=list(scan.object_names),
        object_centres=scan.object_centres)


def sqa3d_scenes(questions_path, annotations_path, scene_root, *, points: int = 200_000,
                 width: int = 640, height: int = 480, seed: int = 0, hfov_deg: float = 90.0,
                 rule: ViewRule = ViewRule(), max_views: int = 8,
                 align: bool = True) -> Iterator[BenchmarkScene]:
  """SQA3D's questions by scene (in the order scenes first appear in the questions file),
  each scene's distinct situations in groups of up to `max_views`: one BenchmarkScene per
  group, camera k at situation k."""
  if not isinstance(max_views, int) or isinstance(max_views, bool) or max_views < 1:
    raise ValueError(f"max_views: expected an int >= 1, got {max_views!r}")
  settings = _settings(width, height, hfov_deg)
  rows = [(q.meta["row"], q) for q in read_sqa3d(questions_path, annotations_path, scene_root)]
  order = {q.question_id: k for k, (_, q) in enumerate(rows)}
  for row, question in rows:
    _check_text(questions_path, row, question, _sqa3d_text(question))
    _check_answers(annotations_path, question.meta["annotation_row"], question)
  for scene_id, items in _by_scene(rows).items():
    scan = read_scan(scene_root, scene_id, align=align)
    xyz, rgb, instance = subsample(scan, points, seed)
    cloud = _cloud(xyz, rgb, instance)
    situations: dict[tuple, list] = {}
    for item in items:
      q = item[1]
      situations.setdefault((q.meta["position"], q.meta["rotation"]), []).append(item)
    keys = list(situations)
    for start in range(0, len(keys), max_views):
      group = keys[start:start + max_views]
      poses, images, questions = [], [], []
      for view, key in enumerate(group):
        first = situations[key][0][1]
        try:
          eye, forward = sqa3d_pose(scan, *key, rule=rule)
        except ValueError as error:
          raise BenchmarkFormatError(annotations_path, first.meta["annotation_row"],
                                     first.question_id, "rotation", str(error)) from None
        for _, q in situations[key]:
          questions.append({
              "question_id": q.question_id, "question": _sqa3d_text(q), "options": [],
              "answer": q.answer, "answer_text": q.answer, "answers": list(q.answers),
              "category": q.category, "answer_objects": [], "initial_view": view,
              "views": [view], "needs_exploration": True,
              "order": order[q.question_id], "situation": q.meta["situation"], "position": list(key[0]),
              "rotation": list(key[1])})
        poses.append(camera_pose(eye, forward))
        images.append(_render_view(cloud, poses[-1], settings))
      yield BenchmarkScene(
          benchmark="sqa3d", scene_id=scene_id, geometry="scan", questions=questions,
          images=images, intrinsics=np.repeat(settings.intrinsics()[None], len(poses), 0),
          world_from_camera=np.stack(poses), xyz=xyz, rgb=rgb, instance=instance,
          scene_min=scan.bounds[0], scene_max=scan.bounds[1],
          object_names=list(scan.object_names), object_centres=scan.object_centres)


def _sqa3d_text(question: BenchmarkQuestion) -> str:
  situation = question.meta["situation"].strip()
  return f"{situation} {question.question.strip()}" if situation else question.question
