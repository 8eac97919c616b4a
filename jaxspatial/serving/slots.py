"""Continuous batching's device side: a fixed number of decode slots (rows of one KV cache),
each with its own fill, and the fixed programs that act on them.

  encode_image   one image's vision tokens (a program per image grid: the vision encoder
                 per image size), written into a request's token buffer (`write_tokens`)
  prefill_into   a right-padded prompt (a program per prompt-length bucket and vision-token
                 and image-count bucket: the tokens enter as data, whatever the images'
                 sizes) prefilled into a fresh cache of its bucket's length, then copied into
                 one row; the row's other slots turn invalid
  append_into    a segment appended to a kept row (a conversation's next turn: what is new
                 since the cache's content), optionally after restoring the row to its
                 prompt boundary (the reply it generated dropped)
  decode_steps   `steps` decode steps of every live row at once: each row samples with its
                 own settings and key, writes at its own slot, stops at a stop token or its
                 budget

Every program is `jax.jit` over the model's split state with the slots donated: nothing is
written back into the model, and each call replaces the slot state. A row's cache has
`capacity + 1` physical slots: rows that are not live write their (ignored) step into an
invalid slot at their fill, which the extra slot keeps in bounds for a full row.

Restoring to the prompt boundary is exact for every family: attention layers' slots past it
turn invalid (the next write goes over them); recurrent layers (Qwen3.5's delta-rule and
convolution state) have no slots, so their state at the boundary is kept (`snapshot`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx, struct

from jaxspatial.models.policy import VisionOutput
from jaxspatial.models.sampler import DecodeState, RowSampling, append, prefill, sample_rows

Array = jax.Array


@struct.dataclass
class Slots:
  cache: list             # per layer, the family's pytree with B rows and capacity + 1 slots
  valid: Array            # [B, S + 1] slots holding real tokens
  next_slot: Array        # [B] int32, each row's fill
  next_position: Array    # [B] int32, the M-RoPE position each row's next token takes
  logits: Array           # [B, V] float32, each row's next-token logits
  keys: Array             # [B, 2] uint32, each row's sampling key
  prompt_slot: Array      # [B] int32, the fill at the row's prompt boundary
  prompt_position: Array  # [B] int32, next_position there
  snapshot: list          # the cache's recurrent leaves at the prompt boundary


def positional(model) -> list:
  """Per cache leaf (flattened), whether it has a slot axis (keys, values) or is a
  recurrent state whatever the length (Qwen3.5's convolution inputs and delta-rule state)."""
  text = model.language_model
  one = jax.eval_shape(lambda: text.init_cache(1, 1))
  two = jax.eval_shape(lambda: text.init_cache(1, 2))
  return [a.shape != b.shape for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(two))]


def _recurrent(cache, is_positional) -> list:
  return [leaf for leaf, p in zip(jax.tree.leaves(cache), is_positional) if not p]


def _with_recurrent(cache, leaves, is_positional):
  flat, tree = jax.tree.flatten(cache)
  it = iter(leaves)
  return jax.tree.unflatten(tree, [leaf if p else next(it) for leaf, p in
                                   zip(flat, is_positional)])


@functools.partial(jax.jit, static_argnames=("graphdef", "rows", "capacity", "dtype"))
def init_slots(graphdef, params, rows: int, capacity: int, dtype: str) -> Slots:
  model = nnx.merge(graphdef, params)
  text = model.language_model
  cache = text.init_cache(rows, capacity + 1, jnp.dtype(dtype))
  is_positional = positional(model)
  zeros = jnp.zeros(rows, jnp.int32)
  return Slots(cache=cache, valid=jnp.zeros((rows, capacity + 1), bool), next_slot=zeros,
               next_position=zeros,
               logits=jnp.zeros((rows, model.config.text.vocab_size), jnp.float32),
               keys=jnp.zeros((rows, 2), jnp.uint32), prompt_slot=zeros, prompt_position=zeros,
               snapshot=_recurrent(cache, is_positional))


def _put_row(big: Array, small: Array, row: Array) -> Array:
  """`small` (one row, its axes no longer than big's) written at the start of `row`."""
  return jax.lax.dynamic_update_slice(big, small.astype(big.dtype),
                                      (row,) + (0,) * (small.ndim - 1))


def _row(big: Array, row: Array) -> Array:
  return jax.lax.dynamic_slice_in_dim(big, row, 1, axis=0)


