"""3DThinker's latent block: special tokens, the `<output_3D>` expansion, embedding rows for
new tokens, the policy (Qwen2.5-VL + 3D projector) and where its latents are read, and the
target-feature extractors.

Latents, training mode (teacher forcing, as the reference's stage 1): the latent slots hold
the `<|latent_pad|>` embedding; the latents are the last-layer hidden states at the
positions just before each pad (the start token and pads 1..T-1). Inference mode is the
sampler's latent mode (`SamplingConfig.latent_tokens`): after the start token each step
feeds the previous hidden state back as the next input, so latent k is the hidden state
fed into slot k: the same positions, but from fed-back inputs instead of pad embeddings.

Targets are VGGT features (the last aggregator block's tokens). `VGGTExtractor` runs VGGT
as a host callback where the `vggt` package and weights are installed; as 3DThinker's
feature script, frames are first resized to 480 wide x 640 tall (PIL, Lanczos), then
prepared as VGGT's loader does (crop mode: 518 x 518, 5 + 37 x 37 = 1374 tokens for any
input frame, the projector's fusion output). Here neither can be
downloaded, so `GeometryStandInExtractor` computes deterministic features from the
ground-truth geometry of synthetic scenes (depth and world coordinates pooled to VGGT's
token grid, then a fixed random projection to the channel width): a stand-in that lets
the whole pipeline train, not VGGT.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspatial.models.projector3d import Projector3D, Projector3DConfig
from jaxspatial.models.qwen2_5_vl.preprocess import batch_vision_inputs

LATENT_PAD, LATENT_START, LATENT_END = "<|latent_pad|>", "<|latent_start|>", "<|latent_end|>"
OUTPUT_3D = "<output_3D>"


def add_latent_tokens(tokenizer) -> dict[str, int]:
  """Adds the three latent tokens as special tokens; returns their ids."""
  tokenizer.add_special_tokens({"additional_special_tokens": [LATENT_PAD, LATENT_START,
                                                               LATENT_END]})
  return {t: tokenizer.convert_tokens_to_ids(t) for t in (LATENT_PAD, LATENT_START, LATENT_END)}


def expand_output_3d(text: str, num_latents: int = 12) -> str:
  """Replaces the `<output_3D>` placeholder with start + num_latents pads + end."""
  if text.count(OUTPUT_3D) != 1:
    raise ValueError(f"expand_output_3d: expected one {OUTPUT_3D} placeholder, found "
                     f"{text.count(OUTPUT_3D)} in {text[:60]!r}")
  return text.replace(OUTPUT_3D, LATENT_START + LATENT_PAD * num_latents + LATENT_END)


def latent_label_mask(input_ids_BxL: jax.Array, pad_id: int) -> jax.Array:
  """False at latent-pad positions: they take no cross-entropy (start, end and text do)."""
  return input_ids_BxL != pad_id


def grow_embeddings(text_model, vocab_size: int, *, rngs: nnx.Rngs) -> None:
  """Adds rows to the token embedding (and an untied LM head) for new tokens; existing
  rows are kept, new rows drawn like the originals' initialisation."""
  embedding = text_model.embed_tokens.embedding
  old = embedding[...]
  if vocab_size < old.shape[0]:
    raise ValueError(f"grow_embeddings: {vocab_size} is smaller than the vocabulary "
                     f"{old.shape[0]}")
  extra = vocab_size - old.shape[0]
  new_rows = jax.random.normal(rngs.params(), (extra, old.shape[1]), old.dtype) * old.std()
  embedding.set_value(jnp.concatenate([old, new_rows]))
  text_model.embed_tokens.num_embeddings = vocab_size
  if text_model.lm_head is not None:
    kernel = text_model.lm_head.kernel
    head = kernel[...]
    new_cols = jax.random.normal(rngs.params(), (head.shape[0], extra), head.dtype) * head.std()
    kernel.set_value(jnp.concatenate([head, new_cols], axis=1))
    text_model.lm_head.out_features = vocab_size


def latent_positions(tokens_BxS: jax.Array, start_id: int, num_latents: int = 12):
  """(positions [B, T], found [B]): the start token's position and the next T - 1, whose
  hidden states are the training-mode latents."""
  is_start = tokens_BxS == start_id
  first = jnp.argmax(is_start, axis=-1)
  positions = jnp.clip(first[:, None] + jnp.arange(num_latents)[None], 0,
                       tokens_BxS.shape[1] - 1)
  return positions, jnp.any(is_start, axis=-1)


def image_token_rows(x_BxSxC: jax.Array, tokens_BxS: jax.Array, image_token_id: int,
                     num_images: int, tokens_per_image: int) -> jax.Array:
  """The rows of x at each sequence's image tokens, in order, as [B, K, P, C] (every
  sequence holds K images of P tokens)."""
  count = num_images * tokens_per_image
  is_image = tokens_BxS == image_token_id
  order = jnp.argsort(~is_image, axis=-1, stable=True)[:, :count]  # image positions first
  rows = jnp.take_along_axis(x_BxSxC, order[..., None], axis=1)
  return rows.reshape(x_BxSxC.shape[0], num_images, tokens_per_image, x_BxSxC.shape[-1])


