"""MindCube (and MindCube-Tiny): JSONL with id, category, type, meta_info, question, images,
gt_answer. The setting (among, around, rotation) is the id's prefix."""

from __future__ import annotations

from data_pipelines.readers.common import (OPTION_LETTERS, BenchmarkFormatError,
                                           BenchmarkQuestion, QuestionIds, check_options,
                                           field, option_letters, parse_options,
                                           read_json_rows,
                                           resolve_images)

SETTINGS = ("among", "around", "rotation")


def read_mindcube(path, image_root=None, check_images: bool = True) -> list[BenchmarkQuestion]:
  """Reads every row; image paths are joined to `image_root` and checked when given."""
  questions, ids = [], QuestionIds(path, "id")
  for row, record in read_json_rows(path, "id"):
    record_id = field(path, row, record, "id", str)
    ids.add(row, record_id)
    category = field(path, row, record, "category", list, record_id)
    kind = field(path, row, record, "type", (str, int), record_id)
    text = field(path, row, record, "question", str, record_id)
    images = field(path, row, record, "images", list, record_id)
    answer = field(path, row, record, "gt_answer", str, record_id)
    if "meta_info" not in record:
      raise BenchmarkFormatError(path, row, record_id, "meta_info", "missing")
    setting = record_id.split("_", 1)[0]
    if setting not in SETTINGS:
      raise BenchmarkFormatError(path, row, record_id, "id",
                                 f"expected a prefix in {SETTINGS}, got {setting!r}")
    if not images or not all(isinstance(i, str) for i in images):
      raise BenchmarkFormatError(path, row, record_id, "images",
                                 "expected a non-empty list of paths")
    stem, options = parse_options(text)
    check_options(path, row, record_id, "question", options or option_letters(text))
    if answer not in OPTION_LETTERS[:len(options)]:
      raise BenchmarkFormatError(path, row, record_id, "gt_answer",
                                 f"expected one of the {len(options)} option letters "
                                 f"{OPTION_LETTERS[:len(options)]!r}, got {answer!r}")
    questions.append(BenchmarkQuestion(
        benchmark="mindcube", question_id=record_id, question=text, answer=answer,
        answers=(answer,), options=options,
        images=resolve_images(path, row, record_id, images, image_root, check_images,
                              [f"images[{k}]" for k in range(len(images))]),
        category=setting,
        meta={"category": category, "type": kind, "meta_info": record["meta_info"],
              "stem": stem}))
  return questions