def _store(slots: Slots, row, state: DecodeState, logits_1xV, key, is_positional) -> Slots:
  """`slots` with `row` holding `state` (batch 1, its slots no more than the row's) at a
  prompt boundary."""
  cache = jax.tree.map(lambda big, small: _put_row(big, small, row), slots.cache, state.cache)
  width = slots.valid.shape[1]
  valid = jnp.zeros((1, width), bool).at[:, :state.valid.shape[1]].set(state.valid)
  snapshot = [_put_row(big, small, row) for big, small in
              zip(slots.snapshot, _recurrent(state.cache, is_positional))]
  return Slots(cache=cache, valid=_put_row(slots.valid, valid, row),
               next_slot=slots.next_slot.at[row].set(state.next_slot),
               next_position=slots.next_position.at[row].set(state.next_position[0]),
               logits=slots.logits.at[row].set(logits_1xV[0]),
               keys=slots.keys.at[row].set(key),
               prompt_slot=slots.prompt_slot.at[row].set(state.next_slot),
               prompt_position=slots.prompt_position.at[row].set(state.next_position[0]),
               snapshot=snapshot)


# What `grids` says to the sampler when the vision tokens come as data: there are images.
_IMAGES = (True,)


@functools.partial(jax.jit, static_argnames=("graphdef", "grid"))
def encode_image(graphdef, params, pixels, grid) -> VisionOutput:
  """The vision tokens (and DeepStack features) of one image of patch grid `grid`."""
  return nnx.merge(graphdef, params).encode_images(pixels, (grid,))


@functools.partial(jax.jit, donate_argnames=("buffer",))
def write_tokens(buffer: VisionOutput, tokens: VisionOutput, offset) -> VisionOutput:
  """`buffer` (a request's vision tokens, padded to a bucket) with `tokens` at `offset`."""
  put = lambda b, t: jax.lax.dynamic_update_slice_in_dim(b, t.astype(b.dtype), offset, axis=-2)
  return jax.tree.map(put, buffer, tokens)


@functools.partial(jax.jit, static_argnames=("graphdef", "dtype"), donate_argnames=("slots",))
def prefill_into(graphdef, params, slots: Slots, row, ids_1xL, mask_1xL, real, vision,
                 sequence_grids, key, dtype) -> Slots:
  """`row` holding a fresh prompt (right-padded to its bucket, `real` tokens); `vision`:
  its images' tokens in order (None: none), `sequence_grids` [1, K, 3] their grids, both
  padded to buckets."""
  model = nnx.merge(graphdef, params)
  state, logits = prefill(model, ids_1xL, mask_1xL, ids_1xL.shape[1], jnp.dtype(dtype), None,
                          _IMAGES if vision is not None else (), sequence_grids, vision,
                          real_length=real)
  return _store(slots, row, state, logits, key, positional(model))


@functools.partial(jax.jit, static_argnames=("graphdef", "window"), donate_argnames=("slots",))
def append_into(graphdef, params, slots: Slots, row, restore, ids_1xT, mask_1xT, real, vision,
                sequence_grids, key, window: int = 0) -> Slots:
  """`row` with a segment (right-padded, `real` tokens) appended to what it holds, or, with
  `restore`, to its prompt boundary. `window` (0: all): the row's first slots the segment
  attends over and is written in (its fill plus the padded segment must fit)."""
  model = nnx.merge(graphdef, params)
  is_positional = positional(model)
  window = window or slots.valid.shape[1]
  flat, tree = jax.tree.flatten(jax.tree.map(lambda big: _row(big, row), slots.cache))
  cache = jax.tree.unflatten(tree, [x[:, :window] if p else x
                                    for x, p in zip(flat, is_positional)])
  kept = _recurrent(cache, is_positional)
  snapshot = [_row(leaf, row) for leaf in slots.snapshot]
  cache = _with_recurrent(cache, [jnp.where(restore, s, k) for s, k in zip(snapshot, kept)],
                          is_positional)
  fill = jnp.where(restore, slots.prompt_slot[row], slots.next_slot[row])
  valid = _row(slots.valid, row)[:, :window] & (jnp.arange(window) < fill)[None]
  position = jnp.where(restore, slots.prompt_position[row], slots.next_position[row])
  state = DecodeState(cache=cache, valid=valid, next_slot=fill, next_position=position[None],
                      last_hidden=jnp.zeros((1, model.config.text.hidden_size), jnp.float32),
                      last_token=jnp.full(1, -1, jnp.int32))
  state, logits = append(model, state, ids_1xT, mask_1xT, None,
                         _IMAGES if vision is not None else (), sequence_grids, vision,
                         real_length=real)
  return _store(slots, row, state, logits, key, is_positional)


