"""Per-question scores as the benchmarks' official evaluation code computes them (host,
numpy). Each rule names the public file it follows; WORKSPACE.md "Benchmarks" lists which
protocol uses which.

- Multiple choice: exact option-letter accuracy, the letter read by a `LETTER_RULES` rule:
  - "mindcube": MindCube's `extract_answer` (src/evaluation/core/extractors.py) over the
    whole reply: the last match of the first pattern family that matches ("X." anywhere,
    then an `<Answer>` section, "Answer: X", a line starting with X, ..., a lone X).
  - "thinker3d": 3DThinker's evaluation: the same priority over the `<answer>` block's
    content, or the whole reply when it has none.
  - "think3d": Think3D's spagent scripts (`spagent/utils/utils.py` normalize_answer): the
    `<answer>` block if any, then the first "(X)" or "X." (A-D), else the first capital A-D
    anywhere.
  - "vsibench": VSI-Bench's scorer (thinking-in-space `lmms_eval/tasks/vsibench/utils.py`):
    the reply's first space-separated token, trailing "." removed, equal ignoring case.
  - "blink": BLINK's `analyze_answer` (eval/test_benchmark.py) without its GPT-3.5
    fallback: a bare "X" or "(X)" reply, else the one "(X)" token (whitespace-separated,
    among the question's choices) of the reply or of its last paragraph; any other reply
    goes to GPT-3.5 there and reads as no answer here.
  - "letter": strict: the answer starts with the letter ("B", "(B)", "B. sofa").
- Numeric answers (VSI-Bench's NA question types): mean relative accuracy,
  MRA = 1/|C| sum_{theta in C} 1[|pred - gt| / gt < 1 - theta], C = {0.50, 0.55, ..., 0.95}.
  The paper writes "<"; the public code compares with "<=", which differs only on a
  boundary (gt 2, pred 3 at theta 0.5): `inclusive=True` is the code's rule. An unparsable
  prediction scores 0 (the code's worst case).
- ChartQA: pix2struct's `relaxed_correctness` (pix2struct/metrics.py), best over the
  references.
- Open answers: SQuAD-normalised exact match against every reference (`exact_match`), or a
  score given from outside (a judge's verdict) passed as a number.

Which text a rule reads (`EXTRACTS`): "reply", the model's whole final text, as the
official scripts pass it, or "answer_block", the content of its first <answer>...</answer>
when there is one, else the text (`prediction_answer`). Rules that read the whole reply
themselves ("mindcube", "thinker3d", "think3d", "blink") ignore it.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from jaxspatial.rl.rewards import text as rules

# The ten confidence thresholds of VSI-Bench's MRA (the code's linspace(.5, .95, 10)).
MRA_THRESHOLDS = np.linspace(0.50, 0.95, 10)
LETTER_RULES = ("mindcube", "thinker3d", "think3d", "vsibench", "blink", "letter")
NUMBER_RULES = ("vsibench", "first_number")
EXTRACTS = ("reply", "answer_block")
METRICS = ("accuracy", "mra", "exact_match", "relaxed_accuracy")
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
_SPAGENT_LETTER = re.compile(r"\(([A-D])\)|([A-D])\.")


def prediction_answer(text: str | None) -> str:
  """The answer a model's text gives: its first <answer>...</answer>'s content, else the
  whole text; stripped ("" for None)."""
  if text is None:
    return ""
  inside = rules.answer_text(text)
  return (text if inside is None else inside).strip()


def _extracted(text: str | None, extract: str) -> str:
  if extract == "reply":
    return text or ""
  if extract == "answer_block":
    return prediction_answer(text)
  raise ValueError(f"extract: expected one of {EXTRACTS}, got {extract!r}")


def _first_token(text: str) -> str:
  """VSI-Bench's `fuzzy_matching`: the first " "-separated token, "." stripped from its end,
  then whitespace."""
  return text.split(" ")[0].rstrip(".").strip()


def _think3d_letter(text: str) -> str | None:
  answer = text.strip()
  start, end = answer.find("<answer>"), answer.find("</answer>")
  if start != -1 and end != -1 and end > start:
    answer = answer[start + len("<answer>"):end].strip()
  match = _SPAGENT_LETTER.search(answer)
  if match:
    return match.group(1) or match.group(2)
  return next((c for c in answer if c in "ABCD"), None)


def _blink_letter(text: str, num_options: int) -> str | None:
  choices = {f"({chr(ord('A') + k)})" for k in range(num_options)}
  if text in ("A", "B", "C", "D", "E"):
    return text
  if text in ("(A)", "(B)", "(C)", "(D)", "(E)"):
    return text[1]
  found = choices.intersection(text.split())
  last = choices.intersection(text.split("\n\n")[-1].split())
  if len(last) == 1 and found:
    return next(iter(last))[1]
  if len(found) == 1:
    return next(iter(found))[1]
  return None  # BLINK asks GPT-3.5 to pick a choice here


def predicted_letter(text: str | None, rule: str = "mindcube", extract: str = "answer_block",
                     num_options: int = 5) -> str | None:
  """The option letter a prediction gives under `rule` (LETTER_RULES), or None."""
  if rule == "mindcube":
    return rules.thinker3d_option(text or "")
  if rule == "thinker3d":
    inside = rules.answer_text(text or "")
    return rules.thinker3d_option(text or "" if inside is None else inside.strip())
  if rule == "think3d":
    return _think3d_letter(text or "")
  if rule == "blink":
    return _blink_letter(text or "", num_options)
  if rule == "letter":
    return rules.option_letter(_extracted(text, extract))
  if rule == "vsibench":
    token = _first_token(_extracted(text, extract))
    return token.upper() if len(token) == 1 and token.isalpha() else None
  raise ValueError(f"predicted_letter.rule: expected one of {LETTER_RULES}, got {rule!r}")


def option_correct(text: str | None, answer: str, rule: str = "mindcube",
                   extract: str = "answer_block", num_options: int = 5) -> bool:
  """Whether the prediction's option letter (by `rule`) is the reference letter."""
  letter = predicted_letter(text, rule, extract, num_options)
  return letter is not None and letter == answer.strip().upper()


