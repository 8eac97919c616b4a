"""The task an episode is about: a scene, a question, its answer, and where to start.

Every field has a fixed shape (padded, with counts or -1 fills), so a batch of tasks
is one pytree that `jax.vmap` maps over. Text is stored as token ids; tokenising is
the data pipeline's job. A task carries its input views' images when the dataset has
them (Think3D's prompt shows them); otherwise `input_images` is empty, [K, 0, 0, 3], and
an environment that needs them renders the input cameras.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxspatial.geometry import Camera, PointCloud, concrete, validate_camera

Array = jax.Array
INT32_MAX = 2 ** 31 - 1  # ids are stored as int32: larger ones would wrap (2^40 -> 0)


@struct.dataclass
class Task:
  """One episode's inputs.

  cloud:              the padded scene `PointCloud` [P]
  input_cameras:      `Camera` [K], the input views (reconstruction cameras), padded
  num_input_cameras:  [] int32, how many of the K are real
  scene_min, scene_max: [3] float32, the scene's axis-aligned bounds
  question_ids:       [Lq] int32 token ids, padded with -1
  answer_ids:         [R, La] int32 token ids of the R reference answers (several for
                      benchmarks with more than one annotated answer), padded with -1 (a
                      padding row starts with -1)
  answer_choice:      [] int32, index of the correct option for multiple choice, -1 if open
  answer_objects:     [M] int32 instance ids the answer refers to, padded with -1
  initial_camera:     `Camera` [], where the episode starts (Act3D)
  input_images:       [K, H, W, 3] uint8, the input views' images in camera order (padded
                      like `input_cameras`), or [K, 0, 0, 3] when the dataset has none
  """

  cloud: PointCloud
  input_cameras: Camera
  num_input_cameras: Array
  scene_min: Array
  scene_max: Array
  question_ids: Array
  answer_ids: Array
  answer_choice: Array
  answer_objects: Array
  initial_camera: Camera
  input_images: Array

  @property
  def has_input_images(self) -> bool:
    """Static: whether the dataset's images came with the task (else renders stand in)."""
    return self.input_images.shape[-3] > 0 and self.input_images.shape[-2] > 0

  @classmethod
  def create(cls, cloud: PointCloud, input_cameras: Camera, initial_camera: Camera | None = None,
             scene_min=None, scene_max=None, question_ids=(), answer_ids=(),
             answer_choice: int = -1, answer_objects=(), num_input_cameras: int | None = None,
             max_question_tokens: int = 64, max_answer_tokens: int = 16,
             max_answer_objects: int = 4, input_images=None,
             max_answers: int = 1) -> "Task":
    """Builds a task on the host, padding text and object lists to fixed lengths.

    Bounds default to those of the valid points; the initial camera defaults to the
    first input camera. `answer_ids`: one reference's ids, or a list of references (up to
    `max_answers`). `input_images` [K or num_input_cameras, H, W, 3] uint8: the
    input views' images (the real ones alone are padded by repeating the last, as the
    cameras are); None gives the empty [K, 0, 0, 3].
    Raises ValueError naming the field for values that would run silently wrong: cameras
    with non-finite numbers, focal lengths <= 0 or a non-rigid pose, bounds with
    scene_min > scene_max or non-finite, ids outside [0, 2^31 - 1] (int32) or not integers.
    """
    if not isinstance(input_cameras, Camera):
      raise TypeError(f"Task.input_cameras: expected a Camera, got {type(input_cameras).__name__}")
    if input_cameras.world_from_camera.ndim != 3:
      raise ValueError("Task.input_cameras: expected a batch of cameras with pose "
                       f"[K, 4, 4], got {tuple(input_cameras.world_from_camera.shape)}")
    num_cameras = input_cameras.world_from_camera.shape[0]
    if num_input_cameras is None:
      num_input_cameras = num_cameras
    if not isinstance(num_input_cameras, (int, np.integer)) or isinstance(num_input_cameras,
                                                                           bool):
      raise TypeError(f"Task.num_input_cameras: expected an int, got {num_input_cameras!r}")
    if not 1 <= num_input_cameras <= num_cameras:
      raise ValueError(f"Task.num_input_cameras: expected 1..{num_cameras}, "
                       f"got {num_input_cameras}")
    if scene_min is None or scene_max is None:
      xyz = np.asarray(cloud.xyz)[np.asarray(cloud.valid)]
      if len(xyz) == 0:
        raise ValueError("Task: the cloud has no valid points and no bounds were given")
      scene_min = xyz.min(0) if scene_min is None else scene_min
      scene_max = xyz.max(0) if scene_max is None else scene_max
    if initial_camera is None:
      initial_camera = jax.tree.map(lambda x: x[0], input_cameras)
    if not isinstance(initial_camera, Camera):
      raise TypeError(f"Task.initial_camera: expected a Camera, got "
                      f"{type(initial_camera).__name__}")
    if tuple(initial_camera.world_from_camera.shape) != (4, 4):
      raise ValueError(f"Task.initial_camera: expected one camera with pose [4, 4], got "
                       f"{tuple(initial_camera.world_from_camera.shape)}")
    validate_camera(input_cameras, "Task.input_cameras")
    validate_camera(initial_camera, "Task.initial_camera")
    scene_min, scene_max = _bounds(scene_min, scene_max)
    if not isinstance(answer_choice, (int, np.integer)) or isinstance(answer_choice, bool) or (
        not -1 <= answer_choice <= INT32_MAX):
      raise ValueError(f"Task.answer_choice: expected an int >= -1 (-1: open question), got "
                       f"{answer_choice!r}")
    images = _input_images(input_images, num_cameras, num_input_cameras)
    return cls(
        cloud=cloud, input_cameras=input_cameras,
        num_input_cameras=jnp.asarray(num_input_cameras, jnp.int32),
        scene_min=jnp.asarray(scene_min, jnp.float32),
        scene_max=jnp.asarray(scene_max, jnp.float32),
        question_ids=_pad_ids("question_ids", question_ids, max_question_tokens),
        answer_ids=_pad_answers(answer_ids, max_answers, max_answer_tokens),
        answer_choice=jnp.asarray(answer_choice, jnp.int32),
        answer_objects=_pad_ids("answer_objects", answer_objects, max_answer_objects),
        initial_camera=initial_camera, input_images=images)


