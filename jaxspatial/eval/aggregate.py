"""Per-question scores over seeds -> per-category and overall results with their spread.

A column of a paper's table is one or more raw categories: one category's value is the
mean score of its questions; a column of several (VSI-Bench's relative direction: easy,
medium, hard) is the mean of its categories' values, as VSI-Bench's public scorer
averages them. Overall is "micro" (the mean over every question: MindCube, BLINK) or
"macro" (the mean of the columns: VSI-Bench's average). A pooled column (the demo's
"explore": left and right) is the mean over every question of its categories. Each value is
computed per seed; the result is the mean over seeds, the sample standard deviation over
seeds (ddof 1; 0 for one seed) and the standard error over questions (of the seed-mean
scores; sqrt(p (1 - p) / n) for right-or-wrong answers). Scores and values are fractions in
[0, 1]. Training-time evaluation and `launch.eval --benchmark` both report through it.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

OVERALL_MODES = ("micro", "macro")


def spread(values) -> float:
  """The sample standard deviation over seeds (ddof 1), 0.0 for a single seed."""
  values = np.asarray(values, np.float64)
  return float(np.std(values, ddof=1)) if values.size > 1 else 0.0


def standard_error(scores_Q) -> float:
  """The standard error of a mean over questions (population variance: for right-or-wrong
  answers sqrt(p (1 - p) / n))."""
  scores_Q = np.asarray(scores_Q, np.float64)
  return float(np.std(scores_Q) / np.sqrt(scores_Q.size)) if scores_Q.size else 0.0


def _entry(per_seed, n: int, se: float) -> dict:
  per_seed = [float(v) for v in per_seed]
  return {"accuracy": float(np.mean(per_seed)), "n": int(n), "std": spread(per_seed),
          "se": float(se), "seeds": per_seed}


def _mean_se(entries) -> float:
  """The standard error of a mean of independent means."""
  return float(np.sqrt(sum(e["se"] ** 2 for e in entries)) / len(entries))


def summarize(scores, categories: Sequence[str], columns: Sequence[str] | None = None,
              groups: Mapping[str, Sequence[str]] | None = None,
              overall: str = "micro",
              pooled: Mapping[str, Sequence[str]] | None = None) -> dict:
  """{"overall": entry, "categories": {column: entry}}, entry = {"accuracy" (the mean over
  seeds), "n" (questions), "std" (over seeds), "se" (over questions), "seeds" (the per-seed
  values)}.

  scores: [seeds, questions] per-question scores in [0, 1] (a 1-D array is one seed).
  categories: each question's raw category.
  columns: the reported columns in order (default: `groups`' keys, else the categories in
    first-seen order); each column's raw categories are `groups[column]` (default the
    column itself). A column with no question is left out; a question whose category no
    column takes counts in the micro overall only.
  pooled: extra columns, each the mean over every question of its raw categories (after
    `columns`; not part of a macro overall).
  """
  scores = np.asarray(scores, np.float64)
  if scores.ndim == 1:
    scores = scores[None]
  if scores.ndim != 2 or scores.shape[0] == 0:
    raise ValueError(f"summarize.scores: expected [seeds, questions] with at least one seed, "
                     f"got shape {scores.shape}")
  if scores.shape[1] != len(categories):
    raise ValueError(f"summarize.categories: expected one per question ({scores.shape[1]}), "
                     f"got {len(categories)}")
  if not np.all(np.isfinite(scores)) or np.any((scores < 0) | (scores > 1)):
    raise ValueError("summarize.scores: expected finite values in [0, 1]")
  if overall not in OVERALL_MODES:
    raise ValueError(f"summarize.overall: expected one of {OVERALL_MODES}, got {overall!r}")
  groups = dict(groups or {})
  if columns is None:
    columns = list(groups) or list(dict.fromkeys(categories))
  categories = np.asarray(list(categories), dtype=object)
  out = {}
  question_means = scores.mean(axis=0)
  for column in columns:
    parts = [c for c in groups.get(column, (column,)) if np.any(categories == c)]
    if not parts:
      continue
    per_part = [scores[:, categories == c].mean(axis=1) for c in parts]
    n = sum(int(np.sum(categories == c)) for c in parts)
    se = _mean_se([{"se": standard_error(question_means[categories == c])} for c in parts])
    out[column] = _entry(np.mean(per_part, axis=0), n, se)
  if overall == "micro" or not out:
    total = _entry(scores.mean(axis=1), scores.shape[1], standard_error(question_means))
  else:
    per_seed = np.mean([entry["seeds"] for entry in out.values()], axis=0)
    total = _entry(per_seed, sum(entry["n"] for entry in out.values()),
                   _mean_se(out.values()))
  for column, parts in (pooled or {}).items():
    where = np.isin(categories, list(parts))
    if where.any():
      out[column] = _entry(scores[:, where].mean(axis=1), int(where.sum()),
                           standard_error(question_means[where]))
  total["mode"] = overall
  return {"overall": total, "categories": out}
