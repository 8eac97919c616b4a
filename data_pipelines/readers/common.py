"""What every benchmark reader returns, and the errors it raises on bad input."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
from typing import Any, Iterator

from jaxspatial import errors

OPTION_LETTERS = "ABCDEF"
# " A. text B. text ..." or "(A) text (B) text": the letters in order, each after a space/start.
_OPTION = re.compile(r"(?:^|\s)\(?([A-F])[.)]\s+")


class BenchmarkFormatError(errors.RecordError):
  """A row that does not follow its benchmark's published format."""

  def __init__(self, path, row: int, record_id, field: str, problem: str):
    self.path, self.row, self.record_id, self.field = str(path), row, record_id, field
    self.problem = problem
    super().__init__(f"{path}: row {row} (id {record_id!r}), field {field!r}: {problem}")

  def __reduce__(self):
    return type(self), (self.path, self.row, self.record_id, self.field, self.problem)


class MissingImageError(errors.MissingInputError):
  """An image a question refers to is not on disk."""

  def __init__(self, path, row: int, record_id, image: str):
    self.path, self.row, self.record_id, self.image = str(path), row, record_id, image
    super().__init__(f"{path}: row {row} (id {record_id!r}), field 'images': "
                     f"image not found: {image}")

  def __reduce__(self):
    return type(self), (self.path, self.row, self.record_id, self.image)


@dataclasses.dataclass(frozen=True)
class BenchmarkQuestion:
  """One question of a benchmark, in one shape for all of them.

  options: the multiple-choice options in letter order, () for open questions.
  answer: the correct letter for multiple choice, else the first reference answer.
  answers: every accepted answer (ScanQA lists several).
  """

  benchmark: str
  question_id: str
  question: str
  answer: str
  answers: tuple[str, ...] = ()
  options: tuple[str, ...] = ()
  images: tuple[str, ...] = ()
  category: str = ""
  scene_id: str = ""
  object_ids: tuple[int, ...] = ()
  object_names: tuple[str, ...] = ()
  meta: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)

  @property
  def is_multiple_choice(self) -> bool:
    return bool(self.options)


def parse_options(question: str) -> tuple[str, tuple[str, ...]]:
  """Splits 'stem A. x B. y ...' into (stem, (x, y, ...)); no options -> (question, ())."""
  matches = list(_OPTION.finditer(question))
  # Keep the last run of consecutive letters A, B, C, ... (a stem may mention "A." earlier).
  run: list[re.Match] = []
  for match in matches:
    expected = OPTION_LETTERS[len(run)] if len(run) < len(OPTION_LETTERS) else None
    if match.group(1) == expected:
      run.append(match)
    elif match.group(1) == "A":
      run = [match]
  if len(run) < 2:
    return question.strip(), ()
  options = tuple(question[a.end():b.start()].strip() for a, b in zip(run, run[1:]))
  options += (question[run[-1].end():].strip(),)
  return question[:run[0].start()].strip(), options


def read_json_rows(path) -> Iterator[tuple[int, dict]]:
  """(row number from 1, record) from a .jsonl file or a .json list."""
  path = pathlib.Path(path)
  if not path.exists():
    raise FileNotFoundError(f"benchmark file not found: {path}")
  if path.suffix == ".jsonl":
    with path.open() as f:
      for number, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          record = json.loads(line)
        except json.JSONDecodeError as e:
          raise BenchmarkFormatError(path, number, None, "<line>", f"not JSON ({e.msg})") from e
        if not isinstance(record, dict):
          raise BenchmarkFormatError(path, number, None, "<line>", "expected a JSON object")
        yield number, record
    return
  try:
    records = json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise BenchmarkFormatError(path, 0, None, "<file>", f"not JSON ({e.msg})") from e
  if not isinstance(records, list):
    raise BenchmarkFormatError(path, 0, None, "<file>", "expected a JSON list of records")
  for number, record in enumerate(records, 1):
    if not isinstance(record, dict):
      raise BenchmarkFormatError(path, number, None, "<record>", "expected a JSON object")
    yield number, record


def field(path, row: int, record: dict, name: str, kind, record_id=None):
  """record[name], checked against `kind` (a type or tuple of types)."""
  if name not in record:
    raise BenchmarkFormatError(path, row, record_id, name, "missing")
  value = record[name]
  if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
    names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
    raise BenchmarkFormatError(path, row, record_id, name,
                               f"expected {names}, got {type(value).__name__}")
  return value


def inside_root(path, row: int, record_id, field: str, value, root=None) -> str:
  """`value`, a file path from a row, joined to `root` (when given; else as written): it
  must be a non-empty relative path inside the benchmark's folder. Absolute paths, any
  `..` component (what it means depends on links and on what is a folder, so it is not
  normalised away) and the folder itself are refused with a BenchmarkFormatError naming
  the file, row and field. Links inside the folder are the folder owner's, and followed."""
  where = f" {root}" if root is not None else ""
  if not isinstance(value, str) or not value.strip():
    raise BenchmarkFormatError(path, row, record_id, field, f"expected a non-empty relative "
                               f"path, got {value!r:.80}")
  if "\x00" in value:
    raise BenchmarkFormatError(path, row, record_id, field, f"expected a path without NUL "
                               f"characters, got {value!r:.80}")
  if os.path.isabs(value):
    raise BenchmarkFormatError(path, row, record_id, field, f"expected a path relative to the "
                               f"benchmark folder{where}, got the absolute path {value!r:.80}")
  base = os.path.abspath(root if root is not None else ".")
  full = os.path.normpath(os.path.join(base, value))
  relative = pathlib.PurePosixPath(value)
  if ".." in relative.parts or full == base or os.path.commonpath([full, base]) != base:
    outside = full != base and os.path.commonpath([full, base]) != base
    raise BenchmarkFormatError(path, row, record_id, field, f"expected a path inside the "
                               f"benchmark folder{where} without '..', got {value!r:.80}, which "
                               + ("leaves it" if outside else "names the folder itself"
                                  if relative == pathlib.PurePosixPath(".") else
                                  "climbs with '..'"))
  return value if root is None else str(pathlib.Path(root) / value)


def check_file(path, row: int, record_id, field: str, file: str) -> None:
  """MissingImageError when `file` is not a file on disk; a path the OS refuses to look
  up (too long, ...) is a BenchmarkFormatError."""
  try:
    found = pathlib.Path(file).is_file()
  except (OSError, ValueError) as error:
    raise BenchmarkFormatError(path, row, record_id, field, f"cannot look up {file[:80]!r}: "
                               f"{getattr(error, 'strerror', None) or error}") from None
  if not found:
    raise MissingImageError(path, row, record_id, file)


def resolve_images(path, row: int, record_id, images, image_root, check: bool,
                   fields=None) -> tuple[str, ...]:
  """The row's image paths, each checked by `inside_root` (named by `fields`, one per
  image; default 'images'), joined to `image_root` and, with `check`, found on disk."""
  fields = ["images"] * len(images) if fields is None else list(fields)
  resolved = tuple(inside_root(path, row, record_id, name, image, image_root)
                   for name, image in zip(fields, images))
  if image_root is not None and check:
    for name, image in zip(fields, resolved):
      check_file(path, row, record_id, name, image)
  return resolved
