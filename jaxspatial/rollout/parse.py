"""Reading a turn's action out of the automaton on device.

The decoder records the grammar state before every generated token. Walking each token's
bytes from that state through the byte-level DFA labels every byte with the field it
writes; an enum's value is the option its last byte completes, a number's value is read
from its digits, a text field's value is its bytes (`ParsedTurn.texts`, the first
TEXT_BYTES of them). No detokenising, no host round trip.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxspatial.rollout.nfa import NO_FIELD
from jaxspatial.rollout.regex_ast import Enum, Text
from jaxspatial.rollout.token_table import TokenAutomaton

Array = jax.Array
# A text field's bytes kept on device (a static shape); a longer text is cut here, its
# full length stays in `values`.
TEXT_BYTES = 256


def _no_texts():
  return np.full((0, TEXT_BYTES), -1, np.int32)


@struct.dataclass
class ParsedTurn:
  """The parse of one turn per episode (leading batch axes allowed).

  valid:   the turn is in the grammar (closed and well formed)
  values:  [F] float32 field values (enum: option index; number: its value; text: its
           length in bytes), 0 if absent
  present: [F] bool, the field was written
  texts:   [num_text_fields, TEXT_BYTES] int32 each `Text` field's bytes in order
           (`Grammar.text_fields`), -1 padded (all -1 when absent); [0, TEXT_BYTES] for a
           grammar without text fields
  """
  valid: Array
  values: Array
  present: Array
  texts: Array = dataclasses.field(default_factory=_no_texts)

  def field(self, grammar, name: str) -> tuple[Array, Array]:
    """(value, present) of a field by name (`grammar`: a Grammar)."""
    index = grammar.field_id(name) - 1
    return self.values[..., index], self.present[..., index]

  def text(self, grammar, name: str) -> tuple[Array, Array]:
    """(bytes [TEXT_BYTES] int32, -1 padded; present) of a `Text` field by name."""
    return (self.texts[..., grammar.text_index(name), :],
            self.field(grammar, name)[1])


def turn_bytes(automaton: TokenAutomaton, tokens_T: Array, count: Array) -> tuple[Array, Array]:
  """The bytes of the first `count` tokens, [T, Lmax] (-1 padded), and their token mask."""
  used = jnp.arange(tokens_T.shape[0]) < count
  table = automaton.token_bytes[jnp.clip(tokens_T, 0, automaton.vocab_size - 1)]
  return jnp.where(used[:, None], table, -1), used


def parse_turn(automaton: TokenAutomaton, tokens_T: Array, states_T: Array, count: Array,
               final_state: Array) -> ParsedTurn:
  """One episode's turn: its tokens, the grammar state before each, how many were
  generated, and the state after the last."""
  grammar = automaton.grammar
  data_TxL, _ = turn_bytes(automaton, tokens_T, count)

  def step(carry, byte_T):
    state, stopped = carry
    live = (byte_T >= 0) & ~stopped
    b = jnp.maximum(byte_T, 0)
    field = jnp.where(live, automaton.byte_field[state, b], NO_FIELD)
    option = jnp.where(live, automaton.byte_option[state, b], -1)
    state = jnp.where(live, automaton.byte_next[state, b], state)
    stopped = stopped | automaton.accepting[state]
    return (state, stopped), (field, option)

  start = states_T.astype(jnp.int32)
  _, (field_LxT, option_LxT) = jax.lax.scan(step, (start, automaton.accepting[start]), data_TxL.T)
  data = data_TxL.T.reshape(-1)
  fields = field_LxT.reshape(-1)
  options = option_LxT.reshape(-1)
  # Byte order inside the flattened [L, T] layout is column-major; restore token order.
  order = jnp.arange(data.shape[0]).reshape(data_TxL.shape[1], data_TxL.shape[0]).T.reshape(-1)
  data, fields, options = data[order], fields[order], options[order]

  values, present, texts = [], [], []
  digit = (data >= ord("0")) & (data <= ord("9"))
  for index, spec in enumerate(grammar.fields):
    mine = fields == index + 1
    present.append(jnp.any(mine))
    if isinstance(spec, Enum):
      values.append(jnp.max(jnp.where(mine, options, -1)).astype(jnp.float32))
      continue
    if isinstance(spec, Text):
      values.append(jnp.sum(mine).astype(jnp.float32))
      texts.append(_field_bytes(data, mine))
      continue
    dot_seen = jnp.cumsum(mine & (data == ord("."))) > 0
    integer = mine & digit & ~dot_seen
    fraction = mine & digit & dot_seen
    places = jnp.sum(fraction)
    # The digits as one integer mantissa, then one division: the correctly rounded value.
    after = jnp.sum(integer | fraction) - jnp.cumsum(integer | fraction)
    powers = jnp.asarray([10 ** k for k in range(10)], jnp.int32)
    weight = jnp.where(integer | fraction, powers[jnp.clip(after, 0, 9)], 0)
    mantissa = jnp.sum(weight * jnp.where(digit, data - ord("0"), 0))
    scale = jnp.asarray([10.0 ** k for k in range(10)], jnp.float32)[jnp.minimum(places, 9)]
    magnitude = mantissa.astype(jnp.float32) / scale  # exact powers: pow() is not
    negative = jnp.any(mine & (data == ord("-")))
    values.append(jnp.where(negative, -magnitude, magnitude))
  valid = automaton.accepting[final_state.astype(jnp.int32)]
  values = jnp.stack(values) if values else jnp.zeros((0,), jnp.float32)
  present = jnp.stack(present) if present else jnp.zeros((0,), bool)
  texts = jnp.stack(texts) if texts else jnp.asarray(_no_texts())
  return ParsedTurn(valid=valid, values=jnp.where(valid, values, 0.0),
                    present=present & valid, texts=jnp.where(valid, texts, -1))


def _field_bytes(data: Array, mine: Array) -> Array:
  """[TEXT_BYTES] the bytes where `mine`, in order, -1 padded (past TEXT_BYTES dropped)."""
  position = jnp.cumsum(mine) - 1
  slot = jnp.where(mine & (position < TEXT_BYTES), position, TEXT_BYTES)
  return jnp.full(TEXT_BYTES, -1, jnp.int32).at[slot].set(data.astype(jnp.int32), mode="drop")


def walk_states(automaton: TokenAutomaton, tokens_T: Array, count: Array) -> tuple[Array, Array]:
  """(state before each token [T], state after the last counted token) from the start.
  An accepting state is kept: the turn ended there (tokens after it are ignored)."""
  def step(state, inputs):
    token, used = inputs
    nxt = automaton.token_next[state, token].astype(jnp.int32)
    return jnp.where(used & ~automaton.accepting[state], nxt, state), state
  used = jnp.arange(tokens_T.shape[0]) < count
  final, before = jax.lax.scan(step, jnp.asarray(1, jnp.int32), (tokens_T, used))
  return before, final
