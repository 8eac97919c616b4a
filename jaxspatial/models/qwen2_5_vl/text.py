"""The Qwen2 text decoder of Qwen2.5-VL in Flax NNX.

Grouped-query attention with biased q/k/v projections and M-RoPE, RMSNorm, SwiGLU MLP,
tied or untied embeddings. Attention scores, softmax, norms and logits run in float32
whatever the computation dtype; prefill and training attention go through
`jaxspatial.models.attention` (cuDNN flash attention on GPU), decode through the einsum
path over the cache. `remat` recomputes each decoder layer in the backward pass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspatial.models.attention import attention, check_implementation, write_cache
from jaxspatial.models.qwen2_5_vl.config import TextConfig
from jaxspatial.models.sharding import logical_init
from jaxspatial.models.qwen2_5_vl.rope import apply_rotary, mrope_cos_sin

Array = jax.Array
_DEFAULT = nnx.initializers.lecun_normal()


def linear(in_features: int, out_features: int, logical: tuple, *, use_bias: bool, rngs,
           dtype, param_dtype) -> nnx.Linear:
  """nnx.Linear whose kernel (and bias) carry logical axes for the sharding rules."""
  return nnx.Linear(in_features, out_features, use_bias=use_bias, dtype=dtype,
                    param_dtype=param_dtype, rngs=rngs,
                    kernel_init=logical_init(_DEFAULT, logical),
                    bias_init=logical_init(nnx.initializers.zeros_init(), logical[1:]))


class RMSNorm(nnx.Module):
  def __init__(self, size: int, eps: float, *, param_dtype=jnp.float32):
    self.weight = nnx.Param(jnp.ones((size,), param_dtype))
    self.eps = eps

  def __call__(self, x: Array) -> Array:
    x32 = x.astype(jnp.float32)
    variance = jnp.mean(x32 * x32, axis=-1, keepdims=True)
    return (self.weight[...] * (x32 * jax.lax.rsqrt(variance + self.eps))).astype(x.dtype)


class Attention(nnx.Module):
  def __init__(self, config: TextConfig, *, rngs: nnx.Rngs, dtype, param_dtype,
               implementation: str = "auto"):
    self.config = config
    self.implementation = check_implementation(implementation)
    d, h, kv = config.head_dim, config.num_attention_heads, config.num_key_value_heads
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.q_proj = linear(config.hidden_size, h * d, ("embed", "heads"), use_bias=True, **kw)
    self.k_proj = linear(config.hidden_size, kv * d, ("embed", "kv_heads"), use_bias=True, **kw)
    self.v_proj = linear(config.hidden_size, kv * d, ("embed", "kv_heads"), use_bias=True, **kw)
    self.o_proj = linear(h * d, config.hidden_size, ("heads", "embed"), use_bias=False, **kw)

  def __call__(self, x_BxLxC: Array, cos: Array, sin: Array, mask_BxLxS: Array,
               cache: tuple[Array, Array] | None = None, index: Array | None = None):
    """Without a cache: attention over x. With (k, v) caches [B, S, KV, D] and a write
    index: x's keys and values are written at [index, index + L) and x attends over the
    whole cache (mask [B, L, S]). Returns (out, cache)."""
    c = self.config
    b, length, _ = x_BxLxC.shape
    d, h, kv = c.head_dim, c.num_attention_heads, c.num_key_value_heads
    q = apply_rotary(self.q_proj(x_BxLxC).reshape(b, length, h, d), cos, sin)
    k = apply_rotary(self.k_proj(x_BxLxC).reshape(b, length, kv, d), cos, sin)
    v = self.v_proj(x_BxLxC).reshape(b, length, kv, d)
    if cache is not None:
      k_cache, v_cache = cache
      k, v = write_cache(k_cache, k, index), write_cache(v_cache, v, index)
      cache = (k, v)
    out = attention(q, k, v, mask_BxLxS, self.implementation).reshape(b, length, h * d)
    return self.o_proj(out.astype(x_BxLxC.dtype)), cache


class MLP(nnx.Module):
  def __init__(self, config: TextConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype, use_bias=False)
    self.gate_proj = linear(config.hidden_size, config.intermediate_size, ("embed", "mlp"), **kw)
    self.up_proj = linear(config.hidden_size, config.intermediate_size, ("embed", "mlp"), **kw)
    self.down_proj = linear(config.intermediate_size, config.hidden_size, ("mlp", "embed"), **kw)

  def __call__(self, x: Array) -> Array:
    return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
  def __init__(self, config: TextConfig, *, rngs: nnx.Rngs, dtype, param_dtype,
               attention: str = "auto"):
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.self_attn = Attention(config, implementation=attention, **kw)
    self.mlp = MLP(config, **kw)
    self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps,
                                   param_dtype=param_dtype)
    self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps,
                                            param_dtype=param_dtype)

  def __call__(self, x, cos, sin, mask, cache=None, index=None):
    attended, cache = self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, index)
    x = x + attended
    return x + self.mlp(self.post_attention_layernorm(x)), cache


def remat_call(module: nnx.Module, fn, x: Array) -> Array:
  """fn(module, x) under `jax.checkpoint`: its activations are recomputed in the backward
  pass. Only RNG state (dropout counters) is written back, so unlike `nnx.remat`, which
  writes the whole module back, this also runs inside a rollout's while loop."""
  graphdef, state = nnx.split(module)

  def pure(state, x):
    inner = nnx.merge(graphdef, state)
    return fn(inner, x), nnx.state(inner, nnx.RngState)

  y, rng_state = jax.checkpoint(pure)(state, x)
  if jax.tree.leaves(rng_state):
    nnx.update(module, rng_state)
  return y


