"""Attention for prefill and training: `jax.nn.dot_product_attention` with the backend's
fused kernel where it exists (cuDNN flash attention on GPU in bf16 / fp16), the einsum path
elsewhere. Attention over a KV cache (a decode step, and a segment on the einsum path) reads
the cache block by block up to its last written slot (`filled_attention`), not its capacity.

Implementations, by name:
  "einsum"  grouped-query einsum, float32 scores and softmax (the reference)
  "xla"     `jax.nn.dot_product_attention(implementation="xla")`
  "cudnn"   `jax.nn.dot_product_attention(implementation="cudnn")`: GPU, bf16 / fp16 only
  "auto"    "cudnn" on a GPU when the computation dtype is bf16 / fp16, else "einsum"
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array
IMPLEMENTATIONS = ("auto", "einsum", "xla", "cudnn")
_FUSED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def check_implementation(name: str) -> str:
  if name not in IMPLEMENTATIONS:
    raise ValueError(f"attention implementation: expected one of {IMPLEMENTATIONS}, got {name!r}")
  return name


def resolve(name: str, dtype) -> str:
  """The implementation `name` runs as for a computation in `dtype` on this backend."""
  check_implementation(name)
  if name == "auto":
    fused = jax.default_backend() == "gpu" and jnp.dtype(dtype) in _FUSED_DTYPES
    return "cudnn" if fused else "einsum"
  if name == "cudnn" and jnp.dtype(dtype) not in _FUSED_DTYPES:
    raise ValueError(f"attention 'cudnn' runs in bfloat16 or float16, not {jnp.dtype(dtype)}; "
                     "set model.dtype=bfloat16 or attention 'auto'")
  return name


def write_cache(cache_BxSxKxD: Array, new_BxLxKxD: Array, index: Array) -> Array:
  """The cache with `new` written at slots [index, index + L): `index` [] for every row, or
  [B] a slot per row (continuous batching: each row has its own fill)."""
  new = new_BxLxKxD.astype(cache_BxSxKxD.dtype)
  if jnp.ndim(index) == 0:
    return jax.lax.dynamic_update_slice(cache_BxSxKxD, new, (0, index, 0, 0))
  return jax.vmap(lambda row, x, at: jax.lax.dynamic_update_slice(row, x, (at, 0, 0)))(
      cache_BxSxKxD, new, index)


def einsum_attention(q_BxTxNxD: Array, k_BxSxKxD: Array, v_BxSxKxD: Array,
                     mask_BxTxS: Array) -> Array:
  """Grouped-query attention with float32 scores; masked-out keys get float32's minimum (a
  row with no valid key attends uniformly: its output is ignored downstream)."""
  b, t, n, d = q_BxTxNxD.shape
  kv = k_BxSxKxD.shape[2]
  q = q_BxTxNxD.reshape(b, t, kv, n // kv, d)  # query heads grouped by their KV head
  scores = jnp.einsum("btkgd,bskd->bkgts", q, k_BxSxKxD.astype(q.dtype),
                      preferred_element_type=jnp.float32) / jnp.sqrt(jnp.float32(d))
  scores = jnp.where(mask_BxTxS[:, None, None], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
  out = jnp.einsum("bkgts,bskd->btkgd", probs, v_BxSxKxD.astype(q.dtype))
  return out.reshape(b, t, n, d)


# Cache attention reads the cache block by block up to its fill (`filled_attention`): a
# decode step early in a rollout, whose cache is sized for the whole episode, does not
# pay for the empty slots (benchmarks/decode_bench.py). 0: the whole capacity every step.
# A `lax.switch` over a few static prefix lengths (the shortest holding the fill) was measured
# against this loop on a 2-core CPU and lost: Think3D's :cpu rollout 209 against 181 ms,
# decode_bench's batch 32 in 1,024 slots 28.4 against 22.3 ms a step.
DECODE_BLOCK = 128


def decode_block() -> int:
  """`DECODE_BLOCK`, read when a program is traced."""
  return DECODE_BLOCK


def filled_attention(q_BxTxNxD: Array, k_BxSxKxD: Array, v_BxSxKxD: Array,
                     mask_BxTxS: Array, filled: Array, block: int) -> Array:
  """`einsum_attention` over the cache's first `filled` slots only (traced; keys at or past
  it must be masked out): a loop over `block`-slot blocks with a running softmax, so a
  decode step's work follows the cache's fill, not its capacity. A row with no valid key
  gets zeros (its output is ignored downstream)."""
  b, t, n, d = q_BxTxNxD.shape
  s, kv = k_BxSxKxD.shape[1], k_BxSxKxD.shape[2]
  g = n // kv
  q = q_BxTxNxD.reshape(b, t, kv, g, d)
  scale = 1.0 / jnp.sqrt(jnp.float32(d))
  blocks = -(-s // block)
  lowest = jnp.finfo(jnp.float32).min

  def body(j, carry):
    peak, total, acc = carry
    # The last block ends at the capacity (its start clamped); slots an earlier block
    # already read are masked out.
    start = jnp.minimum(j * block, s - block)
    k = jax.lax.dynamic_slice_in_dim(k_BxSxKxD, start, block, 1).astype(q.dtype)
    v = jax.lax.dynamic_slice_in_dim(v_BxSxKxD, start, block, 1).astype(q.dtype)
    mask = jax.lax.dynamic_slice_in_dim(mask_BxTxS, start, block, 2)
    mask = mask & ((start + jnp.arange(block)) >= j * block)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32) * scale
    scores = jnp.where(mask[:, None, None], scores, lowest)
    new_peak = jnp.maximum(peak, scores.max(-1))
    probs = jnp.where(mask[:, None, None], jnp.exp(scores - new_peak[..., None]), 0.0)
    decay = jnp.exp(peak - new_peak)
    total = total * decay + probs.sum(-1)
    acc = acc * decay[..., None] + jnp.einsum("bkgts,bskd->bkgtd", probs.astype(q.dtype), v,
                                              preferred_element_type=jnp.float32)
    return new_peak, total, acc

  init = (jnp.full((b, kv, g, t), lowest, jnp.float32), jnp.zeros((b, kv, g, t), jnp.float32),
          jnp.zeros((b, kv, g, t, d), jnp.float32))
  used = jnp.minimum(-(-filled // block), blocks)
  _, total, acc = jax.lax.fori_loop(0, used, body, init)
  out = acc / jnp.maximum(total, jnp.finfo(jnp.float32).tiny)[..., None]
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, n, d).astype(q.dtype)


def attention(q_BxTxNxD: Array, k_BxSxKxD: Array, v_BxSxKxD: Array,
              mask_BxTxS: Array | None = None, implementation: str = "einsum",
              lengths_B: Array | None = None) -> Array:
  """[B, T, N, D] attention of T queries over S keys (N query heads, K = N / g KV heads).
  Either `mask` [B, T, S] (True where a query may attend a key) or `lengths` [B] int32
  (sequences packed at the front: the first lengths[b] queries and keys are real; the
  fused kernels then need no mask tensor). Keys and values are cast to the queries' dtype
  (a float32 cache under a bf16 computation)."""
  name = resolve(implementation, q_BxTxNxD.dtype)
  if (mask_BxTxS is None) == (lengths_B is None):
    raise ValueError("attention: pass exactly one of a mask and sequence lengths")
  if name == "einsum" or q_BxTxNxD.shape[1] == 1:
    if mask_BxTxS is None:
      keys = jnp.arange(k_BxSxKxD.shape[1])
      mask_BxTxS = jnp.broadcast_to((keys[None] < lengths_B[:, None])[:, None],
                                    (q_BxTxNxD.shape[0], q_BxTxNxD.shape[1], keys.shape[0]))
    return einsum_attention(q_BxTxNxD, k_BxSxKxD, v_BxSxKxD, mask_BxTxS)
  k = k_BxSxKxD.astype(q_BxTxNxD.dtype)
  v = v_BxSxKxD.astype(q_BxTxNxD.dtype)
  if lengths_B is not None:
    lengths = lengths_B.astype(jnp.int32)
    return jax.nn.dot_product_attention(q_BxTxNxD, k, v, query_seq_lengths=lengths,
                                        key_value_seq_lengths=lengths, implementation=name)
  return jax.nn.dot_product_attention(q_BxTxNxD, k, v, mask=mask_BxTxS[:, None].astype(bool),
                                      implementation=name)
