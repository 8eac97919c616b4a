"""The Qwen3 text decoder of Qwen3-VL in Flax NNX.

Grouped-query attention with QK-norm (RMSNorm over each head's `head_dim` on queries and
keys, before the rotary), q / k / v / o biases only where `attention_bias` says, interleaved
M-RoPE, RMSNorm, SwiGLU MLP, tied or untied embeddings. DeepStack: `residuals[k]` (the
vision encoder's k-th DeepStack features placed at the image tokens, zero elsewhere) is
added to the hidden state after decoder layer k, as transformers adds them at the visual
positions. Numerics and attention paths as in `jaxspatial.models.qwen2_5_vl.text`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspatial.models.attention import attention, check_implementation
from jaxspatial.models.qwen2_5_vl.text import RMSNorm, linear, remat_call, tied_logits
from jaxspatial.models.qwen3_vl.config import TextConfig
from jaxspatial.models.qwen3_vl.rope import apply_rotary, mrope_cos_sin
from jaxspatial.models.sharding import logical_init

Array = jax.Array


class Attention(nnx.Module):
  def __init__(self, config: TextConfig, *, rngs: nnx.Rngs, dtype, param_dtype,
               implementation: str = "auto"):
    self.config = config
    self.implementation = check_implementation(implementation)
    d, h, kv = config.head_dim, config.num_attention_heads, config.num_key_value_heads
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype, use_bias=config.attention_bias)
    self.q_proj = linear(config.hidden_size, h * d, ("embed", "heads"), **kw)
    self.k_proj = linear(config.hidden_size, kv * d, ("embed", "kv_heads"), **kw)
    self.v_proj = linear(config.hidden_size, kv * d, ("embed", "kv_heads"), **kw)
    self.o_proj = linear(h * d, config.hidden_size, ("heads", "embed"), **kw)
    self.q_norm = RMSNorm(d, config.rms_norm_eps, param_dtype=param_dtype)
    self.k_norm = RMSNorm(d, config.rms_norm_eps, param_dtype=param_dtype)

  def __call__(self, x_BxLxC: Array, cos: Array, sin: Array, mask_BxLxS: Array,
               cache: tuple[Array, Array] | None = None, index: Array | None = None):
    """Without a cache: attention over x. With (k, v) caches [B, S, KV, D] and a write
    index: x's keys and values are written at [index, index + L) and x attends over the
    whole cache (mask [B, L, S]). Returns (out, cache)."""
    c = self.config
    b, length, _ = x_BxLxC.shape
    d, h, kv = c.head_dim, c.num_attention_heads, c.num_key_value_heads
    q = self.q_norm(self.q_proj(x_BxLxC).reshape(b, length, h, d))
    k = self.k_norm(self.k_proj(x_BxLxC).reshape(b, length, kv, d))
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    v = self.v_proj(x_BxLxC).reshape(b, length, kv, d)
    if cache is not None:
      k_cache, v_cache = cache
      k = jax.lax.dynamic_update_slice(k_cache, k.astype(k_cache.dtype), (0, index, 0, 0))
      v = jax.lax.dynamic_update_slice(v_cache, v.astype(v_cache.dtype), (0, index, 0, 0))
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


def _add_residual(x_BxLxC: Array, residuals, layer: int) -> Array:
  """x plus DeepStack residual `layer` where there is one (layers past K get none)."""
  if residuals is None or layer >= residuals.shape[0]:
    return x_BxLxC
  return x_BxLxC + residuals[layer].astype(x_BxLxC.dtype)


class TextModel(nnx.Module):
  """Embeddings, decoder layers, final norm and the LM head."""

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
    self.layers = nnx.List([DecoderLayer(config, rngs=rngs, dtype=dtype,
                                         param_dtype=param_dtype, attention=attention)
                            for _ in range(config.num_hidden_layers)])
    self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, param_dtype=param_dtype)
    self.lm_head = None if config.tie_word_embeddings else linear(
        config.hidden_size, config.vocab_size, ("embed", "vocab"), use_bias=False, dtype=dtype,
        param_dtype=param_dtype, rngs=rngs)

  def _cos_sin(self, position_ids_3xBxL: Array):
    c = self.config
    return mrope_cos_sin(position_ids_3xBxL, c.head_dim, c.rope_theta, c.mrope_section)

  def hidden_states(self, inputs_embeds_BxLxC: Array, position_ids_3xBxL: Array,
                    attention_mask_BxL: Array, residuals: Array | None = None) -> Array:
    """Final-norm hidden states [B, L, C] with causal and padding masks; `residuals`
    [K, B, L, C]: DeepStack features added after layers 0 .. K-1."""
    length = inputs_embeds_BxLxC.shape[1]
    causal = jnp.tril(jnp.ones((length, length), bool))
    mask = causal[None] & attention_mask_BxL.astype(bool)[:, None, :]
    cos, sin = self._cos_sin(position_ids_3xBxL)
    x = inputs_embeds_BxLxC
    for i, layer in enumerate(self.layers):
      if self.remat:  # activations inside the layer are recomputed for the gradient
        x = remat_call(layer, lambda layer, x: layer(x, cos, sin, mask)[0], x)
      else:
        x, _ = layer(x, cos, sin, mask)
      x = _add_residual(x, residuals, i)
    return self.norm(x)

  def init_cache(self, batch: int, length: int, dtype=jnp.float32) -> list[tuple[Array, Array]]:
    """Zeroed (k, v) caches [B, S, KV, D] per layer; the cache dtype is a choice."""
    c = self.config
    shape = (batch, length, c.num_key_value_heads, c.head_dim)
    return [(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in self.layers]

  def extend(self, inputs_embeds_BxLxC: Array, position_ids_3xBxL: Array,
             cache_valid_BxS: Array, cache: list, index: Array,
             residuals: Array | None = None):
    """Appends L positions at cache slot `index` and returns (hidden [B, L, C], cache).

    `cache_valid_BxS` marks the cache slots that hold real tokens once this segment is
    written (padding stays invalid); each new token attends to valid slots up to its own.
    `residuals` [K, B, L, C]: this segment's DeepStack features (see `hidden_states`).
    """
    length = inputs_embeds_BxLxC.shape[1]
    slots = jnp.arange(cache_valid_BxS.shape[1])
    query_slot = index + jnp.arange(length)
    mask = (slots[None, :] <= query_slot[:, None])[None] & cache_valid_BxS.astype(bool)[:, None]
    cos, sin = self._cos_sin(position_ids_3xBxL)
    x = inputs_embeds_BxLxC
    new_cache = []
    for i, (layer, layer_cache) in enumerate(zip(self.layers, cache)):
      x, layer_cache = layer(x, cos, sin, mask, layer_cache, index)
      x = _add_residual(x, residuals, i)
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
               attention_mask_BxL: Array, residuals: Array | None = None) -> Array:
    hidden = self.hidden_states(self.embed_tokens(input_ids_BxL), position_ids_3xBxL,
                                attention_mask_BxL, residuals)
    return self.logits(hidden)
