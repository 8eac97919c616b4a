"""The gated delta rule of Qwen3.5's linear-attention layers (Gated DeltaNet), in two forms,
and the short causal convolution in front of it.

Per value head, the state S [K, V] is a fast-weight memory. For each token t, with the gate
g_t <= 0 (log decay) and the write strength beta_t in (0, 1):

    S <- exp(g_t) S                      decay
    S <- S + k_t (beta_t (v_t - S^T k_t))^T   delta-rule write (the correction only)
    o_t = S^T q_t

`recurrent` runs that token by token (`lax.scan` over time): decode steps, and the reference
the other form is tested against. `chunked` is the parallel form for prefill and training:
within a chunk of C tokens, the delta-rule writes are solved at once with a unit lower-
triangular system (the UT transform of DeltaNet: (I + L) U = beta V, L_ij = beta_i k_i.k_j
exp(gamma_i - gamma_j) for j < i, gamma the in-chunk cumulative gate), inverted by
log2(C) matmul doublings (`unit_lower_inverse`); `lax.scan` then
carries the state across chunks with matmuls only. Both take the same inputs and give the
same outputs and final state.

Numerics: every input is cast to float32 and the kernel's matmuls run at HIGHEST precision
(the triangular system is badly conditioned under bf16 or TF32), so the state accumulates in
float32 whatever the model's computation dtype; the state is carried in float32 in the cache.

Masking: a token marked invalid (padding, or a slot an ended episode does not write) is the
identity on the state (gate 0, beta 0), and the convolution skips it (`causal_conv` reads the
last K - 1 valid inputs), so a sequence with holes gives what its valid tokens alone give.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array
HIGHEST = jax.lax.Precision.HIGHEST
FORMS = ("chunked", "recurrent")
CHUNK_SIZE = 64  # transformers' and the FLA kernels' chunk


def _mm(spec: str, *operands) -> Array:
  return jnp.einsum(spec, *operands, precision=HIGHEST, preferred_element_type=jnp.float32)


def l2_normalize(x: Array, eps: float = 1e-6) -> Array:
  """x / sqrt(sum(x^2) + eps) over the last axis (the FLA / transformers convention)."""
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def batch_parallel(x: Array) -> Array:
  """x laid out over the mesh's batch axes ('data', 'fsdp') only, when a mesh is set and the
  batch divides: the scans then carry per-device state with no collective inside the loop
  (GSPMD may otherwise split a head or key dimension and all-reduce every step, which on
  fake CPU devices can deadlock). The kernel's FLOPs are a small part of a layer's."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  axes = tuple(a for a in ("data", "fsdp") if a in mesh.axis_names and mesh.shape[a] > 1)
  size = 1
  for a in axes:
    size *= mesh.shape[a]
  spec = jax.sharding.PartitionSpec(axes if axes and x.shape[0] % size == 0 else None)
  return jax.lax.with_sharding_constraint(x, spec)


def recurrent(q_BxTxHxK: Array, k_BxTxHxK: Array, v_BxTxHxV: Array, g_BxTxH: Array,
              beta_BxTxH: Array, state_BxHxKxV: Array) -> tuple[Array, Array]:
  """Token by token. q, k, v, g, beta float32, q and k normalised (q scaled); returns
  (out [B, T, H, V], final state [B, H, K, V])."""
  def step(state, inputs):
    q, k, v, g, beta = inputs
    state = state * jnp.exp(g)[..., None, None]
    remembered = _mm("bhkv,bhk->bhv", state, k)
    delta = (v - remembered) * beta[..., None]
    state = state + k[..., :, None] * delta[..., None, :]
    return state, _mm("bhkv,bhk->bhv", state, q)

  time_major = [jnp.moveaxis(x, 1, 0) for x in (q_BxTxHxK, k_BxTxHxK, v_BxTxHxV, g_BxTxH,
                                                beta_BxTxH)]
  state, out = jax.lax.scan(step, state_BxHxKxV, time_major)
  return jnp.moveaxis(out, 0, 1), state


