"""The main job's task: the box is in the first view exactly when it is in front, and the
turn toward the named side brings it into view."""

import jax
import jax.numpy as jnp
import numpy as np

from data_pipelines.synthetic import look_around
from jaxspatial.envs import act3d

PARAMS = act3d.Act3DParams(width=56, height=56, hfov_deg=90.0, turn_step_deg=90.0)


def _box_pixels(obs_state_task, action=None):
  task = obs_state_task
  _, state = act3d.reset(None, task, PARAMS)
  if action is not None:
    _, state, *_ = act3d.step(None, state, act3d.Act3DAction.navigate(action), PARAMS)
  from jaxspatial.render import render
  view = render(task.cloud, act3d.camera_of(state.position, state.forward, PARAMS), 56, 56, 1)
  return int(jnp.sum(view.instance == 0))


def test_the_box_is_seen_only_from_the_right_direction():
  tasks, questions = look_around.make_tasks(24, seed=3)
  assert {q.side for q in questions} == set(look_around.SIDES)
  for i, q in enumerate(questions):
    task = jax.tree.map(lambda x, i=i: jnp.asarray(x[i]), tasks)
    first = _box_pixels(task)
    left, right = _box_pixels(task, "turn_left"), _box_pixels(task, "turn_right")
    seen = {"front": first, "left": left, "right": right}
    for side, pixels in seen.items():
      assert (pixels > 50) == (side == q.side), (q, seen)
    ids = np.asarray(tasks.answer_ids[i])
    assert bytes(ids[ids >= 0].astype(np.uint8)).decode() == q.colour


def test_sides_follow_the_prior():
  _, questions = look_around.make_tasks(240, seed=1)
  counts = {s: sum(q.side == s for q in questions) for s in look_around.SIDES}
  assert counts == {"front": 80, "left": 120, "right": 40}


def test_the_expert_turns_right_more_often_and_answers_what_it_sees():
  rng = np.random.default_rng(0)
  front = look_around.expert_turns(look_around.LookQuestion("front", "red"), rng)
  assert front == [look_around.answer_turn("red")]
  turns = [look_around.expert_turns(look_around.LookQuestion("left", "blue"), rng)
           for _ in range(400)]
  went_left = [t for t in turns if "turn_left" in t[0]]
  assert 120 < len(went_left) < 200  # 40%
  assert all(t[1] == look_around.answer_turn("blue") for t in went_left)
  guesses = {t[1] for t in turns if "turn_right" in t[0]}
  assert len(guesses) > 1  # a guess when the box was not found
