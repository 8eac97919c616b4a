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
