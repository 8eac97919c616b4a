"""A benchmark's predictions -> the papers' results (what `launch.eval --benchmark` will call
once backends produce predictions): every setting (with tools, without, other models) and
seed scored by the benchmark's protocol (data_pipelines.protocols, jaxspatial.eval),
aggregated per category over seeds, written as results.json and results.md."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from data_pipelines.protocols import Protocol, protocol as named_protocol
from data_pipelines.readers.common import BenchmarkQuestion
from jaxspatial.eval import report
from jaxspatial.eval.aggregate import summarize

# Settings compared in the table when both are present: the tool loop against the model alone.
TOOL_PAIRS = (("tools", "no_tools"),)


def question_scores(questions: Sequence[BenchmarkQuestion], predictions: Mapping[str, Any],
                    spec: Protocol, where: str = "") -> np.ndarray:
  """[questions] scores of one run: `predictions[question_id]` is the model's text (scored by
  the protocol's metric for the question) or a number (a verdict, taken as the score).
  A question without a prediction is an error naming the run and the first ids."""
  missing = [q.question_id for q in questions if q.question_id not in predictions]
  if missing:
    raise ValueError(f"predictions{where}: {len(missing)} of {len(questions)} questions have no "
                     f"prediction, first {missing[:5]}")
  scores = np.zeros(len(questions), np.float64)
  for k, q in enumerate(questions):
    try:
      scores[k] = spec.score(q, predictions[q.question_id])
    except (TypeError, ValueError) as error:
      raise type(error)(f"predictions{where}[{q.question_id!r}] ({spec.benchmark}, "
                        f"answer {q.answer!r}): {error}") from None
  return scores


def evaluate_predictions(questions: Sequence[BenchmarkQuestion],
                         predictions: Mapping[str, Mapping[Any, Mapping[str, Any]]],
                         benchmark: str | Protocol, out_dir=None,
                         compare: Sequence[tuple[str, str]] | None = None,
                         primary: str | None = None, title: str | None = None,
                         failures: Mapping[str, dict] | None = None) -> dict:
  """The results document of `predictions[setting][seed][question_id]` (text or score) over
  the benchmark's questions; written to `out_dir` (results.json, results.md) when given.

  Every seed of every setting must predict every question the protocol selects; ids no
  question has are an error (the wrong benchmark's predictions). `compare` defaults to
  ("tools", "no_tools") when both settings are present. `failures`: per setting {"items",
  "failed", "categories": {column: count}}, the items whose request or episode failed (they
  score 0), shown beside the accuracy."""
  spec = named_protocol(benchmark) if isinstance(benchmark, str) else benchmark
  selected = spec.select(questions)
  if not selected:
    raise ValueError(f"{spec.benchmark}: no question to evaluate (of {len(questions)} read)")
  if not predictions:
    raise ValueError(f"{spec.benchmark}: predictions: expected at least one setting, got none")
  known = {q.question_id for q in questions}
  categories = [spec.category(q) for q in selected]
  settings, seeds = {}, {}
  for setting, runs in predictions.items():
    if not runs:
      raise ValueError(f"predictions[{setting!r}]: expected at least one seed, got none")
    rows = []
    for seed, answers in runs.items():
      unknown = [k for k in answers if k not in known]
      if unknown:
        raise ValueError(f"predictions[{setting!r}][{seed!r}]: {len(unknown)} ids are no "
                         f"question of {spec.benchmark}, first {unknown[:5]}")
      rows.append(question_scores(selected, answers, spec, f"[{setting!r}][{seed!r}]"))
    settings[setting] = summarize(np.stack(rows), categories, spec.columns, spec.groups,
                                  spec.overall)
    seeds[setting] = [str(seed) for seed in runs]
  if compare is None:
    compare = [pair for pair in TOOL_PAIRS if all(name in settings for name in pair)]
  document = report.results_document(
      settings, benchmark=spec.benchmark, primary=primary, columns=[
          c for c in spec.columns if any(c in s["categories"] for s in settings.values())],
      labels=spec.labels, compare=compare, seeds=seeds, questions=len(selected),
      metrics=sorted({spec.metric(q) for q in selected}),
      **({} if failures is None else {"failures": dict(failures)}))
  if out_dir is not None:
    report.write_results(out_dir, document, title)
  return document
