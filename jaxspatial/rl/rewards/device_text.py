"""Answer extraction on device, on UTF-8 byte ids (-1 padding), matching `text.py`.

The rollout turns generated tokens into bytes with a token -> bytes table; these
functions then find the first <answer>...</answer> and its option letter (Think3D's
leading letter; 3DThinker's letter found anywhere by a priority of patterns, on UTF-8
decoded characters classified by Python's own Unicode \\w and \\s), and PERIA's public
format and rule checks (`peria_format`, `peria_correct`), without leaving the device.
Fixed shapes throughout; jit and vmap friendly.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np

from jaxspatial.rl.rewards.text import PERIA_SYNONYMS

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


def in_class(codepoints: Array, char_class: str) -> Array:
  """Whether each code point is in a regex class ("\\w", "\\s", ...) as Python reads it."""
  bounds = jnp.asarray(_class_bounds(char_class))
  return jnp.searchsorted(bounds, codepoints, side="right") % 2 == 1


def shifted(x_L: Array, k: int, fill) -> Array:
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
    well_formed &= (size <= k) | shifted(is_continuation, k, False)
  covered = jnp.zeros(length, bool)
  for k in range(1, 4):
    covered |= shifted(well_formed & (size > k), -k, False)
  lead_bits = jnp.select([size == 1, size == 2, size == 3], [byte, byte & 0x1F, byte & 0x0F],
                         byte & 0x07)
  code = lead_bits
  for k in range(1, 4):
    code = jnp.where(size > k, (code << 6) | (shifted(byte, k, 0) & 0x3F), code)
  code = jnp.where(well_formed, code, 0xFFFD)
  starts_char = real & ~covered
  owner = jax.lax.cummax(jnp.where(starts_char, jnp.arange(length), 0))
  return jnp.where(real, code[owner], -1).astype(jnp.int32)


def last_true(mask_L: Array) -> Array:
  """The index of the last True, -1 when none."""
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
  is_word = in_class(points, r"\w") & (points >= 0)
  is_space = in_class(points, r"\s") & (points >= 0)
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
      hit &= shifted(t, k, -1) == value
    return hit

  def before(mask: Array, k: int) -> Array:  # mask[p - k]
    return shifted(mask, -k, False)

  letter = (t >= ord("A")) & (t <= ord("E"))
  lone = letter & ~before(word, 1) & ~shifted(word, 1, False)
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
  answer_colon_space = answer & shifted(is_byte(":"), 6, False) & shifted(is_byte(" "), 7,
                                                                             False)

  # Inside "<Answer>" up to the next "<" (or the end).
  tag = _first(is_byte("<") & shifted(answer, 1, False) & shifted(is_byte(">"), 7, False))
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
  ends = (shifted(t, 1, -1) == ord(".")) | (pos + 1 == hi) | shifted(space, 1, False)
  line_start = (plain | prefixed) & ends
  opener = jnp.where(plain, pos - 1, pos - 9)  # its newline
  chained = line_start & (opener > lo) & newline[jnp.clip(opener, 0, length - 1)] & \
      line_start[jnp.clip(opener - 1, 0, length - 1)]
  # Between "*" or '"'; a match's closing delimiter cannot open the next one.
  delimiter = (t == ord("*")) | (t == ord('"'))
  quoted = letter & before(delimiter, 1) & shifted(delimiter, 1, False)
  # "Answer", then ":" optionally, whitespace, the letter.
  answer_word = answer & ~before(word, 1)
  after_colon = pos + len(b"Answer") + (shifted(t, len(b"Answer"), -1) == ord(":"))
  next_nonspace = jax.lax.cummin(jnp.where(in_text & ~space, pos, length), reverse=True)
  target = jnp.append(next_nonspace, length)[jnp.clip(after_colon, 0, length)]
  target_ok = (target < hi) & (letter & ~shifted(word, 1, False))[
      jnp.clip(target, 0, length - 1)]
  answer_label = jnp.where(answer_word & target_ok, target, -1)

  candidates = [
      last_true(letter & (shifted(t, 1, -1) == ord("."))),
      jnp.where(tag >= 0, last_true(letter & in_section_from(13) & after_my), -1),
      jnp.where(tag >= 0, last_true(letter & in_section_from(14) & after_the), -1),
      jnp.where(tag >= 0, last_true(lone & in_section), -1),
      last_true(_greedy_scan(line_start, chained)),
      last_true(_greedy_scan(quoted, quoted & before(quoted, 2))),
      jnp.max(answer_label),
      last_true(letter & after_my),
      last_true(letter & after_answer_is),
  ]
  line = jnp.cumsum(newline)
  last_line = line[jnp.maximum(last_true(lone), 0)]
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


def starts_any_case(ids_L: Array, pattern: bytes) -> Array:
  """[L] bool: where `pattern` begins, ASCII letters in either case."""
  length = ids_L.shape[-1]
  hit = jnp.zeros(length, bool)
  if len(pattern) > length:
    return hit
  positions = jnp.arange(length - len(pattern) + 1)
  window = jnp.ones(positions.shape, bool)
  for k, byte in enumerate(pattern):
    value = ids_L[positions + k]
    if chr(byte).isascii() and chr(byte).isalpha():
      window &= (value == ord(chr(byte).lower())) | (value == ord(chr(byte).upper()))
    else:
      window &= value == byte
  return hit.at[positions].set(window)


def _complete(ids_L: Array, opening: bytes, closing: bytes) -> tuple[Array, Array]:
  """(a complete opening...closing pair exists, where the first opening starts; L if
  none): the regex `opening.*?closing` (DOTALL, any case) matches, first at that start."""
  positions = jnp.arange(ids_L.shape[-1])
  opens = starts_any_case(ids_L, opening)
  first = _first_from(opens, 0)
  closed = jnp.any(starts_any_case(ids_L, closing) & (positions >= first + len(opening)))
  return jnp.any(opens) & closed, first


def peria_format(ids_L: Array) -> Array:
  """PERIA's R_format in {-1, 0, +1} on device: `text.peria_format` on bytes. Tags match
  in any ASCII case; Python's IGNORECASE also takes "\u0130", "\u0131" (for i), "\u017f"
  (s) and the Kelvin sign (k) inside tags: those count only on the host."""
  think = starts_any_case(ids_L, b"</think>")
  think_end = _first_from(think, 0) + len(b"</think>")
  has_answer, _ = _complete(ids_L, b"<answer>", b"</answer>")
  has_action, action = _complete(ids_L, b"<action>", b"</action>")
  broken = has_action & (action < think_end)
  return jnp.where(~jnp.any(think), -1, jnp.where(
      ~has_answer, jnp.where(has_action, 0, -1), jnp.where(broken, -1, 1))).astype(jnp.int32)


PUNCTUATION = tuple(b"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
ARTICLES = (tuple(b"a"), tuple(b"an"), tuple(b"the"))
_HASH_BASE = 1000003


def compact(ids_L: Array, keep_L: Array) -> Array:
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
  ids = compact(ids, (ids >= 0) & ~punct)
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
  return compact(ids_L, (positions >= start) & (positions < end) & (ids_L >= 0))


# --- PERIA's public reward manager on device (`text.peria_*`) --------------------------------
#
# Every function takes -1-padded UTF-8 byte ids and returns fixed shapes. Texts are kept
# compacted to the front. Where the device rule is narrower than Python's (`peria_rule`),
# it never gives credit the public rule would not.

PERIA_MAX_ITEMS = 16  # comma-separated pieces per side the set rule compares
_EN_DASH = encode("\u2013")
_BOXED_OPEN = encode("\\boxed{")
_SYNONYMS = tuple(tuple(sorted(w.encode() for w in synonyms))
                  for synonyms in PERIA_SYNONYMS)


@functools.lru_cache(maxsize=None)
def _whitespace_codepoints() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Python's str.isspace() (= regex \\s = what strip() and split() remove), by UTF-8
  length: one byte, two, three (none is longer)."""
  spaces = [c for c in range(0x110000) if chr(c).isspace()]
  by_length = [[c for c in spaces if len(chr(c).encode()) == n] for n in (1, 2, 3)]
  assert sum(map(len, by_length)) == len(spaces)
  return tuple(np.asarray(codes, np.int32) for codes in by_length)


