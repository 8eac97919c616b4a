"""Think3D's fusion of learned reconstructions into one coloured cloud (numpy, on the host).

The rules are the public Think3D code's (spagent's Pi3 / VGGT servers and its offline RL
cache; ../shared/reference/think3d.md section 3), written here from their behaviour:

  Pi3   keep a pixel when sigmoid(conf) > 0.06 (the threshold the tool wrapper and the RL
        cache use; the server's own default is 0.08) and it is not a depth edge of the
        camera-frame depth, `depth_edge(local_points[..., 2], rtol=0.02)`; the point is the
        global `points` there, its colour the RGB frame's pixel.
  VGGT  point-map branch: keep world_points_conf >= its 50th percentile over all frames and
        > 1e-5.
  depth per-view depth + cameras (Depth-Anything-3): unproject every pixel through its
        intrinsics and camera-to-world pose; keep depth > 0 and finite and conf >= DA3's own
        adaptive threshold (its GLB export: 1.05 clamped into the 40th..90th percentiles).

Then the common tail, in this order:
  1. non-finite points are dropped (the offline cache does; one NaN would otherwise make
     the covariance NaN and drop every point);
  2. Mahalanobis outlier removal: d = the squared Mahalanobis distance under the empirical
     (1/M) covariance, keep d < mean(d) + 3 std(d). Squared because the public code uses
     scikit-learn's `EmpiricalCovariance.mahalanobis`, which returns squared distances (it
     also keeps the covariance's pseudo-inverse, as we do). Skipped for 10 points or fewer,
     as the offline cache does (the statistics of so few points remove real ones);
  3. the stride cap: with M > max_points points, step = M // max_points and the points
     0, step, 2 step, ... are kept, the first max_points of them (the public code's rule; it
     favours the first views when M is not a multiple). 1,500,000 for Pi3, 500,000 for VGGT.

Everything streams one frame, or one chunk of points, at a time (float64 statistics), so
memory stays a small multiple of the kept points. Bad input raises ValueError naming the
array, the expected and the actual shape.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxspatial.geometry.unproject import unproject_depth

PI3_CONF_THRESHOLD = 0.06
PI3_EDGE_RTOL = 0.02
PI3_MAX_POINTS = 1_500_000
VGGT_CONF_PERCENTILE = 50.0
VGGT_MIN_CONF = 1e-5
VGGT_MAX_POINTS = 500_000
DA3_CONF_THRESHOLD = 1.05
DA3_CONF_PERCENTILES = (40.0, 90.0)
OUTLIER_STD = 3.0
MIN_OUTLIER_POINTS = 11  # the offline cache runs the Mahalanobis filter on more than 10 points
CHUNK_POINTS = 1 << 20


@dataclasses.dataclass(frozen=True)
class Fused:
  """Kept points in fusion order (frame, row, column).

  xyz [M, 3] float32 world points; rgb [M, 3] uint8; pixel_index [M] int64, the flat index
  `frame * H * W + row * W + column` of each point's pixel in the fused frames."""

  xyz: np.ndarray
  rgb: np.ndarray
  pixel_index: np.ndarray


def _shape_error(where: str, name: str, expected, got) -> ValueError:
  return ValueError(f"{where}.{name}: expected shape {expected}, got {tuple(got)}")


def _floats(where: str, name: str, value, shape: tuple) -> np.ndarray:
  """`value` as a float array of `shape` (None: any size), or a ValueError naming it."""
  array = np.asarray(value)
  ok = array.ndim == len(shape) and all(e is None or e == s for e, s in zip(shape, array.shape))
  if not ok:
    shown = "(" + ", ".join("?" if e is None else str(e) for e in shape) + ")"
    raise _shape_error(where, name, shown, array.shape)
  if not np.issubdtype(array.dtype, np.floating):
    raise ValueError(f"{where}.{name}: expected a float dtype, got {array.dtype}")
  return array


def _images(where: str, images, frames_hw: tuple) -> np.ndarray:
  images = np.asarray(images)
  expected = (*frames_hw, 3)
  if images.shape != expected:
    raise _shape_error(where, "images", expected, images.shape)
  if images.dtype != np.uint8:
    raise ValueError(f"{where}.images: expected dtype uint8, got {images.dtype}")
  return images


