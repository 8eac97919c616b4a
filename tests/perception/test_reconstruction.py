"""Reconstruction adapters end to end on tiny random torch models with the real models'
interfaces (Pi3's forward, VGGT's forward, Depth-Anything-3's inference), whose geometry is a
known scene: preprocessing, fusion (against the references in test_fusion), cameras,
PointCloud, Think3D's cache file (data_pipelines.caches), the host function as a HostTool
under jit / vmap, loading errors, and the Open3D RGB-D backend (data_pipelines.reconstruct)."""

import ast
import pathlib
import sys
import types

import jax
import numpy as np
import pytest
import torch
from PIL import Image
from scipy.spatial.transform import Rotation

from data_pipelines.caches import read_think3d_cache, write_reconstruction_cache
from data_pipelines.reconstruct import RGBDReconstructor
from jaxspatial.geometry import Camera, bucket_size
from jaxspatial.perception import fusion, reconstruction
from jaxspatial.perception.host_tool import HostTool
from jaxspatial.perception.reconstruction import (DepthAnything3Reconstructor,
                                                  Pi3Reconstructor, VGGTReconstructor,
                                                  reconstruction_tool)
from tests.perception.test_fusion import (BOX_Z, WALL_Z, pixel_colours, ray_cast, ref_pi3,
                                          ref_vggt, scene_poses)

FLIP_X = np.diag([-1.0, 1.0, 1.0, 1.0])


