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

import dataclasses
import json
from collections.abc import Mapping

import grain
import jax
import numpy as np

from data_pipelines.synthetic.questions import FAMILIES, LETTERS
from jaxspatial.envs import Task, decode_text  # noqa: F401 (re-exported: readers use it)
from jaxspatial.geometry import Camera, PointCloud, bucket_size
from jaxspatial import errors

MAX_VIEWS = 8
MAX_QUESTION_BYTES = 384
MAX_ANSWER_BYTES = 128   # ScanQA's longest annotated answers fit
MAX_ANSWERS = 4          # reference answers per question (ScanQA lists several)
MAX_ANSWER_OBJECTS = 4
MAX_QUESTIONS_PER_SCENE = 16


@dataclasses.dataclass(frozen=True)
class TaskLimits:
  """The padded sizes of a dataset's tasks: question bytes, reference answers and their
  bytes, answer objects, questions per scene. The synthetic set's are the module's MAX_*
  constants; a benchmark's come with its builder config (real questions run longer:
  MindCube's reach 569 bytes, ScanQA's answers 162 bytes, 8 answers, 25 objects, and a
  ScanNet scene holds up to 170 questions)."""

  question_bytes: int = MAX_QUESTION_BYTES
  answer_bytes: int = MAX_ANSWER_BYTES
  answers: int = MAX_ANSWERS
  answer_objects: int = MAX_ANSWER_OBJECTS
  questions_per_scene: int = MAX_QUESTIONS_PER_SCENE


SYNTHETIC_LIMITS = TaskLimits()


def encode_text(text: str, length: int) -> np.ndarray:
  """UTF-8 bytes as int32 ids, padded with -1; raises if the text is longer."""
  data = np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)
  if len(data) > length:
    raise ValueError(f"encode_text: {len(data)} bytes, more than the padded length {length}: "
                     f"{text[:60]!r}...")
  out = np.full(length, -1, np.int32)
  out[: len(data)] = data
  return out


class RecordError(errors.RecordError):
  """A dataset record (one scene example) that breaks the stored format
  (data_pipelines/builders/synthetic_spatial.py). `scene` is its scene_seed, `field` the
  field (`questions[2].initial_view` for a question's), the message says what was expected
  and what the record holds."""

  def __init__(self, scene, field: str, problem: str):
    self.scene, self.field, self.problem = scene, field, problem
    super().__init__(f"scene {scene}: {field}: {problem}")

  def __reduce__(self):  # pickles across processes (grain workers) with its fields
    return type(self), (self.scene, self.field, self.problem)


def _got(value) -> str:
  text = repr(value)
  return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _is_int(value) -> bool:
  return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def answer_rows(question: dict, scene_seed, prefix: str = "",
                limits: TaskLimits = SYNTHETIC_LIMITS) -> np.ndarray:
  """[limits.answers, limits.answer_bytes] the question's reference answers (`answers`, a list,
  when the record has several; else `answer_text`), -1 padded. `prefix` names the
  question in errors (`questions[2].`)."""
  label = f"question {str(question.get('question', ''))[:60]!r}"
  answers = question.get("answers")
  if answers is not None and not (isinstance(answers, list) and not answers):
    name = "answers"
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
      raise RecordError(scene_seed, prefix + name,
                        f"{label}: expected a list of strings, got {_got(answers)}")
  elif "answer_text" in question:
    name, answers = "answer_text", [question["answer_text"]]
    if not isinstance(answers[0], str):
      raise RecordError(scene_seed, prefix + name,
                        f"{label}: expected a string, got {_got(answers[0])}")
  else:
    raise RecordError(scene_seed, prefix + "answer_text", f"{label}: missing")
  if len(answers) > limits.answers:
    raise RecordError(scene_seed, prefix + name, f"{label} has {len(answers)} reference "
                      f"answers, more than MAX_ANSWERS {limits.answers}")
  rows = np.full((limits.answers, limits.answer_bytes), -1, np.int32)
  for r, answer in enumerate(answers):
    where = f"{prefix}{name}[{r}]" if name == "answers" else prefix + name
    if not answer.strip():
      raise RecordError(scene_seed, where, f"{label}: expected a non-empty answer, got "
                        f"{answer!r}")
    try:
      size = len(answer.encode("utf-8"))
    except UnicodeEncodeError:
      raise RecordError(scene_seed, where, f"{label}: expected UTF-8 encodable text, got "
                        f"{answer[:60]!r}") from None
    if size > limits.answer_bytes:
      raise RecordError(scene_seed, where, f"{label}: {size} bytes, more than the padded "
                        f"length {limits.answer_bytes}")
    rows[r] = encode_text(answer, limits.answer_bytes)
  return rows


