"""Reconstruction adapters: Pi3, VGGT and Depth-Anything-3, one output.

Each adapter wraps a model object with the real model's interface and turns frames
(uint8 RGB [N, H, W, 3]) into a `Reconstruction`: a fused coloured cloud (Think3D's rules,
`jaxspatial.perception.fusion`), camera-to-world OpenCV poses of the input views and, where
known, their intrinsics at the model's resolution. From there:

  reconstruct(frames, backend="pi3", checkpoint=...)  the entry point: (padded Morton-
                              ordered `PointCloud`, input cameras `Camera` [N] at the
                              frames' resolution); backends loaded once per checkpoint
  recon.to_pointcloud()       a padded, Morton-ordered `PointCloud` for the environments
  reconstructor.host_function(P)  fixed shapes (points [P, 3] Morton-ordered, colors
                              [P, 3] uint8, valid [P], cameras [N, 4, 4]) per scene of a
                              batch, optionally of the first `count` frames only
  reconstruction_tool(host_fn, P, N)  that function as a `HostTool`: `tool(images=...)`
                              inside jit / vmap, one host call per batch (online;
                              `envs.think3d.with_reconstruction` puts it into a Task)

Offline, data_pipelines owns the files and Open3D (jaxspatial never imports it):
  data_pipelines.caches.write_reconstruction_cache(path, recon)   Think3D's RL cache (.npz)
  data_pipelines.scene_caches.build_scene_caches   a benchmark's image sets -> caches
  data_pipelines.reconstruct.RGBDReconstructor   posed RGB-D views -> the same Reconstruction

Model interfaces (read from the public code):
  Pi3     forward(imgs [B, N, 3, H, W] in [0, 1]) -> {points, local_points [B, N, H, W, 3],
          conf [B, N, H, W, 1] (logits), camera_poses [B, N, 4, 4] camera-to-world OpenCV}
  VGGT    forward(images [S, 3, H, W] in [0, 1]) -> {pose_enc [B, S, 9] (world-to-camera),
          depth [B, S, H, W, 1], depth_conf [B, S, H, W], world_points [B, S, H, W, 3],
          world_points_conf [B, S, H, W]}
  DA3     inference(list of RGB uint8 arrays, process_res=..., process_res_method=...) ->
          Prediction(depth [N, h, w], conf [N, h, w], extrinsics [N, 3, 4] world-to-camera,
          intrinsics [N, 3, 3], processed_images [N, h, w, 3] uint8)

Preprocessing as Think3D's servers: Pi3 and VGGT frames are resized up to the next multiple
of 14 in each side (ceil) with Lanczos (OpenCV's INTER_LANCZOS4, as the public code; "pil"
uses PIL's Lanczos), only when a side is not a multiple already. The Pi3 server feeds the
model BGR frames (it decodes with OpenCV and never converts) while colours come from an RGB
copy; think3d.md records that as the effective behaviour of every Think3D cache, so
`channel_order="bgr"` is Pi3's default here and "rgb" (what Pi3's own loader feeds and was
trained on) is the option. VGGT gets RGB in Think3D's server.

Nothing here downloads: `from_pretrained(path)` imports the user-installed package (`pi3`,
`vggt`, `depth_anything_3`) and loads a local checkpoint, and says which is missing.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np

from jaxspatial.errors import check_one_of
from jaxspatial.geometry import Camera, PointCloud, pad_to_bucket, sort_spatially
from jaxspatial.geometry.pointcloud import MIN_BUCKET, morton_order
from jaxspatial.perception import fusion
from jaxspatial.perception.host_tool import HostTool

PATCH = 14
CHANNEL_ORDERS = ("bgr", "rgb")
RESAMPLERS = ("cv2", "pil")


@dataclasses.dataclass(frozen=True)
class Reconstruction:
  """One scene's fused cloud and input cameras.

  xyz [M, 3] float32 world points, rgb [M, 3] uint8, valid [M] bool (PointCloud's fields,
  unpadded: all True); cameras_c2w [N, 4, 4] float32 camera-to-world, OpenCV axes;
  intrinsics [N, 3, 3] float32 at `image_size` (H, W), the frames the model saw, or None;
  pixel_index [M] int64, each point's flat pixel `frame * H * W + row * W + column` in those
  frames (None when unknown, e.g. after Open3D's voxel grid); frame_layout (resized_h,
  resized_w, top, left): the input frames were resized to that size and placed at (top,
  left) in the model's frames (negative: cropped), None for a plain resize to
  `image_size` (`cameras(frames_hw)` maps the intrinsics back through it)."""

  xyz: np.ndarray
  rgb: np.ndarray
  valid: np.ndarray
  cameras_c2w: np.ndarray
  intrinsics: np.ndarray | None
  image_size: tuple[int, int]
  pixel_index: np.ndarray | None = None
  frame_layout: tuple[int, int, int, int] | None = None

  @classmethod
  def from_fused(cls, fused: fusion.Fused, cameras_c2w, intrinsics, image_size,
                 frame_layout=None) -> "Reconstruction":
    return cls(xyz=fused.xyz, rgb=fused.rgb, valid=np.ones(len(fused.xyz), bool),
               cameras_c2w=np.asarray(cameras_c2w, np.float32),
               intrinsics=None if intrinsics is None else np.asarray(intrinsics, np.float32),
               image_size=tuple(int(s) for s in image_size), pixel_index=fused.pixel_index,
               frame_layout=frame_layout)

  @property
  def num_points(self) -> int:
    return int(self.valid.sum())

  @property
  def num_views(self) -> int:
    return len(self.cameras_c2w)

  def cameras(self, frames_hw: tuple[int, int] | None = None) -> Camera:
    """The input views as a `Camera` [N] (needs intrinsics): at the model's resolution
    (`image_size`), or with `frames_hw` at the input frames' (H, W)."""
    if self.intrinsics is None:
      raise ValueError("Reconstruction.intrinsics: this backend gives none, so no Camera")
    intrinsics = self.intrinsics
    if frames_hw is not None:
      intrinsics = frame_intrinsics(intrinsics, frames_hw,
                                    self.frame_layout or (*self.image_size, 0, 0))
    return Camera.from_matrices(intrinsics, self.cameras_c2w)

  def to_pointcloud(self, min_bucket: int = MIN_BUCKET, sort: bool = True) -> PointCloud:
    """The valid points as a `PointCloud` padded to `bucket_size` (Morton-ordered unless
    `sort` is False)."""
    keep = np.asarray(self.valid, bool)
    cloud = PointCloud.create(self.xyz[keep].reshape(-1, 3), self.rgb[keep].reshape(-1, 3))
    return pad_to_bucket(sort_spatially(cloud) if sort else cloud, min_bucket)

  def padded(self, num_points: int, sort: bool = False) -> dict[str, np.ndarray]:
    """Fixed shapes: points [P, 3] float32, colors [P, 3] uint8, valid [P] bool, cameras
    [N, 4, 4] float32. More than P points are cut by Think3D's stride rule; `sort` puts
    the kept points in Morton order (as `to_pointcloud`)."""
    if int(num_points) != num_points or num_points < 1:
      raise ValueError(f"Reconstruction.padded.num_points: expected an integer >= 1, got "
                       f"{num_points!r}")
    keep = np.flatnonzero(self.valid)
    keep = keep[fusion.stride_indices(len(keep), int(num_points))]
    if sort and len(keep):
      keep = keep[morton_order(self.xyz[keep])]
    count = len(keep)
    points = np.zeros((num_points, 3), np.float32)
    colors = np.zeros((num_points, 3), np.uint8)
    valid = np.zeros(num_points, bool)
    points[:count], colors[:count], valid[:count] = self.xyz[keep], self.rgb[keep], True
    return {"points": points, "colors": colors, "valid": valid,
            "cameras": np.asarray(self.cameras_c2w, np.float32)}


