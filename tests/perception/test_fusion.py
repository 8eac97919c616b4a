"""Think3D's fusion rules against numpy references written here from think3d.md section 3
(and Pi3's public `depth_edge` definition), on a scene of known geometry: a wall and a box
face seen by two cameras, with depth edges at the box's outline, a low-confidence patch, a
NaN point and far outliers planted for the Mahalanobis rule."""

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from jaxspatial.perception import fusion

H, W, FOCAL = 24, 32, 60.0
WALL_Z, BOX_Z = 5.0, 3.0
BOX = (-0.45, 0.45, -0.35, 0.35)  # x0, x1, y0, y1 of the box face in world metres


# ---- references, written from the text -------------------------------------------------

def ref_depth_edge(depth_NxHxW, rtol, kernel=3):
  """An edge: (max - min) of the depth over the in-image k x k window, over the pixel's own
  depth, above rtol (0 / 0 is no edge, x / 0 with x > 0 is one)."""
  r = kernel // 2
  out = np.zeros(depth_NxHxW.shape, bool)
  for n, v, u in np.ndindex(*depth_NxHxW.shape):
    window = depth_NxHxW[n, max(0, v - r):v + r + 1, max(0, u - r):u + r + 1]
    spread, own = window.max() - window.min(), depth_NxHxW[n, v, u]
    ratio = (np.inf if spread > 0 else 0.0) if own == 0 else spread / own
    out[n, v, u] = ratio > rtol
  return out


def ref_mahalanobis_keep(points, num_std=3.0):
  """Squared Mahalanobis distance under the empirical covariance (scikit-learn's
  EmpiricalCovariance.mahalanobis, which the public code calls, returns squares): keep
  d < mean(d) + num_std * std(d)."""
  x = points.astype(np.float64)
  centred = x - x.mean(0)
  precision = np.linalg.pinv(np.cov(x.T, bias=True))
  d = np.array([c @ precision @ c for c in centred])
  return d < d.mean() + num_std * d.std()


