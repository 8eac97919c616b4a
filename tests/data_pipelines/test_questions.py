"""Every generated answer re-derived by separate geometric checks."""

import collections

import jax
import numpy as np
import pytest

from data_pipelines.synthetic.questions import LETTERS, VISIBLE_PIXELS, moved_camera
from data_pipelines.synthetic.samples import RIGS, SampleConfig, make_sample, scene_seed
from jaxspatial.geometry import project

CONFIG = SampleConfig(num_points=30_000, width=96, height=72)


@pytest.fixture(scope="module")
def samples():
  return [make_sample("train", i, RIGS[i % len(RIGS)], CONFIG) for i in range(18)]


def camera_axes(sample, view):
  """Right axis and level forward axis straight from the pose's columns."""
  pose = np.asarray(sample.cameras.world_from_camera[view], np.float64)
  right = pose[:3, 0]
  forward = pose[:3, 2] * np.array([1, 1, 0])
  return pose[:3, 3], right / np.linalg.norm(right), forward / np.linalg.norm(forward)


def by_name(sample, name):
  (obj,) = [o for o in sample.room.objects if o.name == name]
  return obj


def pixels_of(sample, view, instance):
  return int((sample.instance[view] == instance).sum())


def check_direction(sample, q):
  word, ref_name = q.question.split("?")[0].split("what is ")[1].rsplit(" the ", 1)
  ref = np.asarray(by_name(sample, ref_name).centre)
  answer = np.asarray(by_name(sample, q.answer_text).centre)
  _, right, forward = camera_axes(sample, q.views[0])
  x, y = (answer - ref) @ right, (answer - ref) @ forward
  expected = {"to the left of": -x > abs(y), "to the right of": x > abs(y),
              "in front of": y > abs(x),
              "behind": -y > abs(x)}[word]
  assert expected, (q.question, q.answer_text, x, y)


@pytest.mark.slow
def test_answers_are_geometrically_right(samples):
  families = collections.Counter()
  for sample in samples:
    for q in sample.questions:
      families[q.family] += 1
      if q.options:  # multiple choice: 2-5 distinct options, the letter names the answer
        assert 2 <= len(q.options) <= 5 and len(set(q.options)) == len(q.options)
        assert q.options[LETTERS.index(q.answer)] == q.answer_text
        assert all(f"{LETTERS[i]}. {o}" in q.question for i, o in enumerate(q.options))
      if q.family in ("relative_direction", "open_direction"):
        check_direction(sample, q)
      elif q.family == "closest":
        ref = by_name(sample, q.question.split("?")[0].split("closest to the ")[1])
        distances = {o.name: np.linalg.norm(np.subtract(o.centre, ref.centre))
                     for o in sample.room.objects if o.name in q.options}
        assert min(distances, key=distances.get) == q.answer_text
      elif q.family == "count":
        kind = q.question.split("How many ")[1].split("s are")[0]
        assert int(q.answer_text) == sum(o.name.endswith(" " + kind) for o in sample.room.objects)
      elif q.family == "route":
        target = by_name(sample, q.question.split("?")[0].split("face the ")[1])
        position, right, forward = camera_axes(sample, q.views[0])
        d = np.asarray(target.centre) - position
        x, y = d @ right, d @ forward
        expected = {"turn right": x > abs(y), "turn left": -x > abs(y),
                    "go straight": y > abs(x), "turn around": -y > abs(x)}
        assert expected[q.answer_text], (x, y, q.answer_text)
      elif q.family == "camera_motion":
        (first, second) = q.views
        a, right, _ = camera_axes(sample, first)
        b, _, _ = camera_axes(sample, second)
        assert ((b - a) @ right > 0) == (q.answer_text == "right")
      elif q.family == "visible_after_turn":
        target = by_name(sample, q.answer_text)
        action = q.question.split("if you ")[1].split(",")[0]
        angle, walk = {"turn 90 degrees to the right": (-90.0, 0.0),
                       "turn 90 degrees to the left": (90.0, 0.0), "turn around": (180.0, 0.0),
                       "walk 1.5 m forward": (0.0, 1.5)}[action]
        camera = moved_camera(sample.cameras, q.views[0], angle, walk)
        points = np.asarray(sample.room.cloud.xyz)[np.asarray(sample.room.cloud.instance)
                                                    == target.instance]
        u, v, z = (np.asarray(t) for t in project(camera, points))
        in_view = (z > 0) & (u > -0.5) & (u < CONFIG.width - 0.5) & (v > -0.5) & (
            v < CONFIG.height - 0.5)
        assert in_view.sum() >= VISIBLE_PIXELS, "the answer lies in the turned camera's frustum"
      if q.needs_exploration:  # read from the initial view's instance image
        for instance in q.answer_objects:
          assert pixels_of(sample, q.initial_view, instance) < VISIBLE_PIXELS
      elif q.answer_objects:
        assert any(pixels_of(sample, q.initial_view, i) >= VISIBLE_PIXELS
                   for i in q.answer_objects)
  assert set(families) == {"relative_direction", "visible_after_turn", "closest", "count",
                           "camera_motion", "route", "open_direction"}, families
  assert sum(q.needs_exploration for s in samples for q in s.questions) > 10


