"""Qwen3-VL: the vision encoder's tokens placed at the image tokens of the text decoder, its
DeepStack features added to the decoder's first hidden states at the same positions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspatial.models.policy import VisionOutput
from jaxspatial.models.qwen2_5_vl.model import QwenVLMethods, place_at_image_tokens
from jaxspatial.models.qwen2_5_vl.vision import Grids
from jaxspatial.models.qwen3_vl import preprocess
from jaxspatial.models.qwen3_vl.config import Qwen3VLConfig
from jaxspatial.models.qwen3_vl.hf_params import checkpoint_shapes, load_weights, scan
from jaxspatial.models.qwen3_vl.text import TextModel
from jaxspatial.models.qwen3_vl.vision import VisionModel

Array = jax.Array


class Qwen3VL(QwenVLMethods, nnx.Module):
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

  def encode_images(self, pixel_values: Array, grids: Grids) -> VisionOutput:
    """The vision tokens [N, C] of the images, in order, and the DeepStack features
    [K, N, C] (K blocks, in block order; None without DeepStack blocks)."""
    tokens, deepstack = self.visual(pixel_values, grids)
    return VisionOutput(tokens, deepstack if deepstack.shape[0] else None)

  # --- decoder inputs ------------------------------------------------------------------------

  def decoder_inputs(self, input_ids_BxL: Array, pixel_values: Array | None = None,
                     grids: Grids = (), vision: VisionOutput | None = None
                     ) -> tuple[Array, Array | None]:
    """(token embeddings with the vision tokens written, in order, at the image tokens,
    DeepStack residuals [K, B, L, C] placed the same way and zero elsewhere; None without
    images or DeepStack). `vision` (`encode_images`' output for these grids) skips running
    the encoder."""
    embeds = self.language_model.embed_tokens(input_ids_BxL)
    if not grids:
      return embeds, None
    vision = self.encode_images(pixel_values, grids) if vision is None else vision
    image = self.config.image_token_id
    embeds = place_at_image_tokens(input_ids_BxL, image, vision.tokens_NxC, embeds)
    if vision.deepstack_KxNxC is None:
      return embeds, None
    # Zero off the images: adding the residual everywhere is transformers' masked add.
    return embeds, place_at_image_tokens(input_ids_BxL, image, vision.deepstack_KxNxC,
                                         jnp.zeros((), embeds.dtype))
