"""Surface samplers for primitive shapes: points, outward normals, in numpy.

All functions take a `numpy.random.Generator` and return `(xyz [n, 3], normal [n, 3])`
in float32, uniformly distributed over the surface by area.
"""

from __future__ import annotations

import numpy as np


def _yaw_matrix(yaw: float) -> np.ndarray:
  c, s = np.cos(yaw), np.sin(yaw)
  return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]], np.float32)


def box_surface(rng: np.random.Generator, centre, size, yaw: float, n: int):
  """A box with edge lengths `size` (x, y, z), turned by `yaw` about +z."""
  size = np.asarray(size, np.float32)
  sx, sy, sz = size
  face_areas = np.array([sy * sz, sy * sz, sx * sz, sx * sz, sx * sy, sx * sy])
  face = rng.choice(6, size=n, p=face_areas / face_areas.sum())
  local = rng.uniform(-0.5, 0.5, size=(n, 3)).astype(np.float32)
  axis = face // 2
  sign = np.where(face % 2 == 0, -0.5, 0.5).astype(np.float32)
  local[np.arange(n), axis] = sign
  normal = np.zeros((n, 3), np.float32)
  normal[np.arange(n), axis] = np.sign(sign)
  rotation = _yaw_matrix(yaw)
  return ((local * size) @ rotation.T + np.asarray(centre, np.float32),
          normal @ rotation.T)


def sphere_surface(rng: np.random.Generator, centre, radius: float, n: int):
  direction = rng.normal(size=(n, 3)).astype(np.float32)
  direction /= np.linalg.norm(direction, axis=1, keepdims=True)
  return direction * radius + np.asarray(centre, np.float32), direction


def cylinder_surface(rng: np.random.Generator, centre, radius: float, height: float, n: int):
  """An upright closed cylinder whose axis is +z through `centre`."""
  side, cap = 2 * np.pi * radius * height, np.pi * radius ** 2
  part = rng.choice(3, size=n, p=np.array([side, cap, cap]) / (side + 2 * cap))
  angle = rng.uniform(0, 2 * np.pi, n)
  r = np.where(part == 0, radius, radius * np.sqrt(rng.uniform(0, 1, n)))
  z = np.where(part == 0, rng.uniform(-height / 2, height / 2, n),
               np.where(part == 1, -height / 2, height / 2))
  xyz = np.stack([r * np.cos(angle), r * np.sin(angle), z], 1).astype(np.float32)
  normal = np.where((part == 0)[:, None],
                    np.stack([np.cos(angle), np.sin(angle), np.zeros(n)], 1),
                    np.stack([np.zeros(n), np.zeros(n), np.where(part == 1, -1.0, 1.0)], 1))
  return xyz + np.asarray(centre, np.float32), normal.astype(np.float32)


def rectangle(rng: np.random.Generator, origin, edge_u, edge_v, n: int):
  """A flat rectangle `origin + a edge_u + b edge_v`, a, b in [0, 1]."""
  origin, edge_u, edge_v = (np.asarray(x, np.float32) for x in (origin, edge_u, edge_v))
  ab = rng.uniform(0, 1, size=(n, 2)).astype(np.float32)
  normal = np.cross(edge_u, edge_v)
  normal = normal / np.linalg.norm(normal)
  return origin + ab[:, :1] * edge_u + ab[:, 1:] * edge_v, np.tile(normal, (n, 1))
