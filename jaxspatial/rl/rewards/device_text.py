"""Answer extraction on device, on UTF-8 byte ids (-1 padding), matching `text.py`.

The rollout turns generated tokens into bytes with a token -> bytes table; these
functions then find the first <answer>...</answer> and its option letter without
leaving the device. Fixed shapes throughout; jit and vmap friendly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array
WHITESPACE = tuple(b" \t\n\r\x0b\x0c")


def encode(text: str) -> tuple[int, ...]:
  return tuple(text.encode("utf-8"))


def find(ids_L: Array, pattern: tuple[int, ...], start: Array | int = 0) -> Array:
  """First index >= start where `pattern` occurs, or -1."""
  length = ids_L.shape[-1]
  n = len(pattern)
  if n > length:
    return jnp.asarray(-1, jnp.int32)
  positions = jnp.arange(length - n + 1)
  hit = jnp.ones(positions.shape, bool)
  for k, byte in enumerate(pattern):
    hit &= ids_L[positions + k] == byte
  hit &= positions >= start
  return jnp.where(jnp.any(hit), jnp.argmax(hit), -1).astype(jnp.int32)


def answer_span(ids_L: Array) -> tuple[Array, Array, Array]:
  """(found, start, end) of the first <answer>...</answer> (content between the tags)."""
  open_at = find(ids_L, encode("<answer>"))
  start = open_at + len("<answer>")
  close_at = find(ids_L, encode("</answer>"), jnp.maximum(start, 0))
  found = (open_at >= 0) & (close_at >= 0)
  return found, start, close_at


def option_letter(ids_L: Array, start: Array, end: Array) -> Array:
  """Index 0..4 of the option letter at the start of ids[start:end], or -1 (as
  `text.option_letter`: optional '(', a letter A-E, then ')', '.', ':', space or end)."""
  length = ids_L.shape[-1]
  positions = jnp.arange(length)
  inside = (positions >= start) & (positions < end)
  is_space = jnp.zeros(length, bool)
  for byte in WHITESPACE:
    is_space |= ids_L == byte
  first = jnp.argmax(inside & ~is_space)  # the first non-space character of the span
  has_first = jnp.any(inside & ~is_space)
  at = lambda i: jnp.where((i < end) & (i < length), ids_L[jnp.clip(i, 0, length - 1)], -1)
  paren = at(first) == ord("(")
  letter_at = first + paren.astype(jnp.int32)
  letter = at(letter_at)
  after = at(letter_at + 1)
  is_letter = (letter >= ord("A")) & (letter <= ord("E"))
  follows = ((after == ord(")")) | (after == ord(".")) | (after == ord(":")) | (after == -1))
  for byte in WHITESPACE:
    follows |= after == byte
  ok = has_first & is_letter & follows
  return jnp.where(ok, letter - ord("A"), -1).astype(jnp.int32)


def answer_letter(ids_L: Array) -> tuple[Array, Array]:
  """(has_answer_tag, option index or -1) of a byte sequence."""
  found, start, end = answer_span(ids_L)
  letter = option_letter(ids_L, start, end)
  return found, jnp.where(found, letter, -1)


def starts(ids_L: Array, pattern: tuple[int, ...]) -> Array:
  """[L] bool: where `pattern` begins."""
  length = ids_L.shape[-1]
  n = len(pattern)
  hit = jnp.zeros(length, bool)
  if n > length:
    return hit
  positions = jnp.arange(length - n + 1)
  window = jnp.ones(positions.shape, bool)
  for k, byte in enumerate(pattern):
    window &= ids_L[positions + k] == byte
  return hit.at[positions].set(window)


def peria_format(ids_L: Array) -> Array:
  """PERIA's R_format in {-1, 0, +1} on device (as `text.peria_format`)."""
  think_end = starts(ids_L, encode("</think>"))
  action = starts(ids_L, encode("<action>"))
  has_answer = jnp.any(starts(ids_L, encode("<answer>")))
  has_think, has_action = jnp.any(think_end), jnp.any(action)
  # A </think> counts for an action when it starts at or after the previous action's end
  # and ends before this action starts.
  positions = jnp.arange(ids_L.shape[-1])
  think_done = jnp.cumsum(jnp.where(think_end, 1, 0))  # </think> starts at or before i
  gap = len("</think>")
  before = jnp.concatenate([jnp.zeros(gap, think_done.dtype), think_done[:-gap]])
  previous_end = jax.lax.cummax(jnp.where(action, positions + len("<action>"), 0))
  previous_end = jnp.concatenate([jnp.zeros(1, previous_end.dtype), previous_end[:-1]])
  at_previous = jnp.where(previous_end > 0, think_done[jnp.maximum(previous_end - 1, 0)], 0)
  thought = (before - at_previous) > 0
  broken = jnp.any(action & ~thought)
  return jnp.where(~has_think, -1, jnp.where(~has_answer, jnp.where(has_action, 0, -1),
                                             jnp.where(broken, -1, 1))).astype(jnp.int32)