def host_outputs(num_points: int, num_views: int) -> dict[str, tuple]:
  """The host function's outputs as (shape, dtype) per name (a `HostTool`'s `outputs`)."""
  return {"points": ((num_points, 3), jnp.float32), "colors": ((num_points, 3), jnp.uint8),
          "valid": ((num_points,), jnp.bool_), "cameras": ((num_views, 4, 4), jnp.float32)}


# One scene batch runs the model scene by scene, and an overrun call is abandoned, not
# killed (HostTool), so its thread keeps the accelerator: a retry would compete with it and
# a model's failure repeats anyway. Hence a long timeout and no retry by default.
RECONSTRUCTION_TIMEOUT_S = 600.0
RECONSTRUCTION_RETRIES = 0


class _ReconstructionTool(HostTool):
  """`HostTool` over a reconstructor's host function, checking the frames when traced."""

  def __init__(self, name: str, host_fn: Callable, num_points: int, num_views: int,
               **options):
    for field, value in (("num_points", num_points), ("num_views", num_views)):
      if int(value) != value or value < 1:
        raise ValueError(f"reconstruction_tool.{field}: expected an integer >= 1, got "
                         f"{value!r}")
    self.num_points, self.num_views = int(num_points), int(num_views)

    # HostTool passes inputs by keyword; the host function takes them positionally (a
    # function of the frames alone still serves calls without `count`).
    def call(images, count=None):
      return host_fn(images) if count is None else host_fn(images, count)

    super().__init__(name, call, host_outputs(self.num_points, self.num_views), **options)

  def __call__(self, images, count=None):
    """One scene's frames [N, H, W, 3] uint8 (inside vmap: the batch, one host call) ->
    points [P, 3], colors [P, 3] uint8, valid [P], cameras [N, 4, 4], failed. `count`
    ([] int): only the first `count` frames are real (a padded Task's input views); the
    host function then reconstructs those and repeats the last camera."""
    images = jnp.asarray(images)
    # A wrong shape here would fail every call on the host (or be flagged as a tool
    # failure in flag mode): refuse it when traced instead.
    if images.ndim != 4 or images.shape[0] != self.num_views or images.shape[-1] != 3:
      raise ValueError(f"reconstruction_tool {self.name!r}.images: expected one scene's "
                       f"frames [{self.num_views}, H, W, 3] (vmap over scenes), got "
                       f"{images.shape}")
    if images.dtype != jnp.uint8:
      raise ValueError(f"reconstruction_tool {self.name!r}.images: expected dtype uint8, got "
                       f"{images.dtype}")
    if count is None:
      return super().__call__(images=images)
    count = jnp.asarray(count)
    if count.shape != () or not jnp.issubdtype(count.dtype, jnp.integer):
      raise ValueError(f"reconstruction_tool {self.name!r}.count: expected an integer scalar "
                       f"per scene, got {count.dtype}{list(count.shape)}")
    return super().__call__(images=images, count=count.astype(jnp.int32))


