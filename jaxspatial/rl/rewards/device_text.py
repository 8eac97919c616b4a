"""Answer extraction on device, on UTF-8 byte ids (-1 padding), matching `text.py`.

The rollout turns generated tokens into bytes with a token -> bytes table; these
functions then find the first <answer>...</answer> and its option letter (Think3D's
leading letter; 3DThinker's letter found anywhere by a priority of patterns, on UTF-8
decoded characters classified by Python's own Unicode \\w and \\s) without leaving the
device. Fixed shapes throughout; jit and vmap friendly.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np

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


@functools.lru_cache(maxsize=None)
def _class_bounds(char_class: str) -> np.ndarray:
  """The code points where membership of a regex class (r"\\w", r"\\s") flips, read
  from Python's own `re` over every code point: a code point c is in the class when an odd
  number of bounds are <= c. Device and host rules then classify characters alike."""
  every = "".join(map(chr, range(0x110000)))
  spans = [m.span() for m in re.finditer(char_class + "+", every)]
  return np.asarray([bound for span in spans for bound in span], np.int32)


def _in_class(codepoints: Array, char_class: str) -> Array:
  bounds = jnp.asarray(_class_bounds(char_class))
  return jnp.searchsorted(bounds, codepoints, side="right") % 2 == 1


def _shifted(x_L: Array, k: int, fill) -> Array:
  """out[p] = x[p + k], `fill` outside."""
  if k == 0:
    return x_L
  pad = jnp.full((abs(k),), fill, x_L.dtype)
  return jnp.concatenate([x_L[k:], pad]) if k > 0 else jnp.concatenate([pad, x_L[:k]])


def codepoints(ids_L: Array) -> Array:
  """Per byte, the code point of the UTF-8 character it belongs to (-1 on padding). A byte
  that is no part of a well-formed lead + continuation sequence is a character of its own,
  U+FFFD (overlong forms are not checked)."""
  length = ids_L.shape[-1]
  real = ids_L >= 0
  byte = jnp.where(real, ids_L, 0)
  size = jnp.select([byte < 0x80, (byte >= 0xC2) & (byte <= 0xDF),
                     (byte >= 0xE0) & (byte <= 0xEF), (byte >= 0xF0) & (byte <= 0xF4)],
                    [1, 2, 3, 4], 0)
  is_continuation = real & ((byte & 0xC0) == 0x80)
  well_formed = real & (size > 0)
  for k in range(1, 4):
    well_formed &= (size <= k) | _shifted(is_continuation, k, False)
  covered = jnp.zeros(length, bool)
  for k in range(1, 4):
    covered |= _shifted(well_formed & (size > k), -k, False)
  lead_bits = jnp.select([size == 1, size == 2, size == 3], [byte, byte & 0x1F, byte & 0x0F],
                         byte & 0x07)
  code = lead_bits
  for k in range(1, 4):
    code = jnp.where(size > k, (code << 6) | (_shifted(byte, k, 0) & 0x3F), code)
  code = jnp.where(well_formed, code, 0xFFFD)
  starts_char = real & ~covered
  owner = jax.lax.cummax(jnp.where(starts_char, jnp.arange(length), 0))
  return jnp.where(real, code[owner], -1).astype(jnp.int32)


def _last(mask_L: Array) -> Array:
  length = mask_L.shape[-1]
  return jnp.where(jnp.any(mask_L), length - 1 - jnp.argmax(mask_L[::-1]), -1)


def _first(mask_L: Array) -> Array:
  return jnp.where(jnp.any(mask_L), jnp.argmax(mask_L), -1)


def _greedy_scan(candidate_L: Array, overlaps_previous_L: Array) -> Array:
  """The candidates a left-to-right regex scan keeps when some overlap the candidate just
  before them: along a chain of overlapping candidates every other one is kept, from the
  chain's first."""
  rank = jnp.cumsum(candidate_L) - 1
  chain_start = jax.lax.cummax(jnp.where(candidate_L & ~overlaps_previous_L, rank, -1))
  return candidate_L & ((rank - chain_start) % 2 == 0)