def test_samples_are_deterministic_and_splits_disjoint():
  a = make_sample("train", 5, "pair", CONFIG)
  b = make_sample("train", 5, "pair", CONFIG)
  assert a.questions == b.questions
  np.testing.assert_array_equal(a.rgb, b.rgb)
  seeds = {split: {scene_seed(split, i) for i in range(5000)}
           for split in ("train", "validation", "test")}
  assert not seeds["train"] & seeds["validation"] and not seeds["train"] & seeds["test"]
  assert not seeds["validation"] & seeds["test"]
  other = make_sample("test", 5, "pair", CONFIG)
  assert not np.array_equal(np.asarray(other.room.cloud.xyz), np.asarray(a.room.cloud.xyz))
  with pytest.raises(ValueError, match="unknown split 'dev'"):
    make_sample("dev", 0)


def test_rigs_have_the_benchmark_shapes(samples):
  views = {s.rig: len(s.rgb) for s in samples}
  assert views == {"rotation": 4, "around": 3, "among": 4, "pair": 2, "sweep": 8, "single": 1}
  rotation = next(s for s in samples if s.rig == "rotation")
  positions = np.asarray(rotation.cameras.position)
  np.testing.assert_allclose(positions, np.tile(positions[:1], (4, 1)), atol=1e-6)
  # Each view is the previous one turned right by 90 degrees.
  f = np.array(rotation.cameras.forward)[:, :2]
  f /= np.linalg.norm(f, axis=1, keepdims=True)
  cross = f[:-1, 0] * f[1:, 1] - f[:-1, 1] * f[1:, 0]
  np.testing.assert_allclose(cross, -1.0, atol=1e-5)
  for s in samples:
    assert s.rgb.shape[1:] == (72, 96, 3) and s.depth.shape == s.rgb.shape[:3]
    assert jax.tree.leaves(s.cameras)[0].shape[0] == len(s.rgb)


def test_difficulty_controls():
  hard = SampleConfig(num_points=30_000, width=96, height=72, clutter=6, exploration_only=True,
                      min_objects=8, max_objects=8)
  samples = [make_sample("validation", i, "single", hard) for i in range(4)]
  assert all(len(s.room.objects) == 8 for s in samples)
  questions = [q for s in samples for q in s.questions]
  assert questions and all(q.needs_exploration for q in questions)
  plain = make_sample("validation", 0, "single", SampleConfig(num_points=30_000, width=96,
                                                              height=72, min_objects=8,
                                                              max_objects=8))
  cluttered = samples[0].room.cloud
  # Clutter adds unnamed points and leaves the named objects where they were.
  assert cluttered.num_points > plain.room.cloud.num_points
  assert samples[0].room.objects == plain.room.objects
