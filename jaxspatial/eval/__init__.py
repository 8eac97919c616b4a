"""Evaluation protocols' metrics and result reports, independent of any benchmark's files:
metrics.py (per-question scores: option-letter accuracy by the repo's answer rules,
VSI-Bench's mean relative accuracy), aggregate.py (categories x seeds x settings ->
mean and spread), report.py (results.json and the paper-layout results.md)."""

from jaxspatial.eval.aggregate import summarize
from jaxspatial.eval.metrics import (MRA_THRESHOLDS, mean_relative_accuracy, option_correct,
                                     parse_number, prediction_answer, score)
from jaxspatial.eval.report import markdown_table, results_document, write_results

__all__ = ["MRA_THRESHOLDS", "markdown_table", "mean_relative_accuracy", "option_correct",
           "parse_number", "prediction_answer", "results_document", "score", "summarize",
           "write_results"]
