"""Batches of synthetic episodes for rollouts: tasks from generated rooms and their
first prompts (Act3D: the room size and the question)."""

from __future__ import annotations

import jax
import numpy as np

from data_pipelines.synthetic.rigs import orbit_cameras
from data_pipelines.synthetic.room import make_room
from jaxspatial.envs.task import Task
from jaxspatial.rollout import prompts


def act3d_tasks(batch: int, seed: int = 0, points: int = 20_000, scenes: int = 2):
  """`batch` tasks over `scenes` rooms, each asking where an object is (the answer is the
  object's name), and their questions."""
  tasks, questions = [], []
  rooms = [make_room(seed + s, points, num_objects=4) for s in range(scenes)]
  for i in range(batch):
    room = rooms[i % scenes]
    centre = np.asarray(room.bounds_max) / 2
    cameras = orbit_cameras((centre[0], centre[1], 0.5), 2.0, 1.5, 4, 64, 48)
    target = room.objects[(i // scenes) % len(room.objects)]
    name = target.name
    tasks.append(Task.create(room.cloud, cameras, answer_objects=[target.instance],
                             scene_min=room.bounds_min, scene_max=room.bounds_max,
                             answer_ids=list(name.encode()), max_answer_tokens=32))
    x, y, _ = target.centre
    questions.append((f"Which object stands nearest to the floor point ({x:.1f}, {y:.1f})?",
                      room))
  stacked = jax.tree.map(lambda *x: np.stack(x), *tasks)
  return stacked, questions


def act3d_prompts(tokenizer, questions, image_tokens: int, prefill: str = ""):
  texts = [prompts.chat_prompt(prompts.ACT3D_SYSTEM, prompts.act3d_user_text(
      q, room.bounds_min, room.bounds_max), image_tokens, prefill=prefill)
           for q, room in questions]
  return prompts.left_padded(tokenizer, texts)
