"""Sampling under jit: prefill the prompt into a preallocated KV cache, then decode in a
`lax.while_loop` (greedy, or temperature with top-k / top-p), stopping per sequence at
stop tokens. Prompts are left-padded so that every sequence's last prompt token sits in
the same cache slot.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  max_new_tokens: int = 32
  temperature: float = 0.0       # 0: greedy
  top_k: int = 0                 # 0: off
  top_p: float = 1.0             # 1: off
  stop_tokens: tuple[int, ...] = ()
  pad_token: int = 0             # emitted after a sequence stops
  cache_dtype: str = "float32"


@struct.dataclass
class Generation:
  tokens: Array      # [B, N] int32, pad after a stop token
  logprobs: Array    # [B, N] float32 log-probabilities of the sampled tokens (0 on pads)
  lengths: Array     # [B] int32 generated tokens, the stop token included


def filter_logits(logits_BxV: Array, top_k: int, top_p: float) -> Array:
  """Masks (to -inf) tokens outside the top-k and outside the smallest top-p nucleus."""
  if top_k > 0:
    kth = jax.lax.top_k(logits_BxV, top_k)[0][:, -1:]
    logits_BxV = jnp.where(logits_BxV < kth, -jnp.inf, logits_BxV)
  if top_p < 1.0:
    order = jnp.argsort(-logits_BxV, axis=-1)
    sorted_logits = jnp.take_along_axis(logits_BxV, order, axis=-1)
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each token
    keep_sorted = before < top_p
    keep = jnp.zeros_like(keep_sorted).at[jnp.arange(logits_BxV.shape[0])[:, None],
                                          order].set(keep_sorted)
    logits_BxV = jnp.where(keep, logits_BxV, -jnp.inf)
  return logits_BxV


def generate(model, input_ids_BxL: Array, attention_mask_BxL: Array, key: Array,
             config: SamplingConfig = SamplingConfig(), pixel_values: Array | None = None,
             grids=(), sequence_grids_BxKx3: Array | None = None) -> Generation:
  """Generates up to `max_new_tokens` for each (left-padded) prompt."""
  text = model.language_model
  batch, prompt_len = input_ids_BxL.shape
  total = prompt_len + config.max_new_tokens
  embeds = model.embed(input_ids_BxL, pixel_values, grids)
  positions = model.position_ids(input_ids_BxL, attention_mask_BxL,
                                 sequence_grids_BxKx3 if grids else None)
  cache = text.init_cache(batch, total, jnp.dtype(config.cache_dtype))
  valid = jnp.concatenate([attention_mask_BxL.astype(bool),
                           jnp.zeros((batch, config.max_new_tokens), bool)], axis=1)
  hidden, cache = text.extend(embeds, positions, valid, cache, jnp.asarray(0))
  logits = text.logits(hidden[:, -1]).astype(jnp.float32)
  real = attention_mask_BxL.astype(bool)
  next_position = jnp.max(jnp.where(real[None], positions, -1), axis=(0, 2)) + 1  # [B]
  stops = jnp.asarray(config.stop_tokens or (-1,), jnp.int32)

  def choose(logits, key):
    if config.temperature <= 0:
      token = jnp.argmax(logits, axis=-1)
      logp = jax.nn.log_softmax(logits, axis=-1)
    else:
      scaled = filter_logits(logits / config.temperature, config.top_k, config.top_p)
      token = jax.random.categorical(key, scaled, axis=-1)
      logp = jax.nn.log_softmax(scaled, axis=-1)
    return token.astype(jnp.int32), jnp.take_along_axis(logp, token[:, None], -1)[:, 0]

  def cond(state):
    step, *_, finished, _ = state
    return (step < config.max_new_tokens) & ~jnp.all(finished)

  def body(state):
    step, cache, valid, logits, tokens, logprobs, finished, key = state
    key, sample_key = jax.random.split(key)
    token, logp = choose(logits, sample_key)
    token = jnp.where(finished, config.pad_token, token)
    logp = jnp.where(finished, 0.0, logp)
    tokens = tokens.at[:, step].set(token)
    logprobs = logprobs.at[:, step].set(logp)
    now_finished = finished | jnp.any(token[:, None] == stops[None], axis=-1)
    slot = prompt_len + step
    valid = valid.at[:, slot].set(True)
    position = jnp.broadcast_to((next_position + step)[None, :, None], (3, batch, 1))
    hidden, cache = text.extend(text.embed_tokens(token[:, None]), position, valid, cache, slot)
    logits = text.logits(hidden[:, -1]).astype(jnp.float32)
    return step + 1, cache, valid, logits, tokens, logprobs, now_finished, key

  tokens = jnp.full((batch, config.max_new_tokens), config.pad_token, jnp.int32)
  logprobs = jnp.zeros((batch, config.max_new_tokens), jnp.float32)
  state = (jnp.asarray(0), cache, valid, logits, tokens, logprobs, jnp.zeros(batch, bool), key)
  step, _, _, _, tokens, logprobs, finished, _ = jax.lax.while_loop(cond, body, state)
  is_stop = jnp.any(tokens[..., None] == stops, axis=-1)
  first_stop = jnp.where(jnp.any(is_stop, -1), jnp.argmax(is_stop, -1) + 1, step)
  return Generation(tokens=tokens, logprobs=logprobs, lengths=first_stop.astype(jnp.int32))