def thinker3d_option(ids_L: Array, start: Array, end: Array) -> Array:
  """Index 0..4 of the option letter 3DThinker's reward reads from ids[start:end] (stripped
  of whitespace first), or -1: `text.thinker3d_option` on UTF-8 bytes, its patterns in
  the same priority, \\w, \\s and \\b read with Python's Unicode classes."""
  length = ids_L.shape[-1]
  pos = jnp.arange(length)
  points = codepoints(ids_L)
  is_word = _in_class(points, r"\w") & (points >= 0)
  is_space = _in_class(points, r"\s") & (points >= 0)
  inside = (pos >= start) & (pos < end)
  content = inside & ~is_space
  lo = jnp.where(jnp.any(content), jnp.argmax(content), end)
  hi = jnp.where(jnp.any(content), length - jnp.argmax(content[::-1]), lo)
  in_text = (pos >= lo) & (pos < hi)
  t = jnp.where(in_text, ids_L, -1)  # the stripped answer's bytes, -1 elsewhere
  word, space = is_word & in_text, is_space & in_text

  def at(pattern: bytes) -> Array:  # [L] bool: `pattern` starts here, inside the text
    hit = jnp.ones(length, bool)
    for k, value in enumerate(pattern):
      hit &= _shifted(t, k, -1) == value
    return hit

  def before(mask: Array, k: int) -> Array:  # mask[p - k]
    return _shifted(mask, -k, False)

  letter = (t >= ord("A")) & (t <= ord("E"))
  lone = letter & ~before(word, 1) & ~_shifted(word, 1, False)
  newline = t == ord("\n")
  is_byte = lambda *values: functools.reduce(jnp.logical_or, [t == ord(v) for v in values])
  # Per letter position: "answer is " ends just before it, after "My " / "my " ("my
  # answer is X") or "The " / "the " ("the answer is X").
  after_answer_is = before(at(b"answer is "), 10)
  answer_is = after_answer_is & before(is_byte(" "), 11)
  after_my = answer_is & before(is_byte("y"), 12) & before(is_byte("M", "m"), 13)
  after_the = (answer_is & before(is_byte("e"), 12) & before(is_byte("h"), 13)
               & before(is_byte("T", "t"), 14))
  answer = at(b"Answer")
  answer_colon_space = answer & _shifted(is_byte(":"), 6, False) & _shifted(is_byte(" "), 7,
                                                                             False)

  # Inside "<Answer>" up to the next "<" (or the end).
  tag = _first(is_byte("<") & _shifted(answer, 1, False) & _shifted(is_byte(">"), 7, False))
  section_lo = tag + len(b"<Answer>")
  following = _first((t == ord("<")) & (pos >= section_lo))
  section_hi = jnp.where(following >= 0, following, hi)
  in_section = (tag >= 0) & (pos >= section_lo) & (pos < section_hi)
  in_section_from = lambda k: in_section & (pos - k >= section_lo)

  # A letter alone at a line start (optionally after "Answer: "), then ".", whitespace or
  # the end; the scan consumes that whitespace, so a newline it ends on cannot also open
  # the next line's match.
  plain = letter & ((pos == lo) | before(newline, 1))
  prefixed = letter & before(answer_colon_space, 8) & ((pos - 8 == lo) | before(newline, 9))
  ends = (_shifted(t, 1, -1) == ord(".")) | (pos + 1 == hi) | _shifted(space, 1, False)
  line_start = (plain | prefixed) & ends
  opener = jnp.where(plain, pos - 1, pos - 9)  # its newline
  chained = line_start & (opener > lo) & newline[jnp.clip(opener, 0, length - 1)] & \
      line_start[jnp.clip(opener - 1, 0, length - 1)]
  # Between "*" or '"'; a match's closing delimiter cannot open the next one.
  delimiter = (t == ord("*")) | (t == ord('"'))
  quoted = letter & before(delimiter, 1) & _shifted(delimiter, 1, False)
  # "Answer", then ":" optionally, whitespace, the letter.
  answer_word = answer & ~before(word, 1)
  after_colon = pos + len(b"Answer") + (_shifted(t, len(b"Answer"), -1) == ord(":"))
  next_nonspace = jax.lax.cummin(jnp.where(in_text & ~space, pos, length), reverse=True)
  target = jnp.append(next_nonspace, length)[jnp.clip(after_colon, 0, length)]
  target_ok = (target < hi) & (letter & ~_shifted(word, 1, False))[
      jnp.clip(target, 0, length - 1)]
  answer_label = jnp.where(answer_word & target_ok, target, -1)

  candidates = [
      _last(letter & (_shifted(t, 1, -1) == ord("."))),
      jnp.where(tag >= 0, _last(letter & in_section_from(13) & after_my), -1),
      jnp.where(tag >= 0, _last(letter & in_section_from(14) & after_the), -1),
      jnp.where(tag >= 0, _last(lone & in_section), -1),
      _last(_greedy_scan(line_start, chained)),
      _last(_greedy_scan(quoted, quoted & before(quoted, 2))),
      jnp.max(answer_label),
      _last(letter & after_my),
      _last(letter & after_answer_is),
  ]
  line = jnp.cumsum(newline)
  last_line = line[jnp.maximum(_last(lone), 0)]
  candidates.append(_first(lone & (line == last_line)))
  found = jnp.stack(candidates)
  chosen = found[jnp.argmax(found >= 0)]
  return jnp.where(chosen >= 0, ids_L[jnp.maximum(chosen, 0)] - ord("A"), -1).astype(jnp.int32)


def thinker3d_answer_letter(ids_L: Array) -> Array:
  """3DThinker's option index (0..4, or -1) of the first <answer>...</answer>."""
  found, start, end = answer_span(ids_L)
  return jnp.where(found, thinker3d_option(ids_L, start, end), -1)


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
