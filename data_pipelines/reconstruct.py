"""Reconstruction from posed RGB-D views with Open3D: the default when no learned
reconstructor (Pi3, VGGT) is installed.

`reconstruct(images, depths, cameras)` unprojects every view, fuses them (a plain
union, or TSDF fusion in a `UniformTSDFVolume` over the views' bounds), voxel
downsamples, removes statistical outliers, and pads the result to a bucket size.
It runs on the host. `RGBDReconstructor` gives it the learned reconstructors' output, a
`jaxspatial.perception.reconstruction.Reconstruction` (which lives in jaxspatial and never
imports this module).

Open3D 0.20's `ScalableTSDFVolume` silently extracts nothing, so it is not used.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from jaxspatial.geometry import Camera, PointCloud, pad_to_bucket, sort_spatially
from jaxspatial.perception.reconstruction import Reconstruction


def _open3d():
  try:
    import open3d as o3d  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError("reconstruct needs open3d (pip install 'jaxspatial[data]'; on Debian "
                      "also apt-get install libusb-1.0-0)") from e
  return o3d


def _views(images, depths, cameras: Camera):
  images = np.asarray(images)
  depths = np.asarray(depths, np.float32)
  if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
    raise ValueError(f"reconstruct: images must be [V, H, W, 3] uint8, got "
                     f"{images.shape} {images.dtype}")
  if depths.shape != images.shape[:3]:
    raise ValueError(f"reconstruct: depths must be [V, H, W] = {images.shape[:3]}, "
                     f"got {depths.shape}")
  if tuple(cameras.world_from_camera.shape) != (len(images), 4, 4):
    raise ValueError(f"reconstruct: expected {len(images)} cameras, got pose shape "
                     f"{tuple(cameras.world_from_camera.shape)}")
  return images, depths


def reconstruct(images, depths, cameras: Camera, *, voxel_size: float = 0.02,
                method: Literal["unproject", "tsdf"] = "unproject",
                outlier_neighbors: int = 20, outlier_std_ratio: float = 2.0,
                depth_max: float = 100.0, min_bucket: int = 1024) -> PointCloud:
  """Fuses posed RGB-D views into a padded, Morton-ordered `PointCloud`.

  Args:
    images: [V, H, W, 3] uint8; depths: [V, H, W] float32 camera z, 0 where unknown.
    cameras: `Camera` [V] (OpenCV, camera-to-world).
    voxel_size: downsampling voxel (metres); for TSDF also the voxel of the volume.
    method: "unproject" (union of back-projected pixels) or "tsdf".
    outlier_neighbors, outlier_std_ratio: statistical outlier removal (0 disables).
  """
  o3d = _open3d()
  images, depths = _views(images, depths, cameras)
  num_views, height, width = depths.shape
  poses = np.asarray(cameras.world_from_camera, np.float64)
  intrinsics = [o3d.camera.PinholeCameraIntrinsic(width, height, float(cameras.fx[i]),
                                                  float(cameras.fy[i]), float(cameras.cx[i]),
                                                  float(cameras.cy[i]))
                for i in range(num_views)]

  def rgbd(i):
    return o3d.geometry.RGBDImage.create_from_color_and_depth(
        o3d.geometry.Image(np.ascontiguousarray(images[i])),
        o3d.geometry.Image(np.ascontiguousarray(depths[i])), depth_scale=1.0,
        depth_trunc=depth_max, convert_rgb_to_intensity=False)

  if method == "unproject":
    fused = o3d.geometry.PointCloud()
    for i in range(num_views):
      fused += o3d.geometry.PointCloud.create_from_rgbd_image(rgbd(i), intrinsics[i],
                                                              np.linalg.inv(poses[i]))
  elif method == "tsdf":
    fused = _tsdf(o3d, rgbd, intrinsics, poses, depths, cameras, voxel_size)
  else:
    raise ValueError(f"reconstruct: method must be 'unproject' or 'tsdf', got {method!r}")
  if voxel_size > 0:
    fused = fused.voxel_down_sample(voxel_size)
  if outlier_neighbors > 0 and len(fused.points) > outlier_neighbors:
    fused, _ = fused.remove_statistical_outlier(outlier_neighbors, outlier_std_ratio)
  xyz = np.asarray(fused.points, np.float32)
  rgb = np.asarray(fused.colors, np.float32)
  cloud = PointCloud.create(xyz.reshape(-1, 3), rgb.reshape(-1, 3) if len(rgb) else None)
  return pad_to_bucket(sort_spatially(cloud), min_bucket)


def _tsdf(o3d, rgbd, intrinsics, poses, depths, cameras: Camera, voxel_size: float):
  """TSDF fusion in a uniform volume around everything the views see."""
  # Bounds of the observed points decide the volume.
  corners = []
  for i, depth in enumerate(depths):
    v, u = np.nonzero(depth > 0)
    if len(u) == 0:
      continue
    z = depth[v, u]
    x = (u - float(cameras.cx[i])) * z / float(cameras.fx[i])
    y = (v - float(cameras.cy[i])) * z / float(cameras.fy[i])
    world = np.stack([x, y, z], 1) @ poses[i][:3, :3].T + poses[i][:3, 3]
    corners.append([world.min(0), world.max(0)])
  if not corners:
    return o3d.geometry.PointCloud()
  low = np.min([c[0] for c in corners], 0) - 4 * voxel_size
  high = np.max([c[1] for c in corners], 0) + 4 * voxel_size
  length = float(np.max(high - low))
  resolution = int(np.ceil(length / voxel_size))
  volume = o3d.pipelines.integration.UniformTSDFVolume(
      length=length, resolution=resolution, sdf_trunc=4 * voxel_size,
      color_type=o3d.pipelines.integration.TSDFVolumeColorType.RGB8, origin=low.reshape(3, 1))
  for i in range(len(depths)):
    volume.integrate(rgbd(i), intrinsics[i], np.linalg.inv(poses[i]))
  return volume.extract_point_cloud()


class RGBDReconstructor:
  """Posed RGB-D views fused by Open3D (`reconstruct`: unproject or TSDF, voxel grid,
  statistical outliers), returned as a `Reconstruction` like Pi3's, VGGT's and DA3's (the
  depth's own cameras; no pixel index, the voxel grid merges pixels). Needs open3d."""

  def __init__(self, *, voxel_size: float = 0.02, method: str = "unproject",
               outlier_neighbors: int = 20, outlier_std_ratio: float = 2.0,
               depth_max: float = 100.0):
    self.options = dict(voxel_size=voxel_size, method=method,
                        outlier_neighbors=outlier_neighbors,
                        outlier_std_ratio=outlier_std_ratio, depth_max=depth_max)

  def reconstruct(self, images_NxHxWx3, depths_NxHxW, cameras: Camera) -> Reconstruction:
    if not isinstance(cameras, Camera):
      raise TypeError(f"RGBDReconstructor.cameras: expected a Camera, got "
                      f"{type(cameras).__name__}")
    cloud = reconstruct(images_NxHxWx3, depths_NxHxW, cameras, **self.options)
    valid = np.asarray(cloud.valid)
    xyz, rgb = np.asarray(cloud.xyz)[valid], np.asarray(cloud.rgb)[valid]
    return Reconstruction(xyz=xyz, rgb=rgb, valid=np.ones(len(xyz), bool),
                          cameras_c2w=np.asarray(cameras.world_from_camera, np.float32),
                          intrinsics=np.asarray(cameras.intrinsic_matrix, np.float32),
                          image_size=tuple(np.shape(depths_NxHxW)[1:3]))
