"""Reward rules on strings (host): answer extraction, option letters (Think3D's leading
letter; 3DThinker's letter found anywhere by a priority of patterns), normalisation,
format checks, PERIA's public reward manager (format, rule check, judge gate) and its
repetition penalty. Evaluation and tests use these; the
on-device versions in `device_text.py` must agree with them."""

from __future__ import annotations

import collections
import itertools
import re
import string

import numpy as np

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# An option letter: optional "(", a letter A-E, then ")", ".", ":", whitespace or the end.
LETTER = re.compile(r"^\s*\(?([A-E])(?:[).:]|\s|$)")
THINKER3D_FORMAT = re.compile(
    r"<\|latent_start\|>.*?<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)


def thinker3d_latent_block_ids(ids, pieces, latent_tokens, num_latents: int = 12,
                              primed: bool = False) -> bool:
  """Whether a completion's token ids open with a real latent block: only whitespace
  tokens before the first `<|latent_start|>` id (or, `primed`, the prompt ended with it),
  then `num_latents` `<|latent_pad|>` ids and the `<|latent_end|>` id. `pieces[i]`: token
  i's bytes. The regex above reads text, where ordinary tokens can spell the block that
  the sampler never entered latent mode for; 3DThinker's format reward counts only ids
  (the host reference of `rollout.thinker3d.real_latent_block`)."""
  start, pad, end = (int(t) for t in latent_tokens)
  ids = [int(t) for t in ids]
  if primed:
    after = 0
  else:
    if start not in ids:
      return False
    first = ids.index(start)
    if any(not pieces[t] or pieces[t].strip(b" \t\n\r") for t in ids[:first]):
      return False
    after = first + 1
  block = ids[after:after + num_latents + 1]
  return block == [pad] * num_latents + [end]


def answer_text(text: str) -> str | None:
  """The content of the first <answer>...</answer>, or None."""
  match = ANSWER.search(text)
  return match.group(1) if match else None


def option_letter(answer: str | None) -> str | None:
  """'A'..'E' when the answer starts with an option letter ("B", "(B)", "B. sofa")."""
  if answer is None:
    return None
  match = LETTER.match(answer)
  return match.group(1) if match else None


def thinker3d_answer(text: str) -> str:
  """3DThinker's answer text: the first <answer>...</answer>'s content, stripped ("" when
  there is none)."""
  answer = answer_text(text)
  return "" if answer is None else answer.strip()


# 3DThinker's option letter, the public reward's patterns in priority order, each giving
# its last match. Patterns of the public list that need a letter followed by "." are left
# out after the first: the first would have matched.
_LETTER_DOT = re.compile(r"([A-E])\.")
_ANSWER_SECTION = re.compile(r"<Answer>(.*?)(?:<|$)", re.DOTALL)
_LONE_LETTER = re.compile(r"\b([A-E])\b")
_SECTION_PATTERNS = (re.compile(r"[Mm]y answer is ([A-E])"),
                     re.compile(r"[Tt]he answer is ([A-E])"), _LONE_LETTER)
_TEXT_PATTERNS = (re.compile(r"(?:^|\n)(?:Answer: )?([A-E])(?:\.|$|\s)"),
                  re.compile(r"[*\"]([A-E])[*\"]"),
                  re.compile(r"\bAnswer:?\s*([A-E])\b"),
                  re.compile(r"[Mm]y answer is ([A-E])"),
                  re.compile(r"answer is ([A-E])"))


def _last_letter(pattern: re.Pattern, text: str) -> str | None:
  last = None
  for match in pattern.finditer(text):
    last = match.group(1)
  return last


def thinker3d_option(answer: str) -> str | None:
  """The option letter 3DThinker's reward reads from an answer's text, or None: the last
  "X." anywhere; else, inside a "<Answer>" section (up to the next "<"), the last "my
  answer is X", "the answer is X" or lone X; else the last X alone at a line start
  (optionally after "Answer: ") followed by whitespace or the end, X between "*" / '"',
  "Answer" [":"] [whitespace] X, "my answer is X", "answer is X"; else the first lone X of
  the last line holding one. X is A-E (upper case); "lone" is between word boundaries."""
  if not answer:
    return None
  letter = _last_letter(_LETTER_DOT, answer)
  if letter:
    return letter
  section = _ANSWER_SECTION.search(answer)
  patterns = ((section.group(1), p) for p in _SECTION_PATTERNS) if section else ()
  for where, pattern in (*patterns, *((answer, p) for p in _TEXT_PATTERNS)):
    letter = _last_letter(pattern, where)
    if letter:
      return letter
  for line in reversed(answer.split("\n")):
    match = _LONE_LETTER.search(line)
    if match:
      return match.group(1)
  return None


def normalize_answer(text: str) -> str:
  """SQuAD-style: lower case, no punctuation, no articles, single spaces."""
  text = text.lower()
  text = "".join(c for c in text if c not in set(string.punctuation))
  text = re.sub(r"\b(a|an|the)\b", " ", text)
  return " ".join(text.split())


def exact_match(prediction: str | None, references) -> bool:
  if prediction is None:
    return False
  norm = normalize_answer(prediction)
  return bool(norm) and any(norm == normalize_answer(r) for r in references)


def token_f1(prediction: str, reference: str) -> float:
  pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
  common = sum((collections.Counter(pred) & collections.Counter(ref)).values())
  if not pred or not ref or common == 0:
    return 0.0
  precision, recall = common / len(pred), common / len(ref)
  return 2 * precision * recall / (precision + recall)


def rule_judge(prediction: str | None, references, f1_threshold: float = 0.5) -> bool:
  """A stand-in for Act3D's LLM judge until the judge callback exists: normalised exact
  match, or token F1 >= threshold against any reference."""
  if prediction is None or not normalize_answer(prediction):
    return False
  return exact_match(prediction, references) or any(
      token_f1(prediction, r) >= f1_threshold for r in references)


# PERIA's public reward manager (PEDIA's `geo_vision_qa.py`; /work/shared/reference/peria.md
# section 9). Its tag regexes ignore case; an answer or action counts only when closed.
PERIA_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
PERIA_THINK_END = re.compile(r"</think>", re.IGNORECASE)
PERIA_ACTION = re.compile(r"<action>.*?</action>", re.DOTALL | re.IGNORECASE)
_WHOLE_BOXED = re.compile(r"\\boxed\{(.*)\}", re.DOTALL)
_BOXED = re.compile(r"\\boxed\{(.*?)\}")  # no DOTALL: a wrapper does not span lines
_RANGE = re.compile(r"([\d.]+)%?\s*[-\u2013]\s*([\d.]+)%?")
PERIA_YES = frozenset({"yes", "yeah", "yep", "yup", "true", "correct"})
PERIA_NO = frozenset({"no", "nope", "nah", "false", "incorrect"})
PERIA_NOT_AVAILABLE = frozenset({"n/a", "na", "none", "not available", "not applicable"})
PERIA_SYNONYMS = (PERIA_YES, PERIA_NO, PERIA_NOT_AVAILABLE)


def peria_format(text: str) -> int:
  """PERIA's R_format in {-1, 0, +1} on the whole response, tags in any case: no `</think>`
  -> -1; no complete `<answer>...</answer>` -> 0 when a complete `<action>...</action>`
  exists (cut off by the budget), else -1; an action starting before the first `</think>`
  has ended (no `</think>` ends at or before its start) -> -1; otherwise +1. An unclosed
  `<answer>` or `<action>` is no answer or action."""
  think_end = PERIA_THINK_END.search(text)
  if think_end is None:
    return -1
  action = PERIA_ACTION.search(text)
  if PERIA_ANSWER.search(text) is None:
    return 0 if action is not None else -1
  # The earliest complete action is the one most likely to come before every </think> end.
  return -1 if action is not None and action.start() < think_end.end() else 1


def peria_prediction(response: str) -> str:
  """The prediction PERIA scores: the first `<answer>...</answer>`'s content (tags in any
  case, across lines), else the text after the first `</think>` (any case), else "";
  stripped, then a prediction that is one whole `\\boxed{...}` becomes its content,
  stripped (greedy: "\\boxed{a}\\boxed{b}" becomes "a}\\boxed{b")."""
  answer = PERIA_ANSWER.search(response)
  if answer is not None:
    prediction = answer.group(1)
  else:
    think_end = PERIA_THINK_END.search(response)
    prediction = "" if think_end is None else response[think_end.end():]
  prediction = prediction.strip()
  boxed = _WHOLE_BOXED.fullmatch(prediction)
  return boxed.group(1).strip() if boxed else prediction


def peria_normalize(answer: str) -> str:
  """Both sides of PERIA's rule, in this order: every `\\boxed{X}` becomes X (X up to the
  first "}", on one line; scanned left to right, not again over the result), then Python's
  strip() and lower(), then every trailing "." dropped (so "12 ." keeps its space)."""
  return _BOXED.sub(r"\1", answer).strip().lower().rstrip(".")


def _peria_number(normalized: str) -> float | None:
  """Python's float() of the text with its commas removed (float strips whitespace and
  takes signs, exponents, underscores between digits, inf / nan and Unicode digits)."""
  try:
    return float(normalized.replace(",", ""))
  except ValueError:
    return None


def _peria_items(normalized: str) -> frozenset:
  return frozenset(item.strip() for item in normalized.split(",")) - {""}


def _peria_range(normalized: str) -> tuple[float, float] | None:
  """(low, high) of "a-b": numbers of digits and dots, each optionally followed by "%",
  joined by a hyphen or an en dash with optional whitespace around it."""
  match = _RANGE.fullmatch(normalized.strip())
  if match is None:
    return None
  try:
    return float(match.group(1)), float(match.group(2))
  except ValueError:  # "1.2.3", "."
    return None


def peria_rule(prediction: str, reference: str) -> bool:
  """PERIA's rule check of a prediction against one reference, both normalised
  (`peria_normalize`): equal; both in one synonym set (yes, no, not available); a
  reference holding a comma and both sides the same set of stripped non-empty
  comma-separated items; both numbers (float() after removing commas) less than 1e-6
  apart ("12.0" = "12", "12.5" != "125", "1,000" = "1000"); both ranges a-b with the
  same two numbers. No token-overlap credit."""
  p, g = peria_normalize(prediction), peria_normalize(reference)
  if p == g or any(p in words and g in words for words in PERIA_SYNONYMS):
    return True
  if "," in g:
    items = _peria_items(g)
    if items and items == _peria_items(p):
      return True
  p_number, g_number = _peria_number(p), _peria_number(g)
  if p_number is not None and g_number is not None and abs(p_number - g_number) < 1e-6:
    return True
  p_range, g_range = _peria_range(p), _peria_range(g)
  return p_range is not None and p_range == g_range


def peria_correct(prediction: str, references) -> float:
  """PERIA's rule score R_correct in {0, 1} of an extracted prediction (`peria_prediction`)
  against its references: the best over them; an empty prediction scores 0."""
  if not prediction:
    return 0.0
  return float(any(peria_rule(prediction, r) for r in references))


def peria_judge_gate(prediction: str, references, rule_score: float,
                     maptrace: bool = False) -> bool:
  """Whether PERIA's public manager asks its LLM judge: the rule score is 0, the prediction
  is non-empty, the task is not MapTrace, and not both short: the prediction at most one
  whitespace-separated word and the ground truth one reference of at most one word (the
  public code counts the words of `str(ground_truth)`: a list of two or more references
  is never short)."""
  references = list(references)
  both_short = (len(prediction.split()) <= 1 and len(references) == 1
                and len(references[0].split()) <= 1)
  return (rule_score == 0 and bool(prediction) and not maptrace and bool(references)
          and not both_short)


def peria_repetition(model_text: str, num_turns: int) -> float:
  """PERIA's R_rep on model text: the public reward manager's tiers, most severe first.

  Text shorter than 20 characters scores 0. Characters, words and phrases count only as
  *consecutive* repeats (words are runs of regex \\w; consecutive copies are separated by
  whitespace alone, so "no, no, no" is no run): one character other than a newline 50+
  times in a row -3; a word 20+ times in a row -3; a phrase of 4+ words 10+ times in a
  row -2 (its inner whitespace repeated exactly; the last copy's last word may be a
  prefix, as the public regex reads it); a sentence (split at . ! ? and newlines, longer
  than 10 characters once stripped) 10+ times anywhere -1.5 * 2 / n, 7+ times -1.0 * 2 / n,
  n = max(num_turns, 2); a word 10+ times in a row -1.5; else 0. Linear in the text for
  words and characters, quadratic only in the longest whitespace-separated run of words
  for phrases (the public back-reference regex is quadratic in the whole text)."""
  if len(model_text) < 20:
    return 0.0
  turns = max(num_turns, 2)
  if _longest_character_run(model_text) >= 50:
    return -3.0
  segments = _word_segments(model_text)
  longest_word_run = max((_longest_run(words) for words, _ in segments), default=0)
  if longest_word_run >= 20:
    return -3.0
  if any(_has_phrase_run(words, gaps, min_words=4, copies=10) for words, gaps in segments):
    return -2.0
  most = _most_repeated_sentence(model_text)
  if most >= 10:
    return -1.5 * 2 / turns
  if most >= 7:
    return -1.0 * 2 / turns
  if longest_word_run >= 10:
    return -1.5
  return 0.0


def _longest_character_run(text: str) -> int:
  """The longest run of one repeated character, newlines excluded (regex `.`)."""
  return max((len(list(run)) for char, run in itertools.groupby(text) if char != "\n"),
             default=0)


_WORD = re.compile(r"\w+")
_WHITESPACE = re.compile(r"\s+")


def _word_segments(text: str) -> list[tuple[list[str], list[str]]]:
  """Maximal runs of words separated by whitespace only: (words, the whitespace between
  consecutive words) per run."""
  segments, words, gaps, previous_end = [], [], [], None
  for match in _WORD.finditer(text):
    if words and _WHITESPACE.fullmatch(text, previous_end, match.start()) is None:
      segments.append((words, gaps))
      words, gaps = [], []
    if words:
      gaps.append(text[previous_end:match.start()])
    words.append(match.group())
    previous_end = match.end()
  if words:
    segments.append((words, gaps))
  return segments


def _longest_run(words: list[str]) -> int:
  return max((len(list(run)) for _, run in itertools.groupby(words)), default=0)


def _ids(items: list[str]) -> np.ndarray:
  table: dict[str, int] = {}
  return np.asarray([table.setdefault(item, len(table)) for item in items], np.int64)


def _has_phrase_run(words: list[str], gaps: list[str], min_words: int, copies: int) -> bool:
  """Whether some phrase of k >= min_words words occurs `copies` times in a row: word p
  equals word p - k over the copies after the first (the very last word may extend the
  phrase's last word), and every gap inside a copy equals the first copy's (the gaps
  between copies are any whitespace)."""
  word_ids, gap_ids = _ids(words), _ids(gaps)
  count = len(words)
  for k in range(min_words, count // copies + 1):
    span = copies * k
    same = word_ids[k:] == word_ids[:-k]
    if np.count_nonzero(same) < span - 1 - k:
      continue
    starts = np.arange(count - span + 1)
    # Words p in [i + k, i + span - 1) must equal word p - k: window [i, i + span - 1 - k).
    word_bad = np.concatenate([[0], np.cumsum(~same)])
    words_ok = word_bad[starts + span - 1 - k] == word_bad[starts]
    if not words_ok.any():
      continue
    # Gaps q in the same window (index q - k), minus those between copies, which may
    # differ: q - k = i + c k - 1 for c = 1 .. copies - 2 (a stride-k sum).
    gap_bad = (gap_ids[k:] != gap_ids[:-k]).astype(np.int64)
    in_window = np.concatenate([[0], np.cumsum(gap_bad)])
    strided = _strided_cumsum(gap_bad, k)
    between = _at(strided, starts + (copies - 2) * k - 1) - _at(strided, starts - 1)
    gaps_ok = (in_window[starts + span - 1 - k] - in_window[starts]) - between == 0
    for i in starts[words_ok & gaps_ok]:
      if words[i + span - 1].startswith(words[i + k - 1]):
        return True
  return False


def _strided_cumsum(values: np.ndarray, stride: int) -> np.ndarray:
  """out[j] = values[j] + values[j - stride] + ..."""
  padded = np.zeros(-(-len(values) // stride) * stride, values.dtype)
  padded[:len(values)] = values
  return np.cumsum(padded.reshape(-1, stride), axis=0).reshape(-1)[:len(values)]


def _at(values: np.ndarray, index: np.ndarray) -> np.ndarray:
  """values[index], 0 where index < 0."""
  return np.where(index >= 0, values[np.maximum(index, 0)], 0)


def _most_repeated_sentence(text: str) -> int:
  sentences = (s.strip() for s in re.split(r"[.!?\n]+", text))
  counts = collections.Counter(s for s in sentences if len(s) > 10)
  return max(counts.values(), default=0)
