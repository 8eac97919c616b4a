"""A deterministic stand-in for VGGT features on synthetic scenes, from their ground-truth
geometry (depth and world coordinates pooled to VGGT's token grid, then a fixed random
projection to the channel width): it lets the whole 3DThinker pipeline train where VGGT
cannot be downloaded; it is not VGGT (that is `jaxspatial.perception.VGGTExtractor`).
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class GeometryStandInExtractor:
  """Deterministic stand-in for VGGT features, from depth and world coordinates.

  Each view is pooled to a grid x grid map of [depth, world x, y, z, coverage, 1] (VGGT's
  37 x 37 patches for 518-pixel inputs; coverage is 2 * the valid fraction - 1, so empty
  patches are not zero vectors), `special` tokens are prepended (VGGT's camera and
  register tokens: the view's camera centre, its forward axis, then fixed constants), and
  a fixed random projection (seeded) maps the 6 channels to `channels`. No token is a zero
  vector, so every token has a defined cosine.
  """

  grid: int = 37
  special: int = 5
  channels: int = 2048
  seed: int = 0

  @property
  def tokens(self) -> int:
    return self.special + self.grid * self.grid

  def __call__(self, depth_NxHxW: np.ndarray, world_from_camera_Nx4x4: np.ndarray,
               intrinsics_Nx4: np.ndarray) -> np.ndarray:
    depth = np.asarray(depth_NxHxW, np.float32)
    n, h, w = depth.shape
    v, u = np.meshgrid(np.arange(h, dtype=np.float32), np.arange(w, dtype=np.float32),
                       indexing="ij")
    features = []
    for i in range(n):
      fx, fy, cx, cy = np.asarray(intrinsics_Nx4[i], np.float32)
      pose = np.asarray(world_from_camera_Nx4x4[i], np.float32)
      camera = np.stack([(u - cx) / fx * depth[i], (v - cy) / fy * depth[i], depth[i]], -1)
      world = camera @ pose[:3, :3].T + pose[:3, 3]
      valid = (depth[i] > 0).astype(np.float32)
      maps = np.concatenate([depth[i][..., None], world * valid[..., None],
                             2 * valid[..., None] - 1, np.ones_like(valid)[..., None]], -1)
      rows = np.array_split(np.arange(h), self.grid)
      cols = np.array_split(np.arange(w), self.grid)
      pooled = np.stack([np.stack([maps[r][:, c].reshape(-1, 6).mean(0) for c in cols])
                         for r in rows]).reshape(-1, 6)
      special = np.zeros((self.special, 6), np.float32)
      special[:, 5] = 1.0
      special[0, :3], special[1, :3] = pose[:3, 3], pose[:3, 2]
      special[2:, 4] = np.arange(1, self.special - 1)  # registers: fixed constants
      features.append(np.concatenate([special, pooled]))
    projection = np.random.default_rng(self.seed).normal(size=(6, self.channels)).astype(
        np.float32) / np.sqrt(6)
    return np.stack(features) @ projection  # [N, tokens, channels]