def _confidence(where: str, name: str, conf, frames_hw: tuple) -> np.ndarray:
  """[N, H, W] from [N, H, W] or [N, H, W, 1] (Pi3's conf carries the trailing 1)."""
  conf = np.asarray(conf)
  if conf.shape == (*frames_hw, 1):
    conf = conf[..., 0]
  if conf.shape != tuple(frames_hw):
    raise _shape_error(where, name, f"{tuple(frames_hw)} or {(*frames_hw, 1)}", conf.shape)
  if not np.issubdtype(conf.dtype, np.floating):
    raise ValueError(f"{where}.{name}: expected a float dtype, got {conf.dtype}")
  return conf


def _check_tail(where: str, num_std, max_points) -> None:
  if num_std is not None and not (np.isfinite(num_std) and num_std >= 0):
    raise ValueError(f"{where}.num_std: expected a finite number >= 0 or None, got {num_std!r}")
  if max_points is not None and (int(max_points) != max_points or max_points < 1):
    raise ValueError(f"{where}.max_points: expected an integer >= 1 or None, got "
                     f"{max_points!r}")


def _window_max(x_HxW: np.ndarray, radius: int) -> np.ndarray:
  """Max over the (2 radius + 1)^2 window around each pixel, the image's own pixels only
  (padding with -inf, as torch's max_pool2d pads); separable: rows, then columns."""
  if radius == 0:
    return x_HxW.copy()
  height, width = x_HxW.shape
  padded = np.pad(x_HxW, radius, constant_values=-np.inf)
  across = padded[:, 0:width].copy()
  for k in range(1, 2 * radius + 1):
    np.maximum(across, padded[:, k:k + width], out=across)
  out = across[0:height].copy()
  for k in range(1, 2 * radius + 1):
    np.maximum(out, across[k:k + height], out=out)
  return out


def depth_edge(depth_xHxW, atol: float | None = None, rtol: float | None = None,
               kernel_size: int = 3, mask_xHxW=None) -> np.ndarray:
  """Pi3's depth-edge mask: a pixel is an edge when the depth range (max - min) over its
  kernel_size^2 neighbourhood inside the image exceeds `atol`, or that range divided by the
  pixel's own depth exceeds `rtol` (a NaN ratio counts as 0, a +inf one as an edge: a zero
  depth beside a non-zero one). With `mask`, only masked-in neighbours count. Shape
  [..., H, W] -> bool [..., H, W]; frames never mix."""
  depth = np.asarray(depth_xHxW)
  if depth.ndim < 2:
    raise ValueError(f"depth_edge.depth: expected shape [..., H, W], got {depth.shape}")
  if not np.issubdtype(depth.dtype, np.floating):
    raise ValueError(f"depth_edge.depth: expected a float dtype, got {depth.dtype}")
  if int(kernel_size) != kernel_size or kernel_size < 1 or kernel_size % 2 == 0:
    raise ValueError(f"depth_edge.kernel_size: expected an odd integer >= 1, got "
                     f"{kernel_size!r}")
  height, width = depth.shape[-2:]
  frames = depth.reshape(-1, height, width)
  masks = None
  if mask_xHxW is not None:
    mask = np.asarray(mask_xHxW)
    if mask.shape != depth.shape or mask.dtype != np.bool_:
      raise ValueError(f"depth_edge.mask: expected bool of shape {depth.shape}, got "
                       f"{mask.dtype} {mask.shape}")
    masks = mask.reshape(-1, height, width)
  edges = np.zeros(frames.shape, bool)
  radius = int(kernel_size) // 2
  with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
    for i, frame in enumerate(frames):
      if masks is None:
        high, low_negated = frame, -frame
      else:
        high = np.where(masks[i], frame, -np.inf)
        low_negated = np.where(masks[i], -frame, -np.inf)
      spread = _window_max(high, radius) + _window_max(low_negated, radius)
      if atol is not None:
        edges[i] |= spread > atol
      if rtol is not None:
        edges[i] |= np.nan_to_num(spread / frame) > rtol
  return edges.reshape(depth.shape)


