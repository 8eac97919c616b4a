"""Scene examples from an ArrayRecord data source into batches of padded `Task`s, with grain.

    source = SyntheticSpatial(data_dir=..., config="tiny").as_data_source()["train"]
    for tasks, meta in task_batches(source, batch_size=8, seed=0):
        ...  # tasks: Task with a leading batch axis of numpy arrays

One task per question; a scene with Q questions yields Q tasks. Text is stored as
UTF-8 byte ids (`encode_text`) until a policy tokenizer is plugged in: byte ids are
a lossless tokenisation every tokenizer can re-encode from (`decode_text`).
`input_images=True` also carries each scene's stored views (`Task.input_images`, padded
like the cameras; Think3D's prompt shows them); off, tasks carry the empty [8, 0, 0, 3].
"""

from __future__ import annotations

import json

import grain
import jax
import numpy as np

from data_pipelines.synthetic.questions import FAMILIES, LETTERS
from jaxspatial.envs import Task, decode_text  # noqa: F401 (re-exported: readers use it)
from jaxspatial.geometry import Camera, PointCloud, bucket_size

MAX_VIEWS = 8
MAX_QUESTION_BYTES = 384
MAX_ANSWER_BYTES = 128   # ScanQA's longest annotated answers fit
MAX_ANSWERS = 4          # reference answers per question (ScanQA lists several)
MAX_ANSWER_OBJECTS = 4
MAX_QUESTIONS_PER_SCENE = 16


def encode_text(text: str, length: int) -> np.ndarray:
  """UTF-8 bytes as int32 ids, padded with -1; raises if the text is longer."""
  data = np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)
  if len(data) > length:
    raise ValueError(f"encode_text: {len(data)} bytes, more than the padded length {length}: "
                     f"{text[:60]!r}...")
  out = np.full(length, -1, np.int32)
  out[: len(data)] = data
  return out


def answer_rows(question: dict, scene_seed) -> np.ndarray:
  """[MAX_ANSWERS, MAX_ANSWER_BYTES] the question's reference answers (`answers`, a list,
  when the record has several; else `answer_text`), -1 padded."""
  answers = question.get("answers") or [question["answer_text"]]
  if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
    raise ValueError(f"scene {scene_seed}: question {question.get('question', '')[:60]!r}: "
                     f"'answers' must be a list of strings, got {answers!r:.80}")
  if len(answers) > MAX_ANSWERS:
    raise ValueError(f"scene {scene_seed}: question {question.get('question', '')[:60]!r} has "
                     f"{len(answers)} reference answers, more than MAX_ANSWERS {MAX_ANSWERS}")
  rows = np.full((MAX_ANSWERS, MAX_ANSWER_BYTES), -1, np.int32)
  for r, answer in enumerate(answers):
    rows[r] = encode_text(answer, MAX_ANSWER_BYTES)
  return rows


def _pad(array: np.ndarray, length: int, fill) -> np.ndarray:
  widths = [(0, length - len(array))] + [(0, 0)] * (array.ndim - 1)
  return np.pad(array, widths, constant_values=fill)


def scene_tasks(example: dict, max_views: int = MAX_VIEWS, points: int | None = None,
                input_images: bool = False) -> list[tuple[Task, dict]]:
  """Every question of one decoded scene example as (Task of numpy arrays, metadata).
  Clouds pad to `bucket_size` of their size, or to `points` (one shape for scenes of
  different sizes: batches stack them). `input_images`: carry the example's decoded
  `images` (else the empty [max_views, 0, 0, 3])."""
  num_points = len(example["xyz"])
  size = bucket_size(num_points) if points is None else points
  if num_points > size:
    raise ValueError(f"scene {example['scene_seed']}: {num_points} points, more than the "
                     f"padded size {size} (raise the points setting)")
  cloud = PointCloud(xyz=_pad(example["xyz"], size, 0.0), rgb=_pad(example["rgb"], size, 0),
                     valid=_pad(np.ones(num_points, bool), size, False),
                     instance=_pad(example["instance"], size, -1))
  views = len(example["world_from_camera"])
  if not 1 <= views <= max_views:
    raise ValueError(f"scene {example['scene_seed']}: {views} views, expected 1..{max_views}")
  take = np.minimum(np.arange(max_views), views - 1)  # pad by repeating the last view
  intrinsics = example["intrinsics"][take]
  cameras = Camera(fx=intrinsics[:, 0], fy=intrinsics[:, 1], cx=intrinsics[:, 2],
                   cy=intrinsics[:, 3], world_from_camera=example["world_from_camera"][take])
  images = (_scene_images(example, intrinsics[:views])[take] if input_images
            else np.zeros((max_views, 0, 0, 3), np.uint8))
  questions = json.loads(example["questions"])
  if len(questions) > MAX_QUESTIONS_PER_SCENE:
    raise ValueError(f"scene {example['scene_seed']}: {len(questions)} questions, more than "
                     f"{MAX_QUESTIONS_PER_SCENE}")
  out = []
  for q in questions:
    initial = q["initial_view"]
    task = Task(
        cloud=cloud, input_cameras=cameras, num_input_cameras=np.int32(views),
        scene_min=example["scene_min"], scene_max=example["scene_max"],
        question_ids=encode_text(q["question"], MAX_QUESTION_BYTES),
        answer_ids=answer_rows(q, example["scene_seed"]),
        answer_choice=np.int32(LETTERS.index(q["answer"]) if q["options"] else -1),
        answer_objects=_pad(np.asarray(q["answer_objects"], np.int32)[:MAX_ANSWER_OBJECTS],
                            MAX_ANSWER_OBJECTS, -1),
        initial_camera=Camera(fx=intrinsics[initial, 0], fy=intrinsics[initial, 1],
                              cx=intrinsics[initial, 2], cy=intrinsics[initial, 3],
                              world_from_camera=example["world_from_camera"][initial]),
        input_images=images)
    meta = {"scene_seed": np.int64(example["scene_seed"]),
            "family": np.int32(FAMILIES.index(q["family"])),
            "needs_exploration": np.bool_(q["needs_exploration"])}
    out.append((task, meta))
  return out


