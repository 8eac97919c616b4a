"""Templated spatial questions whose answers are computed from the scene's geometry.

Every view direction is read in the horizontal plane (+z up): a camera's forward
axis projected on the floor, and its right axis. "To the left of A from view k"
means: the object lies on the left of A as seen by camera k. A question is only asked when its
answer is unambiguous: the answer's direction lies well inside its sector (within
`SECTOR_MARGIN_DEG` of the axis) and every distractor lies clearly outside it.

Families (all multiple choice with 2 to 5 options, one correct, except `open_direction`):
  relative_direction  what is to the left of / right of / in front of / behind A, from view k
  visible_after_turn  after turning left / right / around, or walking forward, at view k,
                      which object comes into view
  closest             which object is closest to A
  count               how many objects of a kind are in the room
  camera_motion       between two views, did the camera move left or right (BLINK-style)
  route               which way to turn at view k to face A
  open_direction      what is to the left of A (a short open answer, Act3D-style)
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from data_pipelines.synthetic.room import Room
from jaxspatial.geometry import Camera, rotation_about_axis
from jaxspatial.render import render_batch

LETTERS = "ABCDE"
SECTOR_MARGIN_DEG = 30.0   # the answer within 30 degrees of its axis (sectors are 90 wide)
DISTRACTOR_GAP_DEG = 60.0  # distractors at least 60 degrees away from the asked axis
VISIBLE_PIXELS = 12        # an object is visible when it wins this many pixels of a view
WALK_M = 1.5               # "walk forward" in visible_after_turn
DIRECTIONS = {"to the right of": 90.0, "to the left of": -90.0, "in front of": 0.0,
              "behind": 180.0}
FAMILIES = ("relative_direction", "visible_after_turn", "closest", "count", "camera_motion",
            "route", "open_direction")


@dataclasses.dataclass(frozen=True)
class SpatialQuestion:
  family: str
  question: str
  options: tuple[str, ...]     # () for open questions
  answer: str                  # the option letter, or the open answer
  answer_text: str             # the answer in words
  answer_objects: tuple[int, ...]
  views: tuple[int, ...]       # the views the question shows
  initial_view: int            # where an agent starts
  needs_exploration: bool      # the answer objects are not visible in the initial view


def horizontal_frame(camera: Camera, view: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(position, unit horizontal forward, unit horizontal right) of a view."""
  pose = np.asarray(camera.world_from_camera[view], np.float64)
  forward = pose[:3, 2].copy()
  forward[2] = 0.0
  forward /= max(np.linalg.norm(forward), 1e-9)
  right = np.array([forward[1], -forward[0], 0.0])  # forward x up
  return pose[:3, 3], forward, right


def bearing_deg(forward: np.ndarray, right: np.ndarray, vector: np.ndarray) -> float:
  """Horizontal angle of vector from forward, positive to the right, in (-180, 180]."""
  return float(np.degrees(np.arctan2(vector @ right, vector @ forward)))


def _angle_gap(a: float, b: float) -> float:
  return abs((a - b + 180.0) % 360.0 - 180.0)


def visible_objects(instance_HxW: np.ndarray, threshold: int = VISIBLE_PIXELS) -> set[int]:
  ids, counts = np.unique(instance_HxW[instance_HxW >= 0], return_counts=True)
  return {int(i) for i, c in zip(ids, counts) if c >= threshold}


