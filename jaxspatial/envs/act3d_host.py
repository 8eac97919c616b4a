"""Act3D as a host environment, the way public agent code runs one: a Python object per
episode, numpy dynamics, and Think3D's numpy renderer.

It is the baseline for `benchmarks/env_bench.py` and a plain reading of equation (1)
with the same choices as `jaxspatial.envs.act3d` (pitch clamp, box clamp, rounding).
"""

from __future__ import annotations

import numpy as np

from jaxspatial.envs.act3d import PRIMITIVES, STOP, Act3DParams
from jaxspatial.geometry import intrinsics_from_fov
from jaxspatial.render.numpy_reference import render_numpy


def _rodrigues(v: np.ndarray, axis: np.ndarray, angle: float) -> np.ndarray:
  axis = axis / np.linalg.norm(axis)
  return (v * np.cos(angle) + np.cross(axis, v) * np.sin(angle)
          + axis * (axis @ v) * (1 - np.cos(angle)))


class Act3DHostEnv:
  """One episode. `step(primitive, distance)` returns (image, position, forward, done)."""

  def __init__(self, xyz: np.ndarray, rgb: np.ndarray, scene_min, scene_max, position,
               forward, params: Act3DParams = Act3DParams()):
    self.xyz, self.rgb, self.params = np.asarray(xyz, np.float32), np.asarray(rgb), params
    self.box_min = np.asarray(scene_min, np.float64) - params.bounds_margin_m
    self.box_max = np.asarray(scene_max, np.float64) + params.bounds_margin_m
    self.position = np.asarray(position, np.float64)
    self.forward = np.asarray(forward, np.float64) / np.linalg.norm(forward)
    self.num_interactions = 0
    self.done = False
    fx, fy, cx, cy = (float(x) for x in intrinsics_from_fov(params.hfov_deg, params.width,
                                                            params.height))
    self.intrinsic = np.array([[fx, 0, cx], [0, fy, cy], [0, 0, 1.0]])

  def step(self, primitive: int, distance: float | None = None):
    if self.done or not 0 <= primitive <= STOP:
      return self.render(), self.position, self.forward, self.done
    if primitive == STOP:
      self.done = True
      return self.render(), self.position, self.forward, self.done
    unit = self.params.unit_steps()[primitive]
    n = 1 if distance is None else int(np.clip(np.floor(distance / unit + 0.5 + 1e-4), 1,
                                               self.params.max_multiplier))
    up = np.array([0.0, 0.0, 1.0])
    right = np.cross(self.forward, up)
    right /= np.linalg.norm(right)
    name = PRIMITIVES[primitive]
    if primitive < 6:
      direction = {"forward": self.forward, "backward": -self.forward, "left": -right,
                   "right": right, "up": up, "down": -up}[name]
      self.position = np.clip(self.position + n * unit * direction, self.box_min, self.box_max)
    else:
      angle = np.deg2rad(n * unit)
      if name in ("turn_left", "turn_right"):
        self.forward = _rodrigues(self.forward, up if name == "turn_left" else -up, angle)
      else:
        sign = 1.0 if name == "turn_up" else -1.0
        limit = np.deg2rad(self.params.max_pitch_deg)
        target = np.arcsin(np.clip(self.forward[2], -1, 1)) + sign * angle
        if abs(target) <= limit:
          self.forward = _rodrigues(self.forward, sign * right, angle)
        else:
          heading = np.array([self.forward[0], self.forward[1], 0.0])
          heading /= np.linalg.norm(heading)
          pitch = np.clip(target, -limit, limit)
          self.forward = heading * np.cos(pitch) + up * np.sin(pitch)
    self.num_interactions += 1
    self.done = self.num_interactions >= self.params.max_interactions
    return self.render(), self.position, self.forward, self.done

  def render(self) -> np.ndarray:
    forward = self.forward
    right = np.cross(forward, [0.0, 0.0, 1.0])
    right /= np.linalg.norm(right)
    down = np.cross(forward, right)
    rotation = np.stack([right, down, forward], 1)  # camera-to-world, OpenCV axes
    extrinsic = np.eye(4)
    extrinsic[:3, :3] = rotation.T
    extrinsic[:3, 3] = -rotation.T @ self.position
    image, _ = render_numpy(self.xyz, self.rgb, self.intrinsic, extrinsic, self.params.height,
                            self.params.width, self.params.splat_radius,
                            background=self.params.background)
    return image
