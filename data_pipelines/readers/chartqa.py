"""ChartQA (Masry et al., ACL Findings 2022) in its published layout:

    <root>/<split>/<split>_human.json       ChartQA-H, human-written questions
    <root>/<split>/<split>_augmented.json   ChartQA-M, machine-generated questions
    <root>/<split>/png/<imgname>            the charts

Each JSON file is a list of {"imgname", "query", "label"}. Questions are open (relaxed
accuracy, reported per part): the label is the reference answer. The category is the part,
"human" or "augmented". ChartQA gives no question ids; a question's id is
"<split>_<part>_<k>", k its position in the part's list from 1 (its row).
"""

from __future__ import annotations

import pathlib

from data_pipelines.readers.common import (BenchmarkFormatError, BenchmarkQuestion, field,
                                           read_json_rows, resolve_images)

PARTS = ("human", "augmented")


def chartqa_file(root, split: str, part: str) -> pathlib.Path:
  return pathlib.Path(root) / split / f"{split}_{part}.json"


def read_chartqa(root, split: str = "test", check_images: bool = True,
                 parts: tuple[str, ...] = PARTS) -> list[BenchmarkQuestion]:
  """Both parts' questions (human first, then augmented, each in file order); image paths
  are `root/<split>/png/<imgname>`, checked on disk with `check_images`.
  `meta`: file, row, split, part, imgname."""
  for part in parts:
    if part not in PARTS:
      raise ValueError(f"read_chartqa.parts: expected names in {PARTS}, got {part!r}")
  if not isinstance(split, str) or not split or "/" in split or split in (".", ".."):
    raise ValueError(f"read_chartqa.split: expected a folder name such as 'test', got "
                     f"{split!r}")
  questions = []
  images = pathlib.Path(root) / split / "png"
  for part in parts:
    path = chartqa_file(root, split, part)
    for row, record in read_json_rows(path):
      record_id = f"{split}_{part}_{row}"
      name = field(path, row, record, "imgname", str, record_id)
      query = field(path, row, record, "query", str, record_id)
      label = field(path, row, record, "label", (str, int, float), record_id)
      if not query.strip():
        raise BenchmarkFormatError(path, row, record_id, "query", "empty question")
      label = str(label)
      if not label.strip():
        raise BenchmarkFormatError(path, row, record_id, "label", "empty answer")
      (image,) = resolve_images(path, row, record_id, [name], images, check_images,
                                ["imgname"])
      questions.append(BenchmarkQuestion(
          benchmark="chartqa", question_id=record_id, question=query, answer=label,
          answers=(label,), images=(image,), category=part, scene_id=name,
          meta={"file": str(path), "row": row, "split": split, "part": part,
                "imgname": name}))
  return questions
