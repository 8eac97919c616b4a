"""The hybrid text decoder of Qwen3.5 in Flax NNX.

Each layer is pre-norm, a token mixer then a SwiGLU MLP. The mixer is, as `layer_types`
says, either
  - Gated DeltaNet (`GatedDeltaNet`): q / k / v from one projection through a short causal
    depthwise convolution and SiLU, per-head gates g = -exp(A_log) softplus(a + dt_bias) and
    write strengths beta = sigmoid(b), the gated delta rule (`delta_rule`), an RMSNorm of
    each head's output gated by SiLU(z), and an output projection; its cache is the last
    K - 1 convolution inputs and the [H, K, V] state, constant in sequence length;
  - gated attention (`GatedAttention`): grouped-query attention with QK-norm, interleaved
    M-RoPE on the first `rotary_dim` of each head, and the output multiplied by
    sigmoid(gate), the gate being the second half of each head's q_proj rows; its cache is
    keys and values, as the other families'.
RMSNorms are zero-centred (x_hat (1 + w), weights initialised to 0), except the DeltaNet's
gated norm (x_hat w). Attention paths and float32 norms as `qwen2_5_vl.text`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspatial.models.attention import attention, check_implementation, write_cache
from jaxspatial.models.qwen2_5_vl import text as base
from jaxspatial.models.qwen2_5_vl.text import MLP, linear
from jaxspatial.models.qwen3_5 import delta_rule
from jaxspatial.models.qwen3_5.config import TextConfig
from jaxspatial.models.qwen3_vl.rope import apply_rotary, mrope_cos_sin
from jaxspatial.models.sharding import logical_init

Array = jax.Array


class RMSNorm(nnx.Module):
  """Zero-centred RMSNorm: x_hat (1 + w) in float32, cast back (transformers' Qwen3_5RMSNorm)."""

  def __init__(self, size: int, eps: float, *, param_dtype=jnp.float32):
    self.weight = nnx.Param(jnp.zeros((size,), param_dtype))
    self.eps = eps

  def __call__(self, x: Array) -> Array:
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (normed * (1.0 + self.weight[...].astype(jnp.float32))).astype(x.dtype)


class GatedRMSNorm(nnx.Module):
  """RMSNorm of each head's output, times w, times SiLU(gate) (Qwen3_5RMSNormGated)."""

  def __init__(self, size: int, eps: float, *, param_dtype=jnp.float32):
    self.weight = nnx.Param(jnp.ones((size,), param_dtype))
    self.eps = eps

  def __call__(self, x: Array, gate: Array) -> Array:
    x32 = x.astype(jnp.float32)
    normed = (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
              ).astype(x.dtype)
    out = self.weight[...] * normed
    return (out * jax.nn.silu(gate.astype(jnp.float32))).astype(x.dtype)


class GatedAttention(nnx.Module):
  def __init__(self, config: TextConfig, *, rngs: nnx.Rngs, dtype, param_dtype,
               implementation: str = "auto"):
    self.config = config
    self.implementation = check_implementation(implementation)
    d, h, kv = config.head_dim, config.num_attention_heads, config.num_key_value_heads
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype, use_bias=config.attention_bias)
    self.q_proj = linear(config.hidden_size, 2 * h * d, ("embed", "heads"), **kw)
    self.k_proj = linear(config.hidden_size, kv * d, ("embed", "kv_heads"), **kw)
    self.v_proj = linear(config.hidden_size, kv * d, ("embed", "kv_heads"), **kw)
    self.o_proj = linear(h * d, config.hidden_size, ("heads", "embed"), **kw)
    self.q_norm = RMSNorm(d, config.rms_norm_eps, param_dtype=param_dtype)
    self.k_norm = RMSNorm(d, config.rms_norm_eps, param_dtype=param_dtype)

  def __call__(self, x_BxLxC: Array, cos: Array, sin: Array, mask_BxLxS: Array,
               cache: tuple[Array, Array] | None = None, index: Array | None = None):
    """As the other families' attention (cache [B, S, KV, D] written at `index`), with the
    output gate and the partial rotary. Returns (out, cache)."""
    c = self.config
    b, length, _ = x_BxLxC.shape
    d, h, kv, r = c.head_dim, c.num_attention_heads, c.num_key_value_heads, c.rotary_dim
    query_gate = self.q_proj(x_BxLxC).reshape(b, length, h, 2 * d)
    q, gate = self.q_norm(query_gate[..., :d]), query_gate[..., d:].reshape(b, length, h * d)
    k = self.k_norm(self.k_proj(x_BxLxC).reshape(b, length, kv, d))
    turn = lambda x: jnp.concatenate([apply_rotary(x[..., :r], cos, sin), x[..., r:]], -1)
    q, k = turn(q), turn(k)
    v = self.v_proj(x_BxLxC).reshape(b, length, kv, d)
    if cache is not None:
      k_cache, v_cache = cache
      k, v = write_cache(k_cache, k, index), write_cache(v_cache, v, index)
      cache = (k, v)
    out = attention(q, k, v, mask_BxLxS, self.implementation).reshape(b, length, h * d)
    out = out.astype(x_BxLxC.dtype) * jax.nn.sigmoid(gate)
    return self.o_proj(out), cache


