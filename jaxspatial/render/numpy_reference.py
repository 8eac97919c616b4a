"""Think3D's published host renderer, in numpy, as the baseline to beat.

Think3D's point renderer (spagent, head after PR #160) splats a 3x3 footprint
as one pass per pixel offset: sort the points by depth, keep the first point
per pixel with `np.unique`, and write it where it is nearer than the depth
buffer. This module reproduces that method for benchmarks and host-side
environments; it is not used on the hot path.
"""

from __future__ import annotations

import numpy as np


def render_numpy(xyz: np.ndarray, rgb: np.ndarray, intrinsic: np.ndarray,
                 camera_from_world: np.ndarray, height: int, width: int,
                 splat_radius: int = 1, near: float = 1e-3,
                 background=(255, 255, 255)) -> tuple[np.ndarray, np.ndarray]:
  """Renders with one argsort-and-unique pass per footprint offset.

  Args:
    xyz: [P, 3] world points; rgb: [P, 3] uint8.
    intrinsic: 3x3 K; camera_from_world: 4x4 world-to-camera extrinsic.
  Returns:
    (rgb [H, W, 3] uint8, depth [H, W] float32, 0 where empty).
  """
  xyz = np.asarray(xyz, np.float32)
  rotation = np.asarray(camera_from_world, np.float32)[:3, :3]
  translation = np.asarray(camera_from_world, np.float32)[:3, 3]
  p_cam = xyz @ rotation.T + translation
  z = p_cam[:, 2]
  front = z > near
  p_cam, z, colours = p_cam[front], z[front], np.asarray(rgb)[front]
  u = np.round(intrinsic[0, 0] * p_cam[:, 0] / z + intrinsic[0, 2]).astype(np.int64)
  v = np.round(intrinsic[1, 1] * p_cam[:, 1] / z + intrinsic[1, 2]).astype(np.int64)

  depth_buffer = np.full(height * width, np.inf, np.float32)
  image = np.empty((height * width, 3), np.uint8)
  image[:] = np.asarray(background, np.uint8)
  for dy in range(-splat_radius, splat_radius + 1):
    for dx in range(-splat_radius, splat_radius + 1):
      uu, vv = u + dx, v + dy
      inside = (uu >= 0) & (uu < width) & (vv >= 0) & (vv < height)
      pixel = vv[inside] * width + uu[inside]
      depth = z[inside]
      order = np.argsort(depth, kind="stable")
      first_pixels, first = np.unique(pixel[order], return_index=True)
      nearest = order[first]
      nearer = depth[nearest] < depth_buffer[first_pixels]
      targets = first_pixels[nearer]
      depth_buffer[targets] = depth[nearest][nearer]
      image[targets] = colours[inside][nearest[nearer]]
  depth_buffer[np.isinf(depth_buffer)] = 0.0
  return image.reshape(height, width, 3), depth_buffer.reshape(height, width)
