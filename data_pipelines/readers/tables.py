"""Rows of a benchmark table: Hugging Face parquet exports, JSONL or a JSON list."""

from __future__ import annotations

import pathlib
from typing import Iterator

from data_pipelines.readers.common import BenchmarkFormatError, read_json_rows


def read_table_rows(path, id_field: str | None = None) -> Iterator[tuple[int, dict]]:
  """(row number from 1, record); parquet through pyarrow, else JSON (`read_json_rows`;
  `id_field` names a row in its errors). A table without rows is refused."""
  path = pathlib.Path(path)
  if path.suffix != ".parquet":
    yield from read_json_rows(path, id_field)
    return
  if not path.exists():
    raise FileNotFoundError(f"benchmark file not found: {path}")
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  records = pq.read_table(path).to_pylist()
  if not records:
    raise BenchmarkFormatError(path, 0, None, "<file>", "no records: the table has no rows")
  yield from enumerate(records, 1)