class QuestionMaker:
  """Makes questions about one room seen from one rig of views."""

  def __init__(self, room: Room, cameras: Camera, instance_VxHxW: np.ndarray,
               rng: np.random.Generator):
    self.room, self.cameras, self.rng = room, cameras, rng
    self.instance = instance_VxHxW
    self.visible = [visible_objects(v) for v in instance_VxHxW]
    names = [o.name for o in room.objects]
    # Only objects with a unique name can be referred to unambiguously.
    self.nameable = [o for o in room.objects if names.count(o.name) == 1]
    self.centre = {o.instance: np.asarray(o.centre, np.float64) for o in room.objects}

  def _mc(self, family, question, answer_text, distractors, answer_objects, views, initial):
    distractors = list(dict.fromkeys(d for d in distractors if d != answer_text))
    self.rng.shuffle(distractors)
    options = [answer_text] + distractors[: len(LETTERS) - 1]
    if len(options) < 2:
      return None
    self.rng.shuffle(options)
    letter = LETTERS[options.index(answer_text)]
    text = question + " " + " ".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(options))
    return self._finish(family, text, tuple(options), letter, answer_text, answer_objects,
                        views, initial)

  def _finish(self, family, text, options, answer, answer_text, answer_objects, views, initial):
    hidden = not set(answer_objects) & self.visible[initial] if answer_objects else False
    return SpatialQuestion(family, text, options, answer, answer_text, tuple(answer_objects),
                           tuple(views), initial, hidden)

  def _direction_candidates(self, view: int):
    """(reference A, direction word, answer B, distractors) with an unambiguous answer."""
    _, forward, right = horizontal_frame(self.cameras, view)
    for a in self.rng.permutation(len(self.nameable)):
      ref = self.nameable[a]
      others = [o for o in self.nameable if o.instance != ref.instance]
      angles = {o.instance: bearing_deg(forward, right, self.centre[o.instance][:3]
                                        - self.centre[ref.instance][:3]) for o in others}
      for word in self.rng.permutation(list(DIRECTIONS)):
        axis = DIRECTIONS[word]
        inside = [o for o in others if _angle_gap(angles[o.instance], axis) <= SECTOR_MARGIN_DEG]
        near = [o for o in others if _angle_gap(angles[o.instance], axis) < DISTRACTOR_GAP_DEG]
        far = [o for o in others if _angle_gap(angles[o.instance], axis) >= DISTRACTOR_GAP_DEG]
        if len(inside) == 1 and len(near) == 1 and far:
          return ref, str(word), inside[0], far
    return None

  def relative_direction(self, view: int):
    found = self._direction_candidates(view)
    if found is None:
      return None
    ref, word, answer, far = found
    return self._mc("relative_direction",
                    f"From the viewpoint of view {view + 1}, what is {word} the {ref.name}?",
                    answer.name, [o.name for o in far], [answer.instance], [view], view)

  def open_direction(self, view: int):
    found = self._direction_candidates(view)
    if found is None:
      return None
    ref, word, answer, _ = found
    return self._finish("open_direction",
                        f"From the viewpoint of view {view + 1}, what is {word} the {ref.name}?",
                        (), answer.name, answer.name, [answer.instance], [view], view)

  def closest(self, view: int):
    for a in self.rng.permutation(len(self.nameable)):
      ref = self.nameable[a]
      others = [o for o in self.nameable if o.instance != ref.instance]
      if len(others) < 2:
        continue
      distance = {o.instance: np.linalg.norm(self.centre[o.instance] - self.centre[ref.instance])
                  for o in others}
      ordered = sorted(others, key=lambda o: distance[o.instance])
      if distance[ordered[1].instance] >= 1.25 * distance[ordered[0].instance]:
        return self._mc("closest", f"Which object is closest to the {ref.name}?",
                        ordered[0].name, [o.name for o in ordered[1:]], [ordered[0].instance],
                        [view], view)
    return None

  def count(self, view: int):
    kinds = sorted({o.name.split(" ", 1)[1] for o in self.room.objects})
    kind = kinds[self.rng.integers(len(kinds))]
    ids = [o.instance for o in self.room.objects if o.name.split(" ", 1)[1] == kind]
    n = len(ids)
    distractors = [str(k) for k in (n - 1, n + 1, n + 2, n + 3) if k >= 0]
    return self._mc("count", f"How many {kind}s are there in the room?", str(n), distractors,
                    ids, [view], view)

  def route(self, view: int):
    position, forward, right = horizontal_frame(self.cameras, view)
    words = {"go straight": 0.0, "turn right": 90.0, "turn left": -90.0, "turn around": 180.0}
    for a in self.rng.permutation(len(self.nameable)):
      target = self.nameable[a]
      angle = bearing_deg(forward, right, self.centre[target.instance] - position)
      for word, axis in words.items():
        if _angle_gap(angle, axis) <= SECTOR_MARGIN_DEG:
          return self._mc(
              "route", f"Standing where view {view + 1} was taken and facing the same way, "
              f"which way do you turn to face the {target.name}?", word,
              [w for w in words if w != word], [target.instance], [view], view)
    return None

  def visible_after_turn(self, view: int, render_moved):
    """After turning (right, left, around) or walking forward: which object comes into view."""
    position, forward, _ = horizontal_frame(self.cameras, view)
    ahead = position + WALK_M * forward
    can_walk = bool(np.all(ahead[:2] > 0.3) and np.all(ahead[:2] < np.asarray(
        self.room.bounds_max[:2]) - 0.3))
    moves = [("turn 90 degrees to the right", -90.0, 0.0),
             ("turn 90 degrees to the left", 90.0, 0.0), ("turn around", 180.0, 0.0)]
    if can_walk:
      moves.append((f"walk {WALK_M:g} m forward", 0.0, WALK_M))
    for k in self.rng.permutation(len(moves)):
      words, angle, walk = moves[k]
      seen = render_moved(view, angle, walk)
      new = [o for o in self.nameable if o.instance in seen - self.visible[view]]
      unseen = [o for o in self.nameable if o.instance not in seen]
      if new and unseen:
        answer = new[self.rng.integers(len(new))]
        return self._mc("visible_after_turn",
                        f"Standing where view {view + 1} was taken, if you {words}, which of "
                        "these will you see?", answer.name, [o.name for o in unseen],
                        [answer.instance], [view], view)
    return None

  def camera_motion(self, first: int, second: int):
    position_a, _, right = horizontal_frame(self.cameras, first)
    position_b, _, _ = horizontal_frame(self.cameras, second)
    sideways = float((position_b - position_a) @ right)
    if abs(sideways) < 0.3:
      return None
    word = "right" if sideways > 0 else "left"
    return self._mc("camera_motion",
                    f"Views {first + 1} and {second + 1} show the same scene. From view "
                    f"{first + 1} to view {second + 1}, did the camera move to the left or to "
                    "the right?", word, ["left" if word == "right" else "right"], [],
                    [first, second], first)


