"""Task construction: padding, defaults and named errors."""

import jax
import numpy as np
import pytest

from data_pipelines.synthetic import make_room, orbit_cameras
from jaxspatial.envs import Task


def test_task_pads_text_and_objects_and_defaults_bounds():
  room = make_room(0, 5000, 3)
  cameras = orbit_cameras((3.0, 2.5, 0.5), 2.0, 1.5, 3, 32, 24)
  task = Task.create(room.cloud, cameras, question_ids=[5, 6, 7], answer_ids=[9],
                     answer_objects=[2], max_question_tokens=8, max_answer_tokens=4)
  np.testing.assert_array_equal(task.question_ids, [5, 6, 7, -1, -1, -1, -1, -1])
  np.testing.assert_array_equal(task.answer_ids, [[9, -1, -1, -1]])
  np.testing.assert_array_equal(task.answer_objects, [2, -1, -1, -1])
  xyz = np.asarray(room.cloud.xyz)
  np.testing.assert_allclose(task.scene_min, xyz.min(0))
  np.testing.assert_allclose(task.scene_max, xyz.max(0))
  np.testing.assert_allclose(task.initial_camera.world_from_camera,
                             cameras.world_from_camera[0])
  assert int(task.num_input_cameras) == 3
  batch = jax.tree.map(lambda *x: np.stack(x), task, task)
  assert batch.question_ids.shape == (2, 8)


def test_task_errors_name_the_field():
  room = make_room(0, 5000, 3)
  cameras = orbit_cameras((3.0, 2.5, 0.5), 2.0, 1.5, 2, 32, 24)
  with pytest.raises(ValueError, match="Task.question_ids: 5 entries, more than the padded length 4"):
    Task.create(room.cloud, cameras, question_ids=range(5), max_question_tokens=4)
  with pytest.raises(ValueError, match=r"Task.num_input_cameras: expected 1..2, got 3"):
    Task.create(room.cloud, cameras, num_input_cameras=3)
  with pytest.raises(ValueError, match=r"Task.input_cameras: expected a batch of cameras"):
    Task.create(room.cloud, jax.tree.map(lambda x: x[0], cameras))


def test_task_input_images_default_empty_pad_like_the_cameras_and_are_checked():
  room = make_room(0, 5000, 3)
  cameras = orbit_cameras((3.0, 2.5, 0.5), 2.0, 1.5, 4, 32, 24)
  task = Task.create(room.cloud, cameras, num_input_cameras=2)
  assert task.input_images.shape == (4, 0, 0, 3) and task.input_images.dtype == np.uint8
  assert not task.has_input_images
  images = np.arange(2 * 24 * 32 * 3, dtype=np.int64).reshape(2, 24, 32, 3).astype(np.uint8)
  task = Task.create(room.cloud, cameras, num_input_cameras=2, input_images=images)
  assert task.has_input_images and task.input_images.shape == (4, 24, 32, 3)
  for k, source in enumerate([0, 1, 1, 1]):  # the real ones, then the last repeated
    np.testing.assert_array_equal(task.input_images[k], images[source])
  full = np.zeros((4, 24, 32, 3), np.uint8)
  assert Task.create(room.cloud, cameras, num_input_cameras=2, input_images=full
                     ).input_images.shape == (4, 24, 32, 3)
  batch = jax.tree.map(lambda *x: np.stack(x), task, task)
  assert batch.input_images.shape == (2, 4, 24, 32, 3) and batch.has_input_images
  with pytest.raises(ValueError, match="Task.input_images: expected dtype uint8, got int32"):
    Task.create(room.cloud, cameras, input_images=full.astype(np.int32))
  with pytest.raises(ValueError, match=r"Task.input_images: expected shape \[K, H, W, 3\] "
                                       r"with H, W > 0, got \(4, 24, 32\)"):
    Task.create(room.cloud, cameras, input_images=full[..., 0])
  with pytest.raises(ValueError, match=r"Task.input_images: expected 4 images \(one per input "
                                       r"camera\) or 2 \(the real ones\), got 3"):
    Task.create(room.cloud, cameras, num_input_cameras=2, input_images=full[:3])