def _bounds(scene_min, scene_max) -> tuple[np.ndarray, np.ndarray]:
  """The scene box as float32 [3] each: finite, scene_min <= scene_max on every axis (else
  the environments' clamps would silently pick one side)."""
  out = []
  for name, value in (("scene_min", scene_min), ("scene_max", scene_max)):
    try:
      array = np.asarray(value, np.float32)
    except (TypeError, ValueError) as error:
      raise ValueError(f"Task.{name}: expected 3 numbers, got {value!r}") from error
    if array.shape != (3,):
      raise ValueError(f"Task.{name}: expected shape (3,), got {array.shape}")
    if not np.isfinite(array).all():
      raise ValueError(f"Task.{name}: expected finite values, got {array.tolist()}")
    out.append(array)
  low, high = out
  if (low > high).any():
    axis = int(np.argmax(low > high))
    raise ValueError(f"Task.scene_min: expected scene_min <= scene_max on every axis, got "
                     f"scene_min {low.tolist()} and scene_max {high.tolist()} (axis {axis})")
  return low, high


def _ids(name: str, ids) -> np.ndarray:
  """Token or instance ids as int64 [n], each an integer in [0, 2^31 - 1] (int32 storage,
  -1 is the padding)."""
  try:
    array = np.asarray(ids)
  except (TypeError, ValueError) as error:
    raise ValueError(f"Task.{name}: expected integer ids, got {ids!r:.80}") from error
  array = array.reshape(-1)
  if array.size == 0:
    return np.zeros(0, np.int64)
  if array.dtype == bool or not (np.issubdtype(array.dtype, np.integer)
                                 or np.issubdtype(array.dtype, np.floating)):
    raise ValueError(f"Task.{name}: expected integer ids, got dtype {array.dtype}")
  if np.issubdtype(array.dtype, np.floating):
    whole = np.isfinite(array) & (array == np.round(array))
    if not whole.all():
      raise ValueError(f"Task.{name}: expected integer ids, got {array[~whole][0].item()!r}")
  bad = (array < 0) | (array > INT32_MAX)
  if bad.any():
    raise ValueError(f"Task.{name}: expected ids in [0, 2^31 - 1] (stored as int32), got "
                     f"{array[bad][0].item()!r}")
  return array.astype(np.int64)