def whitespace(ids_L: Array) -> Array:
  """[L] bool: the byte belongs to a whitespace character (Python's Unicode set; the text
  well-formed UTF-8)."""
  one, two, three = (jnp.asarray(codes) for codes in _whitespace_codepoints())
  second, third = shifted(ids_L, 1, -1), shifted(ids_L, 2, -1)
  follows = lambda b: (b >= 0x80) & (b <= 0xBF)
  code2 = ((ids_L & 0x1F) << 6) | (second & 0x3F)
  code3 = ((ids_L & 0x0F) << 12) | ((second & 0x3F) << 6) | (third & 0x3F)
  starts2 = (ids_L >= 0xC2) & (ids_L <= 0xDF) & follows(second) & jnp.isin(code2, two)
  starts3 = ((ids_L >= 0xE0) & (ids_L <= 0xEF) & follows(second) & follows(third)
             & jnp.isin(code3, three))
  return (jnp.isin(ids_L, one) | starts2 | shifted(starts2, -1, False) | starts3
          | shifted(starts3, -1, False) | shifted(starts3, -2, False))


def _at(ids_L: Array, index: Array) -> Array:
  """ids[index], -1 outside."""
  length = ids_L.shape[-1]
  inside = (index >= 0) & (index < length)
  return jnp.where(inside, ids_L[jnp.clip(index, 0, length - 1)], -1)