def chunked(q_BxTxHxK: Array, k_BxTxHxK: Array, v_BxTxHxV: Array, g_BxTxH: Array,
            beta_BxTxH: Array, state_BxHxKxV: Array,
            chunk_size: int = CHUNK_SIZE) -> tuple[Array, Array]:
  """Chunk-parallel: matmuls within each chunk of `chunk_size` tokens, `lax.scan` across
  chunks. Same inputs and outputs as `recurrent`; the length need not divide (the tail is
  padded with identity tokens)."""
  b, t, h, _ = q_BxTxHxK.shape
  c = chunk_size
  pad = -t % c
  n = (t + pad) // c

  def chunks(x):  # [B, T, H, ...] -> [N, B, H, C, ...]
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    x = x.reshape((b, n, c) + x.shape[2:])
    return jnp.moveaxis(jnp.moveaxis(x, 1, 0), 2, 3)

  q, k, v, g, beta = map(chunks, (q_BxTxHxK, k_BxTxHxK, v_BxTxHxV, g_BxTxH, beta_BxTxH))
  gamma = jnp.cumsum(g, axis=-1)                          # [N, B, H, C] log decay from start
  causal = jnp.tril(jnp.ones((c, c), bool))               # j <= i
  strictly = jnp.tril(jnp.ones((c, c), bool), -1)         # j < i
  gap = gamma[..., :, None] - gamma[..., None, :]         # gamma_i - gamma_j
  decay = jnp.exp(jnp.where(causal, gap, -jnp.inf))       # 0 above the diagonal: no overflow
  k_beta = k * beta[..., None]
  lower = jnp.where(strictly, _mm("...ik,...jk->...ij", k_beta, k) * decay, 0.0)
  inverse = unit_lower_inverse(lower)
  # The in-chunk writes: u = (I + L)^-1 beta v, and the decayed keys that read the state
  # carried in, w = (I + L)^-1 beta k exp(gamma).
  u = _mm("...ij,...jv->...iv", inverse, v * beta[..., None])
  w = _mm("...ij,...jk->...ik", inverse, k_beta * jnp.exp(gamma)[..., None])
  scores = _mm("...ik,...jk->...ij", q, k) * decay        # in-chunk attention, diagonal in
  q_decayed = q * jnp.exp(gamma)[..., None]
  k_decayed = k * jnp.exp(gamma[..., -1:] - gamma)[..., None]
  chunk_decay = jnp.exp(gamma[..., -1])

  def step(state, inputs):
    u, w, scores, q_decayed, k_decayed, chunk_decay = inputs
    written = u - _mm("bhck,bhkv->bhcv", w, state)
    out = _mm("bhck,bhkv->bhcv", q_decayed, state) + _mm("bhij,bhjv->bhiv", scores, written)
    state = state * chunk_decay[..., None, None] + _mm("bhck,bhcv->bhkv", k_decayed, written)
    return state, out

  state, out = jax.lax.scan(step, state_BxHxKxV,
                            (u, w, scores, q_decayed, k_decayed, chunk_decay))
  out = jnp.moveaxis(out, 3, 2)                           # [N, B, C, H, V]
  out = jnp.moveaxis(out, 0, 1).reshape((b, n * c, h, out.shape[-1]))
  return out[:, :t], state


def unit_lower_inverse(lower_CxC: Array) -> Array:
  """(I + L)^-1 for strictly lower-triangular L, by matmuls only: L is nilpotent, so the
  inverse is sum_n (-L)^n = (I - L)(I + L^2)(I + L^4)... (log2 C factors). No triangular
  solve: on the CPU that is a LAPACK call (an Act3D recipe run on the CPU stalled in a
  compiled rollout holding one; not reduced further), on accelerators a sequential kernel,
  where these are batched matmuls."""
  c = lower_CxC.shape[-1]
  eye = jnp.eye(c, dtype=jnp.float32)
  power = -lower_CxC
  inverse = eye + power
  for _ in range(max(0, (c - 1).bit_length() - 1)):
    power = _mm("...ij,...jk->...ik", power, power)
    inverse = _mm("...ij,...jk->...ik", inverse, eye + power)
  return inverse


