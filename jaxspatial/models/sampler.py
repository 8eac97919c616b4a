"""Sampling under jit: prefill the prompt into a preallocated KV cache, then decode in a
`lax.while_loop` (greedy, or temperature with top-k / top-p), stopping per sequence at
stop tokens; `append` writes further segments (observations with images) into the cache
at the right positions. Prompts are left-padded so that every sequence's last prompt
token sits in the same cache slot.

Written against the policy interface (`jaxspatial.models.policy`): any family's model, its
cache a per-layer pytree the family's decoder defines.
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
  # 3DThinker's latent mode: (start, pad, end) token ids. After `start` is emitted (or
  # ends the prompt), `num_latents` steps feed the previous final hidden state back as the
  # next input embedding (emitting `pad`), then `end` is forced.
  latent_tokens: tuple[int, int, int] | None = None
  num_latents: int = 12


@struct.dataclass
class Generation:
  tokens: Array      # [B, N] int32, pad after a stop token
  logprobs: Array    # [B, N] float32 log-probabilities of the sampled tokens (0 on pads)
  lengths: Array     # [B] int32 generated tokens, the stop token included
  latents: Array     # [B, num_latents, C] hidden states fed back in latent mode (else zeros)
  # [B, num_latents, C] final hidden states at the first num_latents generated positions
  # (latent mode configured; else None): 3DThinker's fallback when no latent block is made.
  first_hidden: Array | None = None


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


def repetition_penalty(logits_BxV: Array, seen_BxV: Array, penalty: float) -> Array:
  """Hugging Face's (and vLLM's) repetition penalty: for every token already in the
  context (prompt included), a positive logit is divided by `penalty`, a negative one
  multiplied. Applied before temperature and top-k / top-p, as `generate` orders them."""
  if penalty == 1.0:
    return logits_BxV
  penalised = jnp.where(logits_BxV < 0, logits_BxV * penalty, logits_BxV / penalty)
  return jnp.where(seen_BxV, penalised, logits_BxV)


def mark_seen(seen_BxV: Array, tokens_BxL: Array, mask_BxL: Array) -> Array:
  """`seen` with the masked-in tokens of `tokens` added (for `repetition_penalty`)."""
  rows = jnp.broadcast_to(jnp.arange(tokens_BxL.shape[0])[:, None], tokens_BxL.shape)
  columns = jnp.where(mask_BxL, tokens_BxL, seen_BxV.shape[1])  # out of range: dropped
  return seen_BxV.at[rows, columns].set(True, mode="drop")


def sample_token(logits_BxV: Array, key: Array, temperature: float, top_k: int = 0,
                 top_p: float = 1.0):
  """(token [B] int32, its log-probability under the distribution sampled from): greedy at
  temperature 0, else temperature with top-k / top-p. `key`: one for the batch, or [B, 2]
  one per row (each row's draw then independent of the others)."""
  if temperature <= 0:
    token = jnp.argmax(logits_BxV, axis=-1)
    logp = jax.nn.log_softmax(logits_BxV, axis=-1)
  else:
    scaled = filter_logits(logits_BxV / temperature, top_k, top_p)
    if key.ndim == 2:
      token = jax.vmap(jax.random.categorical)(key, scaled)
    else:
      token = jax.random.categorical(key, scaled, axis=-1)
    logp = jax.nn.log_softmax(scaled, axis=-1)
  return token.astype(jnp.int32), jnp.take_along_axis(logp, token[:, None], -1)[:, 0]


@struct.dataclass
class RowSampling:
  """Per-row sampling settings as data (a serving batch mixes requests; no program per
  setting): temperature [B] (0: greedy), top_k [B] int32 (0: off), top_p [B] (1: off)."""
  temperature: Array
  top_k: Array
  top_p: Array

  @classmethod
  def create(cls, temperature, top_k, top_p) -> "RowSampling":
    return cls(jnp.asarray(temperature, jnp.float32), jnp.asarray(top_k, jnp.int32),
               jnp.asarray(top_p, jnp.float32))


def _top_k_rows(logits_BxV: Array, top_k_B: Array) -> Array:
  """`filter_logits`'s top-k with a k per row (0: all kept); its kth value, so ties stay."""
  vocab = logits_BxV.shape[-1]
  descending = -jnp.sort(-logits_BxV, axis=-1)
  k = jnp.where(top_k_B > 0, jnp.minimum(top_k_B, vocab), vocab)
  kth = jnp.take_along_axis(descending, (k - 1)[:, None], axis=-1)
  return jnp.where(logits_BxV < kth, -jnp.inf, logits_BxV)


def _top_p_rows(logits_BxV: Array, top_p_B: Array) -> Array:
  """`filter_logits`'s nucleus with a p per row (p >= 1: all kept)."""
  order = jnp.argsort(-logits_BxV, axis=-1)
  sorted_logits = jnp.take_along_axis(logits_BxV, order, axis=-1)
  probs = jax.nn.softmax(sorted_logits, axis=-1)
  before = jnp.cumsum(probs, axis=-1) - probs
  keep_sorted = (before < top_p_B[:, None]) | (top_p_B[:, None] >= 1.0)
  keep = jnp.zeros_like(keep_sorted).at[jnp.arange(logits_BxV.shape[0])[:, None],
                                        order].set(keep_sorted)
  return jnp.where(keep, logits_BxV, -jnp.inf)


def row_distribution(logits_BxV: Array, rows: RowSampling) -> tuple[Array, Array]:
  """(the logits each row samples from: tempered, top-k and top-p filtered; their
  log-probabilities [B, V], a greedy row's the raw logits'). The sort the filters need runs
  only when some row asks for top-k or top-p."""
  sampled = rows.temperature > 0
  scaled = logits_BxV / jnp.where(sampled, rows.temperature, 1.0)[:, None]
  scaled = jax.lax.cond(jnp.any(sampled & (rows.top_k > 0)), _top_k_rows,
                        lambda x, _: x, scaled, rows.top_k)
  scaled = jax.lax.cond(jnp.any(sampled & (rows.top_p < 1.0)), _top_p_rows,
                        lambda x, _: x, scaled, rows.top_p)
  logp = jnp.where(sampled[:, None], jax.nn.log_softmax(scaled, axis=-1),
                   jax.nn.log_softmax(logits_BxV, axis=-1))
  return scaled, logp


def sample_rows(logits_BxV: Array, key: Array, rows: RowSampling, distribution: bool = False):
  """`sample_token` with each row's own settings (traced): the same tokens and
  log-probabilities as `sample_token` with that row's settings and key. `key`: one for the
  batch, or [B, 2] a key per row (a row's draws then do not depend on the other rows).
  `distribution`: also return the log-probabilities [B, V] the token was drawn from."""
  scaled, logp = row_distribution(logits_BxV, rows)
  if key.ndim == 2:
    drawn = jax.vmap(jax.random.categorical)(key, scaled)
  else:
    drawn = jax.random.categorical(key, scaled, axis=-1)
  token = jnp.where(rows.temperature > 0, drawn, jnp.argmax(logits_BxV, axis=-1))
  token = token.astype(jnp.int32)
  chosen = jnp.take_along_axis(logp, token[:, None], -1)[:, 0]
  return (token, chosen, logp) if distribution else (token, chosen)


@struct.dataclass
class DecodeState:
  """A KV cache and where the next segment goes."""
  cache: list          # per layer, the family's pytree (attention: (k, v) [B, S, KV, D])
  valid: Array         # [B, S] slots holding real tokens
  next_slot: Array     # [] int32, the first free slot (shared: prompts are left-padded)
  next_position: Array  # [B] int32, the M-RoPE position the next text token takes
  last_hidden: Array    # [B, C] final-norm hidden state of the last written position
  last_token: Array     # [B] int32, the last token written (-1 for embeddings)


def prefill(model, input_ids_BxL: Array, attention_mask_BxL: Array, capacity: int,
            cache_dtype=jnp.float32, pixel_values: Array | None = None, grids=(),
            sequence_grids_BxKx3: Array | None = None, vision=None,
            real_length: Array | None = None):
  """Writes a left-padded prompt into a fresh cache of `capacity` slots.
  Returns (state, logits of the last prompt position [B, V]). `vision`: the vision
  encoder's output (`model.encode_images`) when the caller has it already.
  `real_length`: a right-padded prompt instead, as `append` takes it."""
  batch, length = input_ids_BxL.shape
  if capacity < length:
    raise ValueError(f"prefill: capacity {capacity} is smaller than the prompt ({length})")
  cache = model.language_model.init_cache(batch, capacity, cache_dtype)
  valid = jnp.zeros((batch, capacity), bool)
  state = DecodeState(cache=cache, valid=valid, next_slot=jnp.asarray(0, jnp.int32),
                      next_position=jnp.zeros(batch, jnp.int32),
                      last_hidden=jnp.zeros((batch, model.config.text.hidden_size), jnp.float32),
                      last_token=jnp.full(batch, -1, jnp.int32))
  # The cache is empty: the prompt attends over its own slots, not the whole capacity.
  state, hidden = append_hidden(model, state, input_ids_BxL, attention_mask_BxL, pixel_values,
                                grids, sequence_grids_BxKx3, vision, real_length,
                                attend=length)
  return state, model.language_model.logits(_position(hidden, real_length)).astype(jnp.float32)


def prefill_shared(model, prefix_ids_P: Array, batch: int, capacity: int,
                   cache_dtype=jnp.float32) -> DecodeState:
  """A cache of `capacity` slots for `batch` rows that all start with the same text
  `prefix_ids_P` (a system prompt): the prefix runs once and its keys and values are
  copied to every row, so `append` then writes each row's own tokens after it."""
  one, _ = prefill(model, prefix_ids_P[None], jnp.ones((1, prefix_ids_P.shape[0]), jnp.int32),
                   capacity, cache_dtype)
  return repeat_rows(one, batch)


def repeat_rows(state: DecodeState, times: int) -> DecodeState:
  """Each row's cache `times` times, consecutively ([P] rows -> [P * times]): prompts
  prefilled once and shared by the samples of their group."""
  rows = lambda x: jnp.repeat(x, times, axis=0)
  return DecodeState(cache=jax.tree.map(rows, state.cache), valid=rows(state.valid),
                     next_slot=state.next_slot, next_position=rows(state.next_position),
                     last_hidden=rows(state.last_hidden), last_token=rows(state.last_token))


def append(model, state: DecodeState, input_ids_BxT: Array, attention_mask_BxT: Array,
           pixel_values: Array | None = None, grids=(),
           sequence_grids_BxKx3: Array | None = None, vision=None,
           real_length: Array | None = None):
  """Writes a segment (text, with images where `grids` says) after what the cache holds,
  at the right M-RoPE positions. Returns (state, logits [B, V] of the segment's last
  position: only it is projected on the vocabulary).

  Multi-turn rollouts append each observation this way (its tokens get loss mask 0).
  `grids`: the images' patch grids (static); with `vision` (the encoder's output) given,
  only whether it is empty matters (the tokens and `sequence_grids` are data).
  `real_length` ([] int32): the segment is right-padded and only its first `real_length`
  positions count; the next write starts after them (over the padding, so padding costs
  no cache slots) and the state's last token and hidden state are position
  real_length - 1's."""
  state, hidden = append_hidden(model, state, input_ids_BxT, attention_mask_BxT, pixel_values,
                                grids, sequence_grids_BxKx3, vision, real_length)
  last = _position(hidden, real_length)
  return state, model.language_model.logits(last).astype(jnp.float32)


def _position(segment_BxTx_, real_length: Array | None) -> Array:
  """The segment's last position (right-padded: position real_length - 1)."""
  if real_length is None:
    return segment_BxTx_[:, -1]
  return jax.lax.dynamic_index_in_dim(segment_BxTx_, real_length - 1, 1, keepdims=False)


def append_hidden(model, state: DecodeState, input_ids_BxT: Array, attention_mask_BxT: Array,
                  pixel_values: Array | None = None, grids=(),
                  sequence_grids_BxKx3: Array | None = None, vision=None,
                  real_length: Array | None = None, attend: int | None = None):
  """`append`, returning the segment's final-norm hidden states [B, T, C] in place of the
  last position's logits (a replayed turn's log-probabilities need every position's).
  `attend` (static): attention over the cache's first `attend` slots only (`prefill`)."""
  text = model.language_model
  embeds, residuals = model.decoder_inputs(input_ids_BxT, pixel_values, grids, vision)
  relative = model.position_ids(input_ids_BxT, attention_mask_BxT,
                                sequence_grids_BxKx3 if grids else None)
  real = attention_mask_BxT.astype(bool)
  if not grids:  # text-only positions count real tokens only, from 0
    relative = jnp.broadcast_to(jnp.cumsum(real, axis=-1)[None] - 1, relative.shape)
  positions = relative + state.next_position[None, :, None]
  length = input_ids_BxT.shape[1]
  valid = jax.lax.dynamic_update_slice(state.valid, real, (0, state.next_slot))
  hidden, cache = text.extend(embeds, positions, valid, state.cache, state.next_slot,
                              residuals, attend)
  next_position = jnp.where(jnp.any(real, -1),
                            jnp.max(jnp.where(real[None], positions, -1), axis=(0, 2)) + 1,
                            state.next_position)
  written = length if real_length is None else real_length
  state = DecodeState(cache=cache, valid=valid, next_slot=state.next_slot + written,
                      next_position=next_position,
                      last_hidden=_position(hidden, real_length).astype(jnp.float32),
                      last_token=_position(input_ids_BxT, real_length).astype(jnp.int32))
  return state, hidden


def generate(model, input_ids_BxL: Array, attention_mask_BxL: Array, key: Array,
             config: SamplingConfig = SamplingConfig(), pixel_values: Array | None = None,
             grids=(), sequence_grids_BxKx3: Array | None = None,
             rows: RowSampling | None = None) -> Generation:
  """Generates up to `max_new_tokens` for each (left-padded) prompt. `rows`: per-row
  sampling settings in place of the config's."""
  capacity = input_ids_BxL.shape[1] + config.max_new_tokens
  state, logits = prefill(model, input_ids_BxL, attention_mask_BxL, capacity,
                          jnp.dtype(config.cache_dtype), pixel_values, grids,
                          sequence_grids_BxKx3)
  return decode(model, state, logits, key, config, rows)


def decode(model, state: DecodeState, logits_BxV: Array, key: Array,
           config: SamplingConfig, rows: RowSampling | None = None) -> Generation:
  """Samples up to `max_new_tokens` after the cache's content, from the given logits
  (`rows`: per-row sampling settings in place of the config's)."""
  text = model.language_model
  batch = logits_BxV.shape[0]
  stops = jnp.asarray(config.stop_tokens or (-1,), jnp.int32)

  if rows is None:
    choose = lambda logits, key: sample_token(logits, key, config.temperature, config.top_k,
                                              config.top_p)
  else:
    choose = lambda logits, key: sample_rows(logits, key, rows)

  hidden_size = state.last_hidden.shape[-1]
  latent = config.latent_tokens
  start_id, pad_id, end_id = latent if latent else (-1, -1, -1)

  def cond(carry):
    step, *_, finished, _ = carry
    return (step < config.max_new_tokens) & ~jnp.all(finished)

  def body(carry):
    step, state, logits, tokens, logprobs, latent_left, latents, first, finished, key = carry
    key, sample_key = jax.random.split(key)
    token, logp = choose(logits, sample_key)
    in_latent = latent_left > 0
    force_end = latent_left == -1  # the latent block just ended: its end token is forced
    token = jnp.where(in_latent, pad_id, jnp.where(force_end, end_id, token))
    logp = jnp.where(in_latent | force_end, 0.0, logp)
    token = jnp.where(finished, config.pad_token, token)
    logp = jnp.where(finished, 0.0, logp)
    tokens = tokens.at[:, step].set(token)
    logprobs = logprobs.at[:, step].set(logp)
    now_finished = finished | jnp.any(token[:, None] == stops[None], axis=-1)
    # Latent steps feed the previous final hidden state back instead of a token embedding.
    feed = in_latent & ~finished
    embeds = jnp.where(feed[:, None, None], state.last_hidden[:, None].astype(jnp.float32),
                       text.embed_tokens(token[:, None]).astype(jnp.float32))
    index = config.num_latents - latent_left
    latents = jnp.where((feed[:, None] & (jnp.arange(config.num_latents)[None] == index[:, None])
                         )[..., None], state.last_hidden[:, None], latents)
    latent_left = jnp.where(
        feed, jnp.where(latent_left == 1, -1, latent_left - 1),
        jnp.where(force_end, 0,
                  jnp.where((token == start_id) & ~finished, config.num_latents, latent_left)))
    slot = state.next_slot
    valid = state.valid.at[:, slot].set(True)
    position = jnp.broadcast_to(state.next_position[None, :, None], (3, batch, 1))
    hidden, cache = text.extend(embeds.astype(text.embed_tokens.embedding[...].dtype), position,
                                valid, state.cache, slot)
    state = DecodeState(cache=cache, valid=valid, next_slot=slot + 1,
                        next_position=state.next_position + 1,
                        last_hidden=hidden[:, -1].astype(jnp.float32), last_token=token)
    logits = text.logits(hidden[:, -1]).astype(jnp.float32)
    if first is not None:  # the hidden state at generated position `step`
      first = jnp.where((jnp.arange(config.num_latents) == step)[None, :, None],
                        state.last_hidden[:, None], first)
    return (step + 1, state, logits, tokens, logprobs, latent_left, latents, first,
            now_finished, key)

  tokens = jnp.full((batch, config.max_new_tokens), config.pad_token, jnp.int32)
  logprobs = jnp.zeros((batch, config.max_new_tokens), jnp.float32)
  latent_left = jnp.where(state.last_token == start_id, config.num_latents, 0).astype(jnp.int32)
  latents = jnp.zeros((batch, config.num_latents, hidden_size), jnp.float32)
  first = latents if latent else None
  carry = (jnp.asarray(0), state, logits_BxV.astype(jnp.float32), tokens, logprobs,
           latent_left, latents, first, jnp.zeros(batch, bool), key)
  step, _, _, tokens, logprobs, _, latents, first, _, _ = jax.lax.while_loop(cond, body, carry)
  is_stop = jnp.any(tokens[..., None] == stops, axis=-1)
  first_stop = jnp.where(jnp.any(is_stop, -1), jnp.argmax(is_stop, -1) + 1, step)
  return Generation(tokens=tokens, logprobs=logprobs, lengths=first_stop.astype(jnp.int32),
                    latents=latents, first_hidden=first)
