"""Per-question scores as the papers define them (host, numpy).

- Multiple choice: exact option-letter accuracy, the letter read by one of the repo's
  answer rules (`rl.rewards.text`): "letter" (Think3D / Act3D / PERIA: the answer starts
  with the letter, "B", "(B)", "B. sofa"), "thinker3d" (3DThinker's public priority of
  patterns), "vsibench" (VSI-Bench's public scorer: the first whitespace-separated token,
  a trailing "." removed, equal to the letter ignoring case).
- Numeric answers (VSI-Bench's NA question types): mean relative accuracy,
  MRA = 1/|C| sum_{theta in C} 1[|pred - gt| / gt < 1 - theta], C = {0.50, 0.55, ..., 0.95}.
  The paper writes "<"; the public code (thinking-in-space / lmms-eval) compares with "<=",
  which differs only on a boundary (gt 2, pred 3 at theta 0.5): `inclusive=True` is the
  code's rule. An unparsable prediction scores 0 (the code's worst case).
- Open answers: SQuAD-normalised exact match against every reference (`exact_match`), or a
  score given from outside (a judge's verdict) passed as a number.

The prediction is a model's whole final text: the content of its first
<answer>...</answer> when there is one, else the text (`prediction_answer`).
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from jaxspatial.rl.rewards import text as rules

# The ten confidence thresholds of VSI-Bench's MRA (the code's linspace(.5, .95, 10)).
MRA_THRESHOLDS = np.linspace(0.50, 0.95, 10)
LETTER_RULES = ("letter", "thinker3d", "vsibench")
NUMBER_RULES = ("vsibench", "first_number")
METRICS = ("accuracy", "mra", "exact_match", "relaxed_accuracy")
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def prediction_answer(text: str | None) -> str:
  """The answer a model's text gives: its first <answer>...</answer>'s content, else the
  whole text; stripped ("" for None)."""
  if text is None:
    return ""
  inside = rules.answer_text(text)
  return (text if inside is None else inside).strip()


def predicted_letter(text: str | None, rule: str = "letter") -> str | None:
  """The option letter a prediction gives under `rule` (LETTER_RULES), or None."""
  if rule == "letter":
    return rules.option_letter(prediction_answer(text))
  if rule == "thinker3d":
    return rules.thinker3d_option(rules.thinker3d_answer(text or ""))
  if rule == "vsibench":
    words = prediction_answer(text).split(" ")
    token = words[0].rstrip(".").strip() if words else ""
    return token.upper() if len(token) == 1 and token.isalpha() else None
  raise ValueError(f"predicted_letter.rule: expected one of {LETTER_RULES}, got {rule!r}")


def option_correct(text: str | None, answer: str, rule: str = "letter") -> bool:
  """Whether the prediction's option letter (by `rule`) is the reference letter."""
  letter = predicted_letter(text, rule)
  return letter is not None and letter == answer.strip().upper()


def parse_number(text: str | None, rule: str = "vsibench") -> float | None:
  """The number a prediction gives, or None. "vsibench": the public scorer's rule (the first
  whitespace-separated token, a trailing "." removed, as a float); "first_number": the
  first number anywhere in the answer ("about 3.5 meters" -> 3.5)."""
  answer = prediction_answer(text)
  if rule == "vsibench":
    token = answer.split(" ")[0].rstrip(".").strip() if answer else ""
    try:
      value = float(token)
    except ValueError:
      return None
  elif rule == "first_number":
    match = _NUMBER.search(answer)
    if match is None:
      return None
    value = float(match.group(0))
  else:
    raise ValueError(f"parse_number.rule: expected one of {NUMBER_RULES}, got {rule!r}")
  return value if np.isfinite(value) else None


def mean_relative_accuracy(prediction, target, thresholds=MRA_THRESHOLDS,
                           inclusive: bool = False) -> np.ndarray:
  """VSI-Bench's MRA per question, float64 in [0, 1], broadcast over `prediction` and
  `target`. A NaN prediction (unparsed) scores 0; a target of 0 or a non-finite target is
  refused (the relative error is undefined)."""
  prediction = np.asarray(prediction, np.float64)
  target = np.asarray(target, np.float64)
  if not np.all(np.isfinite(target)) or np.any(target == 0):
    bad = np.flatnonzero(~np.isfinite(target.ravel()) | (target.ravel() == 0))
    raise ValueError(f"mean_relative_accuracy.target: expected finite non-zero values, got "
                     f"{target.ravel()[bad[:5]].tolist()} at flat positions {bad[:5].tolist()}")
  thresholds = np.asarray(thresholds, np.float64)
  with np.errstate(invalid="ignore"):
    relative = np.abs(prediction - target) / np.abs(target)
    tolerance = 1.0 - thresholds
    hit = (relative[..., None] <= tolerance) if inclusive else (relative[..., None] < tolerance)
  hit &= np.isfinite(relative)[..., None]
  return hit.mean(axis=-1)