def _count(ids_L: Array) -> Array:
  return jnp.sum(ids_L >= 0)


def _first_from(mask_L: Array, start: Array) -> Array:
  """The first index >= start where mask holds, else L."""
  length = mask_L.shape[-1]
  hit = mask_L & (jnp.arange(length) >= start)
  return jnp.where(jnp.any(hit), jnp.argmax(hit), length)


def _slice(ids_L: Array, start: Array, end: Array) -> Array:
  """ids[start:end] moved to the front, -1 after (a contiguous span: no scatter)."""
  length = ids_L.shape[-1]
  start = jnp.clip(start, 0, length)
  window = jax.lax.dynamic_slice(jnp.concatenate([ids_L, jnp.full(length, -1, ids_L.dtype)]),
                                 (start,), (length,))
  return jnp.where(jnp.arange(length) < end - start, window, -1)


def strip(ids_L: Array) -> Array:
  """Python's strip() of a compacted text: leading and trailing whitespace removed."""
  content = (ids_L >= 0) & ~whitespace(ids_L)
  length = ids_L.shape[-1]
  first = jnp.argmax(content)
  end = length - jnp.argmax(content[::-1])
  return jnp.where(jnp.any(content), _slice(ids_L, first, end), -1)


def _pad_to(ids_L: Array, width: int) -> Array:
  return jnp.pad(ids_L, (0, width - ids_L.shape[-1]), constant_values=-1)


def _same(a_L: Array, b_L: Array) -> Array:
  """Equal compacted texts (any widths)."""
  width = max(a_L.shape[-1], b_L.shape[-1])
  return jnp.all(_pad_to(a_L, width) == _pad_to(b_L, width))


def peria_prediction(answer_L: Array) -> Array:
  """`text.peria_prediction` after the answer's extraction: the answer's content stripped;
  one whole `\\boxed{...}` becomes its content, stripped."""
  text = strip(answer_L)
  n = _count(text)
  boxed = (n >= len(_BOXED_OPEN) + 1) & (_at(text, n - 1) == ord("}"))
  for k, byte in enumerate(_BOXED_OPEN):
    boxed &= _at(text, k) == byte
  inner = strip(_slice(text, len(_BOXED_OPEN), n - 1))
  return jnp.where(boxed, inner, text)