def mahalanobis_distances(points_Mx3, squared: bool = True,
                          chunk: int = CHUNK_POINTS) -> np.ndarray:
  """Mahalanobis distances [M] (float64) of each point from the mean under the empirical
  (1/M) covariance's pseudo-inverse, squared by default (scikit-learn's convention, which
  Think3D thresholds)."""
  points = _floats("mahalanobis_distances", "points", points_Mx3, (None, 3))
  count = len(points)
  if count == 0:
    return np.zeros(0, np.float64)
  from scipy import linalg  # pylint: disable=import-outside-toplevel
  mean = np.zeros(3, np.float64)
  for start in range(0, count, chunk):
    mean += points[start:start + chunk].sum(0, dtype=np.float64)
  mean /= count
  covariance = np.zeros((3, 3), np.float64)
  for start in range(0, count, chunk):
    centred = points[start:start + chunk].astype(np.float64) - mean
    covariance += centred.T @ centred
  covariance /= count
  precision = linalg.pinvh(covariance, check_finite=False)
  distances = np.empty(count, np.float64)
  for start in range(0, count, chunk):
    centred = points[start:start + chunk].astype(np.float64) - mean
    distances[start:start + chunk] = np.einsum("ij,jk,ik->i", centred, precision, centred)
  np.maximum(distances, 0.0, out=distances)  # rounding can leave -0.0 / -1e-17
  return distances if squared else np.sqrt(distances)


def mahalanobis_inliers(points_Mx3, num_std: float = OUTLIER_STD, squared: bool = True,
                        chunk: int = CHUNK_POINTS) -> np.ndarray:
  """bool [M]: d < mean(d) + num_std * std(d) over the cloud's Mahalanobis distances."""
  distances = mahalanobis_distances(points_Mx3, squared, chunk)
  if len(distances) == 0:
    return np.zeros(0, bool)
  return distances < distances.mean() + num_std * distances.std()