def _scene_images(example: dict, intrinsics_Vx4: np.ndarray) -> np.ndarray:
  """The example's views [V, H, W, 3] uint8, checked against the cameras: the synthetic
  intrinsics put the principal point at the image centre ((W - 1) / 2, (H - 1) / 2)."""
  scene = example["scene_seed"]
  images = np.asarray(example["images"])
  views = len(intrinsics_Vx4)
  if images.ndim != 4 or images.shape[0] != views or images.shape[-1] != 3:
    raise ValueError(f"scene {scene}: images: expected [{views}, H, W, 3] (one per camera), "
                     f"got {images.shape}")
  if images.dtype != np.uint8:
    raise ValueError(f"scene {scene}: images: expected dtype uint8, got {images.dtype}")
  height, width = images.shape[1:3]
  made_for_w = 2 * intrinsics_Vx4[:, 2] + 1
  made_for_h = 2 * intrinsics_Vx4[:, 3] + 1
  wrong = (np.abs(made_for_w - width) > 1) | (np.abs(made_for_h - height) > 1)
  if wrong.any():
    v = int(np.argmax(wrong))
    raise ValueError(f"scene {scene}: images are {width}x{height} but camera {v}'s intrinsics "
                     f"(cx {intrinsics_Vx4[v, 2]:g}, cy {intrinsics_Vx4[v, 3]:g}) were made for "
                     f"a {made_for_w[v]:g}x{made_for_h[v]:g} image")
  return images


class SceneToTasks(grain.experimental.FlatMapTransform):
  max_fan_out = MAX_QUESTIONS_PER_SCENE

  def __init__(self, points: int | None = None, input_images: bool = False):
    self.points = points
    self.input_images = input_images

  def flat_map(self, element):
    return scene_tasks(element, points=self.points, input_images=self.input_images)


def _stack(items):
  return jax.tree.map(lambda *xs: np.stack(xs), *items)


def task_batches(source, batch_size: int, seed: int = 0, shuffle: bool = True,
                 num_epochs: int | None = 1, drop_remainder: bool = True,
                 shard: tuple[int, int] = (0, 1), points: int | None = None,
                 input_images: bool = False) -> grain.IterDataset:
  """A grain pipeline: scenes (shuffled by seed) -> tasks -> batches of (Task, meta).

  The same seed gives the same batches. num_epochs None repeats forever. `points`: every
  cloud padded to this many points (see `scene_tasks`). `input_images`: tasks carry the
  scenes' stored views (Think3D; off for Act3D and PERIA, whose batches do not need them).
  `shard` (index, count): this process reads only every count-th scene of the shuffled
  order, from index (multi-host: `(jax.process_index(), jax.process_count())`); the
  shards are disjoint. An iterator's `get_state()` / `set_state()` resume it exactly
  (saved with checkpoints).
  """
  index, count = shard
  if not 0 <= index < count:
    raise ValueError(f"task_batches: shard {shard} is not (index, count) with 0 <= index < "
                     "count")
  if len(source) < count:
    raise ValueError(f"task_batches: {len(source)} scenes cannot feed {count} shards")
  dataset = grain.MapDataset.source(source)
  if shuffle:
    dataset = dataset.shuffle(seed=seed)
  if count > 1:
    dataset = dataset[index::count]
  dataset = dataset.repeat(num_epochs)
  tasks = grain.experimental.FlatMapIterDataset(dataset.to_iter_dataset(),
                                                SceneToTasks(points, input_images))
  return tasks.batch(batch_size, drop_remainder=drop_remainder, batch_fn=_stack)