def _unbox(ids_L: Array) -> Array:
  """Every `\\boxed{X}` replaced by X as Python's re.sub(r"\\\\boxed\\{(.*?)\\}", r"\\1")
  does: X runs to the first "}" and holds no newline; matches do not overlap."""
  length = ids_L.shape[-1]
  positions = jnp.arange(length)
  far = length + 1

  def next_at(mask):  # [L + 1]: the first index >= p where mask holds, else `far`
    found = jnp.where(mask, positions, far)
    return jnp.append(jax.lax.cummin(found, reverse=True), far)

  after = jnp.minimum(positions + len(_BOXED_OPEN), length)
  close = next_at(ids_L == ord("}"))[after]
  newline = next_at(ids_L == ord("\n"))[after]
  valid = starts(ids_L, _BOXED_OPEN) & (close < far) & (newline > close)
  # Candidates inside an accepted match share its "}": the first valid one of each wins.
  previous = jnp.concatenate([jnp.full(1, -1), jax.lax.cummax(
      jnp.where(valid, positions, -1))[:-1]])
  previous_close = jnp.where(previous >= 0, close[jnp.maximum(previous, 0)], -1)
  accepted = valid & (previous_close != close)
  removed = jnp.zeros(length + 1, bool).at[jnp.where(accepted, close, length)].set(True)[:length]
  for k in range(len(_BOXED_OPEN)):
    removed |= shifted(accepted, -k, False)
  return compact(ids_L, (ids_L >= 0) & ~removed)


def peria_normalize(ids_L: Array) -> Array:
  """`text.peria_normalize` on bytes: `\\boxed{}` wrappers removed, stripped, ASCII letters
  lower-cased (Python's lower() also maps non-ASCII letters: a difference), trailing "."
  dropped."""
  text = strip(_unbox(ids_L))
  upper = (text >= ord("A")) & (text <= ord("Z"))
  text = jnp.where(upper, text + 32, text)
  positions = jnp.arange(text.shape[-1])
  last = jnp.max(jnp.where((text >= 0) & (text != ord(".")), positions, -1))
  return jnp.where(positions <= last, text, -1)


def _decimal(ids_L: Array, start: Array, end: Array, signed: bool):
  """(valid, negative, integer digits, fraction digits) of ids[start:end] read as
  [+-]digits[.digits] (ASCII digits; at least one digit; "5." and ".5" allowed), the
  integer digits without leading zeros and the fraction digits without trailing zeros,
  each compacted: equal values have equal parts ("-0" is not negative)."""
  positions = jnp.arange(ids_L.shape[-1])
  span = (positions >= start) & (positions < end)
  sign = span & (positions == start) & ((ids_L == ord("+")) | (ids_L == ord("-")))
  if not signed:
    sign = jnp.zeros_like(sign)
  body = span & ~sign
  digit = body & (ids_L >= ord("0")) & (ids_L <= ord("9"))
  dot = body & (ids_L == ord("."))
  valid = jnp.all(~body | digit | dot) & (jnp.sum(dot) <= 1) & jnp.any(digit)
  dot_at = jnp.where(jnp.any(dot), jnp.argmax(dot), end)
  whole = digit & (positions < dot_at)
  fraction = digit & (positions > dot_at)
  leading = _first_from(whole & (ids_L != ord("0")), 0)
  trailing = jnp.max(jnp.where(fraction & (ids_L != ord("0")), positions, -1))
  whole_start = jnp.minimum(leading, dot_at)
  nonzero = (whole_start < dot_at) | (trailing > dot_at)
  negative = jnp.any(sign & (ids_L == ord("-"))) & nonzero
  return (valid, negative, _slice(ids_L, whole_start, dot_at),
          _slice(ids_L, dot_at + 1, trailing + 1))


def _same_decimal(a, b) -> Array:
  return a[0] & b[0] & (a[1] == b[1]) & _same(a[2], b[2]) & _same(a[3], b[3])


def _number(normalized_L: Array):
  """`text._peria_number` on bytes, its value exactly as `_decimal` parts."""
  text = strip(compact(normalized_L, (normalized_L >= 0) & (normalized_L != ord(","))))
  return _decimal(text, 0, _count(text), signed=True)


