"""Reward rules on strings (host): answer extraction, option letters, normalisation,
format checks and PERIA's repetition penalty. Evaluation and tests use these; the
on-device versions in `device_text.py` must agree with them."""

from __future__ import annotations

import collections
import re
import string

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# An option letter: optional "(", a letter A-E, then ")", ".", ":", whitespace or the end.
LETTER = re.compile(r"^\s*\(?([A-E])(?:[).:]|\s|$)")
THINKER3D_FORMAT = re.compile(
    r"<\|latent_start\|>.*?<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)


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


def peria_format(text: str) -> int:
  """PERIA's R_format in {-1, 0, +1}, its rules in order: no </think> -> -1; no <answer>
  -> 0 if an <action> was made (truncated mid-episode) else -1; an <action> with no
  </think> since the previous action -> -1; otherwise +1."""
  if "</think>" not in text:
    return -1
  if "<answer>" not in text:
    return 0 if "<action>" in text else -1
  previous = 0
  for match in re.finditer(r"<action>", text):
    if "</think>" not in text[previous:match.start()]:
      return -1
    previous = match.end()
  return 1


def peria_repetition(model_text: str, num_turns: int) -> float:
  """PERIA's R_rep on model text, the first matching tier (most severe first)."""
  if re.search(r"(.)\1{49,}", model_text):
    return -3.0
  words = re.findall(r"\w+", model_text.lower())
  counts = collections.Counter(words)
  if counts and max(counts.values()) >= 20:
    return -3.0
  phrases = collections.Counter(tuple(words[i:i + 4]) for i in range(len(words) - 3))
  if phrases and max(phrases.values()) >= 10:
    return -2.0
  sentences = collections.Counter(s.strip() for s in re.split(r"[.!?\n]+", model_text)
                                  if s.strip())
  most = max(sentences.values()) if sentences else 0
  scale = 2.0 / max(num_turns, 1)
  if most >= 10:
    return -1.5 * scale
  if most >= 7:
    return -1.0 * scale
  if counts and max(counts.values()) >= 10:
    return -1.5
  return 0.0
