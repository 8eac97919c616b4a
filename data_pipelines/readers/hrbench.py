"""HR-Bench 4K / 8K (Wang et al., AAAI 2025): the VLMEvalKit TSV the authors publish
(`hr_bench_4k.tsv`, `hr_bench_8k.tsv`), one row per question, columns

    index, question, answer (the correct letter), category, A, B, C, D, cycle_category,
    image (the picture as base64)

Rows repeat each question with its options rotated (`cycle_category` names the rotation);
VLMEvalKit's convention lets a row's `image` hold another row's `index` instead of the
picture (any value of at most 64 characters), which is followed here. Row k is the k-th
data row (the header line is not counted). The same columns from a parquet / JSON(L)
export are read too (`readers.tables`).

Each question's `meta["image_bytes"]` holds its picture's bytes (decoded from base64; a row
naming another shares that row's bytes object) and `meta["image_sha1"]` their digest.
"""

from __future__ import annotations

import base64
import binascii
import csv
import hashlib
import pathlib
import re
import sys
from typing import Iterator

from data_pipelines.readers.common import (OPTION_LETTERS, BenchmarkFormatError,
                                           BenchmarkQuestion, QuestionIds,
                                           check_options)
from data_pipelines.readers.tables import read_table_rows

REQUIRED = ("index", "question", "answer", "category", "image")
# A value this short in `image` names another row (VLMEvalKit: "<= 64" characters).
REFERENCE_CHARS = 64


def _tsv_rows(path: pathlib.Path) -> Iterator[tuple[int, dict]]:
  """(data row number from 1, {column: text}); the fields are huge (base64 pictures)."""
  if not path.exists():
    raise FileNotFoundError(f"benchmark file not found: {path}")
  limit = csv.field_size_limit()
  csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
  try:
    # Bytes that are not UTF-8 are kept as lone surrogates, so each is named by its row and
    # column (a strict decoder fails somewhere in the chunk it reads ahead).
    with path.open(newline="", encoding="utf-8-sig", errors="surrogateescape") as f:
      reader = csv.reader(f, delimiter="\t")
      try:
        header = next(reader)
      except StopIteration:
        raise BenchmarkFormatError(path, 0, None, "<file>", "no records: the file is "
                                   "empty") from None
      except csv.Error as e:
        raise BenchmarkFormatError(path, 0, None, "<header>", f"not TSV ({e})") from None

      _utf8(path, 0, None, ["<header>"] * len(header), header)
      if len(set(header)) != len(header):
        raise BenchmarkFormatError(path, 0, None, "<header>",
                                   f"repeated column names in {header}")
      row = 0
      while True:
        try:
          cells = next(reader)
        except StopIteration:
          if not row:
            raise BenchmarkFormatError(path, 0, None, "<file>", "no records: only a header")
          return
        except csv.Error as e:
          raise BenchmarkFormatError(path, row + 1, None, "<line>", f"not TSV ({e})") from None

        row += 1
        if not cells:
          continue
        if len(cells) != len(header):
          raise BenchmarkFormatError(path, row, cells[0][:40] if cells else None, "<line>",
                                     f"{len(cells)} fields for the header's {len(header)}")
        _utf8(path, row, cells[0][:40], header, cells)
        yield row, dict(zip(header, cells))
  finally:
    csv.field_size_limit(limit)


def _utf8(path, row: int, record_id, names, cells) -> None:
  for name, cell in zip(names, cells):
    bad = _NOT_UTF8.search(cell)
    if bad:
      raise BenchmarkFormatError(path, row, record_id, name, f"not UTF-8: byte "
                                 f"0x{ord(bad.group()) - 0xdc00:02x} at character "
                                 f"{bad.start() + 1}")


_NOT_UTF8 = re.compile("[\udc80-\udcff]")


def _rows(path: pathlib.Path) -> Iterator[tuple[int, dict]]:
  return _tsv_rows(path) if path.suffix == ".tsv" else read_table_rows(path)