def gated_delta_rule(q_BxTxHkxK: Array, k_BxTxHkxK: Array, v_BxTxHxV: Array, g_BxTxH: Array,
                     beta_BxTxH: Array, state_BxHxKxV: Array | None, valid_BxT: Array | None,
                     form: str = "chunked",
                     chunk_size: int = CHUNK_SIZE) -> tuple[Array, Array]:
  """transformers' `use_qk_l2norm_in_kernel=True` convention: q and k (Hk heads, each
  serving H / Hk consecutive value heads) are L2-normalised and q scaled by K^-1/2 here.
  Invalid tokens leave the state as it was. Returns (out [B, T, H, V] float32, state)."""
  if form not in FORMS:
    raise ValueError(f"gated delta rule form: expected one of {FORMS}, got {form!r}")
  heads, key_heads = v_BxTxHxV.shape[2], q_BxTxHkxK.shape[2]
  if heads % key_heads:
    raise ValueError(f"gated delta rule: {heads} value heads is not a multiple of "
                     f"{key_heads} key heads")
  f32 = lambda x: x.astype(jnp.float32)
  q, k = (jnp.repeat(l2_normalize(f32(x)), heads // key_heads, axis=2)
          for x in (q_BxTxHkxK, k_BxTxHkxK))
  q = q * q.shape[-1] ** -0.5
  v, g, beta = f32(v_BxTxHxV), f32(g_BxTxH), f32(beta_BxTxH)
  if valid_BxT is not None:
    valid = valid_BxT.astype(bool)[..., None]
    g, beta = jnp.where(valid, g, 0.0), jnp.where(valid, beta, 0.0)
  if state_BxHxKxV is None:
    b, _, _, dk = q.shape
    state_BxHxKxV = jnp.zeros((b, heads, dk, v.shape[-1]), jnp.float32)
  q, k, v, g, beta = map(batch_parallel, (q, k, v, g, beta))
  state = batch_parallel(f32(state_BxHxKxV))
  if form == "recurrent":
    return recurrent(q, k, v, g, beta, state)
  return chunked(q, k, v, g, beta, state, chunk_size)


def causal_conv(x_BxTxC: Array, weight_KxC: Array, valid_BxT: Array | None,
                state_BxJxC: Array | None) -> tuple[Array, Array]:
  """Depthwise causal convolution over the valid tokens: out_t = sum_k weight[k] *
  x[t - (K-1) + k] along the valid tokens only, the K - 1 inputs before the first taken from
  `state` (zeros for a fresh sequence). Returns (out [B, T, C] before the activation, the
  new state: the last K - 1 valid inputs). Outputs at invalid tokens are not meaningful."""
  b, t, c = x_BxTxC.shape
  j = weight_KxC.shape[0] - 1
  if state_BxJxC is None:
    state_BxJxC = jnp.zeros((b, j, c), x_BxTxC.dtype)
  sequence = jnp.concatenate([state_BxJxC.astype(x_BxTxC.dtype), x_BxTxC], axis=1)
  if valid_BxT is None:
    valid_BxT = jnp.ones((b, t), bool)
  taken = jnp.concatenate([jnp.ones((b, j), bool), valid_BxT.astype(bool)], axis=1)
  # Compact each row's valid inputs to the front (order kept), convolve, read back.
  rank = jnp.cumsum(taken, axis=1) - 1
  rows = jnp.arange(b)[:, None]
  compact = jnp.zeros_like(sequence).at[rows, jnp.where(taken, rank, j + t)].set(
      sequence, mode="drop")
  weight = weight_KxC.astype(jnp.float32)
  convolved = sum(compact[:, i:i + t].astype(jnp.float32) * weight[i] for i in range(j + 1))
  out = jnp.take_along_axis(convolved, jnp.clip(rank[:, j:] - j, 0, t - 1)[..., None], axis=1)
  total = jnp.sum(taken, axis=1)
  state = jnp.take_along_axis(compact, (total[:, None] - j + jnp.arange(j))[..., None], axis=1)
  return out.astype(x_BxTxC.dtype), state