def add_residual(x_BxLxC: Array, residuals, layer: int) -> Array:
  """x plus residual `layer` [K, B, L, C] where there is one (layers past K get none): the
  policy interface's decoder additions (Qwen3-VL's DeepStack features)."""
  if residuals is None or layer >= residuals.shape[0]:
    return x_BxLxC
  return x_BxLxC + residuals[layer].astype(x_BxLxC.dtype)


def tied_logits(embed: nnx.Embed, hidden_BxLxC: Array) -> Array:
  """h E^T for a tied head, in the embedding's computation dtype, accumulated in float32."""
  table = embed.embedding[...]
  hidden = hidden_BxLxC.astype(embed.dtype or table.dtype)
  return jnp.einsum("...c,vc->...v", hidden, table.astype(hidden.dtype),
                    preferred_element_type=jnp.float32)


class TextModel(nnx.Module):
  """Embeddings, decoder layers, final norm and the LM head. Families with the same
  skeleton (Qwen3-VL) subclass it with their own `decoder_layer` and `rotary`."""

  decoder_layer = DecoderLayer
  norm_class = RMSNorm

  def __init__(self, config: TextConfig, *, rngs: nnx.Rngs, dtype=jnp.float32,
               param_dtype=jnp.float32, attention: str = "auto", remat: bool = False):
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
    return type(self).decoder_layer(config, **options)

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
    """cos, sin [B, L, head_dim] of the positions (Qwen2.5-VL's sectioned M-RoPE)."""
    c = self.config
    return mrope_cos_sin(position_ids_3xBxL, c.head_dim, c.rope_theta, c.mrope_section)

  def init_cache(self, batch: int, length: int, dtype=jnp.float32) -> list[tuple[Array, Array]]:
    """Zeroed (k, v) caches [B, S, KV, D] per layer; the cache dtype is a choice."""
    c = self.config
    shape = (batch, length, c.num_key_value_heads, c.head_dim)
    return [(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in self.layers]

  def extend(self, inputs_embeds_BxLxC: Array, position_ids_3xBxL: Array,
             cache_valid_BxS: Array, cache: list, index: Array, residuals=None):
    """Appends L positions at cache slot `index` ([] for every row, or [B] each row's own)
    and returns (hidden [B, L, C], cache).

    `cache_valid_BxS` marks the cache slots that hold real tokens once this segment is
    written (padding stays invalid); each new token attends to valid slots up to its own.
    `residuals` [K, B, L, C]: this segment's decoder additions (see `hidden_states`).
    """
    length = inputs_embeds_BxLxC.shape[1]
    slots = jnp.arange(cache_valid_BxS.shape[1])
    rows_index = jnp.broadcast_to(index, cache_valid_BxS.shape[:1])
    query_slot_BxL = rows_index[:, None] + jnp.arange(length)
    mask = (slots[None, None] <= query_slot_BxL[..., None]) & cache_valid_BxS.astype(bool)[:, None]
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
