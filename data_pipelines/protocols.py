"""The papers' evaluation protocols per benchmark: the categories a table reports by (its
columns in the paper's order, and the raw categories each column takes), how overall is
formed, and which metric scores each question. Read off the readers' BenchmarkQuestion
records (`data_pipelines.readers`); the scoring itself is `jaxspatial.eval`.

- MindCube / MindCube-Tiny (MindCube, 3DThinker, Think3D): accuracy by setting, the id's
  prefix (Rotation, Around, Among), overall over all questions. MindCube-Tiny holds 1,050
  questions: among 600, around 250, rotation 200.
- VSI-Bench: the question type; multiple-choice types (relative distance, relative direction
  easy / medium / hard, route planning, appearance order) score option accuracy, numeric
  types (object counting, absolute distance, object size, room size) mean relative
  accuracy; the three relative-direction types form one column (the mean of the three),
  and overall is the mean of the eight columns (VSI-Bench's public scorer).
- VSI-Bench-tiny (Think3D): the four multiple-choice columns route planning, relative
  direction, appearance order, relative distance; overall the mean of the columns.
- BLINK multi-view: one column (the sub-task), accuracy.
- ScanQA (Act3D): one open category; scores are the judge's verdicts passed as numbers, or
  normalised exact match.
- SQA3D (Act3D): exact match by the question's first word (What, Is, How, Can, Which,
  Others), overall over all questions.
- ChartQA (PERIA): relaxed accuracy (5 % on numbers) on the human and augmented sets,
  overall their mean. HR-Bench (PERIA): option accuracy on single- and cross-instance
  questions (FSP, FCP), overall their mean.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Mapping, Sequence

from data_pipelines.readers.common import BenchmarkQuestion
from jaxspatial.eval import metrics

VSI_MULTIPLE_CHOICE = ("object_rel_distance", "object_rel_direction_easy",
                       "object_rel_direction_medium", "object_rel_direction_hard",
                       "route_planning", "obj_appearance_order")
VSI_NUMERIC = ("object_counting", "object_abs_distance", "object_size_estimation",
               "room_size_estimation")


@dataclasses.dataclass(frozen=True)
class Protocol:
  """columns: the table's category columns in the paper's order; groups: column -> its raw
  categories (default the column alone); labels: column -> the paper's header; overall:
  "micro" (all questions) or "macro" (the mean of the columns); metric: question -> a
  `jaxspatial.eval.metrics.METRICS` name; letter_rule / number_rule / inclusive / extract:
  how `jaxspatial.eval.score` reads predictions, by default as the benchmark's official
  evaluation code does (`jaxspatial.eval.metrics`; WORKSPACE.md "Benchmarks")."""

  benchmark: str
  columns: tuple[str, ...]
  labels: Mapping[str, str]
  groups: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
  overall: str = "micro"
  metric: Callable[[BenchmarkQuestion], str] = lambda question: "accuracy"
  letter_rule: str = "letter"
  number_rule: str = "vsibench"
  inclusive: bool = False
  extract: str = "answer_block"
  judge_all: bool = False  # with a judge, it scores every question (HR-Bench's scorer)
  keep: Callable[[BenchmarkQuestion], bool] = lambda question: True

  def category(self, question: BenchmarkQuestion) -> str:
    """The raw category a question is counted under (the reader's `category`)."""
    return question.category

  def column(self, question: BenchmarkQuestion) -> str | None:
    """The table column a question counts in, or None."""
    raw = self.category(question)
    for column in self.columns:
      if raw in self.groups.get(column, (column,)):
        return column
    return None

  def select(self, questions: Sequence[BenchmarkQuestion]) -> list[BenchmarkQuestion]:
    """The questions this protocol evaluates (VSI-Bench-tiny: its four types)."""
    return [q for q in questions if self.keep(q)]

  def judged(self, question: BenchmarkQuestion) -> bool:
    """Whether a judge, when one is given, scores this question: open answers (exact match
    otherwise), or every question of a judge-scored benchmark."""
    return self.judge_all or self.metric(question) == "exact_match"

  def score(self, question: BenchmarkQuestion, prediction) -> float:
    """One question's score: the prediction's text (or a verdict given as a number) under
    this protocol's metric and rules."""
    return metrics.score(self.metric(question), prediction, question.answer, question.answers,
                         letter_rule=self.letter_rule, number_rule=self.number_rule,
                         inclusive=self.inclusive, extract=self.extract,
                         num_options=len(question.options) or 5)

  def counts(self, questions: Sequence[BenchmarkQuestion]) -> dict[str, int]:
    """{column: number of questions} over the selected questions, in column order."""
    counted = collections.Counter(self.column(q) for q in self.select(questions))
    return {c: counted[c] for c in self.columns if counted[c]}


def _vsi_metric(question: BenchmarkQuestion) -> str:
  if question.category in VSI_NUMERIC:
    return "mra"
  if question.category in VSI_MULTIPLE_CHOICE:
    return "accuracy"
  raise ValueError(f"VSI-Bench question {question.question_id!r}: question_type: expected one "
                   f"of {VSI_MULTIPLE_CHOICE + VSI_NUMERIC}, got {question.category!r}")


SQA3D_TYPES = ("what", "is", "how", "can", "which", "others")  # readers.sqa3d
HRBENCH_TYPES = ("single", "cross")

_MINDCUBE = dict(columns=("rotation", "around", "among"),
                 labels={"rotation": "Rotation", "around": "Around", "among": "Among"})
_DIRECTION = ("object_rel_direction_easy", "object_rel_direction_medium",
              "object_rel_direction_hard")
_VSI_LABELS = {"object_counting": "Obj. Count", "object_abs_distance": "Abs. Dist.",
               "object_size_estimation": "Obj. Size", "room_size_estimation": "Room Size",
               "object_rel_distance": "Rel. Dist.", "object_rel_direction": "Rel. Dir.",
               "route_planning": "Route Plan", "obj_appearance_order": "Appr. Order"}
_VSI_RULES = dict(letter_rule="vsibench", number_rule="vsibench", inclusive=True, extract="reply")
_THINK3D_VSI = ("route_planning", "object_rel_direction", "obj_appearance_order",
                "object_rel_distance")

PROTOCOLS = {
    # MindCube's extract_answer over the whole reply.
    "mindcube": Protocol("mindcube", letter_rule="mindcube", **_MINDCUBE),
    "mindcube_tiny": Protocol("mindcube_tiny", letter_rule="mindcube", **_MINDCUBE),
    # VSI-Bench's scorer: the reply's first token, MRA with the code's "<=".
    "vsibench": Protocol("vsibench", columns=tuple(_VSI_LABELS), labels=_VSI_LABELS,
                         groups={"object_rel_direction": _DIRECTION}, overall="macro",
                         metric=_vsi_metric, **_VSI_RULES),
    "vsibench_tiny": Protocol("vsibench_tiny", columns=_THINK3D_VSI,
                              labels={c: _VSI_LABELS[c] for c in _THINK3D_VSI},
                              groups={"object_rel_direction": _DIRECTION}, overall="macro",
                              metric=_vsi_metric,
                              keep=lambda q: q.category in VSI_MULTIPLE_CHOICE, **_VSI_RULES),
    # BLINK's analyze_answer (its GPT-3.5 choice extraction not run).
    "blink_mv": Protocol("blink_mv", columns=("Multi-view_Reasoning",),
                         labels={"Multi-view_Reasoning": "Multi-view"}, letter_rule="blink"),
    "scanqa": Protocol("scanqa", columns=("open",), labels={"open": "ScanQA"},
                       metric=lambda question: "exact_match"),
    # SQA3D's table: EM@1 by the question's first word, overall over all questions.
    "sqa3d": Protocol("sqa3d", columns=SQA3D_TYPES, labels={t: t.capitalize()
                                                            for t in SQA3D_TYPES},
                      metric=lambda question: "exact_match"),
    # ChartQA: relaxed accuracy on the human and augmented sets, their mean as overall.
    "chartqa": Protocol("chartqa", columns=("human", "augmented"),
                        labels={"human": "Human", "augmented": "Augmented"}, overall="macro",
                        metric=lambda question: "relaxed_accuracy"),
    # HR-Bench: fine-grained single-instance (FSP) and cross-instance (FCP) perception,
    # overall their mean.
    # With a judge (`--judge_url`), HR-Bench's scorer: an LLM's yes / no on each answer.
    "hrbench": Protocol("hrbench", columns=HRBENCH_TYPES,
                        labels=dict(zip(HRBENCH_TYPES, ("FSP", "FCP"))), overall="macro",
                        groups={"single": ("single", "single_instance"),
                                "cross": ("cross", "cross_instance")}, judge_all=True),
}


def protocol(name: str, **rules) -> Protocol:
  """The named benchmark's protocol; `rules` (letter_rule, number_rule, inclusive, extract)
  replace its official defaults by a named option (e.g. letter_rule="think3d": Think3D's own
  scripts on MindCube)."""
  if name not in PROTOCOLS:
    raise ValueError(f"benchmark: expected one of {sorted(PROTOCOLS)}, got {name!r}")
  unknown = set(rules) - {"letter_rule", "number_rule", "inclusive", "extract"}
  if unknown:
    raise ValueError(f"protocol {name!r}: unknown rule options {sorted(unknown)}; expected "
                     "letter_rule, number_rule, inclusive, extract")
  options = {"letter_rule": metrics.LETTER_RULES, "number_rule": metrics.NUMBER_RULES,
             "extract": metrics.EXTRACTS, "inclusive": (True, False)}
  for key, value in rules.items():
    if value not in options[key]:
      raise ValueError(f"protocol {name!r}: {key}: expected one of {list(options[key])}, got "
                       f"{value!r}")
  return dataclasses.replace(PROTOCOLS[name], **rules)
