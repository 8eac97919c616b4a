"""The main job's task: "What colour is the box?"

A grey floor and one coloured box, about 1.7 m from the camera, in front of it or 90
degrees to its left or right (outside a 90-degree view). The camera starts at the centre
looking along +y. A box in front can be answered from the first view; a box to the side
needs a turn (Act3D's turn_left / turn_right, 90-degree steps in the demo). Boxes out of
view are on the left three times as often as on the right.

The scripted expert explores with Act3D actions but does not know that prior: when the box
is out of view it turns right 60% of the time and left 40%, answers the colour when the
box comes into view, and guesses otherwise. Imitating it, a policy explores (beating
answers from the first view) but, decoding greedily, turns right; GRPO can learn to turn
left, where the box usually is.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxspatial.envs.task import Task
from jaxspatial.geometry import Camera, PointCloud, look_at
from jaxspatial.geometry.pointcloud import bucket_size
from jaxspatial.rollout.agents import Act3DAgent

COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 70, 220),
           "yellow": (230, 210, 40)}
SIDES = ("front", "left", "right")
SIDE_WEIGHTS = {"front": 4, "left": 6, "right": 2}   # out of view: left 3 : right 1
EXPERT_RIGHT = 0.6                                    # the expert's chance to turn right
SIDE_DIRECTION = {"front": (0.0, 1.0), "left": (-1.0, 0.0), "right": (1.0, 0.0)}
CENTRE = np.asarray([3.0, 3.0, 0.0])
CAMERA_HEIGHT = 1.0


@dataclasses.dataclass(frozen=True)
class LookQuestion:
  side: str
  colour: str

  @property
  def question(self) -> str:
    return "What colour is the box?"

  @property
  def needs_exploration(self) -> bool:
    return self.side != "front"


def _scene(rng: np.random.Generator, side: str, colour: str, points: int):
  floor_n = points * 3 // 4
  floor = np.stack([rng.uniform(0, 6, floor_n), rng.uniform(0, 6, floor_n),
                    np.zeros(floor_n)], 1)
  floor_rgb = np.clip(rng.normal(150, 12, (floor_n, 3)), 0, 255)
  box_n = points - floor_n
  dx, dy = SIDE_DIRECTION[side]
  distance = rng.uniform(1.5, 1.9)
  size = rng.uniform(0.9, 1.2)
  centre = CENTRE + np.asarray([dx, dy, 0.0]) * distance + np.asarray(
      [rng.uniform(-0.2, 0.2) * abs(dy), rng.uniform(-0.2, 0.2) * abs(dx), size / 2 + 0.3])
  # Points on the box's faces.
  face = rng.integers(0, 6, box_n)
  uv = rng.uniform(-0.5, 0.5, (box_n, 2))
  axis = face // 2
  sign = np.where(face % 2 == 0, -0.5, 0.5)
  xyz = np.zeros((box_n, 3))
  for a in range(3):
    others = [o for o in range(3) if o != a]
    mask = axis == a
    xyz[mask, a] = sign[mask]
    xyz[mask, others[0]] = uv[mask, 0]
    xyz[mask, others[1]] = uv[mask, 1]
  box = centre + xyz * size
  box_rgb = np.clip(np.asarray(COLOURS[colour])[None] * rng.uniform(0.85, 1.0, (box_n, 1)), 0, 255)
  xyz = np.concatenate([floor, box]).astype(np.float32)
  rgb = np.concatenate([floor_rgb, box_rgb]).astype(np.uint8)
  instance = np.concatenate([np.full(floor_n, -1), np.zeros(box_n)]).astype(np.int32)
  size_padded = bucket_size(len(xyz))
  pad = size_padded - len(xyz)
  cloud = PointCloud(xyz=np.pad(xyz, ((0, pad), (0, 0))), rgb=np.pad(rgb, ((0, pad), (0, 0))),
                     valid=np.pad(np.ones(len(xyz), bool), (0, pad)),
                     instance=np.pad(instance, (0, pad), constant_values=-1))
  return cloud


def make_tasks(count: int, seed: int, points: int = 6000, width: int = 56, height: int = 56,
               hfov_deg: float = 90.0):
  """`count` tasks (sides in SIDE_WEIGHTS proportions, colours balanced, then shuffled) from
  `seed`. Returns (batched numpy Task, questions). Train and test use disjoint seeds."""
  rng = np.random.default_rng(seed)
  # Sides interleaved in proportion (any count keeps them close), colours cycled per round.
  per_round = sum(SIDE_WEIGHTS.values())
  sides = []
  credit = {s: 0.0 for s in SIDES}
  for _ in range(per_round):  # largest-remainder interleaving: f l f l r l ...
    for s in SIDES:
      credit[s] += SIDE_WEIGHTS[s] / per_round
    pick = max(SIDES, key=lambda s: credit[s])
    credit[pick] -= 1.0
    sides.append(pick)
  colours = list(COLOURS)
  order = [(sides[i % per_round], colours[(i // per_round + i) % len(colours)])
           for i in range(count)]
  rng.shuffle(order)
  eye = CENTRE + np.asarray([0.0, 0.0, CAMERA_HEIGHT])
  pose = np.asarray(look_at(eye, eye + np.asarray([0.0, 1.0, 0.0]), (0.0, 0.0, 1.0)))
  camera = Camera.from_fov(hfov_deg, width, height, pose)
  cameras = jax.tree.map(lambda x: np.asarray(x)[None], camera)
  tasks, questions = [], []
  for side, colour in order:
    cloud = _scene(rng, side, colour, points)
    tasks.append(Task.create(cloud, cameras, initial_camera=camera,
                             scene_min=(0.0, 0.0, 0.0), scene_max=(6.0, 6.0, 2.5),
                             answer_ids=list(colour.encode()), answer_objects=[0],
                             max_question_tokens=64, max_answer_tokens=16))
    questions.append(LookQuestion(side, colour))
  stacked = jax.tree.map(lambda *x: np.stack([np.asarray(v) for v in x]), *tasks)
  return stacked, questions


WRITER = Act3DAgent()  # the demo's turns are Act3D's


def _call(action: str) -> str:
  return WRITER.call_turn("no box here", action)


def answer_turn(colour: str) -> str:
  return WRITER.answer_turn("I see it", colour)


def expert_turns(question: LookQuestion, rng: np.random.Generator) -> list[str]:
  """The scripted expert's turns for one question (it does not know where boxes usually are)."""
  if not question.needs_exploration:
    return [answer_turn(question.colour)]
  turn = "right" if rng.random() < EXPERT_RIGHT else "left"
  found = turn == question.side
  colour = question.colour if found else str(rng.choice(list(COLOURS)))
  return [_call(f"turn_{turn}"), answer_turn(colour)]


def first_view_prefix() -> str:
  """The forced start of the initial-view-only baseline's turn: it must answer now."""
  return WRITER.answer_prefix("I see it")