def _pad(array: np.ndarray, length: int, fill) -> np.ndarray:
  widths = [(0, length - len(array))] + [(0, 0)] * (array.ndim - 1)
  return np.pad(array, widths, constant_values=fill)


def scene_label(example) -> int | str:
  """The scene_seed errors name a record by (a placeholder when it has none)."""
  seed = example.get("scene_seed") if isinstance(example, Mapping) else None
  if isinstance(seed, np.ndarray) and seed.ndim == 0:
    seed = seed[()]
  return int(seed) if _is_int(seed) else "<no valid scene_seed>"


def _array(example, scene, name: str, dtype, shape: tuple) -> np.ndarray:
  """example[name]: a numpy array of exactly `dtype` and `shape` (str entries: any length),
  finite when floating point."""
  if name not in example:
    raise RecordError(scene, name, "missing")
  value = example[name]
  dtype = np.dtype(dtype)
  want = "[" + ", ".join(str(s) for s in shape) + "]"
  if not isinstance(value, np.ndarray):
    raise RecordError(scene, name, f"expected a numpy array {want} of {dtype}, got "
                      f"{_got(value)}")
  if value.dtype != dtype:
    raise RecordError(scene, name, f"expected dtype {dtype}, got {value.dtype}")
  if value.ndim != len(shape) or any(isinstance(s, int) and s != d
                                     for s, d in zip(shape, value.shape)):
    raise RecordError(scene, name, f"expected shape {want}, got {value.shape}")
  if dtype.kind == "f" and not np.isfinite(value).all():
    first = np.argwhere(~np.isfinite(value))[0]
    raise RecordError(scene, name, f"expected finite values, got {value[tuple(first)]} at "
                      f"index {tuple(int(i) for i in first)}")
  return value


def scene_questions(example, scene=None,
                    limits: TaskLimits = SYNTHETIC_LIMITS) -> list[dict]:
  """The example's `questions` (JSON text): a list of at most `limits.questions_per_scene`
  question objects, or a RecordError."""
  scene = scene_label(example) if scene is None else scene
  if not isinstance(example, Mapping):
    raise RecordError(scene, "<record>", f"expected a mapping of fields, got {_got(example)}")
  if "questions" not in example:
    raise RecordError(scene, "questions", "missing")
  text = example["questions"]
  if isinstance(text, np.ndarray) and text.ndim == 0:
    text = text[()]
  if not isinstance(text, (str, bytes)):
    raise RecordError(scene, "questions", f"expected JSON text, got {_got(text)}")
  try:
    questions = json.loads(text)
  except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError
    raise RecordError(scene, "questions", f"expected JSON text, got text that does not "
                      f"parse ({str(error)[:100]})") from None
  if not isinstance(questions, list) or not all(isinstance(q, dict) for q in questions):
    raise RecordError(scene, "questions", f"expected a JSON list of question objects, got "
                      f"{_got(questions)}")
  if len(questions) > limits.questions_per_scene:
    raise RecordError(scene, "questions", f"expected at most MAX_QUESTIONS_PER_SCENE "
                      f"{limits.questions_per_scene} questions, got {len(questions)}")
  return questions


def benchmark_name(example) -> str | None:
  """A benchmark record's `benchmark` (builders/spatial_benchmark.py), None for the
  synthetic set's records."""
  name = example.get("benchmark") if isinstance(example, Mapping) else None
  if isinstance(name, np.ndarray) and name.ndim == 0:
    name = name[()]
  return name.decode() if isinstance(name, bytes) else name


def _geometry(example, scene) -> str:
  value = example.get("geometry", "scan")
  if isinstance(value, np.ndarray) and value.ndim == 0:
    value = value[()]
  value = value.decode() if isinstance(value, bytes) else value
  if value not in ("scan", "reconstruction", "none"):
    raise RecordError(scene, "geometry", f"expected 'scan', 'reconstruction' or 'none', got "
                      f"{_got(value)}")
  return value


