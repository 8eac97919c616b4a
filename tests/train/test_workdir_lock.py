"""One run per work directory: a second run stops naming the holder, a lock left by a killed
run is taken over, a lease on an object store is refused while it beats and taken over once
stale, and two concurrent `launch.train` runs leave the first run's outputs as a run alone."""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

from jaxspatial.errors import WorkdirInUseError
from jaxspatial.train import hold_workdir
from jaxspatial.train.workdir_lock import LEASE_FILE, LOCK_FILE
from tests.train.test_trainer_golden import GOLDEN, TINY, differences, metrics

ROOT = pathlib.Path(__file__).resolve().parents[2]
HOLDER = """
import sys, time
from jaxspatial.train import hold_workdir
held = hold_workdir(sys.argv[1])  # referenced: a dropped context manager would release
held.__enter__()
print("held", flush=True)
time.sleep(120)
"""


def start_holder(workdir) -> subprocess.Popen:
  holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(workdir)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
  assert holder.stdout.readline().strip() == "held"
  return holder


def test_a_second_run_stops_naming_the_holder_and_a_dead_holders_lock_is_taken_over(
    tmp_path, capsys):
  holder = start_holder(tmp_path)
  try:
    with pytest.raises(WorkdirInUseError, match=(rf"another run holds this work directory "
                                                 rf"\(pid {holder.pid} on host "
                                                 rf"{socket.gethostname()}, started .*-c")):
      with hold_workdir(tmp_path):
        pass
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  with hold_workdir(tmp_path):  # the kernel freed the dead holder's lock
    with hold_workdir(tmp_path):  # re-entrant inside one run
      pass
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
  assert f"taking over the lock of a run that is gone (pid {holder.pid}" in capsys.readouterr().out
  assert (tmp_path / LOCK_FILE).read_text() == ""  # released cleanly: no holder named
  with hold_workdir(tmp_path):
    pass
  assert "taking over" not in capsys.readouterr().out


def test_a_run_that_stops_before_writing_leaves_no_work_directory(tmp_path):
  """A launch that fails on its input (a missing flag) made the folder only to lock it: it
  goes with the lock; one that wrote anything, or that existed before, stays."""
  with hold_workdir(tmp_path / "new" / "run"):
    pass
  assert not (tmp_path / "new" / "run").exists()
  with hold_workdir(tmp_path / "wrote"):
    (tmp_path / "wrote" / "metrics.jsonl").write_text("{}\n")
  assert sorted(p.name for p in (tmp_path / "wrote").iterdir()) == [LOCK_FILE, "metrics.jsonl"]
  (tmp_path / "before").mkdir()
  with hold_workdir(tmp_path / "before"):
    pass
  assert (tmp_path / "before").is_dir()


def test_a_lease_is_refused_while_it_beats_and_taken_over_once_stale(tmp_path, capsys):
  other = {"host": "trainer-7", "pid": 4242, "token": "theirs", "started": time.time() - 60,
           "heartbeat": time.time() - 5, "command": "python -m launch.train"}
  (tmp_path / LEASE_FILE).write_text(json.dumps(other))
  with pytest.raises(WorkdirInUseError, match=r"pid 4242 on host trainer-7.*heartbeat 5 s ago"):
    with hold_workdir(tmp_path, lease=True):
      pass
  other["heartbeat"] = time.time() - 600
  (tmp_path / LEASE_FILE).write_text(json.dumps(other))
  with hold_workdir(tmp_path, lease=True, heartbeat_s=0.05):
    first = json.loads((tmp_path / LEASE_FILE).read_text())
    time.sleep(0.3)
    beat = json.loads((tmp_path / LEASE_FILE).read_text())
    assert beat["token"] == first["token"] != "theirs"
    assert beat["heartbeat"] > first["heartbeat"]
  assert "taking over the lease of a run that stopped beating 600 s ago (pid 4242" in (
      capsys.readouterr().out)
  assert not (tmp_path / LEASE_FILE).exists()


def test_two_launch_train_runs_on_one_workdir(tmp_path):
  """The second stops at once naming the first; the first's metrics are the golden run's
  (the same tiny demo run, alone and uninterrupted)."""
  flags = [f"--config.{key}={value}" for key, value in TINY.items()]
  command = [sys.executable, "-m", "launch.train", "--config", "configs/demo.py",
             f"--config.workdir={tmp_path}"] + flags
  first = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
  try:
    deadline = time.time() + 60
    while not (tmp_path / LOCK_FILE).exists() or not (tmp_path / LOCK_FILE).read_text():
      assert first.poll() is None and time.time() < deadline, first.communicate()
      time.sleep(0.1)
    started = time.perf_counter()
    second = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    seconds = time.perf_counter() - started
    assert second.returncode == 1, second.stderr[-2000:]
    lines = [line for line in second.stderr.splitlines() if "another run holds" in line]
    assert len(lines) == 1 and f"pid {first.pid} on host" in lines[0], second.stderr[-2000:]
    assert first.poll() is None, "the second run must stop while the first still runs"
    print(f"second run stopped after {seconds:.1f} s")
    out, err = first.communicate(timeout=600)
  finally:
    if first.poll() is None:
      first.kill()
  assert first.returncode == 0, err[-3000:]
  changed = differences(metrics(tmp_path), json.loads(GOLDEN.read_text()))
  assert not changed, changed
