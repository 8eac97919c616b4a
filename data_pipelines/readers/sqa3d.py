"""SQA3D (Ma et al., ICLR 2023), its published pair of files per split:

    v1_balanced_questions_{split}_scannetv2.json
        {"info", "license", ..., "questions": [{"scene_id", "situation",
         "alternative_situation": [str], "question", "question_id"}]}
    v1_balanced_sqa_annotations_{split}_scannetv2.json
        {"info", ..., "annotations": [{"scene_id", "question_type", "answer_type",
         "question_id", "answers": [{"answer", "answer_confidence", "answer_id"}],
         "rotation": {"_x", "_y", "_z", "_w"}, "position": {"x", "y", "z"}}]}

Questions and annotations pair up by question_id (an integer in the published files).
Category: the question type SQA3D's tables report by (What / Is / How / Can / Which /
Others), read off the question's start as the public evaluation code does (the LEO /
3D-VisTA / SceneVerse `get_sqa_question_type`: a case-insensitive prefix "what", "is",
"how", "can", "which", else "others"). The situation, its alternatives, the position
(x, y, z), the rotation quaternion (x, y, z, w), answer_type and question_type go into meta.

Position and rotation, as SQA3D's own visualisation (utils/visualize_data.py) uses them: the
position is metres in the frame of the raw `_vh_clean_2.ply` vertices moved so that the
centre of their bounding box is the origin (z = 0 there); the agent is the arrow along -x
turned by the quaternion (scipy's x, y, z, w order), so it faces R(q) (-1, 0, 0).
`data_pipelines.benchmarks.scannet.sqa3d_pose` maps this into a scan's frame.
"""

from __future__ import annotations

import math
import pathlib

from data_pipelines.readers.common import (BenchmarkFormatError, BenchmarkQuestion,
                                           MissingImageError, QuestionIds, field,
                                           inside_root, read_json)

CATEGORIES = ("what", "is", "how", "can", "which", "others")


def sqa3d_category(question: str) -> str:
  """SQA3D's question type: the first of what / is / how / can / which that the question
  starts with (case-insensitive, leading spaces ignored), else "others"."""
  start = question.lstrip().lower()
  return next((c for c in CATEGORIES[:-1] if start.startswith(c)), "others")


def _load(path, key: str) -> list:
  path = pathlib.Path(path)
  if not path.exists():
    raise FileNotFoundError(f"benchmark file not found: {path}")
  record = read_json(path)
  if not isinstance(record, dict) or key not in record:
    got = f"keys {sorted(record)[:8]}" if isinstance(record, dict) else type(record).__name__
    raise BenchmarkFormatError(path, 0, None, key, f"expected a JSON object with a {key!r} "
                               f"list, got {got}")
  rows = record[key]
  if not isinstance(rows, list) or not rows:
    got = "an empty list" if isinstance(rows, list) else type(rows).__name__
    raise BenchmarkFormatError(path, 0, None, key, f"expected a list of records, got {got}")
  return rows


def _question_id(path, row: int, record) -> str:
  if not isinstance(record, dict):
    raise BenchmarkFormatError(path, row, None, "<record>", f"expected a JSON object, got "
                               f"{type(record).__name__}")
  value = field(path, row, record, "question_id", (int, str))
  if isinstance(value, str) and not value.strip():
    raise BenchmarkFormatError(path, row, value, "question_id", "expected a non-empty id")
  return str(value)


def _numbers(path, row: int, record_id, record: dict, name: str, keys) -> tuple[float, ...]:
  value = field(path, row, record, name, dict, record_id)
  out = []
  for key in keys:
    if key not in value:
      raise BenchmarkFormatError(path, row, record_id, f"{name}.{key}", "missing")
    number = value[key]
    if not isinstance(number, (int, float)) or isinstance(number, bool) or not math.isfinite(
        number):
      raise BenchmarkFormatError(path, row, record_id, f"{name}.{key}", f"expected a finite "
                                 f"number, got {number!r:.40}")
    out.append(float(number))
  return tuple(out)