def frames(height=25, width=38):
  """Two RGB frames: left half red, right half blue, with a gradient so resizing matters."""
  images = np.zeros((2, height, width, 3), np.uint8)
  images[:, :, : width // 2, 0] = 230
  images[:, :, width // 2:, 2] = 230
  images[..., 1] = (np.arange(width) * 255 // width)[None, None]
  images[1] = images[1] // 2 + 40
  return images


def cv2_lanczos_up(images, patch=14):
  import cv2
  height, width = images.shape[1:3]
  size = (-(-width // patch) * patch, -(-height // patch) * patch)
  return np.stack([cv2.resize(f, size, interpolation=cv2.INTER_LANCZOS4) for f in images])


def pinhole(height, width, focal_scale, centre):
  focal = focal_scale * width
  cx, cy = ((width - 1) / 2, (height - 1) / 2) if centre == "grid" else (width / 2, height / 2)
  return np.array([[focal, 0, cx], [0, focal, cy], [0, 0, 1]], np.float64)


class TinyPi3(torch.nn.Module):
  """Pi3's forward over the wall-and-box scene seen from `scene_poses`: geometry from the
  input's size, confidence logits from the input's first channel plus a random conv."""

  def __init__(self, seed=0):
    super().__init__()
    torch.manual_seed(seed)
    self.conf_head = torch.nn.Conv2d(3, 1, 3, padding=1)
    self.register_buffer("poses", torch.tensor(scene_poses(), dtype=torch.float32))

  def forward(self, imgs):
    batch, views, _, height, width = imgs.shape
    k = pinhole(height, width, 1.5, "grid")
    local, _ = ray_cast(self.poses.double().numpy(), k, height, width)
    local = torch.tensor(local, dtype=torch.float32)[None].expand(batch, -1, -1, -1, -1)
    homogeneous = torch.cat([local, torch.ones_like(local[..., :1])], -1)
    poses = self.poses[None].expand(batch, -1, -1, -1)
    points = torch.einsum("bnij,bnhwj->bnhwi", poses, homogeneous)[..., :3]
    flat = imgs.reshape(batch * views, 3, height, width)
    conf = 12.0 * (flat[:, :1] - 0.5) + 0.3 * self.conf_head(flat)
    return dict(points=points, local_points=local,
                conf=conf.reshape(batch, views, height, width, 1), camera_poses=poses)


def reference_pi3(model, images, channel_order="bgr"):
  resized = cv2_lanczos_up(images)
  order = resized[..., ::-1] if channel_order == "bgr" else resized
  imgs = torch.from_numpy(np.ascontiguousarray(order.transpose(0, 3, 1, 2))).float() / 255.0
  with torch.no_grad():
    out = {k: v[0].numpy() for k, v in model(imgs[None]).items()}
  return resized, out, ref_pi3(out["points"], out["local_points"], out["conf"], resized)



def install_pi3(monkeypatch, model_class) -> None:
  """A `pi3` package whose `pi3.models.pi3.Pi3` is `model_class` (the real package is the
  user's install; the adapter imports it by that path)."""
  fake = types.ModuleType("pi3.models.pi3")
  fake.Pi3 = model_class
  for name, module in (("pi3", types.ModuleType("pi3")),
                       ("pi3.models", types.ModuleType("pi3.models")), ("pi3.models.pi3", fake)):
    monkeypatch.setitem(sys.modules, name, module)

def test_pi3_end_to_end_as_think3d():
  model = TinyPi3()
  images = frames()
  recon = Pi3Reconstructor(model).reconstruct(images)
  resized, out, (xyz, rgb, index) = reference_pi3(model, images)
  assert resized.shape == (2, 28, 42, 3) and recon.image_size == (28, 42)  # ceil to 14
  np.testing.assert_array_equal(recon.pixel_index, index)
  np.testing.assert_array_equal(recon.xyz, xyz)
  np.testing.assert_array_equal(recon.rgb, rgb)
  assert recon.valid.all() and recon.num_points == len(xyz) > 500
  np.testing.assert_array_equal(recon.cameras_c2w, scene_poses().astype(np.float32))
  np.testing.assert_allclose(recon.intrinsics[0], pinhole(28, 42, 1.5, "grid"), rtol=1e-4,
                             atol=1e-3)
  # The BGR quirk reaches the model: its confidence reads channel 0, blue under BGR, so the
  # blue (right) half survives and the red half goes; RGB keeps the other half.
  columns = recon.pixel_index % 42
  assert columns.min() >= 19
  as_rgb = Pi3Reconstructor(model, channel_order="rgb").reconstruct(images)
  assert (as_rgb.pixel_index % 42).max() <= 22
  np.testing.assert_array_equal(as_rgb.xyz, reference_pi3(model, images, "rgb")[2][0])
  # Colours are the resized RGB frames, whatever the model saw.
  n, rest = np.divmod(recon.pixel_index, 28 * 42)
  np.testing.assert_array_equal(recon.rgb, resized[n, rest // 42, rest % 42])
  assert (recon.rgb[:, 2] > recon.rgb[:, 0]).all()


def test_pointcloud_cache_and_cameras_round_trip(tmp_path):
  recon = Pi3Reconstructor(TinyPi3()).reconstruct(frames())
  cloud = recon.to_pointcloud()
  assert cloud.num_points == 2048 and int(cloud.valid.sum()) == recon.num_points
  valid = np.asarray(cloud.valid)
  got = np.asarray(cloud.xyz)[valid]
  order = np.lexsort(got.T)
  expected_order = np.lexsort(recon.xyz.T)
  np.testing.assert_array_equal(got[order], recon.xyz[expected_order])
  np.testing.assert_array_equal(np.asarray(cloud.rgb)[valid][order], recon.rgb[expected_order])
  path = write_reconstruction_cache(tmp_path / "cache" / "scene.npz", recon, ["a.jpg", "b.jpg"])
  back, poses, paths = read_think3d_cache(path)
  np.testing.assert_array_equal(np.asarray(back.xyz), recon.xyz)
  np.testing.assert_array_equal(np.asarray(back.rgb), recon.rgb)  # /255 and back, exactly
  np.testing.assert_array_equal(poses, recon.cameras_c2w)
  assert paths == ["a.jpg", "b.jpg"]
  with np.load(path) as data:  # Think3D's keys and dtypes
    assert data["points"].dtype == np.float32 and data["colors"].max() <= 1.0
    assert data["camera_poses"].shape == (2, 4, 4)
  camera = recon.cameras()
  np.testing.assert_allclose(np.asarray(camera.world_from_camera), recon.cameras_c2w)
  np.testing.assert_allclose(np.asarray(camera.fx), recon.intrinsics[:, 0, 0])


def test_host_function_as_a_host_tool_under_jit_and_vmap():
  reconstructor = Pi3Reconstructor(TinyPi3())
  images = frames()
  recon = reconstructor.reconstruct(images)
  host = reconstructor.host_function(4096, sort=False)  # fusion order, to compare with recon
  out = host(images)
  assert out["points"].shape == (4096, 3) and out["colors"].dtype == np.uint8
  assert out["valid"].sum() == recon.num_points and out["cameras"].shape == (2, 4, 4)
  np.testing.assert_array_equal(out["points"][:recon.num_points], recon.xyz)
  assert not out["points"][recon.num_points:].any()
  # A padded scene: its first `count` frames are reconstructed, the last camera repeats.
  padded = host(np.concatenate([images, images[:1] * 0]), count=2)
  np.testing.assert_array_equal(padded["points"], out["points"])
  np.testing.assert_array_equal(padded["cameras"], out["cameras"][[0, 1, 1]])
  small = reconstructor.host_function(300, sort=False)(images)  # Think3D's stride rule
  chosen = fusion.stride_indices(recon.num_points, 300)
  np.testing.assert_array_equal(small["points"][:len(chosen)], recon.xyz[chosen])
  tool = reconstruction_tool(host, 4096, 2)
  assert isinstance(tool, HostTool)
  jitted = jax.jit(lambda im: tool(images=im))(images)
  for key in out:
    np.testing.assert_array_equal(np.asarray(jitted[key]), out[key])
  assert jitted["colors"].dtype == np.uint8 and not bool(jitted["failed"])
  batch = np.stack([images, images[::-1]])
  both = jax.jit(jax.vmap(lambda im: tool(images=im)))(batch)
  assert both["points"].shape == (2, 4096, 3) and both["cameras"].shape == (2, 2, 4, 4)
  np.testing.assert_array_equal(np.asarray(both["points"][0]), out["points"])
  np.testing.assert_array_equal(np.asarray(both["points"][1]), host(images[::-1])["points"])
  assert not np.asarray(both["failed"]).any()
  stats = tool.stats()  # one host call per batch: the jit call's row, then the vmap's two
  assert stats["tools/reconstruct/calls"] == 2 and stats["tools/reconstruct/rows"] == 3
  # Wrong frames are refused when traced, not flagged on the host.
  with pytest.raises(ValueError, match=r"'reconstruct'\.images: expected one scene's frames "
                                       r"\[2, H, W, 3\] \(vmap over scenes\), got \(2, 2, "):
    tool(images=batch)
  with pytest.raises(ValueError, match=r"'reconstruct'\.images: expected dtype uint8"):
    tool(images=images.astype(np.float32))
  with pytest.raises(ValueError, match=r"reconstruction_tool\.num_views: expected an integer"):
    reconstruction_tool(host, 4096, 0)


def test_a_failing_reconstructor_in_flag_mode_returns_failed_and_zeros():
  failing = Pi3Reconstructor(WrongPi3(nan_pose)).host_function(512)
  flagged = reconstruction_tool(failing, 512, 2, on_error="flag")
  batch = np.stack([frames(), frames()[::-1]])
  out = jax.jit(jax.vmap(lambda im: flagged(images=im)))(batch)
  assert np.asarray(out["failed"]).tolist() == [True, True]
  expected = reconstruction.host_outputs(512, 2)
  for key, (shape, dtype) in expected.items():
    value = np.asarray(out[key])
    assert value.shape == (2,) + shape and value.dtype == dtype and not value.any(), key
  assert flagged.stats()["tools/reconstruct/failures"] == 1
  assert "expected finite poses" in flagged.last_error
  raising = reconstruction_tool(failing, 512, 2, name="pi3")
  with pytest.raises(Exception, match=r"host tool 'pi3' failed after 1 attempt.*camera_poses: "
                                       r"expected finite poses"):
    jax.block_until_ready(jax.jit(lambda im: raising(images=im))(frames()))


def test_the_adapters_never_import_data_pipelines():
  """WORKSPACE's rule: the cache writer and the RGB-D backend live in data_pipelines."""
  for module in (reconstruction, fusion):
    tree = ast.parse(pathlib.Path(module.__file__).read_text())
    names = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names]
    names += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert not [n for n in names if n.split(".")[0] == "data_pipelines"], module.__name__


class TinyVGGT(torch.nn.Module):
  """VGGT's forward over the same scene: a world-to-camera pose encoding, point maps whose
  pixels project through VGGT's intrinsics (principal point (W / 2, H / 2)), expp1
  confidences from a random conv."""

  def __init__(self, seed=1):
    super().__init__()
    torch.manual_seed(seed)
    self.conf_head = torch.nn.Conv2d(3, 2, 3, padding=1)
    self.register_buffer("poses", torch.tensor(scene_poses(), dtype=torch.float64))

  def forward(self, images, query_points=None):
    if images.ndim == 4:
      images = images[None]
    batch, views, _, height, width = images.shape
    poses = self.poses.numpy()
    k = pinhole(height, width, 1.2, "vggt")
    local, _ = ray_cast(poses, k, height, width)
    world = np.einsum("nij,nhwj->nhwi", poses[:, :3, :3], local) + poses[:, None, None, :3, 3]
    w2c = np.linalg.inv(poses)
    fov_h, fov_w = 2 * np.arctan(height / 2 / k[1, 1]), 2 * np.arctan(width / 2 / k[0, 0])
    encoding = np.concatenate([w2c[:, :3, 3], Rotation.from_matrix(w2c[:, :3, :3]).as_quat(),
                               np.full((views, 1), fov_h), np.full((views, 1), fov_w)], 1)
    heads = self.conf_head(images.reshape(batch * views, 3, height, width))
    heads = 1.0 + torch.exp(heads.reshape(batch, views, 2, height, width))

    def batched(array):
      return torch.tensor(array, dtype=torch.float32)[None].expand(batch, *array.shape)

    return dict(pose_enc=batched(encoding), depth=batched(local[..., 2:]),
                depth_conf=heads[:, :, 0], world_points=batched(world),
                world_points_conf=heads[:, :, 1], images=images)


def test_vggt_end_to_end_with_camera_to_world_poses():
  model = TinyVGGT()
  images = frames()
  recon = VGGTReconstructor(model).reconstruct(images)
  resized = cv2_lanczos_up(images)  # RGB, as Think3D's VGGT server
  imgs = torch.from_numpy(np.ascontiguousarray(resized.transpose(0, 3, 1, 2))).float() / 255.0
  with torch.no_grad():
    out = model(imgs)
  xyz, rgb, index = ref_vggt(out["world_points"][0].numpy(), out["world_points_conf"][0].numpy(),
                             resized)
  np.testing.assert_array_equal(recon.pixel_index, index)
  np.testing.assert_array_equal(recon.xyz, xyz)
  np.testing.assert_array_equal(recon.rgb, rgb)
  assert 0.45 * 2 * 28 * 42 < len(xyz) < 0.55 * 2 * 28 * 42  # the median (with ties), outliers
  np.testing.assert_allclose(recon.cameras_c2w, scene_poses(), atol=1e-5)
  np.testing.assert_allclose(recon.intrinsics[1], pinhole(28, 42, 1.2, "vggt"), rtol=1e-5)

  def reprojection_error(cameras):
    n, rest = np.divmod(recon.pixel_index, 28 * 42)
    v, u = np.divmod(rest, 42)
    w2c = np.linalg.inv(cameras.astype(np.float64))[n]
    camera = np.einsum("nij,nj->ni", w2c[:, :3, :3], recon.xyz) + w2c[:, :3, 3]
    k = recon.intrinsics[n].astype(np.float64)
    pixels = np.einsum("nij,nj->ni", k, camera)
    return np.abs(pixels[:, :2] / pixels[:, 2:] - np.stack([u, v], 1)).max()

  assert reprojection_error(recon.cameras_c2w) < 1e-2  # each point projects to its pixel
  mirrored = VGGTReconstructor(model, mirror_x=True).reconstruct(images)
  np.testing.assert_allclose(mirrored.cameras_c2w, FLIP_X @ scene_poses() @ FLIP_X, atol=1e-5)
  assert reprojection_error(mirrored.cameras_c2w) > 1.0  # why the flip is off by default
  padded = VGGTReconstructor(model, preprocess="pad")
  inputs, colours = padded.preprocess(images)
  assert inputs.shape == (2, 3, 518, 518) and colours.shape == (2, 518, 518, 3)
  np.testing.assert_array_equal(colours, np.round(inputs.transpose(0, 2, 3, 1) * 255))


class TinyDA3(torch.nn.Module):
  """Depth-Anything-3's `inference`: resizes the frames (longest side process_res), returns
  depth, expp1 confidence, world-to-camera [N, 3, 4] extrinsics, intrinsics and the
  processed uint8 frames, over the same scene."""

  def __init__(self, seed=2):
    super().__init__()
    torch.manual_seed(seed)
    self.conf_head = torch.nn.Conv2d(3, 1, 3, padding=1)
    self.calls = []

  def inference(self, image, extrinsics=None, intrinsics=None, process_res=504,
                process_res_method="upper_bound_resize", **options):
    self.calls.append((len(image), process_res, process_res_method, options))
    height, width = image[0].shape[:2]
    scale = process_res / max(height, width)
    size = (round(width * scale), round(height * scale))
    processed = np.stack([np.asarray(Image.fromarray(f).resize(size, Image.Resampling.BILINEAR))
                          for f in image])
    h, w = processed.shape[1:3]
    poses = scene_poses()
    k = pinhole(h, w, 1.1, "grid")
    local, _ = ray_cast(poses, k, h, w)
    with torch.no_grad():
      x = torch.from_numpy(processed.transpose(0, 3, 1, 2).copy()).float() / 255.0
      conf = (1.0 + torch.exp(self.conf_head(x)[:, 0])).numpy()
    return types.SimpleNamespace(
        depth=local[..., 2].astype(np.float32), conf=conf, is_metric=0,
        extrinsics=np.linalg.inv(poses)[:, :3].astype(np.float32),
        intrinsics=np.stack([k] * len(image)).astype(np.float32), processed_images=processed)


def test_depth_anything_3_through_unprojection():
  model = TinyDA3()
  images = frames(30, 40)
  reconstructor = DepthAnything3Reconstructor(model, process_res=36,
                                              inference_options={"use_ray_pose": False})
  recon = reconstructor.reconstruct(images)
  assert model.calls[-1] == (2, 36, "upper_bound_resize", {"use_ray_pose": False})
  pred = model.inference(list(images), process_res=36)
  poses = np.linalg.inv(np.concatenate([pred.extrinsics, np.tile([[[0, 0, 0, 1]]], (2, 1, 1))], 1))
  fused = fusion.fuse_depth(pred.depth, pred.intrinsics, poses, pred.processed_images, pred.conf)
  np.testing.assert_array_equal(recon.pixel_index, fused.pixel_index)
  np.testing.assert_allclose(recon.xyz, fused.xyz, rtol=1e-6, atol=1e-6)
  assert recon.image_size == (27, 36) and recon.num_points > 300
  np.testing.assert_allclose(recon.cameras_c2w, scene_poses(), atol=1e-5)
  # Camera-to-world taken right: every point lands on the wall or the box face.
  z = recon.xyz[:, 2]
  assert np.minimum(np.abs(z - WALL_Z), np.abs(z - BOX_Z)).max() < 1e-4
  n, rest = np.divmod(recon.pixel_index, 27 * 36)
  np.testing.assert_array_equal(recon.rgb, pred.processed_images[n, rest // 36, rest % 36])
  threshold = min(max(1.05, np.percentile(pred.conf, 40)), np.percentile(pred.conf, 90))
  assert (pred.conf.reshape(-1)[recon.pixel_index] >= threshold).all()
  assert recon.num_points < 0.6 * 2 * 27 * 36  # DA3's rule dropped the least confident 40%
  # The entry point's cameras are at the 30 x 40 frames: the 27 x 36 resize undone (focal
  # 1.1 x 36 becomes 1.1 x 40 on both axes, the principal point the grid's centre).
  _, cameras = reconstruction.reconstruct(images, backend=reconstructor)
  np.testing.assert_allclose(np.asarray(cameras.fx), 44.0, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(cameras.fy), 44.0, rtol=1e-5)
  np.testing.assert_allclose([cameras.cx[0], cameras.cy[0]], [19.5, 14.5], atol=1e-4)
  # DA3's crop methods: the side to process_res, then a centre crop to multiples of 14.
  assert reconstruction.da3_layout(30, 40, 36, "upper_bound_crop") == (27, 36, -6, -4)
  assert reconstruction.da3_layout(30, 40, 28, "lower_bound_crop") == (28, 37, 0, -4)
  assert reconstruction.da3_layout(30, 40, 36, "upper_bound_resize") is None


def test_rgbd_backend_gives_the_same_output_type():
  pytest.importorskip("open3d")
  poses = scene_poses()
  k = pinhole(24, 32, 1.4, "grid")
  local, _ = ray_cast(poses, k, 24, 32)
  images = pixel_colours(2, 24, 32)
  cameras = Camera.from_matrices(np.stack([k, k]), poses)
  recon = RGBDReconstructor(voxel_size=0.05).reconstruct(images, local[..., 2].astype(np.float32),
                                                         cameras)
  assert recon.num_points > 100 and recon.pixel_index is None and recon.image_size == (24, 32)
  z = recon.xyz[:, 2]
  assert np.minimum(np.abs(z - WALL_Z), np.abs(z - BOX_Z)).max() < 0.05
  np.testing.assert_allclose(recon.cameras_c2w, poses, atol=1e-6)
  np.testing.assert_allclose(recon.intrinsics, np.stack([k, k]), rtol=1e-6)
  assert recon.to_pointcloud().num_points == bucket_size(recon.num_points)
  # Through the entry point: its keyword arrays reach the backend; the frames are the
  # depth's, so the cameras come back as given.
  cloud, back = reconstruction.reconstruct(images, backend=RGBDReconstructor(voxel_size=0.05),
                                           depths_NxHxW=local[..., 2].astype(np.float32),
                                           cameras=cameras)
  assert int(np.asarray(cloud.valid).sum()) == recon.num_points
  np.testing.assert_allclose(np.asarray(back.intrinsic_matrix), np.stack([k, k]), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(back.world_from_camera), poses, atol=1e-6)
  with pytest.raises(TypeError, match=r"RGBDReconstructor\.cameras: expected a Camera"):
    RGBDReconstructor().reconstruct(images, local[..., 2], poses)


@pytest.mark.parametrize("adapter, package, install", [
    (Pi3Reconstructor, "pi3", "pip install git+https://github.com/yyfz/Pi3.git"),
    (VGGTReconstructor, "vggt", "pip install git+https://github.com/facebookresearch/vggt.git"),
    (DepthAnything3Reconstructor, "depth_anything_3",
     "pip install git+https://github.com/ByteDance-Seed/Depth-Anything-3.git"),
])
def test_missing_packages_say_what_to_install(monkeypatch, adapter, package, install):
  monkeypatch.setitem(sys.modules, package, None)  # an import of it raises ImportError
  with pytest.raises(ImportError) as error:
    adapter.from_pretrained("/nonexistent/checkpoint")
  message = str(error.value)
  assert f"needs the `{package}` package" in message and install in message
  assert "Weights: huggingface.co/" in message


def test_from_pretrained_loads_a_local_checkpoint(monkeypatch, tmp_path):
  from safetensors.torch import save_file
  install_pi3(monkeypatch, TinyPi3)
  with pytest.raises(FileNotFoundError, match=r"checkpoint not found: .*missing\.safetensors "
                                              r"\(download huggingface\.co/yyfz233/Pi3"):
    Pi3Reconstructor.from_pretrained(tmp_path / "missing.safetensors")
  trained = TinyPi3(seed=7)
  save_file({k: v.contiguous() for k, v in trained.state_dict().items()},
            str(tmp_path / "model.safetensors"))
  loaded = Pi3Reconstructor.from_pretrained(tmp_path / "model.safetensors", channel_order="rgb")
  assert loaded.channel_order == "rgb" and not loaded.model.training
  torch.testing.assert_close(loaded.model.conf_head.weight, trained.conf_head.weight)
  (tmp_path / "weights.txt").write_text("x")
  with pytest.raises(ValueError, match=r"expected a folder or a \.safetensors"):
    Pi3Reconstructor.from_pretrained(tmp_path / "weights.txt")


class WrongPi3(TinyPi3):
  def __init__(self, change):
    super().__init__()
    self.change = change

  def forward(self, imgs):
    return self.change(super().forward(imgs))


def nan_pose(out):
  poses = out["camera_poses"].clone()
  poses[0, 1, 0, 0] = float("nan")
  return {**out, "camera_poses": poses}


class WrongVGGT(TinyVGGT):
  def forward(self, images, query_points=None):
    out = super().forward(images)
    return {**out, "world_points_conf": out["world_points_conf"][..., None]}


def test_bad_inputs_and_outputs_are_named():
  images = frames()
  good = Pi3Reconstructor(TinyPi3())
  with pytest.raises(ValueError, match=r"Pi3Reconstructor\.images: expected dtype uint8, got "
                                       r"float32"):
    good.reconstruct(images.astype(np.float32))
  with pytest.raises(ValueError, match=r"Pi3Reconstructor\.images: expected shape \[N, H, W, 3\]"):
    good.reconstruct(images[0])
  with pytest.raises(ValueError, match=r"channel_order: expected one of \('bgr', 'rgb'\), "
                                       r"got 'gbr'"):
    Pi3Reconstructor(TinyPi3(), channel_order="gbr")

  def squeeze_conf(out):
    return {**out, "conf": out["conf"][..., 0]}

  with pytest.raises(ValueError, match=r"Pi3 output\.conf: expected shape \(1, 2, 28, 42, 1\), "
                                       r"got \(1, 2, 28, 42\)"):
    Pi3Reconstructor(WrongPi3(squeeze_conf)).reconstruct(images)
  with pytest.raises(ValueError, match=r"Pi3 output: missing output\(s\) \['camera_poses'\]"):
    Pi3Reconstructor(WrongPi3(lambda o: {k: v for k, v in o.items()
                                         if k != "camera_poses"})).reconstruct(images)

  with pytest.raises(ValueError, match=r"camera_poses: expected finite poses, got non-finite "
                                       r"values in view\(s\) \[1\]"):
    Pi3Reconstructor(WrongPi3(nan_pose)).reconstruct(images)
  with pytest.raises(ValueError, match=r"VGGT output\.world_points_conf: expected shape "
                                       r"\(1, 2, 28, 42\), got \(1, 2, 28, 42, 1\)"):
    VGGTReconstructor(WrongVGGT()).reconstruct(images)

  class WrongDA3(TinyDA3):
    def inference(self, image, **options):
      pred = super().inference(image, **options)
      pred.processed_images = pred.processed_images.astype(np.float32)
      return pred

  with pytest.raises(ValueError, match=r"Depth-Anything-3 prediction\.processed_images: expected "
                                       r"dtype uint8, got float32"):
    DepthAnything3Reconstructor(WrongDA3(), process_res=28).reconstruct(images)
  with pytest.raises(ValueError, match=r"host_function\.num_points: expected an integer >= 1"):
    good.host_function(0)


class CountedPi3(TinyPi3):
  loads = 0

  def __init__(self, seed=0):
    super().__init__(seed)
    CountedPi3.loads += 1


def test_reconstruct_loads_a_backend_once_and_gives_cameras_at_the_frames_size(monkeypatch,
                                                                                 tmp_path):
  from safetensors.torch import save_file
  install_pi3(monkeypatch, CountedPi3)
  monkeypatch.setattr(reconstruction, "_LOADED", {})
  path = tmp_path / "model.safetensors"
  save_file({k: v.contiguous() for k, v in TinyPi3(seed=3).state_dict().items()}, str(path))
  images = frames()  # 25 x 38: Pi3 sees them at 28 x 42
  CountedPi3.loads = 0
  cloud, cameras = reconstruction.reconstruct(images, backend="pi3", checkpoint=path)
  again, _ = reconstruction.reconstruct(images, backend="pi3", checkpoint=str(path))
  assert CountedPi3.loads == 1  # cached per (backend, checkpoint): loaded once
  np.testing.assert_array_equal(np.asarray(again.xyz), np.asarray(cloud.xyz))
  _, _, (xyz, rgb, _) = reference_pi3(TinyPi3(seed=3), images)
  valid = np.asarray(cloud.valid)
  assert cloud.num_points == bucket_size(len(xyz)) and valid.sum() == len(xyz)
  got, order, expected = np.asarray(cloud.xyz)[valid], np.lexsort(xyz.T), np.lexsort(
      np.asarray(cloud.xyz)[valid].T)
  np.testing.assert_array_equal(got[expected], xyz[order])
  np.testing.assert_array_equal(np.asarray(cloud.rgb)[valid][expected], rgb[order])
  np.testing.assert_allclose(np.asarray(cameras.world_from_camera), scene_poses(), atol=1e-6)
  # The model's pinhole (focal 1.5 x 42, centre (20.5, 13.5)) resized back to 38 x 25 with
  # pixel areas aligned: focal x 38/42 and 25/28, the centre of the 38 x 25 grid.
  np.testing.assert_allclose(np.asarray(cameras.fx), 63 * 38 / 42, rtol=1e-4)
  np.testing.assert_allclose(np.asarray(cameras.fy), 63 * 25 / 28, rtol=1e-4)
  np.testing.assert_allclose(np.asarray(cameras.cx), 18.5, atol=1e-3)
  np.testing.assert_allclose(np.asarray(cameras.cy), 12.0, atol=1e-3)
  # Named errors, before any model is loaded.
  with pytest.raises(ValueError, match=r"reconstruct\.backend: expected one of \('pi3', "
                                       r"'vggt', 'da3'\) or an object .*got 'colmap'"):
    reconstruction.reconstruct(images, backend="colmap")
  with pytest.raises(ValueError, match=r"backend 'vggt' needs checkpoint="):
    reconstruction.reconstruct(images, backend="vggt")
  with pytest.raises(ValueError, match=r"reconstruct\.images: expected dtype uint8, got float32"):
    reconstruction.reconstruct(images.astype(np.float32), backend="pi3", checkpoint=path)
  with pytest.raises(ValueError, match=r"reconstruct\.images: expected shape \[N, H, W, 3\]"):
    reconstruction.reconstruct(images[0], backend="pi3", checkpoint=path)
  with pytest.raises(TypeError, match=r"or an object with a reconstruct\(frames\) method, got "
                                      r"int"):
    reconstruction.reconstruct(images, backend=3)
  with pytest.raises(ValueError, match=r"estimate_intrinsics=False gives no intrinsics"):
    reconstruction.reconstruct(images, backend="pi3", checkpoint=path, estimate_intrinsics=False)
  assert CountedPi3.loads == 1


def test_vggt_loader_layout_maps_pixels_as_its_preprocessing_does():
  """A dark block's centroid in VGGT's crop / pad input lands where `vggt_layout` puts it
  (pixel areas aligned), so intrinsics map back to the input frames through it."""
  from jaxspatial.perception.vggt import vggt_preprocess
  for (height, width), mode in (((40, 30), "crop"), ((30, 40), "pad"), ((40, 30), "pad"),
                                ((20, 60), "crop")):
    image = np.full((1, height, width, 3), 255, np.uint8)
    image[0, 12:17, 9:14] = 0  # centroid (14, 11)
    dark = 1.0 - vggt_preprocess(image, mode)[0, 0]
    rows, cols = np.mgrid[:dark.shape[0], :dark.shape[1]]
    weight = np.where(dark > 0.5, dark, 0.0)
    centre = [(rows * weight).sum() / weight.sum(), (cols * weight).sum() / weight.sum()]
    resized_h, resized_w, top, left = reconstruction.vggt_layout(height, width, mode)
    expected = [(14 + 0.5) * resized_h / height - 0.5 + top,
                (11 + 0.5) * resized_w / width - 0.5 + left]
    np.testing.assert_allclose(centre, expected, atol=0.6, err_msg=f"{mode} {height}x{width}")
    k = np.array([[[500.0, 0, expected[1]], [0, 400.0, expected[0]], [0, 0, 1]]])
    back = reconstruction.frame_intrinsics(k, (height, width),
                                           (resized_h, resized_w, top, left))[0]
    np.testing.assert_allclose([back[1, 2], back[0, 2]], [14, 11], atol=1e-4)
    np.testing.assert_allclose([back[0, 0], back[1, 1]],
                               [500 * width / resized_w, 400 * height / resized_h], rtol=1e-6)
