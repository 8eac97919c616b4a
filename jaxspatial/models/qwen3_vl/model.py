"""Qwen3-VL: the vision encoder's tokens placed at the image tokens of the text decoder, its
DeepStack features added to the decoder's first hidden states at the same positions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspatial.models.policy import VisionOutput
from jaxspatial.models.qwen2_5_vl.vision import Grids
from jaxspatial.models.qwen3_vl import preprocess
from jaxspatial.models.qwen3_vl.config import Qwen3VLConfig
from jaxspatial.models.qwen3_vl.hf_params import checkpoint_shapes, load_weights, scan
from jaxspatial.models.qwen3_vl.rope import rope_index, text_position_ids
from jaxspatial.models.qwen3_vl.text import TextModel
from jaxspatial.models.qwen3_vl.vision import VisionModel

Array = jax.Array


class Qwen3VL(nnx.Module):
  """`dtype`: the computation's; `param_dtype`: the parameters' (float32 master weights for
  training); `attention`: see `jaxspatial.models.attention` ("auto": cuDNN flash attention
  on GPU in bf16); `remat`: recompute each decoder layer and vision block in the backward
  pass (activation memory of one layer instead of all). Implements the policy interface
  (`jaxspatial.models.policy`)."""

  family = "qwen3_vl"
  config_class = Qwen3VLConfig

  def __init__(self, config: Qwen3VLConfig, *, rngs: nnx.Rngs, dtype=jnp.float32,
               param_dtype=jnp.float32, attention: str = "auto", remat: bool = False):
    self.config = config
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype, attention=attention,
              remat=remat)
    self.visual = VisionModel(config.vision, **kw)
    self.language_model = TextModel(config.text, **kw)

  @classmethod
  def from_pretrained(cls, folder, *, dtype=jnp.float32, param_dtype=jnp.float32,
                      seed: int = 0, attention: str = "auto",
                      remat: bool = False) -> "Qwen3VL":
    """Builds from `config.json` and loads the safetensors, tensor by tensor.

    Nothing is traced before the checks: config.json field by field (settings the model
    does not implement are refused), then the index and every shard's header against the
    config (keys, shapes, float16 / bfloat16 / float32 dtypes, no key in two shards). The
    model is then built abstractly (no random initialisation) and every parameter placed
    from the checkpoint, NaN / Inf refused as each tensor is read. Each refusal is a
    `CheckpointError` naming the file and the field or tensor.
    """
    config = Qwen3VLConfig.from_hf(folder)
    tensors = scan(folder, checkpoint_shapes(config), config.text.tie_word_embeddings)
    model = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(seed), dtype=dtype,
                                       param_dtype=param_dtype, attention=attention,
                                       remat=remat))
    load_weights(model, folder, tensors)
    return model

  # --- images ------------------------------------------------------------------------------

  def vision_inputs(self, images_BxKxHxWx3: Array):
    """(pixel values, static grids, per-sequence grids [B, K, 3]) of B x K uint8 views."""
    return preprocess.batch_vision_inputs(self.config.vision, images_BxKxHxWx3)

  def image_grid(self, image_size) -> tuple[int, int, int]:
    return preprocess.image_grid(self.config.vision, image_size)

  def image_tokens(self, image_size) -> int:
    """Image tokens an image of `image_size` (H, W) takes in the prompt."""
    t, h, w = self.image_grid(image_size)
    return t * h * w // self.config.vision.spatial_merge_size ** 2

  def encode_images(self, pixel_values: Array, grids: Grids) -> VisionOutput:
    """The vision tokens [N, C] of the images, in order, and the DeepStack features
    [K, N, C] (K blocks, in block order; None without DeepStack blocks)."""
    tokens, deepstack = self.visual(pixel_values, grids)
    return VisionOutput(tokens, deepstack if deepstack.shape[0] else None)

  # --- decoder inputs ------------------------------------------------------------------------

  def decoder_inputs(self, input_ids_BxL: Array, pixel_values: Array | None = None,
                     grids: Grids = (), vision=None) -> tuple[Array, Array | None]:
    """(token embeddings with the vision tokens written, in order, at the image tokens,
    DeepStack residuals [K, B, L, C] placed the same way and zero elsewhere; None without
    images). `vision` (`encode_images`' output for these grids; also a (tokens,
    DeepStack) pair or the tokens alone) skips running the encoder."""
    embeds = self.language_model.embed_tokens(input_ids_BxL)
    if not grids:
      return embeds, None
    tokens, deepstack = _vision_parts(self.encode_images(pixel_values, grids)
                                      if vision is None else vision)
    is_image = input_ids_BxL == self.config.image_token_id
    # The n-th image token of the flattened batch takes the n-th vision token.
    index = jnp.cumsum(is_image.reshape(-1)).reshape(is_image.shape) - 1
    index = jnp.clip(index, 0, tokens.shape[0] - 1)
    embeds = jnp.where(is_image[..., None], tokens.astype(embeds.dtype)[index], embeds)
    if deepstack is None:
      return embeds, None
    # Zero off the images: adding the residual everywhere is transformers' masked add.
    residuals = jnp.where(is_image[None, ..., None], deepstack.astype(embeds.dtype)[:, index],
                          jnp.zeros((), embeds.dtype))
    return embeds, residuals

  def embed(self, input_ids_BxL: Array, pixel_values: Array | None = None,
            grids: Grids = (), vision=None) -> Array:
    """`decoder_inputs`' embeddings alone (the decoder also needs its residuals)."""
    return self.decoder_inputs(input_ids_BxL, pixel_values, grids, vision)[0]

  def position_ids(self, input_ids_BxL: Array, attention_mask_BxL: Array,
                   sequence_grids_BxKx3: Array | None) -> Array:
    """M-RoPE positions [3, B, L]: text-only positions without grids, else each sequence's
    (`sequence_grids_BxKx3`: its image grids in order, padded by repeating). Text-only
    positions count real tokens, as transformers' `generate` does (its plain forward
    without images numbers 0 .. L-1 whatever the padding)."""
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


def _vision_parts(vision) -> tuple[Array, Array | None]:
  """(tokens, DeepStack features or None) of a VisionOutput, a pair, or tokens alone."""
  if isinstance(vision, VisionOutput):
    tokens, deepstack = vision.tokens_NxC, vision.deepstack_KxNxC
  elif isinstance(vision, tuple):
    tokens, deepstack = vision
  else:
    tokens, deepstack = vision, None
  if deepstack is not None and deepstack.shape[0] == 0:
    deepstack = None
  return tokens, deepstack
