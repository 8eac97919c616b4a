"""Evaluation protocols' metrics and result reports, independent of any benchmark's files:
metrics.py (per-question scores: option-letter accuracy by the repo's answer rules,
VSI-Bench's mean relative accuracy), aggregate.py (categories x seeds x settings ->
mean and spread), report.py (results.json and the paper-layout results.md).

Modules:
- the papers' evaluation metrics and result reports (host, numpy; no data_pipelines): metrics.py
  (per-question scores as each benchmark's public evaluation code reads answers (the
  PAPERS.md's "Benchmarks" table): option letters by LETTER_RULES "mindcube", "thinker3d", "think3d",
  "vsibench", "blink", "letter", over the whole reply or its <answer> block (EXTRACTS);
  VSI-Bench's MRA over theta in {0.50, ..., 0.95}, "<" or the code's "<=" (`inclusive=True`), an
  unread number scoring 0; exact match; pix2struct's `relaxed_correctness`; a number given as
  the prediction (a judge's verdict, a failed item's 0) is the score; MapTrace's normalised DTW
  and its 1.0 threshold on the host),
- aggregate.py (`summarize`, the one evaluator's aggregation, for training-time evaluation
  and `launch.eval --benchmark` alike: [seeds, questions] scores -> per column "accuracy" (mean
  over seeds), "n", "std" (sample, ddof 1), "se" (over questions), "seeds"; a column of several
  categories is their mean, a pooled column the mean over all its questions; overall "micro"
  (all questions) or "macro" (the columns' mean)), report.py
  (`results_document`: results.json's {"overall", "categories"} of the primary setting,
  "settings", "comparisons" (e.g. tools - no_tools); `markdown_table`: rows = settings then a Δ
  row per compared pair, columns = categories then Overall, percent "mean ± std";
  `write_results`: results.json + results.md, each written atomically by `write_text_atomically`
  (mode 0644); `failures_line`: the failed items),
- prediction_log.py (`PredictionLog`: predictions.jsonl as an append-only ledger, a line flushed
  per finished item; `open` keeps the recorded rows when run.json holds the same resume key,
  refuses another run's naming the fields that differ, drops a line cut by a kill)
"""

from jaxspatial.eval.aggregate import summarize
from jaxspatial.eval.metrics import (MRA_THRESHOLDS, mean_relative_accuracy, option_correct,
                                     parse_number, prediction_answer, score)
from jaxspatial.eval.report import markdown_table, results_document, write_results

__all__ = ["MRA_THRESHOLDS", "markdown_table", "mean_relative_accuracy", "option_correct",
           "parse_number", "prediction_answer", "results_document", "score", "summarize",
           "write_results"]