def stride_indices(count: int, max_points: int | None) -> np.ndarray:
  """Think3D's cap: all of range(count) when it fits, else every (count // max_points)-th
  index from 0, the first max_points of them."""
  if max_points is None or count <= max_points:
    return np.arange(count)
  if max_points < 1:
    raise ValueError(f"stride_indices.max_points: expected >= 1, got {max_points}")
  return np.arange(0, count, count // max_points)[:max_points]


def finish(xyz_Mx3, rgb_Mx3, pixel_index_M, num_std: float | None = OUTLIER_STD,
           max_points: int | None = PI3_MAX_POINTS, squared: bool = True) -> Fused:
  """The common tail: drop non-finite points, Mahalanobis (num_std None: off), stride cap."""
  xyz = np.asarray(xyz_Mx3, np.float32)
  rgb = np.asarray(rgb_Mx3)
  index = np.asarray(pixel_index_M, np.int64)
  if xyz.ndim != 2 or xyz.shape[1] != 3 or rgb.shape != xyz.shape or index.shape != xyz.shape[:1]:
    raise ValueError(f"finish: expected xyz [M, 3], rgb [M, 3], pixel_index [M], got "
                     f"{xyz.shape}, {rgb.shape}, {index.shape}")
  _check_tail("finish", num_std, max_points)
  finite = np.isfinite(xyz).all(1)
  if not finite.all():
    xyz, rgb, index = xyz[finite], rgb[finite], index[finite]
  if num_std is not None and len(xyz) >= MIN_OUTLIER_POINTS:
    keep = mahalanobis_inliers(xyz, num_std, squared)
    xyz, rgb, index = xyz[keep], rgb[keep], index[keep]
  chosen = stride_indices(len(xyz), max_points)
  if len(chosen) < len(xyz):
    xyz, rgb, index = xyz[chosen], rgb[chosen], index[chosen]
  return Fused(xyz=np.ascontiguousarray(xyz), rgb=np.ascontiguousarray(rgb, np.uint8),
               pixel_index=index)


def _gather(points_NxHxWx3, images, keep_of_frame) -> tuple:
  """Per frame: the kept pixels' points, colours and flat indices, concatenated."""
  frames, height, width = points_NxHxWx3.shape[:3]
  xyz, rgb, index = [], [], []
  for i in range(frames):
    flat = np.flatnonzero(keep_of_frame(i))
    xyz.append(np.asarray(points_NxHxWx3[i].reshape(-1, 3)[flat], np.float32))
    rgb.append(images[i].reshape(-1, 3)[flat])
    index.append(flat.astype(np.int64) + i * height * width)
  if not frames:
    return np.zeros((0, 3), np.float32), np.zeros((0, 3), np.uint8), np.zeros(0, np.int64)
  return np.concatenate(xyz), np.concatenate(rgb), np.concatenate(index)


def sigmoid(x: np.ndarray) -> np.ndarray:
  """1 / (1 + exp(-x)) in the input's precision (exp overflow gives 0, not a warning)."""
  x = np.asarray(x)
  with np.errstate(over="ignore"):
    return 1.0 / (1.0 + np.exp(-x))


def fuse_pi3(points_NxHxWx3, local_points_NxHxWx3, conf_NxHxW, images_NxHxWx3, *,
             conf_threshold: float = PI3_CONF_THRESHOLD, rtol: float = PI3_EDGE_RTOL,
             num_std: float | None = OUTLIER_STD,
             max_points: int | None = PI3_MAX_POINTS) -> Fused:
  """Think3D's Pi3 fusion of one scene's outputs (batch axis removed).

  points / local_points: [N, H, W, 3] global and camera-frame points; conf: [N, H, W] or
  [N, H, W, 1] logits; images: [N, H, W, 3] uint8 RGB at the model's resolution."""
  where = "fuse_pi3"
  points = _floats(where, "points", points_NxHxWx3, (None, None, None, 3))
  frames_hw = points.shape[:3]
  local = _floats(where, "local_points", local_points_NxHxWx3, (*frames_hw, 3))
  conf = _confidence(where, "conf", conf_NxHxW, frames_hw)
  images = _images(where, images_NxHxWx3, frames_hw)
  if not 0 <= conf_threshold < 1:
    raise ValueError(f"{where}.conf_threshold: expected a probability in [0, 1), got "
                     f"{conf_threshold!r}")
  if not rtol > 0:
    raise ValueError(f"{where}.rtol: expected > 0, got {rtol!r}")
  _check_tail(where, num_std, max_points)

  def keep(i):
    # Pi3's conf is a logit; local z is the camera-frame depth the edge test reads.
    confident = sigmoid(conf[i].astype(np.float32)) > conf_threshold
    edge = depth_edge(local[i, ..., 2].astype(np.float32), rtol=rtol)
    return confident & ~edge

  return finish(*_gather(points, images, keep), num_std=num_std, max_points=max_points)


def fuse_vggt(world_points_SxHxWx3, world_points_conf_SxHxW, images_SxHxWx3, *,
              conf_percentile: float = VGGT_CONF_PERCENTILE, min_conf: float = VGGT_MIN_CONF,
              num_std: float | None = OUTLIER_STD,
              max_points: int | None = VGGT_MAX_POINTS) -> Fused:
  """Think3D's VGGT fusion (point-map branch): conf >= percentile(all conf, 50) and conf >
  1e-5, then the common tail. Arrays without the batch axis."""
  where = "fuse_vggt"
  points = _floats(where, "world_points", world_points_SxHxWx3, (None, None, None, 3))
  frames_hw = points.shape[:3]
  conf = _confidence(where, "world_points_conf", world_points_conf_SxHxW, frames_hw)
  images = _images(where, images_SxHxWx3, frames_hw)
  if not 0 <= conf_percentile <= 100:
    raise ValueError(f"{where}.conf_percentile: expected a percentile in [0, 100], got "
                     f"{conf_percentile!r}")
  _check_tail(where, num_std, max_points)
  threshold = np.percentile(conf, conf_percentile) if conf.size else 0.0
  return finish(*_gather(points, images, lambda i: (conf[i] >= threshold) & (conf[i] > min_conf)),
                num_std=num_std, max_points=max_points)


def da3_conf_threshold(conf, base: float = DA3_CONF_THRESHOLD,
                       percentiles: tuple[float, float] = DA3_CONF_PERCENTILES) -> float:
  """Depth-Anything-3's adaptive threshold: `base` clamped into [P_low, P_high] of conf."""
  conf = np.asarray(conf)
  low, high = np.percentile(conf, percentiles[0]), np.percentile(conf, percentiles[1])
  return float(min(max(base, low), high))


def fuse_depth(depth_NxHxW, intrinsics_Nx3x3, cameras_c2w_Nx4x4, images_NxHxWx3,
               conf_NxHxW=None, *, conf_threshold: float = DA3_CONF_THRESHOLD,
               conf_percentiles: tuple[float, float] | None = DA3_CONF_PERCENTILES,
               num_std: float | None = OUTLIER_STD,
               max_points: int | None = PI3_MAX_POINTS) -> Fused:
  """Per-view depth with cameras (Depth-Anything-3) fused by unprojection: depth finite and
  > 0, conf >= DA3's adaptive threshold (`conf_percentiles` None: `conf_threshold` as is;
  conf None: no confidence test), then the common tail."""
  where = "fuse_depth"
  depth = _floats(where, "depth", depth_NxHxW, (None, None, None))
  frames_hw = depth.shape
  frames = frames_hw[0]
  intrinsics = _floats(where, "intrinsics", intrinsics_Nx3x3, (frames, 3, 3))
  poses = _floats(where, "cameras_c2w", cameras_c2w_Nx4x4, (frames, 4, 4))
  images = _images(where, images_NxHxWx3, frames_hw)
  conf = None if conf_NxHxW is None else _confidence(where, "conf", conf_NxHxW, frames_hw)
  _check_tail(where, num_std, max_points)
  threshold = None
  if conf is not None:
    threshold = (conf_threshold if conf_percentiles is None
                 else da3_conf_threshold(conf, conf_threshold, conf_percentiles))
  xyz, rgb, index = [], [], []
  height, width = frames_hw[1:]
  with np.errstate(invalid="ignore"):
    for i in range(frames):
      keep = np.isfinite(depth[i]) & (depth[i] > 0)
      if conf is not None:
        keep &= conf[i] >= threshold
      flat = np.flatnonzero(keep)
      view = (np.asarray(a[i], np.float64) for a in (depth, intrinsics, poses))
      world = unproject_depth(*view).reshape(-1, 3)[flat]
      xyz.append(world.astype(np.float32))
      rgb.append(images[i].reshape(-1, 3)[flat])
      index.append(flat.astype(np.int64) + i * height * width)
  if not frames:
    return finish(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.uint8),
                  np.zeros(0, np.int64), num_std=num_std, max_points=max_points)
  return finish(np.concatenate(xyz), np.concatenate(rgb), np.concatenate(index),
                num_std=num_std, max_points=max_points)


