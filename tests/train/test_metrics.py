"""MetricWriter: one JSONL row per step across resumes; TensorBoard told to purge."""

from __future__ import annotations

import struct

import pytest

from jaxspatial.train.metrics import MetricWriter, read_jsonl


def _events(logdir):
  """Every tensorboardX event in the logdir's event files (TFRecord framing)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel
  events = []
  for path in sorted(logdir.glob("events.out.tfevents.*")):
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
      (length,) = struct.unpack("<Q", data[offset:offset + 8])
      body = data[offset + 12:offset + 12 + length]
      offset += 12 + length + 4
      event = event_pb2.Event()
      event.ParseFromString(body)
      events.append((path.name, event))
  return events


def test_resume_drops_the_rows_the_run_redoes(tmp_path):
  writer = MetricWriter(tmp_path)
  for step in range(1, 6):
    writer.write(step, {"loss": step})
  writer.close()
  writer = MetricWriter(tmp_path, resume_step=3)  # restored from step 3: 4 and 5 are redone
  assert [row["step"] for row in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3]
  for step in range(4, 7):
    writer.write(step, {"loss": 10 * step})
  writer.close()
  rows = read_jsonl(tmp_path / "metrics.jsonl")
  assert [row["step"] for row in rows] == [1, 2, 3, 4, 5, 6]
  assert [row["loss"] for row in rows] == [1, 2, 3, 40, 50, 60]
  assert not list(tmp_path.glob("*.tmp"))
  # TensorBoard hides the first run's events from step 4 on: the resumed writer's file
  # starts with a session START at the purge step.
  starts = [e.step for _, e in _events(tmp_path) if e.HasField("session_log")]
  assert starts == [4]
  scalars = sorted((e.step, e.wall_time) for _, e in _events(tmp_path) if e.HasField("summary"))
  assert [s for s, _ in scalars] == [1, 2, 3, 4, 4, 5, 5, 6]  # 4 and 5 twice: purged by TB


def test_refuses_a_step_not_after_the_last(tmp_path):
  writer = MetricWriter(tmp_path, tensorboard=False)
  writer.write(1, {"loss": 1})
  writer.write(2, {"loss": 2})
  with pytest.raises(ValueError, match=r"step 2 is not after the last step written, 2"):
    writer.write(2, {"loss": 3})
  with pytest.raises(ValueError, match=r"step 1 is not after the last step written, 2"):
    writer.write(1, {"loss": 3})
  writer.close()
  writer = MetricWriter(tmp_path, tensorboard=False, resume_step=2)
  with pytest.raises(ValueError, match=r"step 2 is not after the step this run resumed from, 2"):
    writer.write(2, {"loss": 3})
  writer.close()
  assert [row["step"] for row in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]


def test_torn_last_row_is_dropped(tmp_path):
  # A process killed mid-write leaves a partial line; the next writer must not glue onto it.
  (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "lo')
  writer = MetricWriter(tmp_path, tensorboard=False)
  writer.write(2, {"loss": 2})
  writer.close()
  assert [row["step"] for row in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]