def moved_camera(cameras: Camera, view: int, angle_deg: float, walk_m: float = 0.0) -> Camera:
  """View `view` turned about world +z by angle_deg (positive = left, counter-clockwise),
  then moved walk_m along its level forward direction."""
  single = jax.tree.map(lambda x: x[view], cameras)
  rotation = np.asarray(rotation_about_axis([0.0, 0.0, 1.0], np.deg2rad(angle_deg)))
  pose = np.asarray(single.world_from_camera).copy()
  pose[:3, :3] = rotation @ pose[:3, :3]
  level = pose[:3, 2] * np.array([1.0, 1.0, 0.0])
  pose[:3, 3] += walk_m * level / max(np.linalg.norm(level), 1e-9)
  return single.with_pose(pose)


def make_questions(room: Room, cameras: Camera, instance_VxHxW: np.ndarray, seed: int,
                   families=FAMILIES, height: int | None = None, width: int | None = None,
                   pair: tuple[int, int] | None = None,
                   render_options: dict | None = None) -> list[SpatialQuestion]:
  """One question per family (where one can be made) about the room and its views."""
  rng = np.random.default_rng(seed)
  maker = QuestionMaker(room, cameras, instance_VxHxW, rng)
  num_views = len(instance_VxHxW)
  height = height or instance_VxHxW.shape[1]
  width = width or instance_VxHxW.shape[2]

  def render_moved(view: int, angle: float, walk: float) -> set[int]:
    camera = moved_camera(cameras, view, angle, walk)
    batch = jax.tree.map(lambda x: x[None], camera)
    out = render_batch(room.cloud, batch, height, width, **(render_options or {}))
    return visible_objects(np.asarray(out.instance[0]))

  questions = []
  for family in families:
    view = int(rng.integers(num_views))
    if family == "camera_motion":
      if pair is None:
        continue
      q = maker.camera_motion(*pair)
    elif family == "visible_after_turn":
      q = maker.visible_after_turn(view, render_moved)
    else:
      q = getattr(maker, family)(view)
    if q is not None:
      questions.append(q)
  return questions
