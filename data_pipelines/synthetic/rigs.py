"""Camera rigs for procedural scenes."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxspatial.geometry import Camera, look_at


def orbit_cameras(target, radius, eye_height: float, num_views: int, width: int, height: int,
                  hfov_deg: float = 70.0) -> Camera:
  """`num_views` cameras evenly spaced on a horizontal circle (or ellipse, with
  `radius = (rx, ry)`) around `target` at `eye_height`, all looking at `target`."""
  rx, ry = np.broadcast_to(np.asarray(radius, np.float64), (2,))
  angles = np.linspace(0, 2 * np.pi, num_views, endpoint=False)
  eyes = np.stack([target[0] + rx * np.cos(angles), target[1] + ry * np.sin(angles),
                   np.full(num_views, eye_height)], 1)
  targets = np.tile(np.asarray(target, np.float32), (num_views, 1))
  return Camera.from_fov(jnp.full(num_views, hfov_deg), width, height, look_at(eyes, targets))


def _cameras(eyes, targets, width: int, height: int, hfov_deg: float) -> Camera:
  eyes, targets = np.asarray(eyes, np.float32), np.asarray(targets, np.float32)
  return Camera.from_fov(jnp.full(len(eyes), hfov_deg), width, height, look_at(eyes, targets))


def rotation_rig(position, num_views: int, width: int, height: int, hfov_deg: float = 70.0,
                 first_yaw_deg: float = 0.0, pitch_deg: float = -10.0) -> Camera:
  """MindCube `rotation`: one position, turning in place by 360 / num_views each view
  (views go clockwise seen from above, so view k+1 is view k turned right)."""
  yaws = np.deg2rad(first_yaw_deg - np.arange(num_views) * 360.0 / num_views)
  pitch = np.deg2rad(pitch_deg)
  directions = np.stack([np.cos(yaws) * np.cos(pitch), np.sin(yaws) * np.cos(pitch),
                         np.full(num_views, np.sin(pitch))], 1)
  eyes = np.tile(np.asarray(position, np.float32), (num_views, 1))
  return _cameras(eyes, eyes + directions, width, height, hfov_deg)


def arc_rig(target, radius: float, eye_height: float, start_deg: float, step_deg: float,
            num_views: int, width: int, height: int, hfov_deg: float = 70.0) -> Camera:
  """MindCube `around` / `among` and BLINK pairs: cameras on an arc around `target`,
  all looking at it; a positive step moves counter-clockwise seen from above."""
  angles = np.deg2rad(start_deg + step_deg * np.arange(num_views))
  eyes = np.stack([target[0] + radius * np.cos(angles), target[1] + radius * np.sin(angles),
                   np.full(num_views, eye_height)], 1)
  targets = np.tile(np.asarray(target, np.float32), (num_views, 1))
  return _cameras(eyes, targets, width, height, hfov_deg)
