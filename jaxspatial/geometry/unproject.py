"""Depth maps to world points: the repo's one pinhole unprojection, on the host or in jit.

OpenCV axes (x right, y down, z forward along the optical axis), pixel j's centre at
coordinate j, intrinsics [[fx, s, cx], [0, fy, cy], [0, 0, 1]], a camera-to-world pose.
Callers differ only in what they do with pixels without depth (zeroed, NaN, dropped), so
that stays with them.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def unproject_depth(depth_HxW, intrinsics_3x3, c2w_4x4):
  """World points [H, W, 3] of a depth map, in the inputs' dtype: camera point
  ((u - cx - s y') z / fx, y' z, z) with y' = (v - cy) / fy at pixel (u, v), then `c2w`.
  No pixel is masked (depth 0 gives the camera centre, NaN gives NaN).

  numpy arrays stay on the host (the pose by a matmul, exact there); anything else goes
  through jnp (jit-able), the pose by multiply-adds, not a matmul: exact float32 on
  accelerators whose default matmul precision is bf16 (the repo's rule for poses)."""
  host = all(isinstance(a, np.ndarray) for a in (depth_HxW, intrinsics_3x3, c2w_4x4))
  xp = np if host else jnp
  depth, k, pose = depth_HxW, intrinsics_3x3, c2w_4x4
  height, width = depth.shape
  v, u = xp.meshgrid(xp.arange(height, dtype=depth.dtype), xp.arange(width, dtype=depth.dtype),
                     indexing="ij")
  fx, s, cx, fy, cy = k[0, 0], k[0, 1], k[0, 2], k[1, 1], k[1, 2]
  y_n = (v - cy) / fy
  x_n = (u - cx - s * y_n) / fx
  z = depth
  if host:
    camera = np.stack([x_n * z, y_n * z, z], -1)
    return camera @ pose[:3, :3].T + pose[:3, 3]
  camera = (x_n * z, y_n * z, z)
  world = [pose[i, 0] * camera[0] + pose[i, 1] * camera[1] + pose[i, 2] * camera[2]
           + pose[i, 3] for i in range(3)]
  return jnp.stack(world, -1)
