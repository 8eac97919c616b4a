"""predictions.jsonl as an evaluation's ledger: every finished item (one question in one
setting and seed) is one JSON line, appended and flushed the moment it is scored, so a run
killed at any point keeps everything it was told, and a rerun with the same `--out` skips
what is recorded and asks only for the rest.

    log = PredictionLog.open(out / "predictions.jsonl", out / "run.json", key)
    log.recorded("no_tools", 0)          # {question_id: row} already done
    log.append(row)                      # thread-safe; row: setting, seed, question_id, ...
    log.rows()                           # every recorded row (the latest per item)

`key` is what makes recorded answers valid for this run (benchmark, split, model, agent,
sampling, scoring rules, judge): it is kept in run.json, and a rerun whose key differs is
refused, naming the fields that changed, instead of mixing two runs' answers. A line cut by a
kill mid-write is dropped (its item is asked again). Lines are flushed to the operating
system, not fsynced: a killed process loses nothing; a power cut may lose the last lines.
"""

from __future__ import annotations

import json
import os
import pathlib
import threading
from typing import Iterable

from jaxspatial.errors import ResumeError

ITEM_FIELDS = ("setting", "seed", "question_id")


def item_key(row: dict) -> tuple[str, int, str]:
  return str(row["setting"]), int(row["seed"]), str(row["question_id"])


def _read_rows(path: pathlib.Path) -> tuple[list[dict], int]:
  """(the rows of the whole lines, the byte length they take): a last line without its
  newline, or that does not parse, was cut by a kill and is not kept."""
  data = path.read_bytes()
  rows, good = [], 0
  for line in data.splitlines(keepends=True):
    if not line.endswith(b"\n"):
      break
    try:
      row = json.loads(line)
      item_key(row)
    except (ValueError, KeyError, TypeError) as error:
      if good + len(line) == len(data):
        break  # the last line, cut or garbled by a kill mid-write
      raise ResumeError(f"{path}: line {len(rows) + 1} is not a prediction row "
                        f"({type(error).__name__}: {str(error)[:100]}); move the file away "
                        "to start over") from None
    rows.append(row)
    good += len(line)
  return rows, good


class PredictionLog:
  """An append-only predictions.jsonl with the rows already in it (`open`)."""

  def __init__(self, path: pathlib.Path, rows: Iterable[dict] = ()):
    self.path = pathlib.Path(path)
    self._rows: dict[tuple, dict] = {item_key(r): r for r in rows}
    self._lock = threading.Lock()
    self.path.parent.mkdir(parents=True, exist_ok=True)
    handle = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.fchmod(handle, 0o644)
    self._file = os.fdopen(handle, "a", encoding="utf-8")

  @classmethod
  def open(cls, path, run_path, key: dict) -> "PredictionLog":
    """The ledger at `path`, its recorded rows kept when `run_path` (run.json) holds the
    same `key`; a new one (key written to `run_path` by the caller) when none is there."""
    path, run_path = pathlib.Path(path), pathlib.Path(run_path)
    rows: list[dict] = []
    if path.exists() and path.stat().st_size:
      recorded = None
      if run_path.exists():
        try:
          recorded = json.loads(run_path.read_text()).get("resume_key")
        except (ValueError, AttributeError):
          recorded = None
      if recorded is None:
        raise ResumeError(f"{path} holds predictions, but {run_path} does not say which run "
                          "wrote them; pass a new --out, or move the file away to start over")
      changed = sorted(k for k in set(recorded) | set(key) if recorded.get(k) != key.get(k))
      if changed:
        differences = "; ".join(f"{k}: recorded {recorded.get(k)!r}, now {key.get(k)!r}"
                                for k in changed)
        raise ResumeError(f"{path.parent} holds another run's predictions ({differences}); "
                          "pass a new --out to keep both, or rerun with the recorded settings "
                          "to finish that run")
      rows, good = _read_rows(path)
      if good < path.stat().st_size:
        with open(path, "r+b") as f:
          f.truncate(good)
    return cls(path, rows)

  def recorded(self, setting: str, seed: int) -> dict[str, dict]:
    """{question_id: row} of (setting, seed) recorded so far."""
    with self._lock:
      return {k[2]: r for k, r in self._rows.items() if k[:2] == (setting, int(seed))}

  def rows(self) -> list[dict]:
    with self._lock:
      return list(self._rows.values())

  def append(self, row: dict) -> None:
    """Writes `row` as one line and flushes it (thread-safe); a later row of the same item
    replaces it."""
    line = json.dumps(row, allow_nan=False) + "\n"
    with self._lock:
      self._file.write(line)
      self._file.flush()
      self._rows[item_key(row)] = row

  def close(self) -> None:
    with self._lock:
      if not self._file.closed:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
