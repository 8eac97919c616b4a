"""The layers the Qwen-VL families share: the logical-axis linear, RMSNorm, the SwiGLU MLP,
grouped-query attention over a (k, v) cache, the pre-norm decoder layer, and the helpers
around them (remat, decoder residuals, a tied head's logits).

Norms, attention scores, softmax and logits run in float32 whatever the computation dtype;
prefill and training attention go through `jaxspatial.models.attention` (cuDNN flash
attention on GPU), decode through the einsum path over the cache.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspatial.models.attention import (attention, check_implementation, decode_block,
                                        filled_attention, resolve, write_cache)
from jaxspatial.models.rope import apply_rotary
from jaxspatial.models.sharding import logical_init

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
  """x_hat w in float32, cast back; `zero_centred`: x_hat (1 + w), weights from 0 (Qwen3.5)."""

  def __init__(self, size: int, eps: float, *, param_dtype=jnp.float32,
               zero_centred: bool = False):
    self.weight = nnx.Param((jnp.zeros if zero_centred else jnp.ones)((size,), param_dtype))
    self.eps = eps
    self.zero_centred = zero_centred

  def __call__(self, x: Array) -> Array:
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    if self.zero_centred:
      return (normed * (1.0 + self.weight[...].astype(jnp.float32))).astype(x.dtype)
    return (self.weight[...] * normed).astype(x.dtype)


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) * up(x)), over a config's hidden and intermediate sizes."""

  def __init__(self, config, *, rngs: nnx.Rngs, dtype, param_dtype, use_bias: bool = False):
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype, use_bias=use_bias)
    self.gate_proj = linear(config.hidden_size, config.intermediate_size, ("embed", "mlp"), **kw)
    self.up_proj = linear(config.hidden_size, config.intermediate_size, ("embed", "mlp"), **kw)
    self.down_proj = linear(config.intermediate_size, config.hidden_size, ("mlp", "embed"), **kw)

  def __call__(self, x: Array) -> Array:
    return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


def attend(q: Array, k: Array, v: Array, mask_BxLxS: Array, implementation: str,
           cache: tuple[Array, Array] | None, index: Array | None):
  """(attention output [B, L, H, D], cache). With (k, v) caches [B, S, KV, D], k and v are
  first written at [index, index + L) and the queries attend over the cache's first slots
  the mask covers (a prefill's own), or over its blocks up to the last slot written
  (`filled_attention`) where the einsum path would read the whole capacity."""
  if cache is not None:
    k_cache, v_cache = cache
    k, v = write_cache(k_cache, k, index), write_cache(v_cache, v, index)
    cache = (k, v)
    keys = mask_BxLxS.shape[-1]
    block = decode_block()
    if (0 < block < keys == k.shape[1]
        and (q.shape[1] == 1 or resolve(implementation, q.dtype) == "einsum")):
      filled = jnp.max(index) + q.shape[1]  # no query reads a slot at or past it
      return filled_attention(q, k, v, mask_BxLxS, filled, block), cache
    k, v = k[:, :keys], v[:, :keys]
  return attention(q, k, v, mask_BxLxS, implementation), cache


class Attention(nnx.Module):
  """Grouped-query attention with M-RoPE on the first `rotary_dim` of each head (default:
  all of it). `bias`: (q / k / v, o) projection biases; `norm`: the QK-norm's class (None:
  no QK-norm); `gated`: q_proj is twice as wide, its second half gating the output through
  a sigmoid (Qwen3.5)."""

  def __init__(self, config, *, rngs: nnx.Rngs, dtype, param_dtype, implementation: str = "auto",
               bias: tuple[bool, bool] = (False, False), norm=None, gated: bool = False,
               rotary_dim: int | None = None):
    self.config = config
    self.implementation = check_implementation(implementation)
    self.gated = gated
    self.rotary_dim = rotary_dim or config.head_dim
    d, h, kv = config.head_dim, config.num_attention_heads, config.num_key_value_heads
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    c, q_rows = config.hidden_size, (2 if gated else 1) * h * d
    self.q_proj = linear(c, q_rows, ("embed", "heads"), use_bias=bias[0], **kw)
    self.k_proj = linear(c, kv * d, ("embed", "kv_heads"), use_bias=bias[0], **kw)
    self.v_proj = linear(c, kv * d, ("embed", "kv_heads"), use_bias=bias[0], **kw)
    self.o_proj = linear(h * d, c, ("heads", "embed"), use_bias=bias[1], **kw)
    make_norm = (lambda: None) if norm is None else (
        lambda: norm(d, config.rms_norm_eps, param_dtype=param_dtype))
    self.q_norm, self.k_norm = make_norm(), make_norm()

  def rotate(self, x: Array, cos: Array, sin: Array) -> Array:
    r = self.rotary_dim
    if r == x.shape[-1]:
      return apply_rotary(x, cos, sin)
    return jnp.concatenate([apply_rotary(x[..., :r], cos, sin), x[..., r:]], -1)

  def __call__(self, x_BxLxC: Array, cos: Array, sin: Array, mask_BxLxS: Array,
               cache: tuple[Array, Array] | None = None, index: Array | None = None):
    """Without a cache: attention over x. With (k, v) caches [B, S, KV, D] and a write
    index: x's keys and values are written at [index, index + L) and x attends over the
    whole cache (mask [B, L, S]). Returns (out, cache)."""
    c = self.config
    b, length, _ = x_BxLxC.shape
    d, h, kv = c.head_dim, c.num_attention_heads, c.num_key_value_heads
    q = self.q_proj(x_BxLxC).reshape(b, length, h, -1)
    gate = None
    if self.gated:
      q, gate = q[..., :d], q[..., d:].reshape(b, length, h * d)
    k = self.k_proj(x_BxLxC).reshape(b, length, kv, d)
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
    v = self.v_proj(x_BxLxC).reshape(b, length, kv, d)
    out, cache = attend(q, k, v, mask_BxLxS, self.implementation, cache, index)
    out = out.reshape(b, length, h * d).astype(x_BxLxC.dtype)
    if gate is not None:
      out = out * jax.nn.sigmoid(gate)
    return self.o_proj(out), cache


class DecoderLayer(nnx.Module):
  """Pre-norm residual layer: a token mixer (`self_attn`, an `attention_class`), then the
  SwiGLU MLP; norms of the class's `norm_class`."""

  norm_class = RMSNorm

  def __init__(self, config, attention_class, *, rngs: nnx.Rngs, dtype, param_dtype,
               attention: str = "auto"):
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.add_mixer(config, attention_class, attention, kw)
    self.mlp = MLP(config, **kw)
    norm = type(self).norm_class
    self.input_layernorm = norm(config.hidden_size, config.rms_norm_eps,
                                param_dtype=param_dtype)
    self.post_attention_layernorm = norm(config.hidden_size, config.rms_norm_eps,
                                         param_dtype=param_dtype)

  def add_mixer(self, config, attention_class, implementation: str, kw: dict) -> None:
    self.self_attn = attention_class(config, implementation=implementation, **kw)

  def mix(self, x, cos, sin, mask, cache, index):
    """The mixer on the normed input: (out, cache)."""
    return self.self_attn(x, cos, sin, mask, cache, index)

  def __call__(self, x, cos, sin, mask, cache=None, index=None):
    mixed, cache = self.mix(self.input_layernorm(x), cos, sin, mask, cache, index)
    x = x + mixed
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
