"""Rows of a benchmark table: Hugging Face parquet exports, JSONL or a JSON list."""

from __future__ import annotations

import pathlib
from typing import Iterator

from data_pipelines.readers.common import read_json_rows


def read_table_rows(path) -> Iterator[tuple[int, dict]]:
  """(row number from 1, record); parquet through pyarrow, else JSON."""
  path = pathlib.Path(path)
  if path.suffix != ".parquet":
    yield from read_json_rows(path)
    return
  if not path.exists():
    raise FileNotFoundError(f"benchmark file not found: {path}")
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  for number, record in enumerate(pq.read_table(path).to_pylist(), 1):
    yield number, record