# Boundary conversions of the models' cameras.

MIRROR_X = np.diag([-1.0, 1.0, 1.0, 1.0])


def rigid_inverse_np(pose_Nx4x4) -> np.ndarray:
  """[R t; 0 1]^-1 = [R^T, -R^T t; 0 1] (float64), for [..., 3, 4] or [..., 4, 4]."""
  pose = np.asarray(pose_Nx4x4, np.float64)
  rotation, translation = pose[..., :3, :3], pose[..., :3, 3]
  out = np.zeros(pose.shape[:-2] + (4, 4), np.float64)
  out[..., :3, :3] = np.swapaxes(rotation, -1, -2)
  out[..., :3, 3] = -np.einsum("...ji,...j->...i", rotation, translation)
  out[..., 3, 3] = 1.0
  return out


def quaternion_xyzw_to_matrix(quaternion_Nx4) -> np.ndarray:
  """Rotation matrices [..., 3, 3] of quaternions (x, y, z, w), scalar last as VGGT's
  pose encoding; they need not be unit (scaled by 2 / |q|^2)."""
  q = np.asarray(quaternion_Nx4, np.float64)
  x, y, z, w = np.moveaxis(q, -1, 0)
  s = 2.0 / (q * q).sum(-1)
  rows = [
      [1 - s * (y * y + z * z), s * (x * y - z * w), s * (x * z + y * w)],
      [s * (x * y + z * w), 1 - s * (x * x + z * z), s * (y * z - x * w)],
      [s * (x * z - y * w), s * (y * z + x * w), 1 - s * (x * x + y * y)],
  ]
  return np.stack([np.stack(row, -1) for row in rows], -2)


