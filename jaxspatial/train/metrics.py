"""Metrics to a JSONL log and TensorBoard event files (tensorboardX, no TensorFlow)."""

from __future__ import annotations

import json
import pathlib
import time


class MetricWriter:
  def __init__(self, logdir, tensorboard: bool = True):
    self.logdir = pathlib.Path(logdir)
    self.logdir.mkdir(parents=True, exist_ok=True)
    self._jsonl = open(self.logdir / "metrics.jsonl", "a", encoding="utf-8")
    self._tb = None
    if tensorboard:
      try:
        from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
        self._tb = SummaryWriter(str(self.logdir))
      except ImportError:
        self._tb = None

  def write(self, step: int, metrics: dict) -> None:
    values = {k: float(v) for k, v in metrics.items()}
    self._jsonl.write(json.dumps({"step": int(step), "time": time.time(), **values}) + "\n")
    self._jsonl.flush()
    if self._tb is not None:
      for name, value in values.items():
        self._tb.add_scalar(name, value, int(step))

  def close(self) -> None:
    self._jsonl.close()
    if self._tb is not None:
      self._tb.close()


def read_jsonl(path) -> list[dict]:
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]
