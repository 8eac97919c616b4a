"""A direct numpy splatter, written from the renderer's specification, as the test oracle.

Every point emits one candidate per footprint pixel; each pixel keeps the
candidate with the smallest (depth, point index). No z-buffer tricks, no
filters: just enumerate and sort.
"""

from __future__ import annotations

import numpy as np


def round_half_away(x):
  return np.where(x >= 0, np.floor(x + 0.5), np.ceil(x - 0.5))


def project_float32(xyz, camera_from_world, fx, fy, cx, cy):
  """The camera frame and pixel coordinates in float32, in the library's operation order."""
  e = np.asarray(camera_from_world, np.float32)
  x, y, z = (np.asarray(xyz, np.float32)[:, i] for i in range(3))
  p = [e[i, 0] * x + e[i, 1] * y + e[i, 2] * z + e[i, 3] for i in range(3)]
  u = np.float32(fx) * p[0] / p[2] + np.float32(cx)
  v = np.float32(fy) * p[1] / p[2] + np.float32(cy)
  return p[2], u, v


def splat_numpy(xyz, rgb, valid, instance, camera_from_world, fx, fy, cx, cy, height, width,
                radius=1, point_radius=None, footprint="square", near=1e-3,
                background=(255, 255, 255)):
  z, u, v = project_float32(xyz, camera_from_world, fx, fy, cx, cy)
  with np.errstate(invalid="ignore"):
    keep = np.asarray(valid) & (z > near) & np.isfinite(z) & np.isfinite(u) & np.isfinite(v)
  index = np.nonzero(keep)[0]
  ui, vi, zk = round_half_away(u[keep]).astype(np.int64), round_half_away(v[keep]).astype(
      np.int64), z[keep]
  if point_radius is None:
    radii = np.full(len(index), radius)
  else:
    pr = np.broadcast_to(np.asarray(point_radius, np.float32), z.shape)[keep]
    radii = np.clip(round_half_away(np.float32(fx) * pr / zk), 0, radius).astype(np.int64)

  cand_pixel, cand_depth, cand_index = [], [], []
  for dy in range(-radius, radius + 1):
    for dx in range(-radius, radius + 1):
      if footprint == "square":
        inside_fp = (abs(dx) <= radii) & (abs(dy) <= radii)
      else:
        inside_fp = dx * dx + dy * dy <= (radii + 0.5) ** 2
      uu, vv = ui + dx, vi + dy
      m = inside_fp & (uu >= 0) & (uu < width) & (vv >= 0) & (vv < height)
      cand_pixel.append(vv[m] * width + uu[m])
      cand_depth.append(zk[m])
      cand_index.append(index[m])
  pixel = np.concatenate(cand_pixel)
  depth = np.concatenate(cand_depth)
  idx = np.concatenate(cand_index)
  order = np.lexsort((idx, depth, pixel))
  pixel, depth, idx = pixel[order], depth[order], idx[order]
  first = np.ones(len(pixel), bool)
  first[1:] = pixel[1:] != pixel[:-1]

  point_index = np.full(height * width, -1, np.int64)
  depth_img = np.zeros(height * width, np.float32)
  point_index[pixel[first]] = idx[first]
  depth_img[pixel[first]] = depth[first]
  hit = point_index >= 0
  rgb_img = np.empty((height * width, 3), np.uint8)
  rgb_img[:] = background
  rgb_img[hit] = np.asarray(rgb)[point_index[hit]]
  inst = np.full(height * width, -1, np.int64)
  inst[hit] = np.asarray(instance)[point_index[hit]]
  shape = (height, width)
  return {"rgb": rgb_img.reshape(shape + (3,)), "depth": depth_img.reshape(shape),
          "point_index": point_index.reshape(shape), "instance": inst.reshape(shape)}
