"""Qwen2.5-VL: the vision encoder's tokens placed at the image tokens of the text decoder."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspatial.models.policy import VisionOutput
from jaxspatial.models.qwen2_5_vl.config import Qwen25VLConfig
from jaxspatial.models.qwen2_5_vl.hf_params import check_checkpoint, load_text_weights
from jaxspatial.models.qwen2_5_vl.preprocess import batch_vision_inputs, image_grid
from jaxspatial.models.qwen2_5_vl.rope import rope_index, text_position_ids
from jaxspatial.models.qwen2_5_vl.text import TextModel
from jaxspatial.models.qwen2_5_vl.vision import Grids, VisionModel, load_vision_weights

Array = jax.Array


def place_at_image_tokens(input_ids_BxL: Array, image_token_id: int, rows_NxC: Array,
                          fill: Array) -> Array:
  """[..., B, L, C]: the n-th image token of the flattened batch takes row n of
  `rows_NxC` (leading axes of the rows kept), every other position `fill`."""
  is_image = input_ids_BxL == image_token_id
  index = jnp.cumsum(is_image.reshape(-1)).reshape(is_image.shape) - 1
  placed = rows_NxC[..., jnp.clip(index, 0, rows_NxC.shape[-2] - 1), :]
  return jnp.where(is_image[..., None], placed.astype(fill.dtype), fill)


class QwenVLMethods:
  """The policy interface's methods that Qwen-VL families share (`jaxspatial.models.policy`):
  image token counts, M-RoPE positions, the forward pass over `decoder_inputs`."""

  def image_tokens(self, image_size) -> int:
    """Decoder tokens of one image of `image_size` (H, W)."""
    t, h, w = self.image_grid(image_size)
    return t * h * w // self.config.vision.spatial_merge_size ** 2

  def embed(self, input_ids_BxL: Array, pixel_values: Array | None = None,
            grids: Grids = (), vision: VisionOutput | None = None) -> Array:
    """`decoder_inputs`' embeddings alone."""
    return self.decoder_inputs(input_ids_BxL, pixel_values, grids, vision)[0]

  def position_ids(self, input_ids_BxL: Array, attention_mask_BxL: Array,
                   sequence_grids_BxKx3: Array | None) -> Array:
    """M-RoPE positions [3, B, L]: text-only positions (real tokens counted) without grids,
    else each sequence's, from its image grids in order (padded by repeating)."""
    if sequence_grids_BxKx3 is None:
      return text_position_ids(attention_mask_BxL)
    positions = jax.vmap(lambda i, m, g: rope_index(
        i, m, g, self.config.image_token_id, self.config.vision.spatial_merge_size))(
            input_ids_BxL, attention_mask_BxL, sequence_grids_BxKx3)
    return jnp.moveaxis(positions, 0, 1)

  def __call__(self, input_ids_BxL: Array, attention_mask_BxL: Array,
               pixel_values: Array | None = None, grids: Grids = (),
               sequence_grids_BxKx3: Array | None = None) -> Array:
    """Float32 logits [B, L, V]. `grids`: every image's (t, h, w) patch grid, in order of
    appearance over the batch; `sequence_grids_BxKx3`: each sequence's own grids (padded
    by repeating), for the M-RoPE positions."""
    embeds, residuals = self.decoder_inputs(input_ids_BxL, pixel_values, grids)
    positions = self.position_ids(input_ids_BxL, attention_mask_BxL,
                                  sequence_grids_BxKx3 if grids else None)
    hidden = self.language_model.hidden_states(embeds, positions, attention_mask_BxL,
                                               residuals)
    return self.language_model.logits(hidden)


class Qwen25VL(QwenVLMethods, nnx.Module):
  """`dtype`: the computation's; `param_dtype`: the parameters' (float32 master weights for
  training); `attention`: see `jaxspatial.models.attention` ("auto": cuDNN flash attention
  on GPU in bf16); `remat`: recompute each decoder layer and vision block in the backward
  pass (activation memory of one layer instead of all). Implements the policy interface
  (`jaxspatial.models.policy`)."""

  family = "qwen2_5_vl"
  config_class = Qwen25VLConfig

  def __init__(self, config: Qwen25VLConfig, *, rngs: nnx.Rngs, dtype=jnp.float32,
               param_dtype=jnp.float32, attention: str = "auto", remat: bool = False):
    self.config = config
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype, attention=attention,
              remat=remat)
    self.visual = VisionModel(config.vision, **kw)
    self.language_model = TextModel(config.text, **kw)

  @classmethod
  def from_pretrained(cls, folder, *, dtype=jnp.float32, param_dtype=jnp.float32,
                      seed: int = 0, attention: str = "auto",
                      remat: bool = False) -> "Qwen25VL":
    """Builds from `config.json` and loads the safetensors, tensor by tensor.

    The model is first built abstractly (shapes only, no random initialisation), so host
    memory holds the loaded parameters plus one tensor in flight; the loaders fail if
    any parameter is left unloaded.

    Nothing is traced before the checks: config.json field by field (settings the model
    does not implement are refused), then the index and every shard's header against the
    config (keys, shapes, float16 / bfloat16 / float32 dtypes, no key in two shards) and the
    vision tensors' values; text tensors are checked for NaN / Inf as they load. Each
    refusal is a `CheckpointError` naming the file and the field or tensor.
    """
    config = Qwen25VLConfig.from_hf(folder)
    check_checkpoint(folder, config, jnp.dtype(param_dtype))
    model = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(seed), dtype=dtype,
                                       param_dtype=param_dtype, attention=attention,
                                       remat=remat))
    load_text_weights(model.language_model, folder)
    load_vision_weights(model.visual, folder)
    return model

  def vision_inputs(self, images_BxKxHxWx3: Array):
    """(pixel values, static grids, per-sequence grids [B, K, 3]) of same-sized views."""
    return batch_vision_inputs(self.config.vision, images_BxKxHxWx3)

  def image_grid(self, image_size) -> tuple[int, int, int]:
    return image_grid(self.config.vision, image_size)

  def encode_images(self, pixel_values: Array, grids: Grids) -> VisionOutput:
    """The vision tokens [N, C] of the images, in order (no DeepStack)."""
    return VisionOutput(self.visual(pixel_values, grids))

  def decoder_inputs(self, input_ids_BxL: Array, pixel_values: Array | None = None,
                     grids: Grids = (), vision: VisionOutput | None = None):
    """(token embeddings with the vision tokens written, in order, at the image tokens,
    None: Qwen2.5-VL adds nothing inside the decoder). `vision` (`encode_images`' output
    for these grids) skips running the encoder."""
    embeds = self.language_model.embed_tokens(input_ids_BxL)
    if not grids:
      return embeds, None
    vision = self.encode_images(pixel_values, grids) if vision is None else vision
    return place_at_image_tokens(input_ids_BxL, self.config.image_token_id,
                                 vision.tokens_NxC, embeds), None