def _window(cache, valid, is_positional, window: int):
  """The first window - 1 slots and the scratch slot (the last) of every row."""
  view = lambda x: jnp.concatenate([x[:, :window - 1], x[:, -1:]], axis=1)
  flat, tree = jax.tree.flatten(cache)
  return (jax.tree.unflatten(tree, [view(x) if p else x for x, p in zip(flat, is_positional)]),
          view(valid))


def _unwindow(cache, valid, small_cache, small_valid, is_positional, window: int):
  put = lambda big, small: big.at[:, :window - 1].set(small[:, :window - 1])
  flat, tree = jax.tree.flatten(cache)
  small = jax.tree.leaves(small_cache)
  return (jax.tree.unflatten(tree, [put(x, y) if p else y for x, y, p in
                                    zip(flat, small, is_positional)]),
          put(valid, small_valid))


@functools.partial(jax.jit, static_argnames=("graphdef", "steps", "stop_ids", "pad_id", "top",
                                             "window"),
                   donate_argnames=("slots",))
def decode_steps(graphdef, params, slots: Slots, live_B, remaining_B, sampling: RowSampling,
                 steps: int, stop_ids: tuple, pad_id: int, top: int = 0, window: int = 0):
  """`steps` decode steps. A row takes a step while live (`live`, budget `remaining` > 0,
  no stop token sampled yet). Returns (slots, tokens [B, steps], log-probabilities
  [B, steps], live [B, steps]: whether each step was the row's, the `top` most likely
  tokens' log-probabilities and ids [B, steps, top] under the distribution each token was
  drawn from).

  `window` (0: all): the steps run over each row's first window - 1 slots and the scratch
  slot, where rows that are not live write; every live row's fill plus its steps must stay
  under window - 1. Attention then reads the window, not the capacity (a program per
  window: the scheduler's powers of two)."""
  model = nnx.merge(graphdef, params)
  text = model.language_model
  is_positional = positional(model)
  full_cache, full_valid = slots.cache, slots.valid
  window = window or full_valid.shape[1]
  cache, valid = _window(full_cache, full_valid, is_positional, window)
  slots = slots.replace(cache=cache, valid=valid)
  rows = jnp.arange(live_B.shape[0])
  stops = jnp.asarray(stop_ids or (-1,), jnp.int32)
  dtype = text.embed_tokens.embedding[...].dtype

  def step(carry, _):
    slots, live, remaining = carry
    live = live & (remaining > 0)
    split = jax.vmap(jax.random.split)(slots.keys)
    token, logp, distribution = sample_rows(slots.logits, split[:, 1], sampling, True)
    top_logp, top_ids = jax.lax.top_k(distribution, top) if top else (
        jnp.zeros((token.shape[0], 0)), jnp.zeros((token.shape[0], 0), jnp.int32))
    token = jnp.where(live, token, pad_id)
    at = jnp.where(live, slots.next_slot, window - 1)  # the scratch slot when not live
    valid = slots.valid.at[rows, at].set(live)
    position = jnp.broadcast_to(slots.next_position[None, :, None], (3, rows.shape[0], 1))
    hidden, cache = text.extend(text.embed_tokens(token[:, None]).astype(dtype), position,
                                valid, slots.cache, at)
    logits = jnp.where(live[:, None], text.logits(hidden[:, -1]).astype(jnp.float32),
                       slots.logits)
    step_up = live.astype(jnp.int32)
    slots = slots.replace(cache=cache, valid=valid, next_slot=at + step_up,
                          next_position=slots.next_position + step_up, logits=logits,
                          keys=jnp.where(live[:, None], split[:, 0], slots.keys))
    stopped = jnp.any(token[:, None] == stops[None], axis=-1)
    remaining = jnp.where(stopped, 0, remaining - step_up)
    return (slots, live, remaining), (token, jnp.where(live, logp, 0.0), live, top_logp,
                                      top_ids)

  (slots, _, _), (tokens, logps, lives, top_logps, top_ids) = jax.lax.scan(
      step, (slots, live_B, remaining_B), None, length=steps)
  cache, valid = _unwindow(full_cache, full_valid, slots.cache, slots.valid, is_positional,
                           window)
  slots = slots.replace(cache=cache, valid=valid)
  return (slots, tokens.T, logps.T, lives.T, top_logps.transpose(1, 0, 2),
          top_ids.transpose(1, 0, 2))


__all__ = ["Slots", "append_into", "decode_steps", "encode_image", "init_slots", "positional",
           "prefill_into", "write_tokens"]
