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
from flax import nnx

from jaxspatial.models.attention import attention, check_implementation, write_cache
from jaxspatial.models.qwen2_5_vl import text as base
from jaxspatial.models.qwen2_5_vl.text import RMSNorm, linear
from jaxspatial.models.qwen3_vl.config import TextConfig
from jaxspatial.models.qwen3_vl.rope import apply_rotary, mrope_cos_sin

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


class TextModel(base.TextModel):
  """Embeddings, Qwen3 decoder layers, final norm and the LM head; the loop, cache, DeepStack
  residuals and logits are the shared decoder's (`qwen2_5_vl.text.TextModel`)."""

  decoder_layer = DecoderLayer

  def rotary(self, position_ids_3xBxL: Array) -> tuple[Array, Array]:
    """cos, sin of Qwen3-VL's interleaved M-RoPE."""
    c = self.config
    return mrope_cos_sin(position_ids_3xBxL, c.head_dim, c.rope_theta, c.mrope_section)
