"""The renderer part: the jit renderer's grid (points, resolutions, radius, views a call),
Open3D and Think3D's numpy method as ratios, scatter-min throughput."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.device_suite.core import Clock, Report, Sizes
from benchmarks.render_bench import (cameras_in_room, jaxspatial_view_ms, numpy_draw, open3d_cloud,
                                     open3d_draw)
from benchmarks.timing import timed
from data_pipelines.synthetic import make_room


def scatter_min_rows(num_updates: int, width: int, height: int, clustered_pixels: int,
                     repeats: int) -> list[dict]:
  """int32 `.at[].min` of `num_updates` into an image-sized buffer: the z-buffer's pass."""
  size = width * height
  buffer = jnp.full((size + 1,), jnp.iinfo(jnp.int32).max, jnp.int32)
  values = jax.random.randint(jax.random.PRNGKey(3), (num_updates,), 0, 2 ** 30)
  patterns = {
      "uniform": jax.random.randint(jax.random.PRNGKey(4), (num_updates,), 0, size),
      f"clustered ({clustered_pixels} pixels)": jax.random.randint(
          jax.random.PRNGKey(5), (num_updates,), 0, clustered_pixels) * 97 % size}
  scatter_min = jax.jit(lambda b, i, v: b.at[i].min(v))
  rows = []
  for name, index in patterns.items():
    seconds = timed(lambda: scatter_min(buffer, index, values), repeats)
    rows.append({"pattern": name, "updates": num_updates, "width": width, "height": height,
                 "ms": 1e3 * seconds, "updates_per_s": num_updates / seconds})
  return rows


def renderer_part(entry: dict, sizes: Sizes, clock: Clock, report: Report) -> None:
  rows, scatter, skipped = [], [], []
  entry.update(rows=rows, scatter_min=scatter, skipped=skipped,
               note="jaxspatial rows draw colour and depth (what the baselines compute); "
                    "first_call_s includes the jit compile; host baselines run after the "
                    "device rows (Open3D's TBB workers spin and steal cores)")
  start = time.perf_counter()
  rooms = {}
  for points in sizes.render_points:
    room = make_room(0, points, num_objects=8)
    rooms[points] = room
    cloud = jax.device_put(room.cloud)
    for width, height in sizes.render_resolutions:
      cameras = cameras_in_room(room, max(sizes.render_views), width, height)
      for radius in sizes.render_radii:
        for views in sizes.render_views:
          row = {"renderer": "jaxspatial", "points": points, "width": width,
                 "height": height, "radius": radius, "views": views}
          if time.perf_counter() - start > sizes.render_budget_s or clock.left() < 30:
            skipped.append({**row, "reason": "renderer budget"})
            continue
          try:
            first, ms = jaxspatial_view_ms(cloud, cameras, height, width, radius, views,
                                           sizes.render_repeats)
            row.update(ms_per_view=ms, points_per_s=points / (ms / 1e3), first_call_s=first)
          except Exception as exc:  # pylint: disable=broad-except
            row["error"] = f"{type(exc).__name__}: {exc}"[:1000]
          rows.append(row)
          report.save()
    for width, height in sizes.render_resolutions:
      scatter.extend(scatter_min_rows(points, width, height, sizes.scatter_clustered_pixels,
                                      sizes.render_repeats))
    del cloud
    report.save()
  entry["host_baselines"] = baselines = []
  for points, room in rooms.items():
    xyz_np, rgb_np = np.asarray(room.cloud.xyz), np.asarray(room.cloud.rgb)
    try:  # open3d's import fails without Debian's libusb (make system-deps)
      o3d_cloud = open3d_cloud(xyz_np, rgb_np)
    except Exception as exc:  # pylint: disable=broad-except
      o3d_cloud = None
      entry["open3d"] = f"skipped: {type(exc).__name__}: {exc}"[:300]
    for width, height in sizes.render_resolutions:
      cameras = cameras_in_room(room, sizes.open3d_views, width, height)
      base = {"points": points, "width": width, "height": height, "views": 1}
      if o3d_cloud is not None:
        views = sizes.open3d_views
        row = {"renderer": "open3d project_to_rgbd_image", **base, "radius": 0}
        try:
          ms = 1e3 * timed(open3d_draw(o3d_cloud, cameras, width, height, views), 2) / views
          row.update(ms_per_view=ms, points_per_s=points / (ms / 1e3))
        except Exception as exc:  # pylint: disable=broad-except
          row["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        baselines.append(row)
      if points == sizes.numpy_points:
        row = {"renderer": "numpy, Think3D method", **base, "radius": 1}
        try:
          draw = numpy_draw(xyz_np, rgb_np, cameras, height, width, 1)
          begin = time.perf_counter()  # one call: it is slow and has nothing to compile
          draw()
          ms = 1e3 * (time.perf_counter() - begin)
          row.update(ms_per_view=ms, points_per_s=points / (ms / 1e3))
        except Exception as exc:  # pylint: disable=broad-except
          row["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        baselines.append(row)
      report.save()
  for row in rows:
    for base in baselines:
      same = (base["points"], base["width"], base["height"], base["radius"]) == (
          row["points"], row["width"], row["height"], row["radius"])
      if same and "ms_per_view" in row and "ms_per_view" in base:
        row["speedup"] = base["ms_per_view"] / row["ms_per_view"]
        row["speedup_vs"] = base["renderer"]