def _text(path, row: int, record: dict, name: str, record_id, allow_empty=False) -> str:
  if name not in record:
    raise BenchmarkFormatError(path, row, record_id, name, "missing")
  value = record[name]
  if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
    value = str(value)
  if not isinstance(value, str):
    raise BenchmarkFormatError(path, row, record_id, name,
                               f"expected text, got {type(value).__name__}")
  if not allow_empty and not value.strip():
    raise BenchmarkFormatError(path, row, record_id, name, "empty")
  return value


def _option(record: dict, letter: str):
  """The option's text, or None when the column is absent or empty (pandas writes NaN as an
  empty field)."""
  value = record.get(letter)
  if value is None or isinstance(value, float) and value != value:
    return None
  value = str(value)
  return value if value.strip() else None


def read_hrbench(path, benchmark: str = "hrbench") -> list[BenchmarkQuestion]:
  """Every row of an HR-Bench table. Options: the non-empty columns A, B, ... in letter
  order (no gaps); answer: one of their letters. `meta`: file, row, cycle_category,
  image_bytes (a 1-tuple), image_sha1."""
  path = pathlib.Path(path)
  records: list[tuple[int, str, dict]] = []
  ids = QuestionIds(path, "index")
  decoded: dict[str, tuple[bytes, str]] = {}      # index -> (picture bytes, sha1)
  references: dict[str, str] = {}                # index -> the index it names
  for row, record in _rows(path):
    index = _text(path, row, record, "index", None).strip()
    for name in REQUIRED:
      if name not in record:
        raise BenchmarkFormatError(path, row, index, name, "missing")
    ids.add(row, index)
    text = _text(path, row, record, "image", index).strip()
    record = {k: v for k, v in record.items() if k != "image"}  # the text is not kept
    if len(text) <= REFERENCE_CHARS:
      references[index] = text
    else:
      try:
        data = base64.b64decode(text, validate=True)
      except (binascii.Error, ValueError) as e:
        raise BenchmarkFormatError(path, row, index, "image", f"not base64 ({e})") from None
      decoded[index] = (data, hashlib.sha1(data).hexdigest())
    records.append((row, index, record))
  for index, target in references.items():
    if target not in decoded:
      raise BenchmarkFormatError(path, ids.rows[index], index, "image",
                                 f"{target!r} is neither base64 image data nor the index of "
                                 "a row that holds an image")
    decoded[index] = decoded[target]

  questions = []
  for row, index, record in records:
    question = _text(path, row, record, "question", index)
    category = _text(path, row, record, "category", index).strip()
    answer = _text(path, row, record, "answer", index).strip()
    options = []
    for letter in OPTION_LETTERS:
      text = _option(record, letter)
      if text is None:
        break
      options.append(text)
    later = [letter for letter in OPTION_LETTERS[len(options):] if _option(record, letter)]
    if later:
      raise BenchmarkFormatError(path, row, index, later[0],
                                 f"option {later[0]} follows the empty option "
                                 f"{OPTION_LETTERS[len(options)]}")
    check_options(path, row, index, OPTION_LETTERS[min(len(options), 5)], options)
    if answer not in OPTION_LETTERS[:len(options)]:
      raise BenchmarkFormatError(path, row, index, "answer",
                                 f"expected one of the option letters "
                                 f"{OPTION_LETTERS[:len(options)]!r}, got {answer!r}")
    data, digest = decoded[index]
    cycle = record.get("cycle_category")
    questions.append(BenchmarkQuestion(
        benchmark=benchmark, question_id=index, question=question, answer=answer,
        answers=(answer,), options=tuple(options), category=category,
        meta={"file": str(path), "row": row,
              "cycle_category": None if cycle is None else str(cycle),
              "image_bytes": (data,), "image_sha1": digest}))
  return questions
