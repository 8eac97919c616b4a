"""One synthetic sample: a room, a camera rig like a benchmark's, the rendered views
(colour, depth, instance ids, cameras) and the questions about them.

Rigs:
  rotation  MindCube: one position, four views turning right by 90 degrees each
  around    MindCube: three views on an arc around an object, 45 degrees apart
  among     MindCube: four views of a central object from its four sides
  pair      BLINK multi-view: two views 30 degrees apart on an arc (camera motion)
  sweep     VSI-Bench: eight views orbiting the room's centre, like video frames
  single    Act3D: one starting view from a random spot in the room
Splits use disjoint scene seeds, so no room appears in two splits.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from data_pipelines.synthetic.questions import FAMILIES, SpatialQuestion, make_questions
from data_pipelines.synthetic.rigs import arc_rig, orbit_cameras, rotation_rig
from data_pipelines.synthetic.room import Room, make_room
from jaxspatial.geometry import Camera
from jaxspatial.render import render_batch

RIGS = ("rotation", "around", "among", "pair", "sweep", "single")
SPLIT_SEED_OFFSET = {"train": 0, "validation": 10_000_000, "test": 20_000_000}


@dataclasses.dataclass(frozen=True)
class SampleConfig:
  num_points: int = 60_000
  min_objects: int = 4
  max_objects: int = 8
  width: int = 160
  height: int = 120
  hfov_deg: float = 70.0
  # Depth-dependent splats (world radius point_radius, capped at splat_radius pixels) close
  # the gaps between points, so no wall shows the background through it (nor an object
  # behind it, which would make visibility answers wrong). Background pixels in six tiny
  # scenes (32,768 points, 96 x 72): 8.0% at 0.03 m / 3 px, 1.2% at 0.05 / 3, 0.02% here.
  point_radius: float = 0.08
  splat_radius: int = 4
  families: tuple[str, ...] = FAMILIES
  clutter: int = 0                 # small unnamed boxes that occlude
  exploration_only: bool = False   # keep only questions whose answer is not in the first view


@dataclasses.dataclass(frozen=True)
class Sample:
  scene_seed: int
  rig: str
  room: Room
  cameras: Camera             # [V]
  rgb: np.ndarray             # [V, H, W, 3] uint8
  depth: np.ndarray           # [V, H, W] float32
  instance: np.ndarray        # [V, H, W] int32
  questions: tuple[SpatialQuestion, ...]


def scene_seed(split: str, index: int) -> int:
  if split not in SPLIT_SEED_OFFSET:
    raise ValueError(f"unknown split {split!r}; expected one of {tuple(SPLIT_SEED_OFFSET)}")
  return SPLIT_SEED_OFFSET[split] + index


def make_rig(rig: str, room: Room, rng: np.random.Generator, config: SampleConfig) -> Camera:
  size = np.asarray(room.bounds_max)
  args = (config.width, config.height, config.hfov_deg)
  target = room.objects[rng.integers(len(room.objects))]
  centre = np.asarray(target.centre)
  if rig == "rotation":
    position = [rng.uniform(1.5, size[0] - 1.5), rng.uniform(1.5, size[1] - 1.5), 1.4]
    return rotation_rig(position, 4, *args, first_yaw_deg=rng.uniform(0, 360))
  if rig in ("around", "among", "pair"):
    views, step = {"around": (3, 45.0), "among": (4, 90.0), "pair": (2, 30.0)}[rig]
    step *= rng.choice([-1.0, 1.0])
    # Keep every camera inside the room (outside, a wall's back would fill the view).
    for attempt in range(64):
      radius = 2.2 * (0.97 ** attempt)
      start = rng.uniform(0, 360)
      angles = np.deg2rad(start + step * np.arange(views))
      eyes = centre[:2] + radius * np.stack([np.cos(angles), np.sin(angles)], 1)
      if ((eyes > 0.3) & (eyes < size[:2] - 0.3)).all():
        break
    return arc_rig((centre[0], centre[1], 0.4), radius, 1.5, start, step, views, *args)
  if rig == "sweep":
    return orbit_cameras((size[0] / 2, size[1] / 2, 0.6), (size[0] / 2 - 0.5, size[1] / 2 - 0.5),
                         1.6, 8, *args)
  if rig == "single":
    position = [rng.uniform(0.8, size[0] - 0.8), rng.uniform(0.8, size[1] - 0.8), 1.5]
    return rotation_rig(position, 1, *args, first_yaw_deg=rng.uniform(0, 360))
  raise ValueError(f"unknown rig {rig!r}; expected one of {RIGS}")


def make_sample(split: str, index: int, rig: str | None = None,
                config: SampleConfig = SampleConfig()) -> Sample:
  """Sample `index` of a split: deterministic in (split, index, rig, config)."""
  seed = scene_seed(split, index)
  rng = np.random.default_rng(seed)
  rig = rig or RIGS[int(rng.integers(len(RIGS)))]
  num_objects = int(rng.integers(config.min_objects, config.max_objects + 1))
  room = make_room(seed, config.num_points, num_objects=num_objects, clutter=config.clutter)
  cameras = make_rig(rig, room, rng, config)
  views = render_batch(room.cloud, cameras, config.height, config.width,
                       splat_radius=config.splat_radius, point_radius=config.point_radius)
  instance = np.asarray(views.instance)
  pair = (0, 1) if rig == "pair" else None
  questions = make_questions(room, cameras, instance, seed, config.families, pair=pair,
                             render_options={"splat_radius": config.splat_radius,
                                             "point_radius": config.point_radius})
  if config.exploration_only:
    questions = [q for q in questions if q.needs_exploration]
  return Sample(seed, rig, room, cameras, np.asarray(views.rgb), np.asarray(views.depth),
                instance, tuple(questions))