class Thinker3DPolicy(nnx.Module):
  """The policy (Qwen2.5-VL) with 3DThinker's 3D projector beside it."""

  def __init__(self, model, projector_config: Projector3DConfig, *, rngs: nnx.Rngs):
    text = model.config.text
    if projector_config.mm_hidden_size != text.hidden_size:
      raise ValueError(f"Thinker3DPolicy: projector mm_hidden_size "
                       f"{projector_config.mm_hidden_size} must equal the model's hidden size "
                       f"{text.hidden_size}")
    self.model = model
    self.projector = Projector3D(projector_config, rngs=rngs)

  def teacher_forced(self, tokens_BxS, attention_mask_BxS, images_BxKxHxWx3):
    """One forward pass: (logits [B, S, V], final hidden states [B, S, C], input
    embeddings [B, S, C] with the vision tokens placed)."""
    model = self.model
    pixels, grids, sequence_grids = batch_vision_inputs(model.config.vision, images_BxKxHxWx3)
    embeds = model.embed(tokens_BxS, pixels, grids)
    positions = model.position_ids(tokens_BxS, attention_mask_BxS, sequence_grids)
    hidden = model.language_model.hidden_states(embeds, positions, attention_mask_BxS)
    return model.language_model.logits(hidden), hidden, embeds

  def image_embeddings(self, embeds_BxSxC, tokens_BxS, num_images: int):
    return image_token_rows(embeds_BxSxC, tokens_BxS, self.model.config.image_token_id,
                            num_images, self.projector.config.fusion_input)

  def project(self, latents_BxTxC, image_embeds_BxKxPxC):
    """[B, K, F, H]: the projector per sample (float32, as the reference's reward)."""
    return jax.vmap(self.projector)(latents_BxTxC.astype(jnp.float32),
                                    image_embeds_BxKxPxC.astype(jnp.float32))


@dataclasses.dataclass(frozen=True)
class GeometryStandInExtractor:
  """Deterministic stand-in for VGGT features, from depth and world coordinates.

  Each view is pooled to a grid x grid map of [depth, world x, y, z, coverage, 1] (VGGT's
  37 x 37 patches for 518-pixel inputs; coverage is 2 * the valid fraction - 1, so empty
  patches are not zero vectors), `special` tokens are prepended (VGGT's camera and
  register tokens: the view's camera centre, its forward axis, then fixed constants), and
  a fixed random projection (seeded) maps the 6 channels to `channels`. No token is a zero
  vector, so every token has a defined cosine.
  """

  grid: int = 37
  special: int = 5
  channels: int = 2048
  seed: int = 0

  @property
  def tokens(self) -> int:
    return self.special + self.grid * self.grid

  def __call__(self, depth_NxHxW: np.ndarray, world_from_camera_Nx4x4: np.ndarray,
               intrinsics_Nx4: np.ndarray) -> np.ndarray:
    depth = np.asarray(depth_NxHxW, np.float32)
    n, h, w = depth.shape
    v, u = np.meshgrid(np.arange(h, dtype=np.float32), np.arange(w, dtype=np.float32),
                       indexing="ij")
    features = []
    for i in range(n):
      fx, fy, cx, cy = np.asarray(intrinsics_Nx4[i], np.float32)
      pose = np.asarray(world_from_camera_Nx4x4[i], np.float32)
      camera = np.stack([(u - cx) / fx * depth[i], (v - cy) / fy * depth[i], depth[i]], -1)
      world = camera @ pose[:3, :3].T + pose[:3, 3]
      valid = (depth[i] > 0).astype(np.float32)
      maps = np.concatenate([depth[i][..., None], world * valid[..., None],
                             2 * valid[..., None] - 1, np.ones_like(valid)[..., None]], -1)
      rows = np.array_split(np.arange(h), self.grid)
      cols = np.array_split(np.arange(w), self.grid)
      pooled = np.stack([np.stack([maps[r][:, c].reshape(-1, 6).mean(0) for c in cols])
                         for r in rows]).reshape(-1, 6)
      special = np.zeros((self.special, 6), np.float32)
      special[:, 5] = 1.0
      special[0, :3], special[1, :3] = pose[:3, 3], pose[:3, 2]
      special[2:, 4] = np.arange(1, self.special - 1)  # registers: fixed constants
      features.append(np.concatenate([special, pooled]))
    projection = np.random.default_rng(self.seed).normal(size=(6, self.channels)).astype(
        np.float32) / np.sqrt(6)
    return np.stack(features) @ projection  # [N, tokens, channels]


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