def _range(normalized_L: Array):
  """(valid, low, high) of `text._peria_range` on bytes, low and high as `_decimal` parts."""
  text = strip(normalized_L)
  n = _count(text)
  space = whitespace(text) & (text >= 0)
  numeric = ((text >= ord("0")) & (text <= ord("9"))) | (text == ord("."))
  low_end = _first_from(~numeric, 0)
  at = low_end + (_at(text, low_end) == ord("%"))
  at = _first_from(~space, at)
  hyphen = _at(text, at) == ord("-")
  en_dash = functools.reduce(jnp.logical_and, [_at(text, at + k) == b
                                               for k, b in enumerate(_EN_DASH)])
  at = at + jnp.where(hyphen, 1, len(_EN_DASH))
  high_start = _first_from(~space, at)
  high_end = _first_from(~numeric, high_start)
  end = high_end + (_at(text, high_end) == ord("%"))
  valid = (low_end > 0) & (hyphen | en_dash) & (high_end > high_start) & (end == n)
  low = _decimal(text, 0, low_end, signed=False)
  high = _decimal(text, high_start, high_end, signed=False)
  return valid & low[0] & high[0], low, high


def _items(normalized_L: Array, max_items: int):
  """Comma-separated pieces, each stripped: ([K, L] items -1 padded, [K] non-empty, fits:
  at most K pieces)."""
  length = normalized_L.shape[-1]
  positions = jnp.arange(length)
  real = normalized_L >= 0
  comma = normalized_L == ord(",")
  piece = jnp.cumsum(comma) - comma
  content = real & ~comma & ~whitespace(normalized_L)
  slot = jnp.where(content & (piece < max_items), piece, max_items)
  first = jnp.full(max_items + 1, length).at[slot].min(positions)[:max_items]
  last = jnp.full(max_items + 1, -1).at[slot].max(positions)[:max_items]
  clipped = jnp.minimum(piece, max_items - 1)
  inside = (real & ~comma & (piece < max_items) & (positions >= first[clipped])
            & (positions <= last[clipped]))
  offset = positions - first[clipped]
  rows = jnp.where(inside, piece, max_items)
  items = jnp.full((max_items + 1, length), -1, normalized_L.dtype).at[
      rows, jnp.where(inside, offset, 0)].set(normalized_L)[:max_items]
  fits = jnp.sum(comma) + 1 <= max_items
  return items, last >= 0, fits


def _synonym_table() -> tuple[np.ndarray, np.ndarray]:
  """The synonym words -1 padded to one width ([N, W]) and each word's set ([N])."""
  entries = [(w, k) for k, synonyms in enumerate(_SYNONYMS) for w in synonyms]
  width = max(len(w) for w, _ in entries) + 1
  table = np.full((len(entries), width), -1, np.int32)
  for row, (w, _) in enumerate(entries):
    table[row, :len(w)] = list(w)
  return table, np.asarray([k for _, k in entries], np.int32)


def _features(normalized_L: Array) -> dict:
  """What PERIA's rules read of one normalised text: the text, its synonym set (-1: none),
  comma pieces, the number and the range it reads as."""
  table, sets = _synonym_table()
  head = _pad_to(normalized_L, max(table.shape[1], normalized_L.shape[-1]))[:table.shape[1]]
  word = jnp.all(head == jnp.asarray(table), -1)
  synonym = jnp.where(jnp.any(word), jnp.asarray(sets)[jnp.argmax(word)], -1)
  items, present, fits = _items(normalized_L, PERIA_MAX_ITEMS)
  return dict(text=normalized_L, synonym=synonym, comma=jnp.any(normalized_L == ord(",")),
              items=items, present=present, fits=fits, number=_number(normalized_L),
              range=_range(normalized_L))


