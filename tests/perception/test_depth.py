"""Depth Anything through transformers: a tiny random model and its DPT image processor saved
and loaded back by DepthBackend.from_pretrained, against transformers' own preprocessing and
post-processing; points_from_depth against a numpy pinhole unprojection of a known plane."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from jaxspatial.perception import depth as dp

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _save_tiny(folder, kind="relative"):
  from transformers import (DepthAnythingConfig, DepthAnythingForDepthEstimation, Dinov2Config,
                            DPTImageProcessorPil)
  backbone = Dinov2Config(image_size=56, patch_size=14, hidden_size=32, num_hidden_layers=4,
                          num_attention_heads=2, intermediate_size=64, out_indices=[1, 2, 3, 4],
                          reshape_hidden_states=False)
  config = DepthAnythingConfig(backbone_config=backbone, patch_size=14,
                               reassemble_hidden_size=32, neck_hidden_sizes=[8, 16, 32, 64],
                               fusion_hidden_size=16, head_hidden_size=8,
                               depth_estimation_type=kind, max_depth=20)
  torch.manual_seed(0)
  model = DepthAnythingForDepthEstimation(config).eval()
  generator = torch.Generator().manual_seed(1)
  with torch.no_grad():  # initialised weights give a flat 0 map behind the ReLU
    for param in model.parameters():
      if param.ndim >= 2:
        param.add_(torch.randn(param.shape, generator=generator) * 0.1)
    model.head.conv3.bias.fill_(0.5)
  model.save_pretrained(folder)
  # Depth Anything's published preprocessing, at the tiny model's size.
  DPTImageProcessorPil(size={"height": 56, "width": 56}, keep_aspect_ratio=True,
                       ensure_multiple_of=14, resample=3, do_pad=False,
                       image_mean=[0.485, 0.456, 0.406],
                       image_std=[0.229, 0.224, 0.225]).save_pretrained(folder)
  return folder


@pytest.fixture(scope="module")
def depth_folder(tmp_path_factory):
  return _save_tiny(tmp_path_factory.mktemp("depth"))


@pytest.fixture(scope="module")
def backend(depth_folder):
  return dp.DepthBackend.from_pretrained(depth_folder)


def _reference(folder, images):
  """transformers end to end: AutoImageProcessor on PIL images, the model,
  post_process_depth_estimation to each image's size."""
  from PIL import Image
  from transformers import AutoImageProcessor, DepthAnythingForDepthEstimation
  processor = AutoImageProcessor.from_pretrained(folder)
  model = DepthAnythingForDepthEstimation.from_pretrained(folder).eval()
  out = []
  for image in images:
    inputs = processor(images=Image.fromarray(image), return_tensors="pt")
    with torch.no_grad():
      predicted = model(**inputs)
    post = processor.post_process_depth_estimation(predicted, target_sizes=[image.shape[:2]])
    out.append(post[0]["predicted_depth"].clamp(min=0).numpy())
  return np.stack(out)


def test_depth_matches_transformers_and_keeps_the_input_size(backend, depth_folder):
  images = np.random.default_rng(0).integers(0, 256, (2, 40, 70, 3), np.uint8)
  depth = backend.depth(images)
  assert depth.shape == (2, 40, 70) and depth.dtype == np.float32
  assert depth.std() > 0 and (depth >= 0).all()
  np.testing.assert_allclose(depth, _reference(depth_folder, images), rtol=1e-4, atol=1e-5)
  assert backend.kind == "relative" and not backend.metric and backend.max_depth is None
  assert "inverse depth" in dp.KINDS[backend.kind]
  # Three rows: the processor must not read them as channels (PIL's reference cannot).
  thin = np.random.default_rng(1).integers(0, 256, (1, 3, 20, 3), np.uint8)
  np.testing.assert_allclose(backend.depth(thin), _reference(depth_folder, thin), rtol=1e-4,
                             atol=1e-5)
  # Thinner still, the processor's 14-multiple height rounds to 0: said with the size.
  with pytest.raises(ValueError, match="cannot resize images of 3 x 40"):
    backend.depth(np.zeros((1, 3, 40, 3), np.uint8))


def test_metric_folders_say_so(tmp_path):
  metric = dp.DepthBackend.from_pretrained(_save_tiny(tmp_path / "metric", kind="metric"))
  assert metric.kind == "metric" and metric.metric and metric.max_depth == 20.0
  depth = metric.depth(np.zeros((1, 28, 28, 3), np.uint8))
  assert (depth >= 0).all() and (depth <= 20.0 + 1e-3).all()  # sigmoid * max_depth


def test_from_pretrained_names_the_folder_and_what_is_missing(depth_folder, tmp_path):
  with pytest.raises(FileNotFoundError, match="is not a folder"):
    dp.DepthBackend.from_pretrained(tmp_path / "nowhere")
  partial = tmp_path / "partial"
  shutil.copytree(depth_folder, partial)
  os.remove(partial / "preprocessor_config.json")
  with pytest.raises(FileNotFoundError) as e:
    dp.DepthBackend.from_pretrained(partial)
  assert str(partial) in str(e.value) and "image processor settings" in str(e.value)
  shutil.copy(depth_folder / "preprocessor_config.json", partial)
  config = json.loads((partial / "config.json").read_text())
  (partial / "config.json").write_text(json.dumps({**config, "model_type": "dpt"}))
  with pytest.raises(ValueError, match="model_type 'dpt', expected one of \\['depth_anything'\\]"):
    dp.DepthBackend.from_pretrained(partial)


