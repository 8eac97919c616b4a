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


@pytest.fixture
def gs():
  """gs:// served by fsspec's in-memory filesystem (etils.epath's gs backend is fsspec's
  "gcs" protocol), which, like GCS, is not a local folder."""
  import fsspec  # pylint: disable=import-outside-toplevel
  from fsspec.implementations.memory import MemoryFileSystem  # pylint: disable=import-outside-toplevel
  from etils.epath import backend  # pylint: disable=import-outside-toplevel
  from fsspec.registry import _registry as registered  # pylint: disable=import-outside-toplevel
  previous = registered.get("gcs")
  MemoryFileSystem.store.clear()
  fsspec.register_implementation("gcs", MemoryFileSystem, clobber=True)
  backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access
  yield "gs://bucket/run"
  if previous is None:
    registered.pop("gcs", None)
  else:
    registered["gcs"] = previous
  backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access


def test_a_remote_logdir_gets_every_row_up_to_a_flush_and_resumes(gs):
  from etils import epath  # pylint: disable=import-outside-toplevel
  writer = MetricWriter(gs, upload_every_s=1e9)
  for step in range(1, 5):
    writer.write(step, {"loss": float(step)})
  assert not (epath.Path(gs) / "metrics.jsonl").exists()  # not uploaded yet
  writer.flush()  # the trainer flushes before each checkpoint
  assert [r["step"] for r in read_jsonl(f"{gs}/metrics.jsonl")] == [1, 2, 3, 4]
  assert any(p.name.startswith("events.out.tfevents.") for p in epath.Path(gs).iterdir())
  writer.write(5, {"loss": 5.0})  # lost with the process: the run resumes from step 4
  del writer
  resumed = MetricWriter(gs, resume_step=3, upload_every_s=1e9)
  assert [r["step"] for r in read_jsonl(f"{gs}/metrics.jsonl")] == [1, 2, 3]
  resumed.write(4, {"loss": 4.5})
  resumed.close()
  rows = read_jsonl(f"{gs}/metrics.jsonl")
  assert [(r["step"], r["loss"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.5)]


def test_charts_and_teacher_files_are_written_to_a_remote_folder(gs):
  import io  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from PIL import Image  # pylint: disable=import-outside-toplevel
  from etils import epath  # pylint: disable=import-outside-toplevel
  from data_pipelines.synthetic import teachers  # pylint: disable=import-outside-toplevel
  from jaxspatial.train.plots import training_curves  # pylint: disable=import-outside-toplevel
  epath.Path(f"{gs}/metrics.jsonl").write_text(
      "".join(f'{{"step": {k}, "sft/loss": {3.0 - k}}}\n' for k in (1, 2, 3)))
  png, svg = training_curves(f"{gs}/metrics.jsonl", ("loss",), width=720, panel_height=400)
  image = Image.open(io.BytesIO(epath.Path(png).read_bytes()))
  assert image.size == (720, 400) and np.asarray(image).std() > 0
  assert png == epath.Path(f"{gs}/curve.png") and "raw:loss:sft" in epath.Path(svg).read_text()
  scene = {"scene_seed": 7, "questions": '[{"answer_text": "red", "options": [], "answer": ""}]'}
  assert teachers.write_scripted([scene], "act3d", f"{gs}/teacher.jsonl") == 1
  records = teachers.read_trajectories(f"{gs}/teacher.jsonl")
  assert records[0]["scene_seed"] == 7 and records[0]["turns"][-1].endswith("<answer>red</answer>")
