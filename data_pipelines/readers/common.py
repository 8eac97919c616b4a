"""What every benchmark reader returns, and the errors it raises on bad input."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import stat
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


def _option_run(question: str) -> list[re.Match]:
  """The last run of consecutive option letters A, B, C, ... in the text (a stem may
  mention "A." earlier)."""
  run: list[re.Match] = []
  for match in _OPTION.finditer(question):
    expected = OPTION_LETTERS[len(run)] if len(run) < len(OPTION_LETTERS) else None
    if match.group(1) == expected:
      run.append(match)
    elif match.group(1) == "A":
      run = [match]
  return run


def option_letters(question: str) -> str:
  """The option letters written in a question ("A" for 'stem A. x'), whatever their count."""
  return "".join(match.group(1) for match in _option_run(question))


def parse_options(question: str) -> tuple[str, tuple[str, ...]]:
  """Splits 'stem A. x B. y ...' into (stem, (x, y, ...)); fewer than two options ->
  (question, ())."""
  run = _option_run(question)
  if len(run) < 2:
    return question.strip(), ()
  options = tuple(question[a.end():b.start()].strip() for a, b in zip(run, run[1:]))
  options += (question[run[-1].end():].strip(),)
  return question[:run[0].start()].strip(), options


def utf8_text(path, data: bytes, row: int = 0, field: str = "<file>") -> str:
  """`data` (the whole file, or line `row` of it) as text; a byte that is not UTF-8 is a
  BenchmarkFormatError naming the byte, its line and its column."""
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as error:
    line = data.count(b"\n", 0, error.start) + 1
    column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
    where = f"column {column}" if row else f"line {line}, column {column}"
    raise BenchmarkFormatError(path, row, None, field, f"not UTF-8: byte "
                               f"0x{data[error.start]:02x} at {where}") from None


class _NonFinite:
  """Where the text has NaN / Infinity / -Infinity, which Python's json reads as floats (not
  a float or a str: a field check that meets one refuses it)."""

  def __init__(self, name: str):
    self.name = name


def _non_finite(value, where: str = "") -> tuple[str, str] | None:
  """(path such as `a.b[2]`, constant) of the first _NonFinite in a parsed value, or None."""
  if isinstance(value, _NonFinite):
    return where, value.name
  items = (value.items() if isinstance(value, dict) else
           enumerate(value) if isinstance(value, list) else ())
  for key, item in items:
    found = _non_finite(item, f"{where}.{key}" if isinstance(key, str) else f"{where}[{key}]")
    if found is not None:
      return found
  return None


def _not_json(constant: str) -> str:
  return f"{constant} is not JSON (RFC 8259 has no NaN or Infinity); write null or a number"


def _json(path, row: int, text: str, what: str):
  """json.loads of a line / file whose NaN and Infinity are marked, not turned to floats."""
  try:
    return json.loads(text, parse_constant=_NonFinite)
  except json.JSONDecodeError as e:
    where = f" at line {e.lineno}" if not row else ""
    raise BenchmarkFormatError(path, row, None, what, f"not JSON ({e.msg}{where})") from None


def _checked_record(path, row: int, record, what: str, id_field: str | None) -> dict:
  if not isinstance(record, dict):
    raise BenchmarkFormatError(path, row, None, what, "expected a JSON object")
  found = _non_finite(record)
  if found is not None:
    record_id = record.get(id_field) if id_field else None
    raise BenchmarkFormatError(path, row, record_id, found[0].lstrip("."), _not_json(found[1]))
  return record


def read_json_rows(path, id_field: str | None = None) -> Iterator[tuple[int, dict]]:
  """(row number from 1, record) from a .jsonl file (rows are lines) or a .json list, read
  as UTF-8 JSON; NaN / Infinity (not JSON) and a file without records are refused. Errors
  name the row and, where a record holds it, its `id_field`."""
  path = pathlib.Path(path)
  if not path.exists():
    raise FileNotFoundError(f"benchmark file not found: {path}")
  data = path.read_bytes()
  if path.suffix == ".jsonl":
    lines = [(number, line) for number, line in enumerate(data.split(b"\n"), 1)
             if line.strip()]
    records = ((number, _json(path, number, utf8_text(path, line, number, "<line>"),
                              "<line>")) for number, line in lines)
    what = "<line>"
  else:
    listed = _json(path, 0, utf8_text(path, data), "<file>")
    if not isinstance(listed, list):
      raise BenchmarkFormatError(path, 0, None, "<file>", "expected a JSON list of records")
    lines, records, what = listed, enumerate(listed, 1), "<record>"
  if not lines:
    raise BenchmarkFormatError(path, 0, None, "<file>", "no records: the file is empty")
  for number, record in records:
    yield number, _checked_record(path, number, record, what, id_field)


def read_json(path):
  """A whole .json file as UTF-8 JSON: bad bytes, bad JSON and NaN / Infinity anywhere in it
  (named by their place, e.g. `questions[3].situation`) are BenchmarkFormatErrors."""
  value = _json(path, 0, utf8_text(path, pathlib.Path(path).read_bytes()), "<file>")
  found = _non_finite(value)
  if found is not None:
    raise BenchmarkFormatError(path, 0, None, found[0].lstrip("."), _not_json(found[1]))
  return value


class QuestionIds:
  """The row each question id of a file was read from: a repeat is refused naming both."""

  def __init__(self, path, field: str):
    self.path, self.field, self.rows = path, field, {}

  def add(self, row: int, record_id) -> None:
    if record_id in self.rows:
      raise BenchmarkFormatError(self.path, row, record_id, self.field,
                                 f"repeats row {self.rows[record_id]}'s id (question ids "
                                 "must be unique in a file)")
    self.rows[record_id] = row


def check_options(path, row: int, record_id, field: str, options) -> None:
  """A multiple-choice question needs two options at least, and at most OPTION_LETTERS."""
  if not 2 <= len(options) <= len(OPTION_LETTERS):
    raise BenchmarkFormatError(path, row, record_id, field,
                               f"{len(options)} option{'s' * (len(options) != 1)}: a "
                               f"multiple-choice question needs at least two and at most "
                               f"{len(OPTION_LETTERS)} ({OPTION_LETTERS})")


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
  """MissingImageError when `file` is not on disk; a directory, a device, a pipe or a socket
  (itself or where a link leads) and a path the OS refuses to look up (too long, ...) are
  BenchmarkFormatErrors: reading them would fail later, hang or never end."""
  try:
    mode = os.stat(file).st_mode
  except (FileNotFoundError, NotADirectoryError):
    raise MissingImageError(path, row, record_id, file) from None
  except (OSError, ValueError) as error:
    raise BenchmarkFormatError(path, row, record_id, field, f"cannot look up {file[:80]!r}: "
                               f"{getattr(error, 'strerror', None) or error}") from None
  if stat.S_ISREG(mode):
    return
  kind = ("a directory" if stat.S_ISDIR(mode) else "a character device" if stat.S_ISCHR(mode)
          else "a block device" if stat.S_ISBLK(mode) else "a pipe" if stat.S_ISFIFO(mode)
          else "a socket")
  link = f", through the link to {os.path.realpath(file)}" if os.path.islink(file) else ""
  raise BenchmarkFormatError(path, row, record_id, field, f"{file} is {kind}{link}, not a "
                             "regular file (expected an image file)")


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
