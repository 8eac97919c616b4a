"""A procedural indoor room as a dense coloured point cloud with instance ids.

World frame: metres, +z up, the floor at z = 0, the room spanning
[0, width] x [0, depth] x [0, height]. The room shell (floor, walls) has
instance -1; object k has instance k. Points are stored in Morton order.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from data_pipelines.synthetic import shapes
from jaxspatial.geometry import PointCloud, sort_spatially

COLOURS = {
    "red": (200, 40, 40), "green": (40, 160, 60), "blue": (40, 80, 200),
    "yellow": (230, 200, 40), "purple": (130, 60, 170), "orange": (235, 130, 30),
    "cyan": (40, 180, 190), "white": (235, 235, 235),
}
KINDS = ("box", "chair", "ball", "lamp", "table", "barrel")
LIGHT_DIRECTION = np.array([0.3, -0.5, 0.8], np.float32) / np.linalg.norm([0.3, -0.5, 0.8])


@dataclasses.dataclass(frozen=True)
class SceneObject:
  instance: int
  name: str  # e.g. "red chair"
  centre: tuple[float, float, float]
  size: tuple[float, float, float]  # axis-aligned extent before yaw
  yaw: float


@dataclasses.dataclass(frozen=True)
class Room:
  cloud: PointCloud
  objects: tuple[SceneObject, ...]
  bounds_min: tuple[float, float, float]
  bounds_max: tuple[float, float, float]


def _shade(base_rgb, normal: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  lambert = 0.55 + 0.45 * np.clip(normal @ LIGHT_DIRECTION, 0.0, 1.0)
  noise = rng.normal(1.0, 0.03, size=(len(normal), 1))
  rgb = np.asarray(base_rgb, np.float32)[None] * lambert[:, None] * noise
  return np.clip(rgb, 0, 255).astype(np.uint8)


def _object_surface(kind: str, rng, centre, size, yaw, n):
  sx, sy, sz = size
  cx, cy, cz = centre
  if kind == "ball":
    return shapes.sphere_surface(rng, centre, sx / 2, n)
  if kind in ("barrel", "lamp"):
    return shapes.cylinder_surface(rng, centre, sx / 2, sz, n)
  if kind == "chair":  # seat and back
    n_seat = n * 2 // 3
    seat = shapes.box_surface(rng, (cx, cy, cz - sz / 4), (sx, sy, sz / 2), yaw, n_seat)
    back_offset = np.array([-np.sin(yaw), np.cos(yaw), 0.0]) * (sy / 2 - 0.05)
    back = shapes.box_surface(rng, np.array([cx, cy, cz + sz / 4]) + back_offset,
                              (sx, 0.1, sz / 2), yaw, n - n_seat)
    return np.concatenate([seat[0], back[0]]), np.concatenate([seat[1], back[1]])
  return shapes.box_surface(rng, centre, size, yaw, n)


def _sizes(kind: str, rng) -> tuple[float, float, float]:
  if kind == "ball":
    d = rng.uniform(0.3, 0.6)
    return (d, d, d)
  if kind == "lamp":
    return (0.3, 0.3, rng.uniform(1.2, 1.7))
  if kind == "barrel":
    d = rng.uniform(0.4, 0.7)
    return (d, d, rng.uniform(0.6, 1.0))
  if kind == "table":
    return (rng.uniform(1.0, 1.6), rng.uniform(0.7, 1.0), 0.75)
  if kind == "chair":
    return (0.5, 0.5, 0.9)
  return tuple(rng.uniform(0.4, 0.9, 3))


def make_room(seed: int, num_points: int = 200_000, num_objects: int = 6,
              size=(6.0, 5.0, 3.0), clutter: int = 0) -> Room:
  """Samples a room with `num_objects` non-overlapping objects on the floor, plus
  `clutter` small grey boxes (instance -1, never named in questions) that occlude."""
  if not 1 <= num_objects <= 12:
    raise ValueError(f"make_room: num_objects must be in [1, 12], got {num_objects}")
  rng = np.random.default_rng(seed)
  width, depth, height = size
  objects: list[SceneObject] = []
  attempts = 0
  while len(objects) < num_objects:
    attempts += 1
    if attempts > 2000:
      raise RuntimeError(f"make_room(seed={seed}): could not place {num_objects} objects")
    kind = KINDS[rng.integers(len(KINDS))]
    colour = list(COLOURS)[rng.integers(len(COLOURS))]
    sx, sy, sz = _sizes(kind, rng)
    reach = 0.5 * np.hypot(sx, sy)
    centre = (rng.uniform(reach + 0.2, width - reach - 0.2),
              rng.uniform(reach + 0.2, depth - reach - 0.2), sz / 2)
    if any(np.hypot(centre[0] - o.centre[0], centre[1] - o.centre[1])
           < reach + 0.5 * np.hypot(o.size[0], o.size[1]) + 0.15 for o in objects):
      continue
    objects.append(SceneObject(len(objects), f"{colour} {kind}", tuple(map(float, centre)),
                               (float(sx), float(sy), float(sz)), float(rng.uniform(0, np.pi))))

  shell_area = width * depth + 2 * (width + depth) * height
  object_points = num_points // 3
  shell_points = num_points - object_points
  parts_xyz, parts_rgb, parts_instance = [], [], []

  floor_n = int(shell_points * width * depth / shell_area)
  xyz, normal = shapes.rectangle(rng, (0, 0, 0), (width, 0, 0), (0, depth, 0), floor_n)
  checker = ((np.floor(xyz[:, 0] / 0.5) + np.floor(xyz[:, 1] / 0.5)) % 2)[:, None]
  floor_rgb = np.where(checker > 0, [150, 110, 80], [185, 150, 110])
  parts_xyz.append(xyz)
  parts_rgb.append((floor_rgb * rng.normal(1.0, 0.03, (floor_n, 1))).clip(0, 255).astype(np.uint8))
  walls = [((0, 0, 0), (width, 0, 0), (0, 0, height), (225, 215, 195)),
           ((width, 0, 0), (0, depth, 0), (0, 0, height), (200, 215, 225)),
           ((width, depth, 0), (-width, 0, 0), (0, 0, height), (225, 215, 195)),
           ((0, depth, 0), (0, -depth, 0), (0, 0, height), (215, 225, 200))]
  wall_lengths = np.array([np.linalg.norm(edge_u) for _, edge_u, _, _ in walls])
  wall_counts = np.floor((shell_points - floor_n) * wall_lengths / wall_lengths.sum()).astype(int)
  wall_counts[-1] += shell_points - floor_n - wall_counts.sum()
  for (origin, edge_u, edge_v, colour), n in zip(walls, wall_counts):
    xyz, normal = shapes.rectangle(rng, origin, edge_u, edge_v, int(n))
    parts_xyz.append(xyz)
    parts_rgb.append(_shade(colour, -normal, rng))  # rectangle normals face out of the room
  parts_instance.append(np.full(sum(len(x) for x in parts_xyz), -1, np.int32))

  volumes = np.array([o.size[0] * o.size[1] + o.size[2] * (o.size[0] + o.size[1])
                      for o in objects])
  counts = np.floor(object_points * volumes / volumes.sum()).astype(int)
  counts[-1] += object_points - counts.sum()
  clutter_rng = np.random.default_rng([seed, 1])  # clutter leaves the main scene unchanged
  for _ in range(clutter):
    side = clutter_rng.uniform(0.15, 0.35)
    centre = (clutter_rng.uniform(0.3, width - 0.3), clutter_rng.uniform(0.3, depth - 0.3),
              side / 2)
    xyz, normal = shapes.box_surface(clutter_rng, centre, (side, side, side),
                                     clutter_rng.uniform(0, np.pi), max(num_points // 200, 50))
    parts_xyz.append(xyz)
    parts_rgb.append(_shade((120, 120, 125), normal, clutter_rng))
    parts_instance.append(np.full(len(xyz), -1, np.int32))
  for obj, n in zip(objects, counts):
    kind = obj.name.split(" ", 1)[1]
    xyz, normal = _object_surface(kind, rng, obj.centre, obj.size, obj.yaw, int(n))
    parts_xyz.append(xyz)
    parts_rgb.append(_shade(COLOURS[obj.name.split(" ")[0]], normal, rng))
    parts_instance.append(np.full(len(xyz), obj.instance, np.int32))

  cloud = sort_spatially(PointCloud.create(np.concatenate(parts_xyz).astype(np.float32),
                                           np.concatenate(parts_rgb),
                                           instance=np.concatenate(parts_instance)))
  return Room(cloud=cloud, objects=tuple(objects), bounds_min=(0.0, 0.0, 0.0),
              bounds_max=(float(width), float(depth), float(height)))
