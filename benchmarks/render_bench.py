"""Renderer throughput: jaxspatial against Open3D and Think3D's numpy method, in one run.

    python -m benchmarks.render_bench            # the issue's shapes: 1M points
    python -m benchmarks.render_bench --points 200000 --repeats 3   # quicker

Cost on a 2-core CPU: about 2 minutes (the numpy baseline takes ~2 s a view).
All renderers draw the same procedural room of `--points` points from the same
8 cameras. Rows give milliseconds per view and points per second; the speed-up
column compares with Open3D's `project_to_rgbd_image` at radius 0 (it has no
footprint) and with the numpy method at radius 1. jaxspatial rows compute what
the baselines compute, colour and depth, as a rollout's jit does when it reads
only those (XLA drops unused outputs); the "(+index, instance)" row also
materialises the point-index and instance images. On an accelerator the last
column is the achieved memory traffic (XLA's cost analysis, bytes accessed)
against the device's measured copy bandwidth, the floor of a scatter renderer.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.timing import timed, timed_first
from data_pipelines.synthetic import make_room, orbit_cameras
from jaxspatial.geometry import Camera
from jaxspatial.render import render, render_batch, splat
from jaxspatial.render.numpy_reference import render_numpy

RESOLUTIONS = ((640, 480), (1024, 768))
RADII = (0, 1)
BATCHES = (1, 8)


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def rgbd_single(cloud, camera, height, width, radius):
  """Colour and depth, what Open3D's project_to_rgbd_image computes; XLA drops the rest."""
  out = render(cloud, camera, height, width, radius)
  return out.rgb, out.depth


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def rgbd_batch(cloud, cameras, height, width, radius):
  out = render_batch(cloud, cameras, height, width, radius)
  return out.rgb, out.depth


def cameras_in_room(room, num_views: int, width: int, height: int) -> Camera:
  centre = np.array(room.bounds_max) / 2
  return orbit_cameras((centre[0], centre[1], 0.5), (2.2, 2.0), 1.8, num_views, width, height)


def jaxspatial_view_ms(cloud, cameras, height, width, radius, num_views, repeats,
                       outputs="rgbd") -> tuple[float, float]:
  """(seconds of the first call, compilation included; milliseconds per view) of drawing
  the first `num_views` of `cameras` in one call; outputs "all" also materialises the
  point-index and instance images."""
  batch = jax.tree.map(lambda x: x[:num_views], cameras)
  if num_views == 1:
    draw, camera = rgbd_single, jax.tree.map(lambda x: x[0], batch)
  else:
    draw, camera = (rgbd_batch if outputs == "rgbd" else render_batch), batch
  first, seconds = timed_first(lambda: draw(cloud, camera, height, width, radius), repeats)
  return first, 1e3 * seconds / num_views


def open3d_cloud(xyz_np, rgb_np):
  """Open3D's tensor point cloud of the scene; ImportError when open3d is missing."""
  import open3d as o3d  # pylint: disable=import-outside-toplevel
  cloud = o3d.t.geometry.PointCloud(o3d.core.Tensor(xyz_np))
  cloud.point.colors = o3d.core.Tensor(rgb_np.astype(np.float32) / 255.0)
  return cloud


def open3d_draw(o3d_cloud, cameras, width, height, num_views):
  """A call drawing the first `num_views` cameras with `project_to_rgbd_image` (radius 0)."""
  import open3d as o3d  # pylint: disable=import-outside-toplevel
  intrinsics = [o3d.core.Tensor(k) for k in np.asarray(cameras.intrinsic_matrix[:num_views])]
  extrinsics = [o3d.core.Tensor(e) for e in np.asarray(cameras.camera_from_world[:num_views])]
  return lambda: [o3d_cloud.project_to_rgbd_image(width, height, k, e, depth_scale=1.0,
                                                  depth_max=100.0)
                  for k, e in zip(intrinsics, extrinsics)]


def numpy_draw(xyz_np, rgb_np, cameras, height, width, radius):
  """A call drawing the first camera with Think3D's numpy method."""
  intrinsic = np.asarray(cameras.intrinsic_matrix[0])
  extrinsic = np.asarray(cameras.camera_from_world[0])
  return lambda: render_numpy(xyz_np, rgb_np, intrinsic, extrinsic, height, width,
                              splat_radius=radius)


def copy_bandwidth(repeats: int) -> float:
  """Bytes per second of a device-to-device copy (read + write) of 256 MiB."""
  x = jnp.ones((64 * 2 ** 20,), jnp.int32)
  copy = jax.jit(lambda a: a + 1)
  return 2 * x.nbytes / timed(lambda: copy(x), repeats)


