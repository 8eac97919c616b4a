"""Log-probabilities of a trajectory's tokens under a model: one forward pass over the
rollout's slot layout (left-padded prompt, turns, observation messages with their views)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxspatial.models.qwen2_5_vl.preprocess import preprocess_image

Array = jax.Array


def vision_inputs(model, images_BxKxHxWx3: Array):
  """Pixel values of every view in token order, the static grids, per-sequence grids."""
  vision = model.config.vision
  batch, views = images_BxKxHxWx3.shape[:2]
  flat = images_BxKxHxWx3.reshape((batch * views,) + images_BxKxHxWx3.shape[2:])
  pixels, grid = jax.vmap(lambda im: preprocess_image(
      im, vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size))(flat)
  del grid
  from jaxspatial.models.qwen2_5_vl.preprocess import smart_resize  # pylint: disable=import-outside-toplevel
  height, width = smart_resize(*images_BxKxHxWx3.shape[2:4],
                               vision.patch_size * vision.spatial_merge_size)
  grid = (1, height // vision.patch_size, width // vision.patch_size)
  sequence_grids = jnp.broadcast_to(jnp.asarray(grid, jnp.int32), (batch, views, 3))
  return pixels.reshape(-1, pixels.shape[-1]), (grid,) * (batch * views), sequence_grids


def token_logprobs(model, tokens_BxS: Array, attention_mask_BxS: Array,
                   images_BxKxHxWx3: Array | None = None, temperature: float = 1.0,
                   with_entropy: bool = False):
  """[B, S] log p(token_j | tokens_<j) (0 at j = 0) at `temperature` (as the rollout
  sampled), and the entropy of each position's distribution when asked."""
  if images_BxKxHxWx3 is not None:
    pixels, grids, sequence_grids = vision_inputs(model, images_BxKxHxWx3)
    logits = model(tokens_BxS, attention_mask_BxS, pixels, grids, sequence_grids)
  else:
    logits = model(tokens_BxS, attention_mask_BxS)
  logits = logits[:, :-1].astype(jnp.float32) / (temperature if temperature > 0 else 1.0)
  logp_all = jax.nn.log_softmax(logits, -1)
  logp = jnp.take_along_axis(logp_all, tokens_BxS[:, 1:, None], -1)[..., 0]
  logp = jnp.pad(logp, ((0, 0), (1, 0)))
  if not with_entropy:
    return logp
  entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, -1)
  return logp, jnp.pad(entropy, ((0, 0), (1, 0)))