def read_sqa3d(questions_path, annotations_path, scene_root=None,
               check_scenes: bool = True) -> list[BenchmarkQuestion]:
  """Every question with its annotation, in the questions file's order. With `scene_root`,
  each question's scene folder (`scene_root/<scene_id>`) must exist when `check_scenes`.
  Errors name the file, the row (from 1, within its list), the question id and the field."""
  annotations: dict[str, tuple[int, dict]] = {}
  annotation_ids = QuestionIds(annotations_path, "question_id")
  for row, record in enumerate(_load(annotations_path, "annotations"), 1):
    record_id = _question_id(annotations_path, row, record)
    annotation_ids.add(row, record_id)
    annotations[record_id] = (row, record)

  questions, seen = [], QuestionIds(questions_path, "question_id")
  for row, record in enumerate(_load(questions_path, "questions"), 1):
    record_id = _question_id(questions_path, row, record)
    seen.add(row, record_id)
    text = field(questions_path, row, record, "question", str, record_id)
    if not text.strip():
      raise BenchmarkFormatError(questions_path, row, record_id, "question",
                                 "expected a non-empty question")
    situation = field(questions_path, row, record, "situation", str, record_id)
    scene_id = field(questions_path, row, record, "scene_id", str, record_id)
    alternatives = record.get("alternative_situation", [])
    if not isinstance(alternatives, list) or not all(isinstance(s, str) for s in alternatives):
      raise BenchmarkFormatError(questions_path, row, record_id, "alternative_situation",
                                 "expected a list of strings")
    if record_id not in annotations:
      raise BenchmarkFormatError(questions_path, row, record_id, "question_id",
                                 f"no annotation with this id in {annotations_path}")
    arow, annotation = annotations[record_id]
    a_scene = field(annotations_path, arow, annotation, "scene_id", str, record_id)
    if a_scene != scene_id:
      raise BenchmarkFormatError(annotations_path, arow, record_id, "scene_id",
                                 f"expected {scene_id!r} (the question's scene in "
                                 f"{questions_path}, row {row}), got {a_scene!r}")
    entries = field(annotations_path, arow, annotation, "answers", list, record_id)
    if not entries:
      raise BenchmarkFormatError(annotations_path, arow, record_id, "answers",
                                 "expected at least one answer")
    answers = []
    for k, entry in enumerate(entries):
      if not isinstance(entry, dict):
        raise BenchmarkFormatError(annotations_path, arow, record_id, f"answers[{k}]",
                                   f"expected an object, got {type(entry).__name__}")
      answer = entry.get("answer")
      if not isinstance(answer, str) or not answer.strip():
        raise BenchmarkFormatError(annotations_path, arow, record_id, f"answers[{k}].answer",
                                   f"expected a non-empty string, got {answer!r:.40}")
      if answer not in answers:
        answers.append(answer)
    position = _numbers(annotations_path, arow, record_id, annotation, "position",
                        ("x", "y", "z"))
    rotation = _numbers(annotations_path, arow, record_id, annotation, "rotation",
                        ("_x", "_y", "_z", "_w"))
    if math.hypot(*rotation) < 1e-6:
      raise BenchmarkFormatError(annotations_path, arow, record_id, "rotation",
                                 f"expected a non-zero quaternion, got {list(rotation)}")
    extra = {}
    for name in ("answer_type", "question_type"):
      if name in annotation:
        extra[name] = field(annotations_path, arow, annotation, name, str, record_id)
    folder = inside_root(questions_path, row, record_id, "scene_id", scene_id, scene_root)
    if scene_root is not None and check_scenes:
      try:
        found = pathlib.Path(folder).is_dir()
      except (OSError, ValueError) as error:
        raise BenchmarkFormatError(questions_path, row, record_id, "scene_id",
                                   f"cannot look up {folder[:80]!r}: {error}") from None
      if not found:
        raise MissingImageError(questions_path, row, record_id, folder)
    questions.append(BenchmarkQuestion(
        benchmark="sqa3d", question_id=record_id, question=text, answer=answers[0],
        answers=tuple(answers), category=sqa3d_category(text), scene_id=scene_id,
        meta={"situation": situation, "alternative_situation": tuple(alternatives),
              "position": position, "rotation": rotation, "row": row,
              "annotation_row": arow, **extra}))
  orphans = set(annotations) - set(seen.rows)
  if orphans:
    record_id = min(orphans, key=lambda i: annotations[i][0])
    raise BenchmarkFormatError(annotations_path, annotations[record_id][0], record_id,
                               "question_id", f"no question with this id in {questions_path} "
                               f"({len(orphans)} annotation(s) without a question)")
  return questions