def reconstruction_tool(host_fn: Callable, num_points: int, num_views: int, *,
                        name: str = "reconstruct",
                        timeout_s: float = RECONSTRUCTION_TIMEOUT_S,
                        retries: int = RECONSTRUCTION_RETRIES,
                        on_error: str = "raise") -> HostTool:
  """A reconstructor's `host_function(num_points)` as a `HostTool` for jit / vmap.

  `host_fn(images [B, N, H, W, 3] uint8)` -> points [B, P, 3], colors [B, P, 3] uint8,
  valid [B, P], cameras [B, N, 4, 4]. Call `tool(images=images_NxHxWx3)` per scene; under
  vmap the host gets the whole batch in one call. `timeout_s` covers that whole call;
  `on_error="flag"` gives zeros with `failed` True instead of raising."""
  return _ReconstructionTool(name, host_fn, num_points, num_views, timeout_s=timeout_s,
                             retries=retries, on_error=on_error)


class _Reconstructor:
  """What every image-only adapter (a `reconstruct(images)` method) shares."""

  def host_function(self, num_points: int,
                    sort: bool = True) -> Callable[..., dict[str, np.ndarray]]:
    """fn(images [..., N, H, W, 3] uint8, count [...] = None) -> padded outputs with the
    same leading axes (`Reconstruction.padded`; Morton-ordered points unless `sort` is
    False), scene by scene; `reconstruction_tool`'s host function. With `count`, scene b
    is reconstructed from its first count[b] frames and its cameras past them repeat the
    last one (a Task's padding)."""
    if int(num_points) != num_points or num_points < 1:
      raise ValueError(f"host_function.num_points: expected an integer >= 1, got "
                       f"{num_points!r}")

    def host(images, count=None):
      images = np.asarray(images)
      if images.ndim < 4:
        raise ValueError(f"host_function.images: expected shape [..., N, H, W, 3], got "
                         f"{images.shape}")
      lead, views = images.shape[:-4], images.shape[-4]
      scenes = images.reshape((-1,) + images.shape[-4:])
      counts = (np.full(len(scenes), views) if count is None
                else np.broadcast_to(np.asarray(count), lead).reshape(-1))
      if not len(scenes):  # an empty batch (a vmap over zero scenes)
        return {k: np.zeros(lead + shape, dtype) for k, (shape, dtype)
                in host_outputs(num_points, views).items()}
      outs = []
      for scene, used in zip(scenes, counts):
        if not 1 <= used <= views:
          raise ValueError(f"host_function.count: expected 1..{views} frames, got {used}")
        out = self.reconstruct(scene[:used]).padded(num_points, sort)
        out["cameras"] = out["cameras"][np.minimum(np.arange(views), used - 1)]
        outs.append(out)
      return {k: np.stack([o[k] for o in outs]).reshape(lead + outs[0][k].shape)
              for k in outs[0]}

    return host


# Preprocessing.

def check_frames(where: str, images_NxHxWx3) -> np.ndarray:
  images = np.asarray(images_NxHxWx3)
  if images.ndim != 4 or images.shape[-1] != 3 or min(images.shape[:3], default=0) < 1:
    raise ValueError(f"{where}.images: expected shape [N, H, W, 3] with N, H, W >= 1, got "
                     f"{images.shape}")
  if images.dtype != np.uint8:
    raise ValueError(f"{where}.images: expected dtype uint8, got {images.dtype}")
  return images


