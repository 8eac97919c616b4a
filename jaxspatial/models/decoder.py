"""The text decoder every Qwen-VL family runs: embeddings, decoder layers, final norm and
the LM head; the layer loop with causal and padding masks, the KV-cache `extend`, decoder
residuals (DeepStack) and float32 logits. A family subclasses `TextDecoder` with its
`attention_class` (or its own `new_layer`), `norm_class` and `mrope_cos_sin` (its M-RoPE);
`remat` recomputes each decoder layer in the backward pass."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspatial.models.layers import (DecoderLayer, RMSNorm, add_residual, linear,
                                      remat_call, tied_logits)
from jaxspatial.models.sharding import logical_init

Array = jax.Array


class TextDecoder(nnx.Module):
  """The shared skeleton; see the module docstring for what a family gives."""

  norm_class = RMSNorm

  def __init__(self, config, *, rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32,
               attention: str = "auto", remat: bool = False):
    config.check()
    self.config = config
    self.remat = remat
    self.embed_tokens = nnx.Embed(
        config.vocab_size, config.hidden_size, dtype=dtype, param_dtype=param_dtype, rngs=rngs,
        embedding_init=logical_init(nnx.initializers.variance_scaling(1.0, "fan_in", "normal",
                                                                      out_axis=0),
                                    ("vocab", "embed")))
    self.layers = nnx.List([self.new_layer(i, config, rngs=rngs, dtype=dtype,
                                           param_dtype=param_dtype, attention=attention)
                            for i in range(config.num_hidden_layers)])
    self.norm = type(self).norm_class(config.hidden_size, config.rms_norm_eps,
                                      param_dtype=param_dtype)
    self.lm_head = None if config.tie_word_embeddings else linear(
        config.hidden_size, config.vocab_size, ("embed", "vocab"), use_bias=False, dtype=dtype,
        param_dtype=param_dtype, rngs=rngs)

  def new_layer(self, index: int, config, **options) -> nnx.Module:  # pylint: disable=unused-argument
    """Decoder layer `index` (hybrid families build different kinds by index)."""
    return DecoderLayer(config, type(self).attention_class, **options)

  def layer_mask(self, mask_BxLxS: Array, valid_BxL: Array):  # pylint: disable=unused-argument
    """What each layer gets as its mask: the attention mask [B, L, S] here; a family whose
    layers also need the segment's valid tokens [B, L] (recurrent layers) returns both."""
    return mask_BxLxS

  def hidden_states(self, inputs_embeds_BxLxC: Array, position_ids_3xBxL: Array,
                    attention_mask_BxL: Array, residuals=None) -> Array:
    """Final-norm hidden states [B, L, C] with causal and padding masks. `residuals`
    [K, B, L, C] (or None) are added after layers 0 .. K-1 (`add_residual`)."""
    length = inputs_embeds_BxLxC.shape[1]
    causal = jnp.tril(jnp.ones((length, length), bool))
    mask = self.layer_mask(causal[None] & attention_mask_BxL.astype(bool)[:, None, :],
                           attention_mask_BxL)
    cos, sin = self.rotary(position_ids_3xBxL)
    x = inputs_embeds_BxLxC
    for i, layer in enumerate(self.layers):
      if self.remat:  # activations inside the layer are recomputed for the gradient
        x = remat_call(layer, lambda layer, x: layer(x, cos, sin, mask)[0], x)
      else:
        x, _ = layer(x, cos, sin, mask)
      x = add_residual(x, residuals, i)
    return self.norm(x)

  def rotary(self, position_ids_3xBxL: Array) -> tuple[Array, Array]:
    """cos, sin [B, L, rotary dim] of the family's M-RoPE (the rotary dimension: the
    config's `rotary_dim` where it has one, else `head_dim`)."""
    c = self.config
    return self.mrope_cos_sin(position_ids_3xBxL, getattr(c, "rotary_dim", c.head_dim),
                              c.rope_theta, c.mrope_section)

  def init_cache(self, batch: int, length: int, dtype=jnp.float32) -> list:
    """Zeroed (k, v) caches [B, S, KV, D] per layer; the cache dtype is a choice."""
    c = self.config
    shape = (batch, length, c.num_key_value_heads, c.head_dim)
    return [(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in self.layers]

  def extend(self, inputs_embeds_BxLxC: Array, position_ids_3xBxL: Array,
             cache_valid_BxS: Array, cache: list, index: Array, residuals=None,
             attend: int | None = None):
    """Appends L positions at cache slot `index` ([] for every row, or [B] each row's own)
    and returns (hidden [B, L, C], cache).

    `cache_valid_BxS` marks the cache slots that hold real tokens once this segment is
    written (padding stays invalid); each new token attends to valid slots up to its own.
    `residuals` [K, B, L, C]: this segment's decoder additions (see `hidden_states`).
    `attend` (static): attention reads slots [0, attend) only, not the whole capacity (a
    prefill into an empty cache: its own L slots; every slot the segment writes must be
    below it).
    """
    length = inputs_embeds_BxLxC.shape[1]
    width = cache_valid_BxS.shape[1] if attend is None else attend
    slots = jnp.arange(width)
    rows_index = jnp.broadcast_to(index, cache_valid_BxS.shape[:1])
    query_slot_BxL = rows_index[:, None] + jnp.arange(length)
    mask = ((slots[None, None] <= query_slot_BxL[..., None])
            & cache_valid_BxS[:, :width].astype(bool)[:, None])
    segment_valid = jax.vmap(lambda row, at: jax.lax.dynamic_slice_in_dim(row, at, length))(
        cache_valid_BxS, rows_index)
    mask = self.layer_mask(mask, segment_valid)
    cos, sin = self.rotary(position_ids_3xBxL)
    x = inputs_embeds_BxLxC
    new_cache = []
    for i, (layer, layer_cache) in enumerate(zip(self.layers, cache)):
      x, layer_cache = layer(x, cos, sin, mask, layer_cache, index)
      x = add_residual(x, residuals, i)
      new_cache.append(layer_cache)
    return self.norm(x), new_cache

  def logits(self, hidden_BxLxC: Array) -> Array:
    """Float32 logits: a computation-dtype matmul accumulated and returned in float32."""
    if self.lm_head is None:
      return tied_logits(self.embed_tokens, hidden_BxLxC)
    if type(self.lm_head) is nnx.Linear:  # pylint: disable=unidiomatic-typecheck
      kernel = self.lm_head.kernel[...]
      hidden = hidden_BxLxC.astype(self.lm_head.dtype or kernel.dtype)
      return jnp.einsum("...c,cv->...v", hidden, kernel.astype(hidden.dtype),
                        preferred_element_type=jnp.float32)
    return self.lm_head(hidden_BxLxC).astype(jnp.float32)  # an adapter (LoRA)

  def __call__(self, input_ids_BxL: Array, position_ids_3xBxL: Array,
               attention_mask_BxL: Array, residuals=None) -> Array:
    hidden = self.hidden_states(self.embed_tokens(input_ids_BxL), position_ids_3xBxL,
                                attention_mask_BxL, residuals)
    return self.logits(hidden)
