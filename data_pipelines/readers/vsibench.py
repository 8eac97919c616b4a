"""VSI-Bench: the Hugging Face export's columns id, dataset, scene_name, question_type,
question, options (a list of "A. ..." strings, or null for numeric answers), ground_truth.
Videos live at `video_root/<dataset>/<scene_name>.mp4`."""

from __future__ import annotations

import pathlib

from data_pipelines.readers.common import (OPTION_LETTERS, BenchmarkFormatError,
                                           BenchmarkQuestion, MissingImageError, field)
from data_pipelines.readers.tables import read_table_rows


def read_vsibench(path, video_root=None, check_videos: bool = True,
                  question_types: tuple[str, ...] | None = None) -> list[BenchmarkQuestion]:
  questions = []
  for row, record in read_table_rows(path):
    record_id = str(field(path, row, record, "id", (str, int)))
    dataset = field(path, row, record, "dataset", str, record_id)
    scene = field(path, row, record, "scene_name", str, record_id)
    kind = field(path, row, record, "question_type", str, record_id)
    if question_types is not None and kind not in question_types:
      continue
    text = field(path, row, record, "question", str, record_id)
    truth = field(path, row, record, "ground_truth", (str, int, float), record_id)
    options = record.get("options") or []
    if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
      raise BenchmarkFormatError(path, row, record_id, "options", "expected a list of strings")
    options = tuple(o.split(". ", 1)[1] if o[:3] in {f"{c}. " for c in OPTION_LETTERS} else o
                    for o in options)
    truth = str(truth)
    if options and truth not in OPTION_LETTERS[:len(options)]:
      raise BenchmarkFormatError(path, row, record_id, "ground_truth",
                                 f"expected one of {OPTION_LETTERS[:len(options)]!r}, "
                                 f"got {truth!r}")
    videos: tuple[str, ...] = ()
    if video_root is not None:
      video = pathlib.Path(video_root) / dataset / f"{scene}.mp4"
      if check_videos and not video.is_file():
        raise MissingImageError(path, row, record_id, str(video))
      videos = (str(video),)
    questions.append(BenchmarkQuestion(
        benchmark="vsibench", question_id=record_id, question=text, answer=truth,
        answers=(truth,), options=options, images=videos, category=kind, scene_id=scene,
        meta={"dataset": dataset}))
  return questions
