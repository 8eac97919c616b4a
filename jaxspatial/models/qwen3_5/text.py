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
gated norm (x_hat w). Attention paths and float32 norms: `jaxspatial.models.layers`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspatial.models import layers
from jaxspatial.models.decoder import TextDecoder
from jaxspatial.models.layers import linear
from jaxspatial.models.qwen3_5 import delta_rule
from jaxspatial.models.qwen3_5.config import TextConfig
from jaxspatial.models.qwen3_vl.rope import mrope_cos_sin
from jaxspatial.models.sharding import logical_init

Array = jax.Array


class RMSNorm(layers.RMSNorm):
  """Zero-centred: x_hat (1 + w), weights from 0 (transformers' Qwen3_5RMSNorm)."""

  def __init__(self, size: int, eps: float, *, param_dtype=jnp.float32):
    super().__init__(size, eps, param_dtype=param_dtype, zero_centred=True)


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


class GatedAttention(layers.Attention):
  """Qwen3.5's full attention: QK-norm (zero-centred), the output gate from q_proj's second
  half, interleaved M-RoPE on the first `rotary_dim` of each head."""

  def __init__(self, config: TextConfig, **options):
    super().__init__(config, bias=(config.attention_bias,) * 2, norm=RMSNorm, gated=True,
                     rotary_dim=config.rotary_dim, **options)


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


class DecoderLayer(layers.DecoderLayer):
  """`kind` "linear_attention": a GatedDeltaNet (`linear_attn`), else gated attention
  (`self_attn`); zero-centred norms."""

  norm_class = RMSNorm

  def __init__(self, config: TextConfig, kind: str, **options):
    self.kind = kind
    super().__init__(config, GatedAttention, **options)

  def add_mixer(self, config, attention_class, implementation: str, kw: dict) -> None:
    if self.kind == "linear_attention":
      self.linear_attn = GatedDeltaNet(config, **kw)
    else:
      super().add_mixer(config, attention_class, implementation, kw)

  def mix(self, x, cos, sin, mask, cache, index):
    """`mask`: (attention mask [B, L, S], this segment's valid tokens [B, L])."""
    attention_mask, valid = mask
    if self.kind == "linear_attention":
      return self.linear_attn(x, valid, cache)
    return self.self_attn(x, cos, sin, attention_mask, cache, index)


class TextModel(TextDecoder):
  """Embeddings, hybrid decoder layers, final (zero-centred) norm and the LM head; the loop,
  residuals and logits are the shared decoder's (`jaxspatial.models.decoder`)."""

  norm_class = RMSNorm
  mrope_cos_sin = staticmethod(mrope_cos_sin)

  def new_layer(self, index: int, config, **options) -> DecoderLayer:
    return DecoderLayer(config, config.layer_types[index], **options)

  def layer_mask(self, mask_BxLxS: Array, valid_BxL: Array):
    return mask_BxLxS, valid_BxL

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