def bytes_accessed(cloud, cameras, height, width, radius, num_views) -> float:
  args = (cloud, cameras if num_views > 1 else jax.tree.map(lambda x: x[0], cameras),
          jnp.asarray((255, 255, 255), jnp.uint8), jnp.float32(1e-3), None,
          num_views if num_views > 1 else None)
  compiled = splat._render_jit.lower(*args, height=height, width=width, splat_radius=radius,
                                     footprint="square").compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost.get("bytes accessed", float("nan")))


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--points", type=int, default=1_000_000)
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--numpy-repeats", type=int, default=2)
  parser.add_argument("--skip-numpy", action="store_true")
  parser.add_argument("--skip-open3d", action="store_true")
  args = parser.parse_args(argv)

  device = jax.devices()[0]
  on_accelerator = device.platform != "cpu"
  print(f"jax {jax.__version__} on {device.platform} ({device.device_kind}), "
        f"{len(jax.devices())} device(s)")
  room = make_room(0, args.points, num_objects=8)
  cloud = room.cloud
  num_points = cloud.num_points
  xyz_np, rgb_np = np.asarray(cloud.xyz), np.asarray(cloud.rgb)
  print(f"scene: procedural room, {num_points:,} points\n")

  o3d_cloud = None
  if not args.skip_open3d:
    try:
      o3d_cloud = open3d_cloud(xyz_np, rgb_np)
    except ImportError:
      print("open3d not installed: its rows are skipped")

  bandwidth = copy_bandwidth(args.repeats) if on_accelerator else None
  if bandwidth:
    print(f"measured copy bandwidth: {bandwidth / 1e9:.1f} GB/s\n")

  header = f"{'renderer':<40}{'size':>10}{'r':>3}{'views':>6}{'ms/view':>10}{'Mpts/s':>9}{'speed-up':>14}"
  header += f"{'GB/s (of copy)':>18}" if bandwidth else ""
  print(header)
  print("-" * len(header))
  for width, height in RESOLUTIONS:
    cameras = cameras_in_room(room, max(BATCHES), width, height)
    for radius in RADII:
      rows = []
      # jaxspatial first: Open3D's TBB workers spin after each call and steal the cores.
      for num_views, outputs in [(1, "rgbd"), (max(BATCHES), "rgbd"), (max(BATCHES), "all")]:
        _, ms = jaxspatial_view_ms(cloud, cameras, height, width, radius, num_views,
                                   args.repeats, outputs)
        traffic = None
        if bandwidth:
          batch = jax.tree.map(lambda x: x[:num_views], cameras)
          traffic = bytes_accessed(cloud, batch, height, width, radius, num_views) / num_views
        name = "jaxspatial " + ("single" if num_views == 1 else "batched")
        name += "" if outputs == "rgbd" else " (+index, instance)"
        rows.append((name, num_views, ms, traffic))
      baseline_name, baseline_ms = None, None
      if radius == 0 and o3d_cloud is not None:
        ms = 1e3 * timed(open3d_draw(o3d_cloud, cameras, width, height, max(BATCHES)),
                         args.repeats) / max(BATCHES)
        rows.insert(0, ("open3d project_to_rgbd_image", 1, ms, None))
        baseline_name, baseline_ms = "open3d", ms
      if not args.skip_numpy and radius == 1:
        ms = 1e3 * timed(numpy_draw(xyz_np, rgb_np, cameras, height, width, radius),
                         args.numpy_repeats)
        rows.insert(0, ("numpy, Think3D method (9 passes)", 1, ms, None))
        baseline_name, baseline_ms = "numpy", ms
      for name, num_views, ms, traffic in rows:
        line = (f"{name:<40}{f'{width}x{height}':>10}{radius:>3}{num_views:>6}{ms:>10.2f}"
                f"{num_points / ms / 1e3:>9.1f}")
        speedup = (f"{baseline_ms / ms:.1f}x" if baseline_ms and name.startswith("jaxspatial")
                   else "")
        line += f"{speedup + (' ' + baseline_name if speedup else ''):>14}"
        if bandwidth and traffic:
          achieved = traffic / (ms / 1e3)
          line += f"{achieved / 1e9:>9.1f} ({100 * achieved / bandwidth:.0f}%)"
        print(line)
    print()
  print("targets (2-core CPU): radius 0 >= 2x open3d; radius 1 >= 20x the numpy method")


if __name__ == "__main__":
  main()
