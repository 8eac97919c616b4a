"""What the Qwen-VL families' model classes share: construction from a config, loading from
a Hugging Face folder through the family's name map, image token counts, M-RoPE positions,
and the forward pass over `decoder_inputs` (the policy interface, `jaxspatial.models.policy`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspatial.models.hf import load_weights, scan
from jaxspatial.models.rope import rope_index, text_position_ids
from jaxspatial.models.vision import Grids, VisionOutput

Array = jax.Array


def place_at_image_tokens(input_ids_BxL: Array, image_token_id: int, rows_NxC: Array,
                          fill: Array, by_row: bool = False) -> Array:
  """[..., B, L, C]: the n-th image token of the flattened batch takes row n of
  `rows_NxC` (leading axes of the rows kept), every other position `fill`. `by_row`: the
  rows are B equal blocks, one per sequence, and sequence b's n-th image token takes row n
  of block b (a sequence that shows fewer images than its block leaves the rest unused)."""
  is_image = input_ids_BxL == image_token_id
  if by_row:
    batch = is_image.shape[0]
    index = (jnp.cumsum(is_image, axis=-1) - 1
             + (rows_NxC.shape[-2] // batch) * jnp.arange(batch)[:, None])
  else:
    index = jnp.cumsum(is_image.reshape(-1)).reshape(is_image.shape) - 1
  placed = rows_NxC[..., jnp.clip(index, 0, rows_NxC.shape[-2] - 1), :]
  return jnp.where(is_image[..., None], placed.astype(fill.dtype), fill)


class QwenVLMethods:
  """A family class gives `family`, `config_class`, `vision_class`, `text_class`, its
  checkpoint layout (`checkpoint_shapes(config)`, `checkpoint_targets(model)`, the
  `skipped_tensors` prefixes it does not run), its preprocessing (`grid_of(vision,
  image_size)`, `batch_inputs(vision, images)`) and `encode_images`.

  `dtype`: the computation's; `param_dtype`: the parameters' (float32 master weights for
  training); `attention`: see `jaxspatial.models.attention` ("auto": cuDNN flash attention
  on GPU in bf16); `remat`: recompute each decoder layer and vision block in the backward
  pass (activation memory of one layer instead of all)."""

  skipped_tensors: tuple[str, ...] = ()

  def __init__(self, config, *, rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32,
               attention: str = "auto", remat: bool = False):
    self.config = config
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype, attention=attention,
              remat=remat)
    self.visual = self.vision_class(config.vision, **kw)
    self.language_model = self.text_class(config.text, **kw)

  @classmethod
  def from_pretrained(cls, folder, *, dtype=jnp.float32, param_dtype=jnp.float32,
                      seed: int = 0, attention: str = "auto", remat: bool = False):
    """Builds from `config.json` and loads the safetensors, tensor by tensor.

    Nothing is traced before the checks: config.json field by field (settings the model
    does not implement are refused), then the index and every shard's header against the
    config (keys, shapes, float16 / bfloat16 / float32 dtypes, no key in two shards). The
    model is then built abstractly (shapes only, no random initialisation) and every
    parameter placed from the checkpoint through the family's name map, NaN / Inf refused
    as each tensor is read, so host memory holds the parameters plus one tensor in flight.
    Each refusal is a `ModelFolderError` naming the file and the field or tensor.
    """
    config = cls.config_class.from_hf(folder)
    tensors = scan(folder, cls.checkpoint_shapes(config), config.text.tie_word_embeddings,
                   skip=cls.skipped_tensors)
    model = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(seed), dtype=dtype,
                                       param_dtype=param_dtype, attention=attention,
                                       remat=remat))
    load_weights(model, folder, tensors, cls.checkpoint_targets(model))
    return model

  def vision_inputs(self, images_BxKxHxWx3: Array):
    """(pixel values, static grids, per-sequence grids [B, K, 3]) of B x K same-sized uint8
    views."""
    return self.batch_inputs(self.config.vision, images_BxKxHxWx3)

  def image_grid(self, image_size) -> tuple[int, int, int]:
    """The static (t, h, w) patch grid of an image of `image_size` (H, W)."""
    return self.grid_of(self.config.vision, image_size)

  def image_tokens(self, image_size) -> int:
    """Decoder tokens of one image of `image_size` (H, W)."""
    t, h, w = self.image_grid(image_size)
    return t * h * w // self.config.vision.spatial_merge_size ** 2

  def embed(self, input_ids_BxL: Array, pixel_values: Array | None = None,
            grids: Grids = (), vision: VisionOutput | None = None) -> Array:
    """`decoder_inputs`' embeddings alone."""
    return self.decoder_inputs(input_ids_BxL, pixel_values, grids, vision)[0]

  def decoder_inputs(self, input_ids_BxL: Array, pixel_values: Array | None = None,
                     grids: Grids = (), vision: VisionOutput | None = None,
                     images_by_row: bool = False) -> tuple[Array, Array | None]:
    """(token embeddings with the vision tokens written, in order, at the image tokens,
    DeepStack residuals [K, B, L, C] placed the same way and zero elsewhere; None without
    images or DeepStack). `vision` (`encode_images`' output for these grids) skips running
    the encoder. `images_by_row`: see `__call__`."""
    embeds = self.language_model.embed_tokens(input_ids_BxL)
    if not grids:
      return embeds, None
    vision = self.encode_images(pixel_values, grids) if vision is None else vision
    image = self.config.image_token_id
    embeds = place_at_image_tokens(input_ids_BxL, image, vision.tokens_NxC, embeds,
                                   images_by_row)
    if vision.deepstack_KxNxC is None:
      return embeds, None
    # Zero off the images: adding the residual everywhere is transformers' masked add.
    return embeds, place_at_image_tokens(input_ids_BxL, image, vision.deepstack_KxNxC,
                                         jnp.zeros((), embeds.dtype), images_by_row)

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
               sequence_grids_BxKx3: Array | None = None,
               images_by_row: bool = False) -> Array:
    """Float32 logits [B, L, V]. `grids`: every image's (t, h, w) patch grid, in order of
    appearance over the batch; `sequence_grids_BxKx3`: each sequence's own grids (padded
    by repeating), for the M-RoPE positions. `images_by_row`: the images are B x K of one
    size, K per sequence, and each sequence's image tokens take its own K in order, whether
    or not it shows all of them (a rollout that stopped before its last observations: the
    views of turns never played are in the batch, their tokens are not)."""
    embeds, residuals = self.decoder_inputs(input_ids_BxL, pixel_values, grids,
                                            images_by_row=images_by_row)
    positions = self.position_ids(input_ids_BxL, attention_mask_BxL,
                                  sequence_grids_BxKx3 if grids else None)
    hidden = self.language_model.hidden_states(embeds, positions, attention_mask_BxL,
                                               residuals)
    return self.language_model.logits(hidden)
