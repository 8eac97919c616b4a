"""The render demo (launch/render_demo.py, configs/render_demo.py): a procedural room seen
from several cameras, as a PNG contact sheet. Rows: colour views, depth maps, instance maps,
and the same views with depth-dependent disc splats."""

from __future__ import annotations

import io
import time

import jax
import numpy as np
from etils import epath

from data_pipelines.synthetic import make_room, orbit_cameras
from jaxspatial.render import render_batch
from jaxspatial.render.contact_sheet import contact_sheet, depth_to_rgb, instance_to_rgb


def render_sheet(config) -> epath.Path:
  """Renders the config's room from `num_views` cameras; writes and returns the sheet."""
  room = make_room(config.seed, config.num_points, num_objects=config.num_objects)
  centre = np.array(room.bounds_max) / 2
  # Cameras inside the room, looking across it at a point above the floor's centre.
  cameras = orbit_cameras((centre[0], centre[1], 0.3), 2.2, 2.2, config.num_views,
                          config.width, config.height, config.hfov_deg)
  print(f"room seed {config.seed}: {room.cloud.num_points:,} points; objects: "
        + ", ".join(o.name for o in room.objects))
  start = time.perf_counter()
  views = render_batch(room.cloud, cameras, config.height, config.width,
                       splat_radius=config.splat_radius)
  discs = render_batch(room.cloud, cameras, config.height, config.width,
                       splat_radius=config.max_splat_radius, point_radius=config.point_radius,
                       footprint="disc")
  jax.block_until_ready((views, discs))
  print(f"rendered {2 * config.num_views} views of {config.width}x{config.height} in "
        f"{time.perf_counter() - start:.2f} s, compilation included")

  rgb, depth, instance = (np.asarray(x) for x in (views.rgb, views.depth, views.instance))
  sheet = contact_sheet(
      [list(rgb), [depth_to_rgb(d) for d in depth], [instance_to_rgb(i) for i in instance],
       list(np.asarray(discs.rgb))],
      labels=[f"colour ({2 * config.splat_radius + 1}x{2 * config.splat_radius + 1} splats)",
              "depth (near is bright)", "instance ids",
              f"colour (depth-dependent discs, {1000 * config.point_radius:.0f} mm points)"])
  out = epath.Path(config.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  buffer = io.BytesIO()
  sheet.save(buffer, format="PNG")
  out.write_bytes(buffer.getvalue())
  print(f"contact sheet: {out}")
  return out