def check_example(example, max_views: int = MAX_VIEWS, points: int | None = None,
                  input_images: bool = False,
                  limits: TaskLimits = SYNTHETIC_LIMITS) -> list[dict]:
  """Checks one decoded scene example against the stored format and returns its
  questions; a RecordError names the scene, the field, what was expected and what was got.

  Per-point arrays (xyz float32 [N, 3], rgb uint8 [N, 3], instance int32 [N]) have one
  length; cameras (intrinsics [V, 4], world_from_camera [V, 4, 4] rigid poses, images,
  depth) one count V in 1..max_views; instance ids lie in -1..objects - 1; every question
  has its fields with their types, its initial view and views among the V, its answer
  letter among its options (answer_text that option), at most `limits.answer_objects`
  answer objects, each an instance present in the cloud. A benchmark record (one with
  `benchmark`) names each question's `category` instead of a synthetic family, and one of
  geometry "none" has an empty cloud."""
  scene = scene_label(example)
  if not isinstance(example, Mapping):
    raise RecordError(scene, "<record>", f"expected a mapping of fields, got {_got(example)}")
  if "scene_seed" not in example:
    raise RecordError(scene, "scene_seed", "missing")
  if not isinstance(scene, int):
    raise RecordError(scene, "scene_seed", f"expected an integer, got "
                      f"{_got(example['scene_seed'])}")
  if not -2**63 <= scene < 2**63:
    raise RecordError(scene, "scene_seed", f"expected an int64, got {scene}")
  if points is not None and (not _is_int(points) or points < 1):
    raise ValueError(f"scene_tasks: points must be a positive integer or None, got {points!r}")
  benchmark = benchmark_name(example)
  if benchmark is not None and not isinstance(benchmark, str):
    raise RecordError(scene, "benchmark", f"expected the benchmark's name, got "
                      f"{_got(benchmark)}")
  geometry = _geometry(example, scene) if benchmark is not None else "scan"
  xyz = _array(example, scene, "xyz", np.float32, ("N", 3))
  num_points = len(xyz)
  if num_points == 0 and geometry != "none":
    raise RecordError(scene, "xyz", "expected at least one point, got 0")
  size = bucket_size(num_points) if points is None else points
  if num_points > size:
    raise RecordError(scene, "xyz", f"{num_points} points, more than the padded size {size} "
                      "(raise the points setting)")
  for name, dtype, shape in (("rgb", np.uint8, ("N", 3)), ("instance", np.int32, ("N",))):
    value = _array(example, scene, name, dtype, shape)
    if len(value) != num_points:
      raise RecordError(scene, name, f"expected {num_points} rows (one per xyz point), got "
                        f"{len(value)}")
  low = _array(example, scene, "scene_min", np.float32, (3,))
  high = _array(example, scene, "scene_max", np.float32, (3,))
  if (low > high).any():
    raise RecordError(scene, "scene_max", f"expected scene_max >= scene_min on every axis, "
                      f"got min {low.tolist()} and max {high.tolist()}")
  intrinsics = _array(example, scene, "intrinsics", np.float32, ("V", 4))
  poses = _array(example, scene, "world_from_camera", np.float32, ("V", 4, 4))
  views = len(poses)
  if not 1 <= views <= max_views:
    raise RecordError(scene, "world_from_camera", f"expected 1..{max_views} views, got {views}")
  if len(intrinsics) != views:
    raise RecordError(scene, "intrinsics", f"expected {views} rows (one per camera of "
                      f"world_from_camera), got {len(intrinsics)}")
  if (intrinsics[:, :2] <= 0).any():
    v = int(np.argmax((intrinsics[:, :2] <= 0).any(1)))
    raise RecordError(scene, "intrinsics", f"expected focal lengths fx, fy > 0, got camera "
                      f"{v}'s {intrinsics[v, :2].tolist()}")
  rotation = poses[:, :3, :3].astype(np.float64)
  skew = np.abs(rotation @ np.swapaxes(rotation, 1, 2) - np.eye(3)).max((1, 2))
  bottom = np.abs(poses[:, 3] - np.array([0, 0, 0, 1], np.float32)).max(1)
  wrong = (skew > 1e-3) | (bottom > 1e-5) | (np.linalg.det(rotation) <= 0)
  if wrong.any():
    v = int(np.argmax(wrong))
    raise RecordError(scene, "world_from_camera", f"expected rigid camera-to-world poses (a "
                      f"rotation, last row 0 0 0 1), got camera {v}'s {poses[v].tolist()}")
  if input_images:
    _scene_images(example, intrinsics, principal_point_check=benchmark is None)
  elif "images" in example:
    images = example["images"]
    if not isinstance(images, (list, tuple, np.ndarray)) or (isinstance(images, np.ndarray)
                                                             and images.ndim == 0):
      raise RecordError(scene, "images", f"expected a sequence of views, got {_got(images)}")
    if len(images) != views:
      raise RecordError(scene, "images", f"expected {views} views (one per camera), got "
                        f"{len(images)}")
  if "rig" in example and not isinstance(example["rig"], (str, bytes)):
    raise RecordError(scene, "rig", f"expected the rig's name, got {_got(example['rig'])}")
  if "depth" in example:
    depth = example["depth"]
    if not isinstance(depth, np.ndarray) or depth.dtype != np.float32:
      raise RecordError(scene, "depth", f"expected a float32 array [{views}, H, W], got "
                        f"{_got(depth)}")
    if depth.ndim != 3 or len(depth) != views:
      raise RecordError(scene, "depth", f"expected shape [{views}, H, W] (one per camera), got "
                        f"{depth.shape}")
  objects = None
  if "object_names" in example:
    names = example["object_names"]
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, (str, bytes))
                                                      for n in names):
      raise RecordError(scene, "object_names", f"expected a list of names, got {_got(names)}")
    objects = len(names)
  if "object_centres" in example:
    centres = _array(example, scene, "object_centres", np.float32, ("O", 3))
    if objects is not None and len(centres) != objects:
      raise RecordError(scene, "object_centres", f"expected {objects} rows (one per object "
                        f"name), got {len(centres)}")
    objects = len(centres)
  instance = example["instance"]
  low_id, high_id = (int(instance.min()), int(instance.max())) if len(instance) else (-1, -1)
  if low_id < -1 or objects is not None and high_id >= objects:
    want = "-1 or more" if objects is None else f"-1..{objects - 1} ({objects} objects)"
    raise RecordError(scene, "instance", f"expected object ids {want}, -1 for none, got "
                      f"{low_id if low_id < -1 else high_id}")
  questions = scene_questions(example, scene, limits)
  present: set[int] = set()
  if any(q.get("answer_objects") for q in questions if isinstance(q, dict)):
    present = set(np.unique(instance).tolist())
  for k, question in enumerate(questions):
    _check_question(question, f"questions[{k}].", scene, views, present, limits,
                    benchmark is not None)
  return questions


