"""ScanQA v1.0: a JSON list of answers, object_ids, object_names, question, question_id,
scene_id. The test split has no answers (`require_answers=False`)."""

from __future__ import annotations

import pathlib

from data_pipelines.readers.common import (BenchmarkFormatError, BenchmarkQuestion,
                                           MissingImageError, QuestionIds, field,
                                           inside_root, read_json_rows)


def read_scanqa(path, scene_root=None, require_answers: bool = True,
                check_scenes: bool = True) -> list[BenchmarkQuestion]:
  """Reads every question. With `scene_root`, each question's scene folder
  (`scene_root/<scene_id>`) must exist when `check_scenes`."""
  questions, ids = [], QuestionIds(path, "question_id")
  for row, record in read_json_rows(path, "question_id"):
    record_id = field(path, row, record, "question_id", str)
    ids.add(row, record_id)
    text = field(path, row, record, "question", str, record_id)
    scene_id = field(path, row, record, "scene_id", str, record_id)
    object_ids = field(path, row, record, "object_ids", list, record_id)
    object_names = field(path, row, record, "object_names", list, record_id)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in object_ids):
      raise BenchmarkFormatError(path, row, record_id, "object_ids", "expected integers")
    if len(object_names) != len(object_ids):
      raise BenchmarkFormatError(path, row, record_id, "object_names",
                                 f"expected {len(object_ids)} names (one per object id), "
                                 f"got {len(object_names)}")
    answers: list = []
    if require_answers or "answers" in record:
      answers = field(path, row, record, "answers", list, record_id)
      if require_answers and not answers:
        raise BenchmarkFormatError(path, row, record_id, "answers", "expected at least one")
      if not all(isinstance(a, str) for a in answers):
        raise BenchmarkFormatError(path, row, record_id, "answers", "expected strings")
    folder = inside_root(path, row, record_id, "scene_id", scene_id, scene_root)
    if scene_root is not None and check_scenes:
      try:
        found = pathlib.Path(folder).exists()
      except (OSError, ValueError) as error:
        raise BenchmarkFormatError(path, row, record_id, "scene_id", f"cannot look up "
                                   f"{folder[:80]!r}: {error}") from None
      if not found:
        raise MissingImageError(path, row, record_id, folder)
    questions.append(BenchmarkQuestion(
        benchmark="scanqa", question_id=record_id, question=text,
        answer=answers[0] if answers else "", answers=tuple(answers), scene_id=scene_id,
        object_ids=tuple(object_ids), object_names=tuple(object_names), category="open"))
  return questions
