"""Depth Anything (transformers' `DepthAnythingForDepthEstimation`) on the host, and the
unprojection of a depth map into world points.

What the model predicts depends on its config's `depth_estimation_type`:
  "relative" (Depth Anything v1 and v2's released relative models, transformers' default):
             relative inverse depth (disparity up to an unknown scale and shift; larger is
             nearer), the ReLU head's output. Not a distance: `points_from_depth` needs a
             metric depth, so convert (fit scale and shift) first.
  "metric"   (the v2 metric checkpoints): depth in metres, sigmoid * `max_depth` (20 indoor,
             80 outdoor).
`DepthBackend.kind` says which a folder holds. `depth(images)` returns the prediction
resized back to each input's size with transformers' post-processing filter (bicubic),
clamped at 0 (both heads are non-negative; bicubic overshoots slightly).

`points_from_depth` is plain jnp (jit-able; `geometry.unproject_depth`) in the repo's camera
convention: OpenCV axes (x right, y down, z forward), pixel j's centre at coordinate j,
intrinsics [[fx, s, cx], [0, fy, cy], [0, 0, 1]], a camera-to-world pose.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxspatial.geometry.unproject import unproject_depth
from jaxspatial.perception.segmentation import (check_folder, check_images, check_model_type,
                                                torch_dtype)

_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
KINDS = {"relative": "relative inverse depth (disparity up to scale and shift)",
         "metric": "metric depth in metres"}


class DepthBackend:
  """transformers' Depth Anything with its image processor."""

  def __init__(self, model, image_processor, device: str = "cpu"):
    self.model, self.image_processor, self.device = model, image_processor, device
    self.kind = model.config.depth_estimation_type
    if self.kind not in KINDS:
      raise ValueError(f"DepthBackend: depth_estimation_type must be one of {list(KINDS)}, "
                       f"got {self.kind!r}")
    self.max_depth = float(model.config.max_depth) if self.kind == "metric" else None

  @classmethod
  def from_pretrained(cls, folder, device: str = "cpu", dtype="float32") -> "DepthBackend":
    """A local Depth Anything folder: config.json (model_type "depth_anything"), weights and
    preprocessor_config.json. FileNotFoundError names the folder and what is missing."""
    where = "DepthBackend.from_pretrained"
    folder = check_folder(folder, where, {
        "config": ("config.json",), "weights": _WEIGHTS,
        "image processor settings": ("preprocessor_config.json", "processor_config.json")})
    check_model_type(folder, where, ("depth_anything",))
    from transformers import (AutoImageProcessor,  # pylint: disable=import-outside-toplevel
                              DepthAnythingForDepthEstimation)
    image_processor = AutoImageProcessor.from_pretrained(folder)
    model = DepthAnythingForDepthEstimation.from_pretrained(
        folder, dtype=torch_dtype(dtype)).to(device).eval()
    return cls(model, image_processor, device)

  @property
  def metric(self) -> bool:
    return self.kind == "metric"

  def depth(self, images_BxHxWx3) -> np.ndarray:
    """[B, H, W] float32 prediction for uint8 RGB images (see the module doc for what it
    means): the processor's resize and normalisation, the model, then bicubic back to H x W."""
    import torch  # pylint: disable=import-outside-toplevel
    import torch.nn.functional as F  # pylint: disable=import-outside-toplevel
    images = check_images(images_BxHxWx3, "DepthBackend.depth")
    height, width = images.shape[1:3]
    # channels_last stated: a 3-pixel-tall image would otherwise read as channels-first.
    try:
      inputs = self.image_processor(images=list(images), return_tensors="pt",
                                    input_data_format="channels_last")
    except ValueError as e:  # a sliver can round to 0 rows at the model's patch multiple
      raise ValueError(f"DepthBackend.depth: the image processor cannot resize images of "
                       f"{height} x {width}: {e}") from e
    dtype = next(self.model.parameters()).dtype
    with torch.inference_mode():
      predicted = self.model(pixel_values=inputs["pixel_values"].to(self.device, dtype))
    depth = predicted.predicted_depth.float()[:, None]
    depth = F.interpolate(depth, size=(height, width), mode="bicubic", align_corners=False)
    return depth[:, 0].clamp(min=0.0).cpu().numpy().astype(np.float32)


def _check(value, shape: tuple, name: str):
  array = jnp.asarray(value)
  if array.shape != shape and not (shape == (None, None) and array.ndim == 2):
    wanted = "[H, W]" if shape == (None, None) else list(shape)
    raise ValueError(f"points_from_depth: {name} must be {wanted}, got shape "
                     f"{tuple(array.shape)}")
  if not jnp.issubdtype(array.dtype, jnp.floating):
    raise ValueError(f"points_from_depth: {name} must be floating point, got {array.dtype}")
  return array.astype(jnp.float32)


def points_from_depth(depth_HxW, intrinsics_3x3, c2w_4x4) -> jax.Array:
  """World points [H * W, 3] float32 of a depth map (z along the optical axis), row-major
  over pixels: camera point ((u - cx - s y') z / fx, y' z, z) with y' = (v - cy) / fy at
  pixel (u, v), then `c2w` (OpenCV axes, camera-to-world). Pixels whose depth is not a
  positive finite number give NaN rows. Concrete intrinsics and poses are checked (fx, fy
  > 0, last rows [0, 0, 1] and [0, 0, 0, 1]); traced ones only by shape."""
  depth = _check(depth_HxW, (None, None), "depth_HxW")
  k = _check(intrinsics_3x3, (3, 3), "intrinsics_3x3")
  pose = _check(c2w_4x4, (4, 4), "c2w_4x4")
  if not isinstance(k, jax.core.Tracer):
    values = np.asarray(k)
    if not (np.isfinite(values).all() and values[0, 0] > 0 and values[1, 1] > 0
            and np.allclose(values[2], [0, 0, 1]) and values[1, 0] == 0):
      raise ValueError(f"points_from_depth: intrinsics_3x3 must be [[fx, s, cx], [0, fy, cy], "
                       f"[0, 0, 1]] with fx, fy > 0, got {values.tolist()}")
  if not isinstance(pose, jax.core.Tracer):
    values = np.asarray(pose)
    if not (np.isfinite(values).all() and np.allclose(values[3], [0, 0, 0, 1])):
      raise ValueError(f"points_from_depth: c2w_4x4 must be a finite pose with last row "
                       f"[0, 0, 0, 1], got {values.tolist()}")
  points = unproject_depth(depth, k, pose)
  ok = jnp.isfinite(depth) & (depth > 0)
  return jnp.where(ok[..., None], points, jnp.nan).reshape(-1, 3)