def _check_question(q: dict, at: str, scene, views: int, present: set[int],
                    limits: TaskLimits = SYNTHETIC_LIMITS, benchmark: bool = False) -> None:
  def get(name, kinds, what):
    if name not in q:
      raise RecordError(scene, at + name, "missing")
    value = q[name]
    if not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds:
      raise RecordError(scene, at + name, f"expected {what}, got {_got(value)}")
    return value

  text = get("question", (str,), "a string")
  try:
    size = len(text.encode("utf-8"))
  except UnicodeEncodeError:
    raise RecordError(scene, at + "question", f"expected UTF-8 encodable text, got "
                      f"{text[:60]!r}") from None
  if not text.strip() or size > limits.question_bytes:
    raise RecordError(scene, at + "question", f"expected 1..{limits.question_bytes} bytes of "
                      f"text, got {size} bytes: {text[:60]!r}")
  if benchmark:
    get("question_id", (str,), "the benchmark's question id")
    if not get("category", (str,), "the question's category"):
      raise RecordError(scene, at + "category", "expected a category name, got ''")
  else:
    family = get("family", (str,), "a string")
    if family not in FAMILIES:
      raise RecordError(scene, at + "family", f"expected one of {FAMILIES}, got {family!r}")
  get("needs_exploration", (bool,), "a bool")
  options = get("options", (list,), "a list of option strings")
  if options and not 2 <= len(options) <= len(LETTERS) or not all(
      isinstance(o, str) and o.strip() for o in options):
    raise RecordError(scene, at + "options", f"expected [] (an open question) or 2.."
                      f"{len(LETTERS)} non-empty strings, got {_got(options)}")
  answer = get("answer", (str,), "a string")
  answer_text = get("answer_text", (str,), "a string")
  if options:
    letters = LETTERS[:len(options)]
    if len(answer) != 1 or answer not in letters:
      raise RecordError(scene, at + "answer", f"expected one of {letters!r} (the letters of "
                        f"its {len(options)} options), got {answer!r}")
    chosen = options[letters.index(answer)]
    if answer_text != chosen:
      raise RecordError(scene, at + "answer_text", f"expected option {answer} "
                        f"{chosen!r}, got {answer_text!r}")
  answer_rows(q, scene, at, limits)
  objects = get("answer_objects", (list,), "a list of instance ids")
  if len(objects) > limits.answer_objects:
    raise RecordError(scene, at + "answer_objects", f"expected at most MAX_ANSWER_OBJECTS "
                      f"{limits.answer_objects} ids, got {len(objects)}: {_got(objects)}")
  for obj in objects:
    if not _is_int(obj) or obj < 0 or int(obj) not in present:
      raise RecordError(scene, at + "answer_objects", f"expected instance ids of the cloud's "
                        f"objects ({sorted(i for i in present if i >= 0)}), got {_got(obj)}")
  initial = get("initial_view", (int,), "an integer view index")
  if not 0 <= initial < views:
    raise RecordError(scene, at + "initial_view", f"expected 0..{views - 1} (the scene's "
                      f"{views} views), got {initial}")
  if "views" in q:
    shown = get("views", (list,), "a list of view indices")
    if not all(_is_int(v) and 0 <= v < views for v in shown):
      raise RecordError(scene, at + "views", f"expected view indices in 0..{views - 1}, got "
                        f"{_got(shown)}")


