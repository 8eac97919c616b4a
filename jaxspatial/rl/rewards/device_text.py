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


PUNCTUATION = tuple(b"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
ARTICLES = (tuple(b"a"), tuple(b"an"), tuple(b"the"))
_HASH_BASE = 1000003


def _compact(ids_L: Array, keep_L: Array) -> Array:
  """The kept bytes moved to the front, -1 after."""
  length = ids_L.shape[-1]
  target = jnp.where(keep_L, jnp.cumsum(keep_L) - 1, length)
  return jnp.full(length + 1, -1, ids_L.dtype).at[target].set(ids_L)[:length]


def _words(ids_L: Array):
  """Per byte: is it in a word, the word's index, the byte's offset in its word; and each
  word's length and hash (words: runs of non-whitespace bytes)."""
  length = ids_L.shape[-1]
  real = ids_L >= 0
  space = jnp.zeros(length, bool)
  for byte in WHITESPACE:
    space |= ids_L == byte
  in_word = real & ~space
  previous = jnp.concatenate([jnp.zeros(1, bool), in_word[:-1]])
  starts_word = in_word & ~previous
  index = jnp.cumsum(starts_word) - 1
  start_at = jax.lax.cummax(jnp.where(starts_word, jnp.arange(length), 0))
  offset = jnp.arange(length) - start_at
  slot = jnp.where(in_word, index, length)
  word_len = jnp.zeros(length + 1, jnp.int32).at[slot].add(1)[:length]
  power = jnp.cumprod(jnp.full(length, _HASH_BASE, jnp.uint32)) // jnp.uint32(_HASH_BASE)
  term = (ids_L.astype(jnp.uint32) + 1) * power[jnp.clip(offset, 0, length - 1)]
  word_hash = jnp.zeros(length + 1, jnp.uint32).at[slot].add(term)[:length]
  return in_word, index, offset, word_len, word_hash


def normalize(ids_L: Array) -> Array:
  """`text.normalize_answer` on UTF-8 bytes: ASCII lower case, ASCII punctuation removed,
  the words a / an / the dropped, words joined by single spaces; -1 padded."""
  upper = (ids_L >= ord("A")) & (ids_L <= ord("Z"))
  ids = jnp.where(upper, ids_L + 32, ids_L)
  punct = jnp.zeros(ids.shape, bool)
  for byte in PUNCTUATION:
    punct |= ids == byte
  ids = _compact(ids, (ids >= 0) & ~punct)
  in_word, index, offset, word_len, _ = _words(ids)
  length = ids.shape[-1]
  article = jnp.zeros(length, bool)  # per word
  for word in ARTICLES:
    match = word_len == len(word)
    for k, byte in enumerate(word):
      at = jnp.zeros(length + 1, jnp.int32).at[jnp.where(in_word & (offset == k), index,
                                                          length)].add(ids == byte)[:length]
      match &= at > 0
    article |= match
  keep = in_word & ~article[jnp.clip(index, 0, length - 1)]
  kept_word = jnp.cumsum(jnp.zeros(length + 1, jnp.int32).at[
      jnp.where(keep & (offset == 0), index, length)].set(1)[:length]) - 1  # rank of kept words
  rank = kept_word[jnp.clip(index, 0, length - 1)]
  position = jnp.cumsum(keep) - 1 + rank  # one space before every kept word but the first
  out = jnp.full(length + 1, -1, ids.dtype)
  out = out.at[jnp.where(keep, position, length)].set(ids)
  gap = keep & (offset == 0) & (rank > 0)
  out = out.at[jnp.where(gap, position - 1, length)].set(ord(" "))
  return out[:length]


def exact_match(prediction_L: Array, reference_L: Array) -> Array:
  """Normalised exact match (`text.exact_match` with one reference); empty never matches."""
  a, b = normalize(prediction_L), normalize(reference_L)
  width = max(a.shape[-1], b.shape[-1])
  a = jnp.pad(a, (0, width - a.shape[-1]), constant_values=-1)
  b = jnp.pad(b, (0, width - b.shape[-1]), constant_values=-1)
  return jnp.all(a == b) & (a[0] >= 0)


def token_f1(prediction_L: Array, reference_L: Array) -> Array:
  """`text.token_f1` on device (words compared by a 32-bit hash of their bytes)."""
  def words(ids):
    normal = normalize(ids)
    in_word, _, offset, word_len, word_hash = _words(normal)
    valid = word_len > 0
    return word_hash, valid
  hp, vp = words(prediction_L)
  hr, vr = words(reference_L)
  same_pp = (hp[:, None] == hp[None]) & vp[:, None] & vp[None]
  same_pr = (hp[:, None] == hr[None]) & vp[:, None] & vr[None]
  count_p = jnp.sum(same_pp, 1)
  count_r = jnp.sum(same_pr, 1)
  first = vp & ~jnp.any(jnp.tril(same_pp, -1), 1)  # first occurrence of each distinct word
  common = jnp.sum(jnp.where(first, jnp.minimum(count_p, count_r), 0))
  n_p, n_r = jnp.sum(vp), jnp.sum(vr)
  precision = common / jnp.maximum(n_p, 1)
  recall = common / jnp.maximum(n_r, 1)
  f1 = 2 * precision * recall / jnp.maximum(precision + recall, 1e-12)
  return jnp.where((n_p > 0) & (n_r > 0) & (common > 0), f1, 0.0)


def rule_judge(prediction_L: Array, reference_L: Array, f1_threshold: float = 0.5) -> Array:
  """`text.rule_judge` with one reference, on device."""
  nonempty = normalize(prediction_L)[0] >= 0
  return nonempty & (exact_match(prediction_L, reference_L)
                     | (token_f1(prediction_L, reference_L) >= f1_threshold))


def span(ids_L: Array, start: Array, end: Array) -> Array:
  """ids[start:end] moved to the front, -1 after."""
  positions = jnp.arange(ids_L.shape[-1])
  return _compact(ids_L, (positions >= start) & (positions < end) & (ids_L >= 0))