def _agree(p: dict, g: dict) -> Array:
  """Whether PERIA's rules credit the prediction's features `p` against the reference's
  `g` (texts of one width)."""
  same_items = (jnp.all(p["items"][:, None] == g["items"][None], -1)
                & p["present"][:, None] & g["present"][None])
  same_sets = (p["fits"] & g["fits"] & jnp.any(p["present"]) & jnp.any(g["present"])
               & jnp.all(~p["present"] | jnp.any(same_items, 1))
               & jnp.all(~g["present"] | jnp.any(same_items, 0)))
  p_range, g_range = p["range"], g["range"]
  return (_same(p["text"], g["text"]) | ((p["synonym"] >= 0) & (p["synonym"] == g["synonym"]))
          | (g["comma"] & same_sets) | _same_decimal(p["number"], g["number"])
          | (p_range[0] & g_range[0] & _same_decimal(p_range[1], g_range[1])
             & _same_decimal(p_range[2], g_range[2])))


def _stacked(first_L: Array, rest_RxL: Array) -> Array:
  """[1 + R, W]: one text and R more, -1 padded to one width W."""
  width = max(first_L.shape[-1], rest_RxL.shape[-1])
  return jnp.concatenate([_pad_to(first_L, width)[None],
                          jax.vmap(lambda r: _pad_to(r, width))(rest_RxL)])


def peria_rule(prediction_L: Array, reference_L: Array) -> Array:
  """`text.peria_rule` on bytes: a faithful subset of it, never crediting what the public
  rule withholds. Where it is narrower:
    lower case   ASCII letters only (Python's lower() also maps non-ASCII capitals, e.g.
                 "\\u00c9" to "\\u00e9");
    numbers      exact decimal equality of [+-]digits[.digits] (ASCII digits, commas
                 removed) instead of float() within 1e-6: the same verdict when both have
                 at most 10 integer and 5 fraction digits (zeros at the ends aside);
                 beyond, values closer than 1e-6 or equal as doubles count on the host only
                 ("1.000001" = "1", 17-digit integers); exponents, underscores and
                 non-ASCII digits parse on the host only ("1e3" = "1000", "1_000" =
                 "1000"); inf and nan never score on either;
    ranges       exact decimal equality of each end instead of float equality: the same
                 up to 15 significant digits; ASCII digits only;
    sets         at most PERIA_MAX_ITEMS comma-separated pieces a side (more: no credit);
    whitespace   Python's Unicode set, read from well-formed UTF-8."""
  features = jax.vmap(_features)(jax.vmap(peria_normalize)(
      _stacked(prediction_L, reference_L[None])))
  return _agree(*(jax.tree.map(lambda x, k=k: x[k], features) for k in (0, 1)))


def words(ids_L: Array) -> Array:
  """How many whitespace-separated words (Python's split())."""
  content = (ids_L >= 0) & ~whitespace(ids_L)
  return jnp.sum(content & ~shifted(content, -1, False))


def peria_correct(answer_L: Array, references_RxLa: Array) -> tuple[Array, Array]:
  """(rule, judge gate) of an answer's content against R references (rows starting with -1
  unused): `text.peria_correct` and `text.peria_judge_gate` (not MapTrace) on device. The
  gate: the rule failed, the prediction is non-empty and not both short (the prediction
  at most one word and the references one of at most one word). The prediction and the
  references go through one vmapped normalisation (one compiled copy)."""
  texts = _stacked(peria_prediction(answer_L), references_RxLa)
  features = jax.vmap(_features)(jax.vmap(peria_normalize)(texts))
  prediction = jax.tree.map(lambda x: x[0], features)
  agree = jax.vmap(lambda g: _agree(prediction, g))(jax.tree.map(lambda x: x[1:], features))
  real = references_RxLa[:, 0] >= 0
  nonempty = texts[0, 0] >= 0
  rule = nonempty & jnp.any(real & agree)
  counts = jax.vmap(words)(texts)
  both_short = (counts[0] <= 1) & (jnp.sum(real) == 1) & jnp.all(~real | (counts[1:] <= 1))
  gate = ~rule & nonempty & jnp.any(real) & ~both_short
  return rule, gate