def _pad_answers(answers, count: int, length: int) -> Array:
  """[count, length] rows of reference ids, -1 padded: from one reference's ids or a list."""
  if isinstance(answers, (str, bytes)):
    raise ValueError(f"Task.answer_ids: expected token ids (or a list of rows), got text "
                     f"{answers!r:.80}; tokenise it first")
  items = list(answers)
  if items and not np.isscalar(items[0]):
    rows = [_ids("answer_ids", a) for a in items]
  else:
    rows = [_ids("answer_ids", items)] if items else []
  if len(rows) > count:
    raise ValueError(f"Task.answer_ids: {len(rows)} reference answers, more than max_answers "
                     f"{count}")
  out = np.full((count, length), -1, np.int32)
  for r, row in enumerate(rows):
    if len(row) > length:
      raise ValueError(f"Task.answer_ids: reference {r} has {len(row)} entries, more than the "
                       f"padded length {length}")
    out[r, :len(row)] = row
  return jnp.asarray(out)


def _input_images(images, num_cameras: int, num_real: int) -> Array:
  """The input views' images [K, H, W, 3] uint8, padded by repeating the last real one."""
  if images is None:
    return jnp.zeros((num_cameras, 0, 0, 3), jnp.uint8)
  dtype = getattr(images, "dtype", None)
  if dtype != np.uint8:
    raise ValueError(f"Task.input_images: expected dtype uint8, got {dtype}")
  shape = tuple(images.shape)
  if len(shape) != 4 or shape[-1] != 3 or shape[1] == 0 or shape[2] == 0:
    raise ValueError(f"Task.input_images: expected shape [K, H, W, 3] with H, W > 0, got {shape}")
  if shape[0] not in (num_cameras, num_real):
    raise ValueError(f"Task.input_images: expected {num_cameras} images (one per input camera) "
                     f"or {num_real} (the real ones), got {shape[0]}")
  take = np.minimum(np.arange(num_cameras), shape[0] - 1)
  return jnp.asarray(np.asarray(images)[take])


def _pad_ids(name: str, ids, length: int) -> Array:
  if isinstance(ids, (str, bytes)):
    raise ValueError(f"Task.{name}: expected ids, got text {ids!r:.80}; tokenise it first")
  ids = _ids(name, ids)
  if len(ids) > length:
    raise ValueError(f"Task.{name}: {len(ids)} entries, more than the padded length {length}")
  out = np.full(length, -1, np.int32)
  out[: len(ids)] = ids
  return jnp.asarray(out)


def decode_text(ids) -> str:
  """A task's -1-padded byte ids (question, answers) as text."""
  ids = np.asarray(ids)
  return bytes(ids[ids >= 0].astype(np.uint8).tolist()).decode("utf-8")


def check_task(task: Task) -> None:
  """Raises ValueError naming the field when what a task holds on the host (not tracers)
  could not give a sound episode: its initial camera or real input cameras unusable
  (`validate_camera`), or its bounds non-finite or with scene_min > scene_max. Tasks built
  by `Task.create` pass; this guards those built directly (the loader) or edited. Under
  jit or vmap the fields are tracers and the environments flag the episode on device
  (`usable`)."""
  if not isinstance(task, Task):
    raise TypeError(f"expected a Task, got {type(task).__name__}")
  validate_camera(task.initial_camera, "Task.initial_camera")
  count = concrete(task.num_input_cameras)
  cameras = task.input_cameras
  if count is not None and count.ndim == 0 and cameras.world_from_camera.ndim == 3:
    cameras = jax.tree.map(lambda x: x[:max(int(count), 0)], cameras)
  validate_camera(cameras, "Task.input_cameras")
  low, high = concrete(task.scene_min), concrete(task.scene_max)
  if low is not None and high is not None:
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
      raise ValueError(f"Task.scene_min/scene_max: expected finite bounds, got "
                       f"{low.tolist()} and {high.tolist()}")
    if (low > high).any():
      raise ValueError(f"Task.scene_min: expected scene_min <= scene_max on every axis, got "
                       f"scene_min {low.tolist()} and scene_max {high.tolist()}")


def camera_is_finite(camera: Camera) -> Array:
  """[...] whether each camera's intrinsics and pose are all finite (on device)."""
  pose = jnp.all(jnp.isfinite(camera.world_from_camera), axis=(-1, -2))
  return pose & jnp.isfinite(camera.fx) & jnp.isfinite(camera.fy) & jnp.isfinite(
      camera.cx) & jnp.isfinite(camera.cy)


def bounds_are_sound(task: Task) -> Array:
  """[] whether the scene box is finite with scene_min <= scene_max (on device)."""
  return jnp.all(jnp.isfinite(task.scene_min) & jnp.isfinite(task.scene_max)
                 & (task.scene_min <= task.scene_max))