def patch_multiple_size(height: int, width: int, patch: int = PATCH) -> tuple[int, int]:
  """(H, W) rounded up to multiples of `patch` (Think3D's resize target)."""
  return -(-height // patch) * patch, -(-width // patch) * patch


def resize_to_patch_multiple(images_NxHxWx3, patch: int = PATCH,
                             resample: str = "cv2") -> np.ndarray:
  """uint8 frames resized up to multiples of `patch` in each side with Lanczos ("cv2":
  OpenCV's INTER_LANCZOS4 as Think3D; "pil": PIL's LANCZOS); unchanged when they are."""
  images = check_frames("resize_to_patch_multiple", images_NxHxWx3)
  if resample not in RESAMPLERS:
    raise ValueError(f"resize_to_patch_multiple.resample: expected one of {RESAMPLERS}, got "
                     f"{resample!r}")
  height, width = images.shape[1:3]
  new_h, new_w = patch_multiple_size(height, width, patch)
  if (new_h, new_w) == (height, width):
    return images
  if resample == "cv2":
    try:
      import cv2  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise ImportError("resample='cv2' (Think3D's exact Lanczos) needs OpenCV: pip install "
                        "opencv-python, or pass resample='pil'") from e
    return np.stack([cv2.resize(np.ascontiguousarray(f), (new_w, new_h),
                                interpolation=cv2.INTER_LANCZOS4) for f in images])
  from PIL import Image  # pylint: disable=import-outside-toplevel
  return np.stack([np.asarray(Image.fromarray(f).resize((new_w, new_h),
                                                        Image.Resampling.LANCZOS))
                   for f in images])


def frame_intrinsics(intrinsics_Nx3x3, frames_hw: tuple[int, int],
                     layout: tuple[int, int, int, int]) -> np.ndarray:
  """Intrinsics [N, 3, 3] at the model's frames -> at the input frames (H, W), which were
  resized to layout's (h, w) and placed at its (top, left). Pixel centres are integers in
  both (OpenCV's and PIL's resize align pixel areas): a model pixel u' is the frame's
  u = (u' - left + 0.5) * W / w - 0.5, so f = f' W / w and c = (c' - left + 0.5) W / w - 0.5."""
  k = np.array(intrinsics_Nx3x3, np.float64)
  height, width = frames_hw
  resized_h, resized_w, top, left = layout
  for axis, (frame, resized, offset) in enumerate(((width, resized_w, left),
                                                   (height, resized_h, top))):
    scale = frame / resized
    k[:, axis, axis] *= scale
    k[:, axis, 2] = (k[:, axis, 2] - offset + 0.5) * scale - 0.5
  return k.astype(np.float32)


def vggt_layout(height: int, width: int, mode: str,
                target: int = 518) -> tuple[int, int, int, int]:
  """Where VGGT's own loader (`vggt.vggt_preprocess`, "crop" / "pad") puts a frame of
  (height, width): (resized_h, resized_w, top, left) in its model frame."""
  # pylint: disable-next=import-outside-toplevel
  from jaxspatial.perception.vggt import VGGT_PATCH
  scaled_h = round(height * (target / width) / VGGT_PATCH) * VGGT_PATCH
  if mode == "crop":
    return scaled_h, target, -((scaled_h - target) // 2) if scaled_h > target else 0, 0
  if width >= height:
    resized_h, resized_w = scaled_h, target
  else:
    resized_h, resized_w = target, round(width * (target / height) / VGGT_PATCH) * VGGT_PATCH
  return resized_h, resized_w, (target - resized_h) // 2, (target - resized_w) // 2


def da3_layout(height: int, width: int, process_res: int,
               method: str) -> tuple[int, int, int, int] | None:
  """Where Depth-Anything-3's input processor puts a frame of (height, width): None for
  the "*resize" methods (a resize of the whole frame), else (resized_h, resized_w, top,
  left) of its "*crop" methods (the longest / shortest side to process_res, then a centre
  crop to multiples of 14)."""
  if not method.endswith("crop"):
    return None
  side = max(height, width) if method.startswith("upper") else min(height, width)
  scale = process_res / side
  resized_h, resized_w = ((height, width) if side == process_res else
                          (max(1, round(height * scale)), max(1, round(width * scale))))
  return (resized_h, resized_w, -((resized_h - resized_h // PATCH * PATCH) // 2),
          -((resized_w - resized_w // PATCH * PATCH) // 2))


def to_unit_chw(images_NxHxWx3: np.ndarray, channel_order: str = "rgb") -> np.ndarray:
  """[N, 3, H, W] float32 in [0, 1] (uint8 / 255 as the servers do), channels reversed for
  "bgr"."""
  if channel_order not in CHANNEL_ORDERS:
    raise ValueError(f"channel_order: expected one of {CHANNEL_ORDERS}, got {channel_order!r}")
  frames = images_NxHxWx3[..., ::-1] if channel_order == "bgr" else images_NxHxWx3
  return np.ascontiguousarray(frames.transpose(0, 3, 1, 2)).astype(np.float32) / np.float32(255.0)


# Torch plumbing (torch is imported only when a model runs).

def _torch():
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError("the learned reconstructors need PyTorch (pip install torch)") from e
  return torch


def _model_device(model, device):
  torch = _torch()
  if device is not None:
    return torch.device(device)
  # A torch module runs where its weights are; any other callable on the CPU.
  for tensor in (*getattr(model, "parameters", tuple)(), *getattr(model, "buffers", tuple)()):
    return tensor.device
  return torch.device("cpu")


def _autocast(torch, device, enabled: bool):
  """Think3D's autocast: bf16 on CUDA devices of compute capability >= 8, else fp16; none
  on CPU (the servers' `autocast('cuda')` does nothing there)."""
  if not enabled or device.type != "cuda":
    import contextlib  # pylint: disable=import-outside-toplevel
    return contextlib.nullcontext()
  major = torch.cuda.get_device_capability(device)[0]
  return torch.autocast("cuda", dtype=torch.bfloat16 if major >= 8 else torch.float16)


def _numpy(value) -> np.ndarray:
  if hasattr(value, "detach"):  # a torch tensor; bf16 has no numpy dtype
    value = value.detach()
    if value.is_floating_point():
      value = value.float()
    return value.cpu().numpy()
  return np.asarray(value)


def _outputs(where: str, outputs, expected: dict[str, tuple], optional: dict | None = None):
  """The model's dict as numpy arrays, each of the expected shape, or a ValueError naming
  the key, the expected and the actual shape."""
  if not isinstance(outputs, dict):
    raise TypeError(f"{where}: expected the model to return a dict, got "
                    f"{type(outputs).__name__}")
  missing = sorted(set(expected) - set(outputs))
  if missing:
    raise ValueError(f"{where}: missing output(s) {missing}; got {sorted(outputs)}")
  arrays = {}
  for key, shape in {**expected, **{k: s for k, s in (optional or {}).items()
                                    if outputs.get(k) is not None}}.items():
    array = _numpy(outputs[key])
    if array.shape != shape:
      raise ValueError(f"{where}.{key}: expected shape {shape}, got {tuple(array.shape)}")
    if not np.issubdtype(array.dtype, np.floating):
      raise ValueError(f"{where}.{key}: expected a float dtype, got {array.dtype}")
    arrays[key] = array
  return arrays


def _finite_poses(where: str, name: str, poses: np.ndarray) -> None:
  bad = ~np.isfinite(poses).all(axis=(-1, -2))
  if bad.any():
    raise ValueError(f"{where}.{name}: expected finite poses, got non-finite values in "
                     f"view(s) {np.flatnonzero(bad).tolist()}")


def _missing_package(adapter: str, package: str, install: str, weights: str) -> ImportError:
  return ImportError(f"{adapter}.from_pretrained needs the `{package}` package, which is not "
                     f"installed: {install}. Weights: {weights}")


def _load_torch_checkpoint(model_class, path: str, adapter: str, weights: str):
  """A folder -> `model_class.from_pretrained(folder)` (Hugging Face layout, offline); a
  .safetensors / .pt / .pth / .bin file -> `model_class()` with that state dict."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"{adapter}.from_pretrained: checkpoint not found: {path} "
                            f"(download {weights} and pass the file or its folder)")
  if os.path.isdir(path):
    return model_class.from_pretrained(path)
  torch = _torch()
  if path.endswith(".safetensors"):
    from safetensors.torch import load_file  # pylint: disable=import-outside-toplevel
    state = load_file(path)
  elif path.endswith((".pt", ".pth", ".bin")):
    state = torch.load(path, map_location="cpu", weights_only=True)
  else:
    raise ValueError(f"{adapter}.from_pretrained: expected a folder or a .safetensors / .pt / "
                     f".pth / .bin file, got {path}")
  model = model_class()
  model.load_state_dict(state)
  return model


class Pi3Reconstructor(_Reconstructor):
  """Pi3 (github.com/yyfz/Pi3) with Think3D's preprocessing and fusion.

  `model`: anything with Pi3's forward (see the module docstring), a torch module.
  Options: channel_order ("bgr": Think3D's effective input, the default; "rgb": Pi3's own
  loader), resample ("cv2" | "pil"), conf_threshold (0.06, the tool's and the RL cache's;
  the server's default is 0.08), rtol (0.02), num_std (3; None: no outlier removal),
  max_points (1,500,000; None: no cap), autocast (bf16 / fp16 on CUDA as Think3D),
  estimate_intrinsics (fit pinhole intrinsics to the local point maps; Pi3 gives none).
  Cameras are Pi3's camera_poses as they are: camera-to-world, OpenCV, no re-alignment."""

  def __init__(self, model, *, device=None, channel_order: str = "bgr",
               resample: str = "cv2", conf_threshold: float = fusion.PI3_CONF_THRESHOLD,
               rtol: float = fusion.PI3_EDGE_RTOL, num_std: float | None = fusion.OUTLIER_STD,
               max_points: int | None = fusion.PI3_MAX_POINTS, autocast: bool = True,
               estimate_intrinsics: bool = True):
    check_one_of("Pi3Reconstructor.channel_order", channel_order, CHANNEL_ORDERS)
    check_one_of("Pi3Reconstructor.resample", resample, RESAMPLERS)
    self.model, self.device = model, device
    self.channel_order, self.resample = channel_order, resample
    self.conf_threshold, self.rtol = conf_threshold, rtol
    self.num_std, self.max_points = num_std, max_points
    self.autocast, self.estimate_intrinsics = autocast, estimate_intrinsics

  @classmethod
  def from_pretrained(cls, path, device: str = "cpu", **options) -> "Pi3Reconstructor":
    """Pi3 from a local checkpoint: its Hugging Face folder (config.json +
    model.safetensors) or the model.safetensors file."""
    weights = "huggingface.co/yyfz233/Pi3 (model.safetensors)"
    try:
      from pi3.models.pi3 import Pi3  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise _missing_package("Pi3Reconstructor", "pi3",
                             "pip install git+https://github.com/yyfz/Pi3.git", weights) from e
    model = _load_torch_checkpoint(Pi3, os.fspath(path), "Pi3Reconstructor", weights)
    return cls(model.to(device).eval(), device=device, **options)

  def preprocess(self, images_NxHxWx3) -> tuple[np.ndarray, np.ndarray]:
    """(model input [1, N, 3, H', W'] float32 in [0, 1] in `channel_order`, the RGB frames
    [N, H', W', 3] uint8 the colours come from)."""
    frames = resize_to_patch_multiple(check_frames("Pi3Reconstructor", images_NxHxWx3),
                                      PATCH, self.resample)
    return to_unit_chw(frames, self.channel_order)[None], frames

  def predict(self, imgs_1xNx3xHxW: np.ndarray) -> dict[str, np.ndarray]:
    """The model's outputs for one scene as checked float32 numpy arrays."""
    torch = _torch()
    device = _model_device(self.model, self.device)
    _, frames, _, height, width = imgs_1xNx3xHxW.shape
    with torch.no_grad(), _autocast(torch, device, self.autocast):
      outputs = self.model(torch.from_numpy(imgs_1xNx3xHxW).to(device))
    return _outputs("Pi3 output", outputs, {
        "points": (1, frames, height, width, 3), "local_points": (1, frames, height, width, 3),
        "conf": (1, frames, height, width, 1), "camera_poses": (1, frames, 4, 4)})

  def reconstruct(self, images_NxHxWx3) -> Reconstruction:
    imgs, frames = self.preprocess(images_NxHxWx3)
    out = self.predict(imgs)
    poses = out["camera_poses"][0]
    _finite_poses("Pi3 output", "camera_poses", poses)
    fused = fusion.fuse_pi3(out["points"][0], out["local_points"][0], out["conf"][0], frames,
                            conf_threshold=self.conf_threshold, rtol=self.rtol,
                            num_std=self.num_std, max_points=self.max_points)
    intrinsics = (fusion.intrinsics_from_local_points(out["local_points"][0])
                  if self.estimate_intrinsics else None)
    return Reconstruction.from_fused(fused, poses, intrinsics, frames.shape[1:3])


VGGT_PREPROCESS = ("think3d", "crop", "pad")


class VGGTReconstructor(_Reconstructor):
  """VGGT (github.com/facebookresearch/vggt), Think3D's VGGT variant of the fusion.

  Points come from the point-map branch (world_points, world_points_conf: conf >= the 50th
  percentile and > 1e-5, Mahalanobis 3 std, at most 500,000 points as Think3D's VGGT
  server). Cameras: VGGT's pose encoding is world-to-camera; we return its inverse, the
  camera-to-world pose, with VGGT's intrinsics. The public Think3D code hands the
  world-to-camera matrix to renderers that expect camera-to-world (think3d.md: do not copy)
  and flips the cameras' x axis "to match Pi3". That flip compensates its own bug: reading
  R for R^T turns the apparent orbit of the cameras the other way. With the inverse taken,
  VGGT's cameras are right-handed OpenCV poses like Pi3's and every world point projects to
  its own pixel; flipping the cameras alone (the points are not flipped) would break that.
  So `mirror_x` is False by default; True reproduces the code's camera-only mirror
  (diag(-1, 1, 1) conjugation), applied to the correct poses.

  preprocess: "think3d" (Think3D's VGGT server: RGB, sides up to multiples of 14 with
  Lanczos; think3d.md cites the paper's 518 input, which the code does not apply), "crop" /
  "pad" (VGGT's own loader at 518, `perception.vggt.vggt_preprocess`)."""

  def __init__(self, model, *, device=None, preprocess: str = "think3d",
               resample: str = "cv2", conf_percentile: float = fusion.VGGT_CONF_PERCENTILE,
               min_conf: float = fusion.VGGT_MIN_CONF, num_std: float | None = fusion.OUTLIER_STD,
               max_points: int | None = fusion.VGGT_MAX_POINTS, mirror_x: bool = False,
               autocast: bool = True):
    check_one_of("VGGTReconstructor.preprocess", preprocess, VGGT_PREPROCESS)
    check_one_of("VGGTReconstructor.resample", resample, RESAMPLERS)
    self.model, self.device = model, device
    self.preprocess_mode, self.resample = preprocess, resample
    self.conf_percentile, self.min_conf = conf_percentile, min_conf
    self.num_std, self.max_points = num_std, max_points
    self.mirror_x, self.autocast = mirror_x, autocast

  @classmethod
  def from_pretrained(cls, path, device: str = "cpu", **options) -> "VGGTReconstructor":
    """VGGT from a local checkpoint: its Hugging Face folder or model.pt / .safetensors."""
    weights = "huggingface.co/facebook/VGGT-1B (model.pt)"
    try:
      from vggt.models.vggt import VGGT  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise _missing_package("VGGTReconstructor", "vggt",
                             "pip install git+https://github.com/facebookresearch/vggt.git",
                             weights) from e
    model = _load_torch_checkpoint(VGGT, os.fspath(path), "VGGTReconstructor", weights)
    return cls(model.to(device).eval(), device=device, **options)

  def preprocess(self, images_NxHxWx3) -> tuple[np.ndarray, np.ndarray]:
    """(model input [S, 3, H', W'] float32 RGB in [0, 1], the frames [S, H', W', 3] uint8)."""
    images = check_frames("VGGTReconstructor", images_NxHxWx3)
    if self.preprocess_mode == "think3d":
      frames = resize_to_patch_multiple(images, PATCH, self.resample)
      return to_unit_chw(frames), frames
    # pylint: disable-next=import-outside-toplevel
    from jaxspatial.perception.vggt import vggt_preprocess
    inputs = vggt_preprocess(images, self.preprocess_mode)
    # The loader's floats are uint8 / 255 (padding 1.0), so the colours are exact.
    frames = np.round(inputs.transpose(0, 2, 3, 1) * 255.0).astype(np.uint8)
    return inputs, frames

  def predict(self, images_Sx3xHxW: np.ndarray) -> dict[str, np.ndarray]:
    torch = _torch()
    device = _model_device(self.model, self.device)
    frames, _, height, width = images_Sx3xHxW.shape
    with torch.no_grad(), _autocast(torch, device, self.autocast):
      outputs = self.model(torch.from_numpy(images_Sx3xHxW).to(device))
    return _outputs("VGGT output", outputs, {
        "pose_enc": (1, frames, 9), "world_points": (1, frames, height, width, 3),
        "world_points_conf": (1, frames, height, width)},
        optional={"depth": (1, frames, height, width, 1),
                  "depth_conf": (1, frames, height, width)})

  def reconstruct(self, images_NxHxWx3) -> Reconstruction:
    inputs, frames = self.preprocess(images_NxHxWx3)
    out = self.predict(inputs)
    image_size = inputs.shape[2:]
    poses, intrinsics = fusion.vggt_cameras(out["pose_enc"][0], image_size, self.mirror_x)
    _finite_poses("VGGT output", "pose_enc", poses)
    fused = fusion.fuse_vggt(out["world_points"][0], out["world_points_conf"][0], frames,
                             conf_percentile=self.conf_percentile, min_conf=self.min_conf,
                             num_std=self.num_std, max_points=self.max_points)
    layout = (None if self.preprocess_mode == "think3d" else
              vggt_layout(*np.shape(images_NxHxWx3)[1:3], self.preprocess_mode))
    return Reconstruction.from_fused(fused, poses, intrinsics, image_size, layout)


class DepthAnything3Reconstructor(_Reconstructor):
  """Depth-Anything-3 (github.com/ByteDance-Seed/Depth-Anything-3) through unprojection.

  `model.inference(frames, process_res, process_res_method, **inference_options)` does its
  own preprocessing (RGB, resized to `process_res`); its depth, confidence, world-to-camera
  extrinsics and intrinsics are unprojected per view (`fusion.fuse_depth`): DA3's own
  confidence rule (its GLB export: 1.05 clamped into the 40th..90th percentiles), then
  Think3D's tail (Mahalanobis 3 std, stride cap 1,500,000). Colours: DA3's processed
  images. Cameras: the inverse of the extrinsics (camera-to-world, OpenCV); `da3_layout`
  maps the intrinsics back to the frames."""

  def __init__(self, model, *, process_res: int = 504,
               process_res_method: str = "upper_bound_resize",
               conf_threshold: float = fusion.DA3_CONF_THRESHOLD,
               conf_percentiles: tuple[float, float] | None = fusion.DA3_CONF_PERCENTILES,
               num_std: float | None = fusion.OUTLIER_STD,
               max_points: int | None = fusion.PI3_MAX_POINTS,
               inference_options: dict[str, Any] | None = None):
    self.model = model
    self.process_res, self.process_res_method = process_res, process_res_method
    self.conf_threshold, self.conf_percentiles = conf_threshold, conf_percentiles
    self.num_std, self.max_points = num_std, max_points
    self.inference_options = dict(inference_options or {})

  @classmethod
  def from_pretrained(cls, path, device: str = "cpu",
                      **options) -> "DepthAnything3Reconstructor":
    """DA3 from a local Hugging Face folder (e.g. DA3NESTED-GIANT-LARGE downloaded)."""
    weights = "huggingface.co/depth-anything (e.g. DA3NESTED-GIANT-LARGE)"
    try:
      from depth_anything_3.api import DepthAnything3  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise _missing_package(
          "DepthAnything3Reconstructor", "depth_anything_3",
          "pip install git+https://github.com/ByteDance-Seed/Depth-Anything-3.git",
          weights) from e
    path = os.fspath(path)
    if not os.path.isdir(path):
      raise FileNotFoundError(f"DepthAnything3Reconstructor.from_pretrained: checkpoint folder "
                              f"not found: {path} (download {weights})")
    model = DepthAnything3.from_pretrained(path)
    return cls(model.to(device).eval(), **options)

  def predict(self, images_NxHxWx3) -> dict[str, np.ndarray]:
    images = check_frames("DepthAnything3Reconstructor", images_NxHxWx3)
    prediction = self.model.inference(list(images), process_res=self.process_res,
                                      process_res_method=self.process_res_method,
                                      **self.inference_options)
    where = "Depth-Anything-3 prediction"
    fields = {}
    for name in ("depth", "conf", "extrinsics", "intrinsics", "processed_images"):
      value = getattr(prediction, name, None)
      if value is None and name != "conf":
        raise ValueError(f"{where}.{name}: missing (got None)")
      fields[name] = None if value is None else _numpy(value)
    depth = fields["depth"]
    frames = len(images)
    if depth.ndim != 3 or depth.shape[0] != frames:
      raise ValueError(f"{where}.depth: expected shape ({frames}, h, w), got {depth.shape}")
    hw = depth.shape[1:]
    expected = {"conf": (frames, *hw), "intrinsics": (frames, 3, 3),
                "processed_images": (frames, *hw, 3)}
    for name, shape in expected.items():
      if fields[name] is not None and fields[name].shape != shape:
        raise ValueError(f"{where}.{name}: expected shape {shape}, got {fields[name].shape}")
    if fields["processed_images"].dtype != np.uint8:
      raise ValueError(f"{where}.processed_images: expected dtype uint8, got "
                       f"{fields['processed_images'].dtype}")
    if fields["extrinsics"].shape not in ((frames, 3, 4), (frames, 4, 4)):
      raise ValueError(f"{where}.extrinsics: expected shape ({frames}, 3, 4) or "
                       f"({frames}, 4, 4), got {fields['extrinsics'].shape}")
    return fields

  def reconstruct(self, images_NxHxWx3) -> Reconstruction:
    out = self.predict(images_NxHxWx3)
    _finite_poses("Depth-Anything-3 prediction", "extrinsics", out["extrinsics"])
    poses = fusion.rigid_inverse_np(out["extrinsics"])
    fused = fusion.fuse_depth(out["depth"], out["intrinsics"], poses, out["processed_images"],
                              out["conf"], conf_threshold=self.conf_threshold,
                              conf_percentiles=self.conf_percentiles, num_std=self.num_std,
                              max_points=self.max_points)
    layout = da3_layout(*np.shape(images_NxHxWx3)[1:3], self.process_res,
                        self.process_res_method)
    return Reconstruction.from_fused(fused, poses, out["intrinsics"], out["depth"].shape[1:],
                                     layout)


# The entry point.

BACKENDS = {"pi3": Pi3Reconstructor, "vggt": VGGTReconstructor,
            "da3": DepthAnything3Reconstructor}
_LOADED: dict[tuple, Any] = {}  # (backend, checkpoint, device, options) -> reconstructor


def _backend_name(backend) -> str:
  if not isinstance(backend, str) or backend not in BACKENDS:
    raise ValueError(f"reconstruct.backend: expected one of {tuple(BACKENDS)} or an object "
                     f"with a reconstruct(frames) method, got {backend!r}")
  return backend


def load_reconstructor(backend: str, checkpoint, device: str = "cpu", **options):
  """The adapter `backend` ("pi3", "vggt", "da3") from a local checkpoint through its
  `from_pretrained(checkpoint, device, **options)`, loaded once per (backend, checkpoint,
  device, options) in this process: later calls return the same object."""
  name = _backend_name(backend)
  if checkpoint is None or not os.fspath(checkpoint):
    raise ValueError(f"reconstruct: backend {name!r} needs checkpoint= (a local folder or "
                     f"file of {BACKENDS[name].__name__}'s weights; nothing is downloaded)")
  key = (name, os.path.realpath(os.fspath(checkpoint)), str(device),
         repr(sorted(options.items())))
  if key not in _LOADED:
    _LOADED[key] = BACKENDS[name].from_pretrained(checkpoint, device=device, **options)
  return _LOADED[key]


def reconstruct(frames_NxHxWx3, backend="pi3", *, checkpoint=None, device: str = "cpu",
                min_bucket: int = MIN_BUCKET, **options) -> tuple[PointCloud, Camera]:
  """Frames (uint8 RGB [N, H, W, 3]) -> (cloud, cameras).

  cloud: the fused points as a `PointCloud` padded to `bucket_size` (at least
  `min_bucket`), Morton-ordered. cameras: the input views as a `Camera` [N], camera-to-
  world OpenCV poses with intrinsics at the frames' resolution (H, W): the backend's,
  mapped back through its resize (Pi3 predicts none: they are fitted to its local point
  maps, `estimate_intrinsics`). A backend that gives no intrinsics is an error (its
  `reconstruct(frames)` still gives the poses alone, `Reconstruction.cameras_c2w`).

  backend: "pi3", "vggt" or "da3", loaded from `checkpoint` on `device` with `options`
  (the adapter's, e.g. conf_threshold) once per process (`load_reconstructor`); or any
  object with a `reconstruct(frames, **options) -> Reconstruction` method, which gets the
  options (e.g. `data_pipelines.reconstruct.RGBDReconstructor()` with `depths_NxHxW=` and
  `cameras=`)."""
  frames = check_frames("reconstruct", frames_NxHxWx3)
  if isinstance(backend, str):
    if backend == "pi3" and options.get("estimate_intrinsics", True) is False:
      raise ValueError("reconstruct: backend 'pi3' with estimate_intrinsics=False gives no "
                       "intrinsics, so no cameras; call Pi3Reconstructor.reconstruct for the "
                       "poses alone")
    reconstructor = load_reconstructor(backend, checkpoint, device, **options)
    recon = reconstructor.reconstruct(frames)
    name = backend
  else:
    if not callable(getattr(backend, "reconstruct", None)):
      raise TypeError(f"reconstruct.backend: expected one of {tuple(BACKENDS)} or an object "
                      f"with a reconstruct(frames) method, got {type(backend).__name__}")
    if checkpoint is not None:
      raise ValueError(f"reconstruct: checkpoint= is for the named backends "
                       f"{tuple(BACKENDS)}; {type(backend).__name__} is already built")
    recon = backend.reconstruct(frames, **options)
    name = type(backend).__name__
  if not isinstance(recon, Reconstruction):
    raise TypeError(f"reconstruct: backend {name} returned {type(recon).__name__}, expected "
                    f"a Reconstruction")
  if recon.num_views != len(frames):
    raise ValueError(f"reconstruct: backend {name} returned {recon.num_views} cameras for "
                     f"{len(frames)} frames")
  if recon.intrinsics is None:
    raise ValueError(f"reconstruct: backend {name} gave no intrinsics (Pi3: the fit to its "
                     f"local point maps failed), so no cameras; its "
                     f"reconstruct(frames).cameras_c2w holds the poses alone")
  return recon.to_pointcloud(min_bucket), recon.cameras(frames.shape[1:3])
