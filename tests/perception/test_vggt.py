"""VGGT's frame preprocessing, token counts and extractor; host extractors under jit."""

import numpy as np
import pytest

from data_pipelines.synthetic.stand_in_features import GeometryStandInExtractor
from jaxspatial.perception.vggt import (VGGTExtractor, features_in_jit, vggt_frames,
                                        vggt_input_size, vggt_preprocess, vggt_tokens)


def test_vggt_extractor_says_what_is_missing():
  with pytest.raises(ImportError, match="needs the `vggt` package"):
    VGGTExtractor("/nonexistent/vggt.pt")


def test_vggt_preprocessing_gives_the_published_token_counts():
  # 3DThinker's frames: 480 wide x 640 tall, crop mode -> 518 x 518 -> 5 + 37 x 37 tokens.
  assert vggt_input_size(640, 480) == (518, 518) and vggt_tokens(640, 480) == 1374
  # A landscape 640 x 480 frame: 518 x 392 in crop mode (1041 tokens), 518 x 518 padded.
  assert vggt_input_size(480, 640) == (392, 518) and vggt_tokens(480, 640) == 1041
  assert vggt_tokens(480, 640, "pad") == 1374
  # Crop: the resized frame is 686 tall; rows 84..601 are kept, so a black band in the
  # top 60 source rows (resized rows < 65) is cut away entirely.
  frame = np.full((1, 640, 480, 3), 255, np.uint8)
  frame[:, :60] = 0
  cropped = vggt_preprocess(frame)
  assert cropped.shape == (1, 3, 518, 518) and cropped.dtype == np.float32
  assert cropped.min() > 0.99
  frame[:, :120] = 0  # resized rows < 129 are black: rows 84..128 survive the crop
  cropped = vggt_preprocess(frame)
  assert cropped[0, :, :40].max() < 0.01 and cropped[0, :, 50:].min() > 0.99
  # Pad: 392 rows of content centred in 518, white (1.0) above and below.
  padded = vggt_preprocess(np.full((2, 480, 640, 3), 51, np.uint8), "pad")
  assert padded.shape == (2, 3, 518, 518)
  np.testing.assert_array_equal(padded[:, :, :63], 1.0)
  np.testing.assert_array_equal(padded[:, :, 455:], 1.0)
  np.testing.assert_allclose(padded[:, :, 63:455], 0.2, atol=1e-6)
  with pytest.raises(ValueError, match=r"expected uint8 frames \[N, H, W, 3\]"):
    vggt_preprocess(np.zeros((4, 4, 3), np.uint8))


def test_features_in_jit_equal_the_host_extractor():
  import jax
  from data_pipelines.synthetic import thinker3d
  extractor = GeometryStandInExtractor(grid=4, channels=32)
  cameras = thinker3d.view_cameras(56, 56, 90.0)
  poses = np.asarray(cameras.world_from_camera)
  intrinsics = np.stack([np.asarray(cameras.fx), np.asarray(cameras.fy),
                         np.asarray(cameras.cx), np.asarray(cameras.cy)], 1)
  depth = np.random.default_rng(0).uniform(0, 3, (3, 56, 56)).astype(np.float32)
  host = extractor(depth, poses, intrinsics)
  inside = jax.jit(lambda d: features_in_jit(extractor, extractor.tokens, 32, d, poses,
                                             intrinsics) * 1.0)(depth)
  np.testing.assert_allclose(np.asarray(inside), host, rtol=1e-6)
  wrong = jax.jit(lambda d: features_in_jit(extractor, 7, 32, d, poses, intrinsics))
  with pytest.raises(Exception, match=r"returned \(3, 21, 32\), expected \(3, 7, 32\)"):
    jax.block_until_ready(wrong(depth))


def test_vggt_extractor_resizes_frames_to_480_by_640_first():
  """3DThinker's feature script resizes every frame with PIL (Lanczos) to (480, 640), 480
  wide and 640 tall, then VGGT's loader (crop mode) makes it 518 wide x 686 tall (bicubic)
  and keeps rows 84..601: a landscape 640 x 480 frame gives 518 x 518, 5 + 37 x 37 = 1374
  tokens (the projector's fusion output), not the 518 x 392 (1041 tokens) it gives as is."""
  torch = pytest.importorskip("torch")
  from PIL import Image
  rng = np.random.default_rng(0)
  frames = rng.integers(0, 256, (2, 480, 640, 3), np.uint8)
  expected = []
  for frame in frames:
    image = Image.fromarray(frame).resize((480, 640), Image.LANCZOS)
    image = np.asarray(image.resize((518, 686), Image.BICUBIC), np.float32) / 255.0
    expected.append(image[84:602].transpose(2, 0, 1))
  np.testing.assert_allclose(vggt_frames(frames), np.stack(expected), atol=1e-6)
  assert vggt_frames(frames, resize_to=None).shape == (2, 3, 392, 518)

  class Aggregator(torch.nn.Module):  # records VGGT's input, returns one token per patch
    def forward(self, images):
      self.seen = images
      b, n, _, h, w = images.shape
      return [torch.zeros(b, n, 5 + (h // 14) * (w // 14), 8)], None

  extractor = VGGTExtractor.__new__(VGGTExtractor)  # VGGT itself is not installable here
  extractor.model = torch.nn.Module()
  extractor.model.aggregator = Aggregator()
  extractor.device, extractor.mode, extractor.resize_to = "cpu", "crop", (480, 640)
  assert extractor(frames).shape == (2, 1374, 8) and extractor.tokens(480, 640) == 1374
  assert tuple(extractor.model.aggregator.seen.shape) == (1, 2, 3, 518, 518)
  import inspect
  assert inspect.signature(VGGTExtractor).parameters["resize_to"].default == (480, 640)
