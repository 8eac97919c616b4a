"""BLINK (the Multi-view_Reasoning subtask and the others): the Hugging Face export's
columns idx, question, sub_task, image_1 .. image_4, choices, answer ("(A)"), prompt.

Images are either embedded ({"bytes", "path"} structs, kept in `meta["image_bytes"]`)
or paths joined to `image_root`.
"""

from __future__ import annotations

import re

from data_pipelines.readers.common import (OPTION_LETTERS, BenchmarkFormatError,
                                           BenchmarkQuestion, QuestionIds, check_options,
                                           field, resolve_images)
from data_pipelines.readers.tables import read_table_rows

_ANSWER = re.compile(r"^\(?([A-F])\)?$")


def read_blink(path, image_root=None, check_images: bool = True,
               sub_task: str | None = "Multi-view_Reasoning") -> list[BenchmarkQuestion]:
  """Reads the rows of `sub_task` (all rows with None). The answer keeps only its letter."""
  questions, ids = [], QuestionIds(path, "idx")
  for row, record in read_table_rows(path, "idx"):
    record_id = str(field(path, row, record, "idx", (str, int)))
    ids.add(row, record_id)
    task = field(path, row, record, "sub_task", str, record_id)
    if sub_task is not None and task != sub_task:
      continue
    text = field(path, row, record, "question", str, record_id)
    choices = field(path, row, record, "choices", list, record_id)
    answer = field(path, row, record, "answer", str, record_id)
    check_options(path, row, record_id, "choices", choices)
    match = _ANSWER.match(answer.strip())
    if not match or OPTION_LETTERS.index(match.group(1)) >= len(choices):
      raise BenchmarkFormatError(path, row, record_id, "answer",
                                 f"expected one of ({OPTION_LETTERS[:len(choices)]}) as "
                                 f"'(A)', got {answer!r}")
    paths, fields, blobs = [], [], []
    for k in range(1, 5):
      image = record.get(f"image_{k}")
      if image is None:
        continue
      if isinstance(image, dict) and isinstance(image.get("bytes"), bytes) and image["bytes"]:
        blobs.append(image["bytes"])
      elif isinstance(image, dict) and not image.get("bytes") and image.get("path"):
        paths.append(image["path"])  # checked by resolve_images: a relative path inside
        fields.append(f"image_{k}")
      elif isinstance(image, str):
        paths.append(image)
        fields.append(f"image_{k}")
      else:
        raise BenchmarkFormatError(path, row, record_id, f"image_{k}",
                                   "expected a path or a {bytes, path} struct, got "
                                   f"{type(image).__name__} {image!r:.60}")
    if not paths and not blobs:
      raise BenchmarkFormatError(path, row, record_id, "image_1", "no image in the row")
    questions.append(BenchmarkQuestion(
        benchmark="blink", question_id=record_id, question=text, answer=match.group(1),
        answers=(match.group(1),), options=tuple(str(c) for c in choices),
        images=resolve_images(path, row, record_id, paths, image_root, check_images,
                              fields),
        category=task,
        meta={"prompt": record.get("prompt", ""), "image_bytes": tuple(blobs)}))
  return questions