@pytest.mark.parametrize("bad, shown", [
    (np.zeros((40, 70, 3), np.uint8), "shape (40, 70, 3)"),
    (np.zeros((1, 40, 70, 3), np.float32), "dtype float32"),
    (np.zeros((1, 40, 70, 1), np.uint8), "shape (1, 40, 70, 1)"),
])
def test_bad_images_are_refused_naming_shape_and_dtype(backend, bad, shown):
  with pytest.raises(ValueError, match=r"DepthBackend.depth: expected images \[B, H, W, 3\]") as e:
    backend.depth(bad)
  assert shown in str(e.value)


def _rotation(axis, angle):
  axis = np.asarray(axis, np.float64) / np.linalg.norm(axis)
  k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
  return np.eye(3) + np.sin(angle) * k + (1 - np.cos(angle)) * k @ k


def test_points_from_depth_unprojects_a_known_plane():
  height, width = 6, 8
  fx, fy, cx, cy = 7.0, 6.0, (width - 1) / 2, (height - 1) / 2
  k = np.array([[fx, 0, cx], [0, fy, cy], [0, 0, 1]])
  c2w = np.eye(4)
  c2w[:3, :3] = _rotation([0.3, -1.0, 0.5], 0.7)
  c2w[:3, 3] = [1.0, -2.0, 0.5]
  # The camera-frame plane n . X = d: the ray through pixel (u, v) is ((u - cx) / fx,
  # (v - cy) / fy, 1), so its depth is z = d / (n . ray).
  normal, offset = np.array([0.2, -0.3, 1.0]), 3.0
  v, u = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
  rays = np.stack([(u - cx) / fx, (v - cy) / fy, np.ones_like(u, float)], -1)
  z = offset / (rays @ normal)
  expected_camera = rays * z[..., None]
  expected = expected_camera.reshape(-1, 3) @ c2w[:3, :3].T + c2w[:3, 3]
  points = np.asarray(dp.points_from_depth(z.astype(np.float32), k, c2w))
  assert points.shape == (height * width, 3) and points.dtype == np.float32
  np.testing.assert_allclose(points, expected, rtol=1e-5, atol=1e-5)
  # In the world frame the points lie on the transformed plane.
  world_normal = c2w[:3, :3] @ normal
  np.testing.assert_allclose(points @ world_normal, offset + world_normal @ c2w[:3, 3],
                             atol=1e-4)
  # OpenCV axes: the pixel right of centre has x > 0, the one below y > 0 (identity pose).
  flat = np.asarray(dp.points_from_depth(np.full((3, 3), 2.0, np.float32),
                                         [[1.0, 0, 1.0], [0, 1.0, 1.0], [0, 0, 1]], np.eye(4)))
  np.testing.assert_allclose(flat.reshape(3, 3, 3)[1, 2], [2.0, 0.0, 2.0])
  np.testing.assert_allclose(flat.reshape(3, 3, 3)[2, 1], [0.0, 2.0, 2.0])
  # Under jit, and pixels without depth become NaN rows.
  holes = z.astype(np.float32).copy()
  holes[0, 0], holes[1, 2] = 0.0, np.inf
  jitted = np.asarray(jax.jit(dp.points_from_depth)(holes, k, c2w))
  assert np.isnan(jitted[[0, 10]]).all() and np.isfinite(np.delete(jitted, [0, 10], 0)).all()
  np.testing.assert_allclose(np.delete(jitted, [0, 10], 0), np.delete(expected, [0, 10], 0),
                             rtol=1e-5, atol=1e-5)


def test_points_from_depth_refuses_bad_inputs():
  depth, k, pose = np.ones((4, 5), np.float32), np.diag([2.0, 2.0, 1.0]), np.eye(4)
  with pytest.raises(ValueError, match=r"depth_HxW must be \[H, W\], got shape \(1, 4, 5\)"):
    dp.points_from_depth(depth[None], k, pose)
  with pytest.raises(ValueError, match="depth_HxW must be floating point, got int32"):
    dp.points_from_depth(depth.astype(np.int32), k, pose)
  with pytest.raises(ValueError, match=r"intrinsics_3x3 must be \[3, 3\], got shape \(4,\)"):
    dp.points_from_depth(depth, np.array([2.0, 2.0, 1.0, 1.0]), pose)
  with pytest.raises(ValueError, match="with fx, fy > 0"):
    dp.points_from_depth(depth, np.diag([-2.0, 2.0, 1.0]), pose)
  with pytest.raises(ValueError, match=r"c2w_4x4 must be \[4, 4\]"):
    dp.points_from_depth(depth, k, np.eye(3))
  bad_pose = np.eye(4)
  bad_pose[3, 0] = 1.0
  with pytest.raises(ValueError, match=r"last row \[0, 0, 0, 1\]"):
    dp.points_from_depth(depth, k, bad_pose)
