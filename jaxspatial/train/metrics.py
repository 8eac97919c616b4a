"""Metrics to a JSONL log and TensorBoard event files (tensorboardX, no TensorFlow).

One row per step: a writer refuses a step at or below the last one it wrote, and a writer
opened with `resume_step=k` (a run restored from step k) first drops the rows past k that
the run is about to redo, rewriting the file atomically, and tells TensorBoard to purge
them (`purge_step=k + 1`).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
import time

from etils import epath


def _rows_up_to(path: pathlib.Path, resume_step: int | None) -> tuple[list[str], bool]:
  """The file's complete rows (with step <= resume_step when given); whether any dropped."""
  text = path.read_text(encoding="utf-8")
  lines = text.splitlines(keepends=True)
  kept, dropped = [], False
  for line in lines:
    if not line.endswith("\n"):  # a row torn by a kill mid-write
      dropped = True
      continue
    if not line.strip():
      continue
    if resume_step is not None:
      try:
        step = json.loads(line).get("step")
      except json.JSONDecodeError:
        dropped = True
        continue
      if step is not None and int(step) > resume_step:
        dropped = True
        continue
    kept.append(line)
  return kept, dropped


def _replace_atomically(path: pathlib.Path, lines: list[str]) -> None:
  tmp = path.with_name(path.name + ".tmp")
  with open(tmp, "w", encoding="utf-8") as f:
    f.writelines(lines)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


class MetricWriter:
  """`logdir` is a local folder or a remote one (gs://, s3://, through etils.epath). A
  remote folder cannot be appended to: the rows and event files are written to a local
  staging folder and uploaded whole (each upload replaces the object atomically) at most
  every `upload_every_s` seconds, on `flush()` (the trainer flushes before each checkpoint,
  so the rows up to a saved step are never lost) and on `close()`."""

  def __init__(self, logdir, tensorboard: bool = True, resume_step: int | None = None,
               upload_every_s: float = 30.0):
    self.logdir = epath.Path(logdir)
    self.remote = "://" in str(logdir)
    self.logdir.mkdir(parents=True, exist_ok=True)
    self.path = self.logdir / "metrics.jsonl"
    self.resume_step = None if resume_step is None else int(resume_step)
    self._last_step = self.resume_step
    self.upload_every_s = upload_every_s
    self._uploaded_at = time.monotonic()
    if self.remote:
      self._staging = pathlib.Path(tempfile.mkdtemp(prefix="jaxspatial-metrics-"))
      local = self._staging / "metrics.jsonl"
      if self.path.exists():
        local.write_bytes(self.path.read_bytes())
    else:
      self._staging = pathlib.Path(self.logdir)
      local = self._staging / "metrics.jsonl"
    self._local = local
    if local.exists():
      kept, dropped = _rows_up_to(local, self.resume_step)
      if dropped:
        _replace_atomically(local, kept)
        if self.remote:
          self.path.write_bytes(local.read_bytes())
    self._jsonl = open(local, "a", encoding="utf-8")
    self._tb = None
    if tensorboard:
      try:
        from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
      except ImportError:
        SummaryWriter = None
      if SummaryWriter is not None:
        purge = None if self.resume_step is None else self.resume_step + 1
        # tensorboardX names files by the second and opens them "wb": a writer reopened
        # within the same second (a quick restart) would overwrite the earlier events.
        self._tb = SummaryWriter(str(self._staging), purge_step=purge,
                                 filename_suffix=f".{os.getpid()}.{time.time_ns() % 10**9}")

  def write(self, step: int, metrics: dict) -> None:
    step = int(step)
    if self._last_step is not None and step <= self._last_step:
      what = ("the step this run resumed from" if self._last_step == self.resume_step
              else "the last step written")
      raise ValueError(f"MetricWriter({self.logdir}): step {step} is not after {what}, "
                       f"{self._last_step} (one row per step)")
    values = {k: float(v) for k, v in metrics.items()}
    self._jsonl.write(json.dumps({"step": step, "time": time.time(), **values}) + "\n")
    self._jsonl.flush()
    self._last_step = step
    if self._tb is not None:
      for name, value in values.items():
        self._tb.add_scalar(name, value, step)
    if self.remote and time.monotonic() - self._uploaded_at >= self.upload_every_s:
      self.flush()

  def flush(self) -> None:
    """Everything written so far is in `logdir` (for a local folder it already is)."""
    if self._tb is not None:
      self._tb.flush()
    if not self.remote:
      return
    self.path.write_bytes(self._local.read_bytes())
    for events in self._staging.glob("events.out.tfevents.*"):
      (self.logdir / events.name).write_bytes(events.read_bytes())
    self._uploaded_at = time.monotonic()

  def close(self) -> None:
    self._jsonl.close()
    if self._tb is not None:
      self._tb.close()
    self.flush()
    if self.remote:
      shutil.rmtree(self._staging, ignore_errors=True)


def read_jsonl(path) -> list[dict]:
  """The rows of a JSONL file, local or remote (etils.epath)."""
  text = epath.Path(path).read_text(encoding="utf-8")
  return [json.loads(line) for line in text.split("\n") if line.strip()]