def scene_tasks(example: dict, max_views: int = MAX_VIEWS, points: int | None = None,
                input_images: bool = False,
                limits: TaskLimits = SYNTHETIC_LIMITS) -> list[tuple[Task, dict]]:
  """Every question of one decoded scene example as (Task of numpy arrays, metadata).
  Clouds pad to `bucket_size` of their size, or to `points` (one shape for scenes of
  different sizes: batches stack them). `input_images`: carry the example's decoded
  `images` (else the empty [max_views, 0, 0, 3]). The example is checked first
  (`check_example`): a record that breaks the stored format raises a RecordError.
  Metadata: the scene's seed and, for the synthetic set, the question's family index and
  needs_exploration; for a benchmark its question_id and category (strings)."""
  questions = check_example(example, max_views, points, input_images, limits)
  benchmark = benchmark_name(example)
  scene = scene_label(example)
  num_points = len(example["xyz"])
  size = bucket_size(num_points) if points is None else points
  cloud = PointCloud(xyz=_pad(example["xyz"], size, 0.0), rgb=_pad(example["rgb"], size, 0),
                     valid=_pad(np.ones(num_points, bool), size, False),
                     instance=_pad(example["instance"], size, -1))
  views = len(example["world_from_camera"])
  take = np.minimum(np.arange(max_views), views - 1)  # pad by repeating the last view
  intrinsics = example["intrinsics"][take]
  cameras = Camera(fx=intrinsics[:, 0], fy=intrinsics[:, 1], cx=intrinsics[:, 2],
                   cy=intrinsics[:, 3], world_from_camera=example["world_from_camera"][take])
  images = (_scene_images(example, intrinsics[:views], benchmark is None)[take]
            if input_images else np.zeros((max_views, 0, 0, 3), np.uint8))
  out = []
  for q in questions:
    initial = q["initial_view"]
    task = Task(
        cloud=cloud, input_cameras=cameras, num_input_cameras=np.int32(views),
        scene_min=example["scene_min"], scene_max=example["scene_max"],
        question_ids=encode_text(q["question"], limits.question_bytes),
        answer_ids=answer_rows(q, scene, limits=limits),
        answer_choice=np.int32(LETTERS.index(q["answer"]) if q["options"] else -1),
        answer_objects=_pad(np.asarray(q["answer_objects"], np.int32).reshape(-1),
                            limits.answer_objects, -1),
        initial_camera=Camera(fx=intrinsics[initial, 0], fy=intrinsics[initial, 1],
                              cx=intrinsics[initial, 2], cy=intrinsics[initial, 3],
                              world_from_camera=example["world_from_camera"][initial]),
        input_images=images)
    if benchmark is None:
      meta = {"scene_seed": np.int64(scene),
              "family": np.int32(FAMILIES.index(q["family"])),
              "needs_exploration": np.bool_(q["needs_exploration"])}
    else:
      meta = {"scene_seed": np.int64(scene), "question_id": np.str_(q["question_id"]),
              "category": np.str_(q["category"])}
    out.append((task, meta))
  return out


