"""Cache reuse across a conversation's requests: a multi-step agent (SpatialClaw) sends its
whole history every step, and the history only grows, so each request's prompt starts
with an earlier request's prompt. The cache that prompt left (batch 1, `sampler.prefill`)
is kept; the next request appends only what is new (`sampler.append`: the previous reply
as the chat template rendered it, the feedback, new images) and decodes from there.

Matching is on token ids and on the images' bytes: an entry serves a prompt when its ids
are a proper prefix of the prompt's and its images are the prompt's first images. A
history rewritten before its end (condensed failed steps) misses and is prefilled whole.
Shapes are bucketed: a new segment is right-padded to a power of two (`append`'s
`real_length`: the padding is invalid slots the next write goes over, so a conversation's
cache holds its tokens without gaps), a fresh cache gets
`growth` times what the prompt and reply need, rounded to a power of two, so a
conversation appends into one cache until it is full and is then prefilled into a larger
one. Entries are dropped least recently used past `entries` (the cache memory is entries x
capacity x the family's cache per token).

Requests run one at a time, at batch 1 (rows with different cache fills cannot share one
cache write); the Batcher is the other way: concurrent requests as one batch, each
prefilled whole.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import threading

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspatial.models.sampler import SamplingConfig, append, decode, prefill
from jaxspatial.serving.engine import Engine, Sampling, next_power
from jaxspatial.serving.prompt import Prompt


# Over the engine's split state, as the engine's own program (nothing written back).
@functools.partial(jax.jit, static_argnames=("graphdef", "capacity", "dtype", "grids"))
def _prefill(graphdef, params, ids, mask, real, pixels, sequence_grids, capacity, dtype,
             grids):
  return prefill(nnx.merge(graphdef, params), ids, mask, capacity, jnp.dtype(dtype), pixels,
                 grids, sequence_grids, real_length=real)


@functools.partial(jax.jit, static_argnames=("graphdef", "grids"))
def _append(graphdef, params, state, ids, mask, real, pixels, sequence_grids, grids):
  state, logits = append(nnx.merge(graphdef, params), state, ids, mask, pixels, grids,
                         sequence_grids, real_length=real)
  return state, jax.lax.dynamic_index_in_dim(logits, real - 1, 1, keepdims=False)


@functools.partial(jax.jit, static_argnames=("graphdef", "config"))
def _decode(graphdef, params, state, logits, key, config):
  return decode(nnx.merge(graphdef, params), state, logits, key, config).tokens


def image_digest(image: np.ndarray) -> bytes:
  image = np.ascontiguousarray(image)
  return hashlib.blake2b(repr((image.shape, image.dtype.str)).encode() + image.tobytes(),
                         digest_size=16).digest()


@dataclasses.dataclass(eq=False)
class _Entry:
  ids: np.ndarray        # [n] the prompt the cache holds
  digests: tuple         # its images' digests, in order
  state: object          # sampler.DecodeState, batch 1
  logits: jax.Array      # [1, V] at the prompt's last position
  slots: int             # cache slots the prompt holds (its padding is written over next)
  capacity: int
  used: int              # request counter when last used (LRU)


class PrefixCache:
  """Generates for prompts of `engine`'s policy, reusing the cache of an earlier prompt
  that the new one extends (see the module doc)."""

  def __init__(self, engine: Engine, entries: int = 8, growth: float = 2.0,
               min_capacity: int = 1024, min_segment: int = 32):
    if entries < 1 or growth < 1:
      raise ValueError(f"PrefixCache: entries >= 1 and growth >= 1 expected, got "
                       f"entries={entries}, growth={growth}")
    self.engine, self.entries, self.growth = engine, int(entries), float(growth)
    self.min_capacity, self.min_segment = int(min_capacity), int(min_segment)
    self._entries: list[_Entry] = []
    self._lock = threading.Lock()
    self._counts = {"requests": 0, "hits": 0, "prefilled_tokens": 0, "reused_tokens": 0}

  def stats(self) -> dict:
    """requests, hits (requests that appended to a kept cache), prefilled_tokens (prompt
    tokens run through the model), reused_tokens (prompt tokens read from a kept cache),
    entries."""
    with self._lock:
      return dict(self._counts, entries=len(self._entries))

  def generate(self, prompt: Prompt, max_new_tokens: int, sampling: Sampling,
               key) -> np.ndarray:
    """The reply's tokens [budget] (the engine's new-token bucket of max_new_tokens)."""
    budget = next_power(max_new_tokens, self.engine.min_new_tokens)
    ids = np.asarray(prompt.ids, np.int32)
    digests = tuple(image_digest(image) for image in prompt.images)
    with self._lock:
      self._counts["requests"] += 1
      entry = self._match(ids, digests, budget)
      if entry is None:
        entry = self._fresh(prompt, ids, digests, budget)
      else:
        self._entries.remove(entry)
        entry = self._extend(entry, prompt, ids, digests)
      entry.used = self._counts["requests"]
      self._entries.append(entry)
      if len(self._entries) > self.entries:
        self._entries.remove(min(self._entries, key=lambda e: e.used))
      config = SamplingConfig(max_new_tokens=budget, temperature=sampling.temperature,
                              top_k=sampling.top_k, top_p=sampling.top_p,
                              stop_tokens=self.engine.stop_ids, pad_token=self.engine.pad_id,
                              cache_dtype=self.engine.cache_dtype)
      tokens = _decode(*self.engine.split, entry.state, entry.logits, key, config)
    return np.asarray(tokens)[0]

  def _match(self, ids, digests, budget) -> _Entry | None:
    best = None
    for entry in self._entries:
      n, k = len(entry.ids), len(entry.digests)
      segment = next_power(len(ids) - n, self.min_segment)
      if (n < len(ids) and k <= len(digests) and digests[:k] == entry.digests
          and entry.slots + segment + budget <= entry.capacity
          and np.array_equal(ids[:n], entry.ids) and (best is None or n > len(best.ids))):
        best = entry
    return best

  def _vision(self, images):
    if not images:
      return None, None, ()
    model = self.engine.model
    grids = tuple(model.image_grid(image.shape[:2]) for image in images)
    return self.engine.pixel_values(images), jnp.asarray([grids], jnp.int32), grids

  def _fresh(self, prompt, ids, digests, budget) -> _Entry:
    length = next_power(len(ids), self.engine.min_length)
    capacity = next_power(int(self.growth * (length + budget)), self.min_capacity)
    padded, mask, real = _right_padded(ids, length, self.engine.pad_id)
    pixels, sequence_grids, grids = self._vision(prompt.images)
    state, logits = _prefill(*self.engine.split, padded, mask, real, pixels, sequence_grids,
                             capacity, self.engine.cache_dtype, grids)
    self._counts["prefilled_tokens"] += len(ids)
    return _Entry(ids, digests, state, logits, len(ids), capacity, 0)

  def _extend(self, entry, prompt, ids, digests) -> _Entry:
    n, k = len(entry.ids), len(entry.digests)
    length = next_power(len(ids) - n, self.min_segment)
    padded, mask, real = _right_padded(ids[n:], length, self.engine.pad_id)
    pixels, sequence_grids, grids = self._vision(prompt.images[k:])
    state, logits = _append(*self.engine.split, entry.state, padded, mask, real, pixels,
                            sequence_grids, grids)
    self._counts["hits"] += 1
    self._counts["prefilled_tokens"] += len(ids) - n
    self._counts["reused_tokens"] += n
    return _Entry(ids, digests, state, logits, len(ids), entry.capacity, 0)


def _right_padded(ids: np.ndarray, length: int, pad_id: int):
  """([1, length] ids, mask, real length []): the padding's slots are written over next."""
  padded = np.full((1, length), pad_id, np.int32)
  mask = np.zeros((1, length), bool)
  padded[0, :len(ids)] = ids
  mask[0, :len(ids)] = True
  return jnp.asarray(padded), jnp.asarray(mask), jnp.asarray(len(ids), jnp.int32)


__all__ = ["PrefixCache", "image_digest"]