def parse_number(text: str | None, rule: str = "vsibench",
                 extract: str = "answer_block") -> float | None:
  """The number a prediction gives, or None. "vsibench": the public scorer's rule (the first
  space-separated token, a trailing "." removed, as a float); "first_number": the first
  number anywhere in the answer ("about 3.5 meters" -> 3.5)."""
  answer = _extracted(text, extract)
  if rule == "vsibench":
    try:
      value = float(_first_token(answer))
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


def _chart_float(text: str) -> float | None:
  """pix2struct's reading of a number: a trailing "%" (every one of them) divides by 100."""
  try:
    return float(text.rstrip("%")) / 100.0 if text.endswith("%") else float(text)
  except ValueError:
    return None


def relaxed_correctness(target: str, prediction: str, max_relative_change: float = 0.05) -> bool:
  """ChartQA's relaxed accuracy, pix2struct's rule on the texts as given (no stripping):
  both numbers and the target non-zero -> relative change <= 5 %; otherwise equal ignoring
  case (so "0.0" against "0" is wrong)."""
  wanted, got = _chart_float(target), _chart_float(prediction)
  if got is not None and wanted:
    return abs(got - wanted) / abs(wanted) <= max_relative_change
  return prediction.lower() == target.lower()


def relaxed_correct(prediction: str | None, target: str, extract: str = "answer_block") -> bool:
  """`relaxed_correctness` of a model's text (its answer, as `extract` reads it)."""
  return relaxed_correctness(target, _extracted(prediction, extract))


def score(metric: str, prediction, answer: str, answers: Sequence[str] = (),
          letter_rule: str = "mindcube", number_rule: str = "vsibench",
          inclusive: bool = False, extract: str = "answer_block",
          num_options: int = 5) -> float:
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
    return float(option_correct(prediction, answer, letter_rule, extract, num_options))
  if metric == "mra":
    value = parse_number(prediction, number_rule, extract)
    return float(mean_relative_accuracy(np.nan if value is None else value, float(answer),
                                        inclusive=inclusive))
  if metric == "exact_match":
    return float(rules.exact_match(_extracted(prediction, extract),
                                   tuple(answers) or (answer,)))
  if metric == "relaxed_accuracy":
    return float(any(relaxed_correct(prediction, a, extract)
                     for a in (tuple(answers) or (answer,))))
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