def ref_stride(count, cap):
  """Every (count // cap)-th point from the first, at most cap of them."""
  if count <= cap:
    return np.arange(count)
  return np.array(list(range(0, count, count // cap))[:cap])


def ref_tail(xyz, rgb, index, cap, num_std=3.0):
  finite = np.isfinite(xyz).all(1)
  xyz, rgb, index = xyz[finite], rgb[finite], index[finite]
  if len(xyz) > 10:
    keep = ref_mahalanobis_keep(xyz, num_std)
    xyz, rgb, index = xyz[keep], rgb[keep], index[keep]
  chosen = ref_stride(len(xyz), cap)
  return xyz[chosen], rgb[chosen], index[chosen]


def ref_pi3(points, local_points, conf, images, threshold=0.06, rtol=0.02, cap=1_500_000):
  """Pi3: sigmoid(conf) > threshold and not a depth edge of the local depth; global points
  under the mask (row-major over frame, row, column), colours from the RGB frames."""
  conf = conf[..., 0] if conf.ndim == 4 else conf
  mask = (1.0 / (1.0 + np.exp(-conf.astype(np.float64))) > threshold)
  mask &= ~ref_depth_edge(local_points[..., 2], rtol)
  index = np.flatnonzero(mask.reshape(-1))
  return ref_tail(points.reshape(-1, 3)[index], images.reshape(-1, 3)[index], index, cap)


def ref_vggt(world_points, conf, images, percentile=50.0, cap=500_000):
  """VGGT: conf >= the percentile of every confidence and conf > 1e-5."""
  mask = (conf >= np.percentile(conf.reshape(-1), percentile)) & (conf > 1e-5)
  index = np.flatnonzero(mask.reshape(-1))
  return ref_tail(world_points.reshape(-1, 3)[index], images.reshape(-1, 3)[index], index, cap)


# ---- the scene ---------------------------------------------------------------------------

def intrinsic(height=H, width=W, focal=FOCAL, centre=None):
  cx, cy = ((width - 1) / 2, (height - 1) / 2) if centre is None else centre
  return np.array([[focal, 0, cx], [0, focal, cy], [0, 0, 1]], np.float64)


def scene_poses():
  """Camera 0 at the origin looking +z; camera 1 moved right, turned 8 degrees left."""
  second = np.eye(4)
  second[:3, :3] = Rotation.from_euler("y", -8, degrees=True).as_matrix()
  second[:3, 3] = [0.6, 0.1, 0.2]
  return np.stack([np.eye(4), second])


def ray_cast(poses, k, height, width):
  """Camera-frame points [N, H, W, 3] and a box mask of a wall z = 5 with a box face z = 3."""
  u, v = np.meshgrid(np.arange(width, dtype=np.float64), np.arange(height, dtype=np.float64))
  rays = np.stack([(u - k[0, 2]) / k[0, 0], (v - k[1, 2]) / k[1, 1], np.ones_like(u)], -1)
  local, on_box = [], []
  for pose in poses:
    direction = rays @ pose[:3, :3].T
    t_box = (BOX_Z - pose[2, 3]) / direction[..., 2]
    hit = pose[:3, 3] + t_box[..., None] * direction
    box = ((hit[..., 0] >= BOX[0]) & (hit[..., 0] <= BOX[1]) & (hit[..., 1] >= BOX[2])
           & (hit[..., 1] <= BOX[3]))
    t = np.where(box, t_box, (WALL_Z - pose[2, 3]) / direction[..., 2])
    local.append(rays * t[..., None])  # camera-frame rays have z = 1, so z = t
    on_box.append(box)
  return np.stack(local), np.stack(on_box)


def to_world(local, poses):
  return np.einsum("nij,nhwj->nhwi", poses[:, :3, :3], local) + poses[:, None, None, :3, 3]


def pixel_colours(frames, height, width):
  """A colour per pixel that names it: (frame * 80 + row * 3, column * 7, 255 - row * 5)."""
  n, v, u = np.meshgrid(np.arange(frames), np.arange(height), np.arange(width), indexing="ij")
  return np.stack([n * 80 + v * 3, u * 7, 255 - v * 5], -1).astype(np.uint8)


OUTLIERS = [(1, 4, 25), (1, 20, 27), (0, 21, 2), (1, 12, 29)]
NAN_PIXEL = (0, 18, 28)
LOW_CONF = (slice(0, 1), slice(2, 7), slice(3, 10))  # frame 0, rows 2-6, columns 3-9


def pi3_scene():
  poses = scene_poses()
  local, on_box = ray_cast(poses, intrinsic(), H, W)
  points = to_world(local, poses).astype(np.float32)
  conf = np.full((2, H, W, 1), 3.0, np.float32)
  conf[LOW_CONF] = -4.0
  # Either side of the threshold, on the probability (not the logit): 0.061 kept, 0.059 not.
  conf[1, 22, 10, 0] = np.log(0.061 / 0.939)
  conf[1, 22, 11, 0] = np.log(0.059 / 0.941)
  for i, (n, v, u) in enumerate(OUTLIERS):  # far away, but their local depth is smooth
    points[n, v, u] = [300.0 + 40 * i, -250.0, 900.0 - 100 * i]
  points[NAN_PIXEL] = np.nan
  return dict(points=points, local_points=local.astype(np.float32), conf=conf,
              images=pixel_colours(2, H, W), on_box=on_box, poses=poses)


def flat(n, v, u, height=H, width=W):
  return n * height * width + v * width + u


# ---- tests -----------------------------------------------------------------------------

def test_depth_edge_matches_the_definition_and_the_box_outline():
  scene = pi3_scene()
  depth = scene["local_points"][..., 2]
  edges = fusion.depth_edge(depth, rtol=0.02)
  np.testing.assert_array_equal(edges, ref_depth_edge(depth, 0.02))
  # The 2 m step at the box's outline is an edge on both sides of it; the slanted wall and
  # face (under 1% over a window) are not: edges are exactly the windows that mix the two.
  box = scene["on_box"].astype(np.float32)
  window_max = np.stack([fusion._window_max(b, 1) for b in box])
  window_min = -np.stack([fusion._window_max(-b, 1) for b in box])
  np.testing.assert_array_equal(edges, window_max != window_min)
  assert 100 < edges.sum() < 400  # the outline's two sides, two views
  # atol, a mask, other kernels, zero depth.
  np.testing.assert_array_equal(fusion.depth_edge(depth, atol=1.0), window_max != window_min)
  assert not fusion.depth_edge(depth, atol=1.0, mask_xHxW=scene["on_box"]).any()
  np.testing.assert_array_equal(fusion.depth_edge(depth, rtol=0.02, kernel_size=5),
                                ref_depth_edge(depth, 0.02, kernel=5))
  # Relative to the pixel's own depth: a 2.03% step is an edge on its near side only; the
  # same 0.0203 at 10 m is no edge at all.
  step = np.ones((2, 3, 6), np.float32)
  step[:, :, 3:] = 1.0203
  step[1] += 9.0
  got = fusion.depth_edge(step, rtol=0.02)
  np.testing.assert_array_equal(got, ref_depth_edge(step, 0.02))
  np.testing.assert_array_equal(got[0], np.tile([False, False, True, False, False, False], (3, 1)))
  assert not got[1].any()
  zeros = np.zeros((1, 4, 5), np.float32)
  zeros[0, 1, 1] = 2.0
  np.testing.assert_array_equal(fusion.depth_edge(zeros, rtol=0.02), ref_depth_edge(zeros, 0.02))
  assert fusion.depth_edge(zeros, rtol=0.02)[0, 0, 0] and not fusion.depth_edge(
      zeros, rtol=0.02)[0, 3, 4]


def test_pi3_fusion_keeps_exactly_what_think3d_keeps():
  scene = pi3_scene()
  fused = fusion.fuse_pi3(scene["points"], scene["local_points"], scene["conf"], scene["images"])
  xyz, rgb, index = ref_pi3(scene["points"], scene["local_points"], scene["conf"],
                            scene["images"])
  np.testing.assert_array_equal(fused.pixel_index, index)
  np.testing.assert_array_equal(fused.xyz, xyz)
  np.testing.assert_array_equal(fused.rgb, rgb)
  assert fused.xyz.dtype == np.float32 and fused.rgb.dtype == np.uint8
  # What went, and why: every pixel is kept but for the four causes.
  edges = ref_depth_edge(scene["local_points"][..., 2], 0.02)
  dropped = edges.copy()
  dropped[LOW_CONF] = True
  dropped[1, 22, 11] = True  # 0.059 < 0.06; its neighbour at 0.061 stays
  dropped[NAN_PIXEL] = True
  for pixel in OUTLIERS:
    assert not edges[pixel]  # only the Mahalanobis rule can remove them
    dropped[pixel] = True
  np.testing.assert_array_equal(np.sort(fused.pixel_index), np.flatnonzero(~dropped.reshape(-1)))
  assert flat(1, 22, 10) in fused.pixel_index
  # Colours and points are the pixels' own.
  n, rest = np.divmod(fused.pixel_index, H * W)
  v, u = np.divmod(rest, W)
  np.testing.assert_array_equal(fused.rgb, scene["images"][n, v, u])
  np.testing.assert_array_equal(fused.xyz, scene["points"][n, v, u])
  # Without the outlier rule the far points come through (the NaN never does).
  kept = fusion.fuse_pi3(scene["points"], scene["local_points"], scene["conf"],
                         scene["images"], num_std=None)
  assert {flat(*p) for p in OUTLIERS} <= set(kept.pixel_index.tolist())
  assert flat(*NAN_PIXEL) not in kept.pixel_index
  # The server's 0.08 drops the 0.061 pixel too.
  strict = fusion.fuse_pi3(scene["points"], scene["local_points"], scene["conf"],
                           scene["images"], conf_threshold=0.08)
  assert flat(1, 22, 10) not in strict.pixel_index


def test_mahalanobis_uses_squared_distances_as_the_public_code():
  rng = np.random.default_rng(3)
  points = (rng.normal(size=(3000, 3)) * [1.0, 2.0, 0.5] @ Rotation.random(
      random_state=4).as_matrix().T + [4, -2, 7]).astype(np.float32)
  keep = fusion.mahalanobis_inliers(points)
  np.testing.assert_array_equal(keep, ref_mahalanobis_keep(points))
  # On a Gaussian cloud the squared rule cuts near 3.2 sigma, the plain one near 3.6: they
  # differ, so this pins the squared one.
  plain = fusion.mahalanobis_inliers(points, squared=False)
  assert plain.sum() > keep.sum()
  centred = points.astype(np.float64) - points.mean(0, dtype=np.float64)
  expected = np.einsum("ij,jk,ik->i", centred, np.linalg.inv(np.cov(centred.T, bias=True)),
                       centred)
  np.testing.assert_allclose(fusion.mahalanobis_distances(points, chunk=700), expected,
                             rtol=1e-9)
  # A flat cloud (singular covariance) still works through the pseudo-inverse.
  planar = points.copy()
  planar[:, 2] = 1.0
  np.testing.assert_array_equal(fusion.mahalanobis_inliers(planar), ref_mahalanobis_keep(planar))
  # Ten points or fewer: no outlier removal (the offline cache's rule).
  few = fusion.finish(points[:10], np.zeros((10, 3), np.uint8), np.arange(10))
  assert len(few.xyz) == 10


def test_the_stride_cap_on_a_large_cloud():
  rng = np.random.default_rng(0)
  count = 3_000_001
  xyz = rng.random((count, 3), dtype=np.float32)
  rgb = np.zeros((count, 3), np.uint8)
  fused = fusion.finish(xyz, rgb, np.arange(count), num_std=None, max_points=1_500_000)
  assert len(fused.xyz) == 1_500_000
  np.testing.assert_array_equal(fused.pixel_index, np.arange(0, 3_000_000, 2))  # step 2
  np.testing.assert_array_equal(fused.xyz, xyz[:3_000_000:2])
  np.testing.assert_array_equal(fusion.stride_indices(count, 1_500_000),
                                ref_stride(count, 1_500_000))
  # Just over the cap: step 1, so the last point goes (Think3D's rule favours the first views).
  np.testing.assert_array_equal(fusion.stride_indices(1_500_001, 1_500_000),
                                np.arange(1_500_000))
  np.testing.assert_array_equal(fusion.stride_indices(10, 3), [0, 3, 6])
  assert len(fusion.stride_indices(999, None)) == 999


def test_vggt_fusion_percentile_and_floor():
  rng = np.random.default_rng(1)
  poses = scene_poses()
  local, _ = ray_cast(poses, intrinsic(), H, W)
  world = to_world(local, poses).astype(np.float32)
  conf = (1.0 + np.exp(rng.normal(size=(2, H, W)))).astype(np.float32)
  conf[0, :4] = 0.0          # below the 1e-5 floor, counted in the percentile
  conf[1, 10:14, 5:20] = 2.5  # ties at the threshold are kept (>=)
  images = pixel_colours(2, H, W)
  fused = fusion.fuse_vggt(world, conf, images)
  xyz, rgb, index = ref_vggt(world, conf, images)
  np.testing.assert_array_equal(fused.pixel_index, index)
  np.testing.assert_array_equal(fused.xyz, xyz)
  np.testing.assert_array_equal(fused.rgb, rgb)
  # All-equal confidences: the percentile equals them and everything stays.
  same = fusion.fuse_vggt(world, np.full((2, H, W), 2.0, np.float32), images, num_std=None)
  assert len(same.xyz) == 2 * H * W


def test_depth_fusion_unprojects_with_da3s_threshold():
  rng = np.random.default_rng(2)
  poses = scene_poses()
  k = intrinsic()
  local, on_box = ray_cast(poses, k, H, W)
  depth = local[..., 2].astype(np.float32)
  depth[0, 3, 3], depth[1, 5, 6] = 0.0, np.nan
  conf = (1.0 + np.exp(rng.normal(size=(2, H, W)))).astype(np.float32)
  images = pixel_colours(2, H, W)
  intrinsics = np.stack([k, k]).astype(np.float32)
  fused = fusion.fuse_depth(depth, intrinsics, poses, images, conf)
  threshold = min(max(1.05, np.percentile(conf, 40)), np.percentile(conf, 90))
  mask = (conf >= threshold) & (depth > 0) & np.isfinite(depth)
  index = np.flatnonzero(mask.reshape(-1))
  world = []
  for i in index:  # one pixel at a time: K^-1 (u, v, 1) depth, then camera-to-world
    n, v, u = np.unravel_index(i, depth.shape)
    camera = np.linalg.inv(intrinsics[n].astype(np.float64)) @ [u, v, 1.0] * depth[n, v, u]
    world.append(poses[n, :3, :3] @ camera + poses[n, :3, 3])
  xyz, rgb, index = ref_tail(np.array(world, np.float32), images.reshape(-1, 3)[index], index,
                             1_500_000)
  np.testing.assert_array_equal(fused.pixel_index, index)
  np.testing.assert_allclose(fused.xyz, xyz, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(fused.rgb, rgb)
  # The points land on the scene: box face at z = 3, wall at z = 5.
  n, rest = np.divmod(fused.pixel_index, H * W)
  v, u = np.divmod(rest, W)
  np.testing.assert_allclose(fused.xyz[:, 2], np.where(on_box[n, v, u], BOX_Z, WALL_Z), atol=1e-5)


def test_vggt_cameras_invert_the_world_to_camera_encoding():
  poses = scene_poses()
  poses[0, :3, :3] = Rotation.from_euler("xyz", [5, -20, 3], degrees=True).as_matrix()
  poses[0, :3, 3] = [1.0, -0.5, 2.0]
  height, width, fx, fy = 28, 42, 50.0, 47.0
  w2c = np.linalg.inv(poses)
  quat = Rotation.from_matrix(w2c[:, :3, :3]).as_quat()  # x, y, z, w
  fov_h, fov_w = 2 * np.arctan(height / 2 / fy), 2 * np.arctan(width / 2 / fx)
  encoding = np.concatenate([w2c[:, :3, 3], quat * 1.7,  # unnormalised, as a network's
                             np.full((2, 1), fov_h), np.full((2, 1), fov_w)], 1)
  cameras, intrinsics = fusion.vggt_cameras(encoding.astype(np.float32), (height, width))
  np.testing.assert_allclose(cameras, poses, atol=2e-6)
  np.testing.assert_allclose(cameras[:, :3, 3], poses[:, :3, 3], atol=2e-6)  # the centres,
  assert not np.allclose(cameras[:, :3, 3], w2c[:, :3, 3], atol=1e-2)       # not T
  np.testing.assert_allclose(intrinsics[0], [[fx, 0, width / 2], [0, fy, height / 2], [0, 0, 1]],
                             rtol=1e-5)
  mirrored, _ = fusion.vggt_cameras(encoding, (height, width), mirror_x=True)
  flip = np.diag([-1.0, 1, 1, 1])
  np.testing.assert_allclose(mirrored, flip @ poses @ flip, atol=2e-6)
  np.testing.assert_allclose(np.linalg.det(mirrored[:, :3, :3]), 1.0, atol=1e-5)


def test_intrinsics_fit_recovers_the_pinhole():
  k = intrinsic(centre=(15.2, 11.7))
  local, _ = ray_cast(scene_poses(), k, H, W)
  fitted = fusion.intrinsics_from_local_points(local.astype(np.float32))
  np.testing.assert_allclose(fitted, np.stack([k, k]), rtol=1e-4, atol=1e-3)
  assert fusion.intrinsics_from_local_points(np.ones((1, 4, 4, 3), np.float32)) is None


def test_bad_inputs_name_the_array():
  scene = pi3_scene()
  args = (scene["points"], scene["local_points"], scene["conf"], scene["images"])
  with pytest.raises(ValueError, match=r"fuse_pi3\.conf: expected shape \(2, 24, 32\) or "
                                       r"\(2, 24, 32, 1\), got \(2, 24, 31\)"):
    fusion.fuse_pi3(*args[:2], scene["conf"][:, :, :31, 0], args[3])
  with pytest.raises(ValueError, match=r"fuse_pi3\.local_points: expected shape \(2, 24, 32, 3\)"):
    fusion.fuse_pi3(args[0], args[1][:1], *args[2:])
  with pytest.raises(ValueError, match=r"fuse_pi3\.images: expected dtype uint8, got float32"):
    fusion.fuse_pi3(*args[:3], args[3].astype(np.float32))
  with pytest.raises(ValueError, match=r"fuse_pi3\.points: expected a float dtype, got int64"):
    fusion.fuse_pi3(np.nan_to_num(args[0]).astype(np.int64), *args[1:])
  with pytest.raises(ValueError, match=r"fuse_pi3\.conf_threshold"):
    fusion.fuse_pi3(*args, conf_threshold=1.5)
  with pytest.raises(ValueError, match=r"fuse_pi3\.max_points: expected an integer >= 1"):
    fusion.fuse_pi3(*args, max_points=0)
  with pytest.raises(ValueError, match=r"fuse_vggt\.world_points_conf: expected shape"):
    fusion.fuse_vggt(args[0], np.ones((2, H, W, 2), np.float32), args[3])
  with pytest.raises(ValueError, match=r"fuse_depth\.cameras_c2w: expected shape \(2, 4, 4\), "
                                       r"got \(2, 3, 4\)"):
    fusion.fuse_depth(args[1][..., 2], np.stack([np.eye(3)] * 2), np.zeros((2, 3, 4)), args[3])
  with pytest.raises(ValueError, match=r"depth_edge\.kernel_size: expected an odd integer"):
    fusion.depth_edge(args[1][..., 2], rtol=0.02, kernel_size=4)
  with pytest.raises(ValueError, match=r"vggt_cameras\.pose_enc: expected shape \(\?, 9\), "
                                       r"got \(2, 7\)"):
    fusion.vggt_cameras(np.zeros((2, 7), np.float32), (28, 28))
