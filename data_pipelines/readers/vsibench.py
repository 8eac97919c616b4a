"""VSI-Bench: the Hugging Face export's columns id, dataset, scene_name, question_type,
question, options (a list of "A. ..." strings, or null for numeric answers), ground_truth.
Videos live at `video_root/<dataset>/<scene_name>.mp4`."""

from __future__ import annotations

from data_pipelines.readers.common import (OPTION_LETTERS, BenchmarkFormatError,
                                           BenchmarkQuestion, QuestionIds, check_file,
                                           check_options, field, inside_root)
from data_pipelines.readers.tables import read_table_rows


def read_vsibench(path, video_root=None, check_videos: bool = True,
                  question_types: tuple[str, ...] | None = None) -> list[BenchmarkQuestion]:
  questions, ids = [], QuestionIds(path, "id")
  for row, record in read_table_rows(path, "id"):
    record_id = str(field(path, row, record, "id", (str, int)))
    ids.add(row, record_id)
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
    if options:
      check_options(path, row, record_id, "options", options)
    if options and truth not in OPTION_LETTERS[:len(options)]:
      raise BenchmarkFormatError(path, row, record_id, "ground_truth",
                                 f"expected one of {OPTION_LETTERS[:len(options)]!r}, "
                                 f"got {truth!r}")
    # Each a relative path: the dataset a folder inside the root, the scene a file inside it.
    folder = inside_root(path, row, record_id, "dataset", dataset, video_root)
    if not scene.strip():
      raise BenchmarkFormatError(path, row, record_id, "scene_name",
                                 f"expected a scene name, got {scene!r}")
    video = inside_root(path, row, record_id, "scene_name", f"{scene}.mp4", folder)
    videos: tuple[str, ...] = ()
    if video_root is not None:
      if check_videos:
        check_file(path, row, record_id, "scene_name", video)
      videos = (video,)
    questions.append(BenchmarkQuestion(
        benchmark="vsibench", question_id=record_id, question=text, answer=truth,
        answers=(truth,), options=options, images=videos, category=kind, scene_id=scene,
        meta={"dataset": dataset}))
  return questions