def vggt_cameras(pose_enc_Sx9, image_hw: tuple[int, int],
                 mirror_x: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """(cameras_c2w [S, 4, 4], intrinsics [S, 3, 3]) float32 from VGGT's pose encoding
  (absT_quaR_FoV: T, quaternion xyzw, fov_h, fov_w) at the model's input size (H, W).

  The encoding is world-to-camera ([R | T], OpenCV axes); we return its inverse. The
  intrinsics are VGGT's: fx = (W / 2) / tan(fov_w / 2), fy likewise, principal point
  (W / 2, H / 2). `mirror_x` reproduces the public Think3D code's flip of the cameras'
  x axis (conjugation by diag(-1, 1, 1), which commutes with the inversion) on correctly
  inverted poses; see `VGGTReconstructor` for why it is off by default."""
  encoding = _floats("vggt_cameras", "pose_enc", pose_enc_Sx9, (None, 9)).astype(np.float64)
  height, width = image_hw
  world_to_camera = np.zeros((len(encoding), 4, 4), np.float64)
  world_to_camera[:, :3, :3] = quaternion_xyzw_to_matrix(encoding[:, 3:7])
  world_to_camera[:, :3, 3] = encoding[:, :3]
  world_to_camera[:, 3, 3] = 1.0
  cameras = rigid_inverse_np(world_to_camera)
  if mirror_x:
    cameras = MIRROR_X @ cameras @ MIRROR_X
  intrinsics = np.zeros((len(encoding), 3, 3), np.float64)
  intrinsics[:, 0, 0] = (width / 2.0) / np.tan(encoding[:, 8] / 2.0)
  intrinsics[:, 1, 1] = (height / 2.0) / np.tan(encoding[:, 7] / 2.0)
  intrinsics[:, 0, 2] = width / 2.0
  intrinsics[:, 1, 2] = height / 2.0
  intrinsics[:, 2, 2] = 1.0
  return cameras.astype(np.float32), intrinsics.astype(np.float32)


def intrinsics_from_local_points(local_points_NxHxWx3) -> np.ndarray | None:
  """Pinhole intrinsics [N, 3, 3] fitted to camera-frame point maps (Pi3 predicts no
  intrinsics): per frame, least squares u = fx x / z + cx and v = fy y / z + cy over the
  pixels with z > 0 (integer pixel centres, as our cameras). None when a frame is
  degenerate (fewer than two distinct rays per axis, or a focal length <= 0)."""
  local = _floats("intrinsics_from_local_points", "local_points", local_points_NxHxWx3,
                  (None, None, None, 3))
  frames, height, width = local.shape[:3]
  u, v = np.meshgrid(np.arange(width, dtype=np.float64), np.arange(height, dtype=np.float64))
  out = np.zeros((frames, 3, 3), np.float32)
  for i in range(frames):
    points = local[i].astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
      good = np.isfinite(points).all(-1) & (points[..., 2] > 0)
      ray_x = (points[..., 0] / points[..., 2])[good]
      ray_y = (points[..., 1] / points[..., 2])[good]
    fits = []
    for ray, pixel in ((ray_x, u[good]), (ray_y, v[good])):
      centred = ray - ray.mean() if ray.size else ray
      spread = (centred * centred).sum()
      if ray.size < 2 or not spread > 0:
        return None
      focal = (centred * (pixel - pixel.mean())).sum() / spread
      fits.append((focal, pixel.mean() - focal * ray.mean()))
    (fx, cx), (fy, cy) = fits
    if not (fx > 0 and fy > 0):
      return None
    out[i] = [[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]]
  return out