def _scene_images(example: dict, intrinsics_Vx4: np.ndarray,
                  principal_point_check: bool = True) -> np.ndarray:
  """The example's views [V, H, W, 3] uint8, checked against the cameras: the synthetic
  intrinsics put the principal point at the image centre ((W - 1) / 2, (H - 1) / 2); a
  benchmark's reconstructed cameras need not (`principal_point_check` False)."""
  scene = scene_label(example)
  if "images" not in example:
    raise RecordError(scene, "images", "missing (input_images needs the stored views)")
  images = example["images"]
  views = len(intrinsics_Vx4)
  if isinstance(images, (list, tuple)):
    if not all(isinstance(i, np.ndarray) for i in images):
      raise RecordError(scene, "images", f"expected a list of [H, W, 3] uint8 arrays, got "
                        f"{_got(images)}")
    shapes = sorted({i.shape for i in images})
    if len(shapes) > 1:
      raise RecordError(scene, "images", f"expected views of one shape, got {shapes[:4]}")
    images = np.stack(images) if images else np.zeros((0,), np.uint8)
  if not isinstance(images, np.ndarray):
    raise RecordError(scene, "images", f"expected [{views}, H, W, 3] uint8 views, got "
                      f"{_got(images)}")
  if (images.ndim != 4 or images.shape[0] != views or images.shape[-1] != 3
      or 0 in images.shape):
    raise RecordError(scene, "images", f"expected [{views}, H, W, 3] (one per camera), "
                      f"got {images.shape}")
  if images.dtype != np.uint8:
    raise RecordError(scene, "images", f"expected dtype uint8, got {images.dtype}")
  height, width = images.shape[1:3]
  if not principal_point_check:
    return images
  made_for_w = 2 * intrinsics_Vx4[:, 2] + 1
  made_for_h = 2 * intrinsics_Vx4[:, 3] + 1
  wrong = (np.abs(made_for_w - width) > 1) | (np.abs(made_for_h - height) > 1)
  if wrong.any():
    v = int(np.argmax(wrong))
    raise RecordError(scene, "images", f"images are {width}x{height} but camera {v}'s "
                      f"intrinsics (cx {intrinsics_Vx4[v, 2]:g}, cy {intrinsics_Vx4[v, 3]:g}) "
                      f"were made for a {made_for_w[v]:g}x{made_for_h[v]:g} image")
  return images


class SceneToTasks(grain.experimental.FlatMapTransform):
  max_fan_out = MAX_QUESTIONS_PER_SCENE

  def __init__(self, points: int | None = None, input_images: bool = False,
               limits: TaskLimits = SYNTHETIC_LIMITS):
    self.points = points
    self.input_images = input_images
    self.limits = limits
    self.max_fan_out = limits.questions_per_scene

  def flat_map(self, element):
    return scene_tasks(element, points=self.points, input_images=self.input_images,
                       limits=self.limits)


def _stack(items):
  return jax.tree.map(lambda *xs: np.stack(xs), *items)


def task_batches(source, batch_size: int, seed: int = 0, shuffle: bool = True,
                 num_epochs: int | None = 1, drop_remainder: bool = True,
                 shard: tuple[int, int] = (0, 1), points: int | None = None,
                 input_images: bool = False,
                 limits: TaskLimits = SYNTHETIC_LIMITS) -> grain.IterDataset:
  """A grain pipeline: scenes (shuffled by seed) -> tasks -> batches of (Task, meta).

  The same seed gives the same batches. num_epochs None repeats forever. `points`: every
  cloud padded to this many points (see `scene_tasks`). `input_images`: tasks carry the
  scenes' stored views (Think3D; off for Act3D and PERIA, whose batches do not need them).
  `shard` (index, count): this process reads only every count-th scene of the shuffled
  order, from index (multi-host: `(jax.process_index(), jax.process_count())`); the
  shards are disjoint. An iterator's `get_state()` / `set_state()` resume it exactly
  (saved with checkpoints). `limits`: the dataset's padded sizes (a benchmark's:
  `builders.spatial_benchmark.task_limits`).
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
                                                SceneToTasks(points, input_images,
                                                             limits))
  return tasks.batch(batch_size, drop_remainder=drop_remainder, batch_fn=_stack)
