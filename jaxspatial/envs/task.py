"""The task an episode is about: a scene, a question, its answer, and where to start.

Every field has a fixed shape (padded, with counts or -1 fills), so a batch of tasks
is one pytree that `jax.vmap` maps over. Text is stored as token ids; tokenising is
the data pipeline's job.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxspatial.geometry import Camera, PointCloud

Array = jax.Array


@struct.dataclass
class Task:
  """One episode's inputs.

  cloud:              the padded scene `PointCloud` [P]
  input_cameras:      `Camera` [K], the input views (reconstruction cameras), padded
  num_input_cameras:  [] int32, how many of the K are real
  scene_min, scene_max: [3] float32, the scene's axis-aligned bounds
  question_ids:       [Lq] int32 token ids, padded with -1
  answer_ids:         [La] int32 token ids of the reference answer, padded with -1
  answer_choice:      [] int32, index of the correct option for multiple choice, -1 if open
  answer_objects:     [M] int32 instance ids the answer refers to, padded with -1
  initial_camera:     `Camera` [], where the episode starts (Act3D)
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

  @classmethod
  def create(cls, cloud: PointCloud, input_cameras: Camera, initial_camera: Camera | None = None,
             scene_min=None, scene_max=None, question_ids=(), answer_ids=(),
             answer_choice: int = -1, answer_objects=(), num_input_cameras: int | None = None,
             max_question_tokens: int = 64, max_answer_tokens: int = 16,
             max_answer_objects: int = 4) -> "Task":
    """Builds a task on the host, padding text and object lists to fixed lengths.

    Bounds default to those of the valid points; the initial camera defaults to the
    first input camera.
    """
    if input_cameras.world_from_camera.ndim != 3:
      raise ValueError("Task.input_cameras: expected a batch of cameras with pose "
                       f"[K, 4, 4], got {tuple(input_cameras.world_from_camera.shape)}")
    num_cameras = input_cameras.world_from_camera.shape[0]
    if num_input_cameras is None:
      num_input_cameras = num_cameras
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
    return cls(
        cloud=cloud, input_cameras=input_cameras,
        num_input_cameras=jnp.asarray(num_input_cameras, jnp.int32),
        scene_min=jnp.asarray(scene_min, jnp.float32),
        scene_max=jnp.asarray(scene_max, jnp.float32),
        question_ids=_pad_ids("question_ids", question_ids, max_question_tokens),
        answer_ids=_pad_ids("answer_ids", answer_ids, max_answer_tokens),
        answer_choice=jnp.asarray(answer_choice, jnp.int32),
        answer_objects=_pad_ids("answer_objects", answer_objects, max_answer_objects),
        initial_camera=initial_camera)


def _pad_ids(name: str, ids, length: int) -> Array:
  ids = np.asarray(ids, np.int64).reshape(-1)
  if len(ids) > length:
    raise ValueError(f"Task.{name}: {len(ids)} entries, more than the padded length {length}")
  out = np.full(length, -1, np.int32)
  out[: len(ids)] = ids
  return jnp.asarray(out)
