"""VGGT target features for 3DThinker, run on the host (the last aggregator block's tokens).

`VGGTExtractor` runs VGGT as a host callback where the `vggt` package and weights are
installed; as 3DThinker's feature script, frames are first resized to 480 wide x 640 tall
(PIL, Lanczos), then prepared as VGGT's loader does (crop mode: 518 x 518, 5 + 37 x 37 =
1374 tokens for any input frame, the projector's fusion output). `features_in_jit` calls a
host extractor from inside a jitted program. Neither VGGT nor its weights can be downloaded
here; synthetic data uses `data_pipelines.synthetic.stand_in_features` instead.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

VGGT_PATCH = 14
VGGT_SPECIAL_TOKENS = 5  # 1 camera + 4 register tokens


def vggt_input_size(height: int, width: int, mode: str = "crop",
                    target_size: int = 518) -> tuple[int, int]:
  """(height, width) VGGT's preprocessing gives a frame: "crop" sets the width to 518 and
  the height to the nearest multiple of 14 keeping the aspect, then centre-crops a taller
  result to 518; "pad" scales the longer side to 518 and pads to a 518 square."""
  if mode == "crop":
    resized = (round(height * (target_size / width) / VGGT_PATCH) * VGGT_PATCH, target_size)
    return min(resized[0], target_size), target_size
  if mode == "pad":
    return target_size, target_size
  raise ValueError(f"vggt_input_size: mode must be 'crop' or 'pad', got {mode!r}")


def vggt_tokens(height: int, width: int, mode: str = "crop", target_size: int = 518) -> int:
  """Tokens per frame of VGGT's aggregator output: 5 special + one per 14 x 14 patch."""
  h, w = vggt_input_size(height, width, mode, target_size)
  return VGGT_SPECIAL_TOKENS + (h // VGGT_PATCH) * (w // VGGT_PATCH)


def vggt_preprocess(images_NxHxWx3: np.ndarray, mode: str = "crop",
                    target_size: int = 518) -> np.ndarray:
  """Frames (uint8 RGB) as VGGT's demo loader prepares them: [N, 3, H', W'] float32 in
  [0, 1], bicubic resize, then the centre crop ("crop") or white padding ("pad")."""
  from PIL import Image  # pylint: disable=import-outside-toplevel
  images = np.asarray(images_NxHxWx3)
  if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
    raise ValueError(f"vggt_preprocess: expected uint8 frames [N, H, W, 3], got "
                     f"{images.dtype} {images.shape}")
  height, width = images.shape[1:3]
  if mode == "crop":
    size = (target_size, round(height * (target_size / width) / VGGT_PATCH) * VGGT_PATCH)
  elif mode == "pad":
    size = ((target_size, round(height * (target_size / width) / VGGT_PATCH) * VGGT_PATCH)
            if width >= height else
            (round(width * (target_size / height) / VGGT_PATCH) * VGGT_PATCH, target_size))
  else:
    raise ValueError(f"vggt_preprocess: mode must be 'crop' or 'pad', got {mode!r}")
  out = []
  for frame in images:
    resized = np.asarray(Image.fromarray(frame).resize(size, Image.Resampling.BICUBIC),
                         np.float32) / 255.0
    if mode == "crop" and resized.shape[0] > target_size:
      top = (resized.shape[0] - target_size) // 2
      resized = resized[top:top + target_size]
    if mode == "pad":
      dh, dw = target_size - resized.shape[0], target_size - resized.shape[1]
      resized = np.pad(resized, ((dh // 2, dh - dh // 2), (dw // 2, dw - dw // 2), (0, 0)),
                       constant_values=1.0)
    out.append(resized.transpose(2, 0, 1))
  return np.stack(out)


VGGT_FRAME_SIZE = (480, 640)  # (width, height) 3DThinker resizes frames to before VGGT


def resize_frames(images_NxHxWx3: np.ndarray, size: tuple[int, int]) -> np.ndarray:
  """uint8 RGB frames resized to `size` = (width, height) with PIL's Lanczos filter (as
  3DThinker's feature script, which also re-saves them in their source format)."""
  from PIL import Image  # pylint: disable=import-outside-toplevel
  images = np.asarray(images_NxHxWx3)
  if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
    raise ValueError(f"resize_frames: expected uint8 frames [N, H, W, 3], got "
                     f"{images.dtype} {images.shape}")
  return np.stack([np.asarray(Image.fromarray(frame).resize(tuple(size),
                                                            Image.Resampling.LANCZOS))
                   for frame in images])


def vggt_frames(images_NxHxWx3: np.ndarray, resize_to: tuple[int, int] | None = VGGT_FRAME_SIZE,
                mode: str = "crop") -> np.ndarray:
  """[N, 3, H', W'] float32 VGGT inputs: frames resized to `resize_to` (width, height;
  None keeps them), then `vggt_preprocess`."""
  frames = images_NxHxWx3 if resize_to is None else resize_frames(images_NxHxWx3, resize_to)
  return vggt_preprocess(frames, mode)


def features_in_jit(extractor, tokens: int, channels: int, *arrays) -> jax.Array:
  """Runs a host extractor (VGGT, the stand-in) from inside a jitted program through
  `jax.pure_callback`: [N, tokens, channels] float32 for per-frame inputs with a leading N.
  Under vmap the batch is handed to the host one element at a time."""
  count = np.shape(arrays[0])[0]
  result = jax.ShapeDtypeStruct((count, tokens, channels), jnp.float32)

  def host(*values):
    features = np.asarray(extractor(*values), np.float32)
    if features.shape != result.shape:
      raise ValueError(f"features_in_jit: the extractor returned {features.shape}, "
                       f"expected {result.shape}")
    return features

  return jax.pure_callback(host, result, *arrays, vmap_method="sequential")


class VGGTExtractor:
  """VGGT-1B's last aggregator block as target features, run on the host.

  Needs the `vggt` package and its weights on local disk (`weights_path`); neither can be
  fetched here, and the error says which is missing. Frames are resized to `resize_to`
  (width, height; 3DThinker's 480 x 640 by default, None keeps them), then preprocessed as
  VGGT's loader does (`vggt_preprocess`, crop mode by default, as 3DThinker's features):
  [N, tokens, 2048] with tokens = `self.tokens(H, W)` (1374 for every frame by default).
  """

  def __init__(self, weights_path: str, device: str = "cpu", mode: str = "crop",
               resize_to: tuple[int, int] | None = VGGT_FRAME_SIZE):
    try:
      from vggt.models.vggt import VGGT  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise ImportError("VGGTExtractor needs the `vggt` package (github.com/facebookresearch/"
                        "vggt) installed; use GeometryStandInExtractor on synthetic data") from e
    import os  # pylint: disable=import-outside-toplevel
    if not os.path.exists(weights_path):
      raise FileNotFoundError(f"VGGT weights not found at {weights_path}")
    import torch  # pylint: disable=import-outside-toplevel
    self.model = VGGT()
    self.model.load_state_dict(torch.load(weights_path, map_location=device))
    self.model.eval().to(device)
    self.device = device
    self.mode = mode
    self.resize_to = resize_to

  def tokens(self, height: int, width: int) -> int:
    """Tokens per frame of an input frame height x width."""
    if self.resize_to is not None:
      width, height = self.resize_to
    return vggt_tokens(height, width, self.mode)

  def __call__(self, images_NxHxWx3) -> np.ndarray:
    import torch  # pylint: disable=import-outside-toplevel
    frames = torch.from_numpy(vggt_frames(images_NxHxWx3, self.resize_to, self.mode))
    with torch.no_grad():
      tokens, _ = self.model.aggregator(frames[None].to(self.device))
    return tokens[-1][0].float().cpu().numpy()  # [N, tokens, 2048]
