"""Cache attention block by block up to the fill equals softmax attention over every valid
slot (numpy), and a whole decode through a model equals the whole-capacity path."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspatial.models.attention import filled_attention

# the module (jaxspatial.models re-exports a function of the same name)
attention_lib = importlib.import_module("jaxspatial.models.attention")


def numpy_attention(q, k, v, mask):
  """[B, T, N, D] softmax attention, KV heads shared by N / K query heads, float64."""
  b, t, n, d = q.shape
  group = n // k.shape[2]
  k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
  scores = np.einsum("btnd,bsnd->bnts", q, k) / np.sqrt(d)
  scores = np.where(mask[:, None], scores, -np.inf)
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  return np.einsum("bnts,bsnd->btnd", probs, v)


@pytest.mark.parametrize("queries", [1, 5])
@pytest.mark.parametrize("top", [45, 70])  # the fill ends inside block 2, or in the last one
def test_blocks_up_to_the_fill_equal_softmax_over_the_valid_slots(queries, top):
  rng = np.random.default_rng(0)
  batch, capacity, heads, kv, d, block = 3, 77, 4, 2, 8, 16  # capacity not a multiple
  q = rng.normal(size=(batch, queries, heads, d)).astype(np.float32)
  k = rng.normal(size=(batch, capacity, kv, d)).astype(np.float32)
  v = rng.normal(size=(batch, capacity, kv, d)).astype(np.float32)
  index = np.array([3, 30, top - queries])  # each row's write slot
  slots = np.arange(capacity)
  query_slot = index[:, None] + np.arange(queries)
  valid = rng.random((batch, capacity)) < 0.8
  valid[np.arange(batch), index] = True  # a query sees at least itself
  mask = (slots[None, None] <= query_slot[..., None]) & valid[:, None]
  filled = int(index.max()) + queries
  got = jax.jit(filled_attention, static_argnums=5)(q, k, v, mask, jnp.int32(filled), block)
  np.testing.assert_allclose(got, numpy_attention(q, k, v, mask), rtol=2e-5, atol=2e-6)
  # Slots past the fill change nothing, and blocks past it are never read (NaN there would
  # reach the output: masked probabilities are zeros, and 0 x NaN is NaN).
  k[:, filled:], v[:, filled:] = 1e6, -1e6
  read = -(-filled // block) * block
  k[:, read:], v[:, read:] = np.nan, np.nan
  again = jax.jit(filled_attention, static_argnums=5)(q, k, v, mask, jnp.int32(filled), block)
  np.testing.assert_array_equal(again, got)


def test_a_greedy_generation_equals_the_whole_capacity_path(monkeypatch):
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from jaxspatial.models.qwen2_5_vl import (  # pylint: disable=import-outside-toplevel
      Qwen25VL, Qwen25VLConfig)
  from jaxspatial.models.sampler import (  # pylint: disable=import-outside-toplevel
      SamplingConfig, generate)
  model = Qwen25VL(Qwen25VLConfig.tiny(128), rngs=nnx.Rngs(0))
  rng = np.random.default_rng(1)
  ids = jnp.asarray(rng.integers(0, 100, (2, 40)), jnp.int32)
  mask = jnp.asarray(np.arange(40)[None] >= np.array([[0], [7]]))  # left padding
  config = SamplingConfig(max_new_tokens=60)  # capacity 100: blocks of 32, fill 40 -> 99
  run = lambda: jax.device_get(jax.jit(generate, static_argnums=4)(
      model, ids, mask, jax.random.key(0), config))
  monkeypatch.setattr(attention_lib, "DECODE_BLOCK", 32)
  blocked = run()
  monkeypatch.setattr(attention_lib, "DECODE_BLOCK", 0)
  whole = run()
  np.testing.assert_array_equal(blocked.tokens, whole.tokens)
  np.testing.assert_allclose(blocked.logprobs, whole.logprobs, rtol=1e-5, atol=1e-5)