class GatedDeltaNet(nnx.Module):
  """Linear attention with the gated delta rule. `form`: "chunked" or "recurrent"
  (`delta_rule`); None picks the recurrent form for one-token steps, chunked otherwise."""

  def __init__(self, config: TextConfig, *, rngs: nnx.Rngs, dtype, param_dtype,
               chunk_size: int = delta_rule.CHUNK_SIZE):
    self.config = config
    self.chunk_size = chunk_size
    c = config
    heads = c.linear_num_value_heads
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype, use_bias=False)
    self.in_proj_qkv = linear(c.hidden_size, c.conv_dim, ("embed", "heads"), **kw)
    self.in_proj_z = linear(c.hidden_size, c.value_dim, ("embed", "heads"), **kw)
    self.in_proj_b = linear(c.hidden_size, heads, ("embed", None), **kw)
    self.in_proj_a = linear(c.hidden_size, heads, ("embed", None), **kw)
    self.out_proj = linear(c.value_dim, c.hidden_size, ("heads", "embed"), **kw)
    conv_init = logical_init(nnx.initializers.lecun_normal(), (None, "heads"))
    self.conv_weight = nnx.Param(conv_init(rngs.params(), (c.linear_conv_kernel_dim,
                                                           c.conv_dim), param_dtype))
    self.dt_bias = nnx.Param(jnp.ones((heads,), param_dtype))
    self.A_log = nnx.Param(jnp.log(jax.random.uniform(rngs.params(), (heads,), param_dtype,
                                                      0.01, 16.0)))
    self.norm = GatedRMSNorm(c.linear_value_head_dim, c.rms_norm_eps, param_dtype=param_dtype)

  def __call__(self, x_BxLxC: Array, valid_BxL: Array | None = None, cache=None,
               form: str | None = None):
    """Returns (out [B, L, C], cache (conv inputs [B, K-1, conv_dim], state [B, H, K, V]
    float32)). Invalid tokens leave the cache as it was."""
    c = self.config
    b, length, _ = x_BxLxC.shape
    conv_state, state = cache if cache is not None else (None, None)
    mixed, conv_state = delta_rule.causal_conv(self.in_proj_qkv(x_BxLxC), self.conv_weight[...],
                                               valid_BxL, conv_state)
    mixed = jax.nn.silu(mixed)
    key_dim = c.linear_num_key_heads * c.linear_key_head_dim
    q = mixed[..., :key_dim].reshape(b, length, c.linear_num_key_heads, c.linear_key_head_dim)
    k = mixed[..., key_dim:2 * key_dim].reshape(q.shape)
    v = mixed[..., 2 * key_dim:].reshape(b, length, c.linear_num_value_heads,
                                         c.linear_value_head_dim)
    beta = jax.nn.sigmoid(self.in_proj_b(x_BxLxC).astype(jnp.float32))
    g = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(
        self.in_proj_a(x_BxLxC).astype(jnp.float32) + self.dt_bias[...].astype(jnp.float32))
    form = form or ("recurrent" if length == 1 else "chunked")
    out, state = delta_rule.gated_delta_rule(q, k, v, g, beta, state, valid_BxL, form,
                                             self.chunk_size)
    z = self.in_proj_z(x_BxLxC).reshape(b, length, c.linear_num_value_heads,
                                        c.linear_value_head_dim)
    out = self.norm(out.astype(x_BxLxC.dtype), z).reshape(b, length, c.value_dim)
    if cache is not None:
      cache = (conv_state.astype(cache[0].dtype), state)
    return self.out_proj(out), cache


class DecoderLayer(nnx.Module):
  def __init__(self, config: TextConfig, kind: str, *, rngs: nnx.Rngs, dtype, param_dtype,
               attention: str = "auto"):
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.kind = kind
    if kind == "linear_attention":
      self.linear_attn = GatedDeltaNet(config, **kw)
    else:
      self.self_attn = GatedAttention(config, implementation=attention, **kw)
    self.mlp = MLP(config, **kw)
    self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps,
                                   param_dtype=param_dtype)
    self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps,
                                            param_dtype=param_dtype)

  def __call__(self, x, cos, sin, mask, cache=None, index=None):
    """`mask`: (attention mask [B, L, S], this segment's valid tokens [B, L])."""
    attention_mask, valid = mask
    normed = self.input_layernorm(x)
    if self.kind == "linear_attention":
      mixed, cache = self.linear_attn(normed, valid, cache)
    else:
      mixed, cache = self.self_attn(normed, cos, sin, attention_mask, cache, index)
    x = x + mixed
    return x + self.mlp(self.post_attention_layernorm(x)), cache


class TextModel(base.TextModel):
  """Embeddings, hybrid decoder layers, final (zero-centred) norm and the LM head; the loop,
  residuals and logits are the shared decoder's (`qwen2_5_vl.text.TextModel`)."""

  norm_class = RMSNorm

  def new_layer(self, index: int, config, **options) -> DecoderLayer:
    return DecoderLayer(config, config.layer_types[index], **options)

  def layer_mask(self, mask_BxLxS: Array, valid_BxL: Array):
    return mask_BxLxS, valid_BxL

  def rotary(self, position_ids_3xBxL: Array) -> tuple[Array, Array]:
    """cos, sin [B, L, rotary_dim] of the interleaved M-RoPE (the partial rotary's)."""
    c = self.config
    return mrope_cos_sin(position_ids_3xBxL, c.rotary_dim, c.rope_theta, c.mrope_section)

  def init_cache(self, batch: int, length: int, dtype=jnp.float32) -> list:
    """Per layer: full attention, zeroed (k, v) [B, S, KV, D] in `dtype`; Gated DeltaNet,
    (conv inputs [B, K-1, conv_dim] in `dtype`, state [B, H, K, V] float32), whatever S."""
    c = self.config
    out = []
    for kind in c.layer_types:
      if kind == "linear_attention":
        out.append((jnp.zeros((batch, c.linear_conv_kernel_dim - 1, c.conv_dim), dtype),
                    jnp.zeros((batch, c.linear_num_value_heads, c.linear_key_head_dim,
                               c.linear_value_head_dim), jnp.float32)))
      else:
        shape = (batch, length, c.num_key_value_heads, c.head_dim)
        out.append((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)))
    return out