def _chart_number(text: str) -> float | None:
  """ChartQA's reading of a number: "12.5" -> 12.5, "40%" -> 0.4, else None."""
  text = text.strip()
  try:
    return float(text[:-1]) / 100.0 if text.endswith("%") else float(text)
  except ValueError:
    return None


def relaxed_correct(prediction: str | None, target: str, tolerance: float = 0.05) -> bool:
  """ChartQA's relaxed accuracy: a numeric answer within `tolerance` relative error of a
  numeric target (a zero target needs an exact zero), anything else equal ignoring case.
  The prediction is the text's <answer> when it has one."""
  guess = prediction_answer(prediction).strip()
  wanted, got = _chart_number(target), _chart_number(guess)
  if wanted is not None and got is not None:
    return got == wanted if wanted == 0 else abs(got - wanted) / abs(wanted) <= tolerance
  return guess.lower() == target.strip().lower()


def score(metric: str, prediction, answer: str, answers: Sequence[str] = (),
          letter_rule: str = "letter", number_rule: str = "vsibench",
          inclusive: bool = False) -> float:
  """One question's score in [0, 1] under `metric` (METRICS). A prediction that is already
  a number (bool, int, float: a judge's verdict, an episode's recorded correctness) is
  taken as the score."""
  if isinstance(prediction, (bool, int, float, np.bool_, np.integer, np.floating)):
    value = float(prediction)
    if not 0.0 <= value <= 1.0:
      raise ValueError(f"score.prediction: expected a score in [0, 1], got {value}")
    return value
  if prediction is not None and not isinstance(prediction, str):
    raise TypeError(f"score.prediction: expected str, a number or None, got "
                    f"{type(prediction).__name__}")
  if metric == "accuracy":
    return float(option_correct(prediction, answer, letter_rule))
  if metric == "mra":
    value = parse_number(prediction, number_rule)
    return float(mean_relative_accuracy(np.nan if value is None else value, float(answer),
                                        inclusive=inclusive))
  if metric == "exact_match":
    return float(rules.exact_match(prediction_answer(prediction), tuple(answers) or (answer,)))
  if metric == "relaxed_accuracy":
    return float(any(relaxed_correct(prediction, a) for a in (tuple(answers) or (answer,))))
  raise ValueError(f"score.metric: expected one of {METRICS}, got {metric!r}")


def normalized_dtw(path, reference) -> float:
  """MapTrace's normalised DTW distance on the host: the DTW distance between two 2-D
  paths (Euclidean step cost, steps (1, 0), (0, 1), (1, 1)) divided by the reference's
  number of points; the same definition as `rl.rewards.papers.normalized_dtw` (on device,
  padded). Lower is better; an empty path is infinitely far."""
  path = np.asarray(path, np.float64).reshape(-1, 2)
  reference = np.asarray(reference, np.float64).reshape(-1, 2)
  if len(reference) == 0:
    raise ValueError("normalized_dtw.reference: expected at least one point, got none")
  if len(path) == 0:
    return float("inf")
  cost = np.linalg.norm(path[:, None] - reference[None], axis=-1)
  total = np.full((len(path) + 1, len(reference) + 1), np.inf)
  total[0, 0] = 0.0
  for i in range(1, len(path) + 1):
    for j in range(1, len(reference) + 1):
      total[i, j] = cost[i - 1, j - 1] + min(total[i - 1, j], total[i, j - 1],
                                             total[i - 1, j - 1])
  return float(total[-1, -1] / len(reference))


def maptrace_correct(path, reference, threshold: float = 1.0) -> bool:
  """PERIA's MapTrace evaluation accuracy: normalised DTW distance <= `threshold` (1.0)."""
  return normalized_dtw(path, reference) <= threshold
