"""One run per work directory.

`hold_workdir(workdir)` is held for a training run: a second run on the same directory stops
at once with one line naming the holder (host, pid, start time, command), instead of both
writing `metrics.jsonl` and `checkpoints/`. On a local or network file system it is an OS
lock (`flock`) on `<workdir>/.lock`: the kernel releases it when the holder dies however it
dies, so a lock left by a killed run is taken over, with a line saying whose it was. On an
object store (`gs://`, `s3://`: no file locks) it is a lease, `<workdir>/lease.json`, whose
holder rewrites a heartbeat every `heartbeat_s`; a lease older than `lease_s` is stale and
taken over. Only process 0 of a multi-process run takes it.

Acquiring is re-entrant within a process (`recipes.train` takes it before building the
experiment, so a second run stops before any data or compile work; `Trainer.run` takes it
again for library callers).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import shlex
import socket
import sys
import threading
import time
import uuid

import jax
from etils import epath

from jaxspatial.errors import WorkdirInUseError

LOCK_FILE = ".lock"
LEASE_FILE = "lease.json"

_HELD: dict[str, list] = {}  # str(workdir) -> [the lock this process holds, depth]
_GUARD = threading.Lock()


def _holder_record(token: str) -> dict:
  return {"host": socket.gethostname(), "pid": os.getpid(), "token": token,
          "started": time.time(), "heartbeat": time.time(),
          "command": " ".join(shlex.quote(a) for a in [os.path.basename(sys.executable)]
                              + sys.argv)[:300]}


def _describe(record: dict) -> str:
  started = datetime.datetime.fromtimestamp(record.get("started", 0), datetime.timezone.utc)
  return (f"pid {record.get('pid', '?')} on host {record.get('host', '?')}, started "
          f"{started:%Y-%m-%d %H:%M:%S} UTC: {record.get('command', '?')}")


def _read(path) -> dict | None:
  try:
    text = path.read_text()
  except (FileNotFoundError, OSError):
    return None
  try:
    record = json.loads(text)
  except ValueError:
    return None
  return record if isinstance(record, dict) else None


def is_remote(workdir) -> bool:
  """An object-store path (a URL scheme other than file://): no OS file locks there."""
  text = os.fspath(workdir)
  return "://" in text and not text.startswith("file://")


@contextlib.contextmanager
def hold_workdir(workdir, lease: bool | None = None, lease_s: float = 120.0,
                 heartbeat_s: float = 30.0):
  """Holds `workdir` for this run (re-entrant within the process; taken by process 0 of a
  multi-process run) while the block runs; raises `WorkdirInUseError` naming the holder if
  another run has it."""
  if jax.process_index() != 0:
    yield None
    return
  key = os.fspath(workdir)
  with _GUARD:
    entry = _HELD.get(key)
    if entry is None:
      lock = WorkdirLock(workdir, lease, lease_s, heartbeat_s)
      lock.acquire()
      entry = _HELD[key] = [lock, 0]
    entry[1] += 1
  try:
    yield entry[0]
  finally:
    with _GUARD:
      entry[1] -= 1
      if entry[1] == 0:
        del _HELD[key]
        entry[0].release()


class WorkdirLock:
  """The lock or lease on one work directory (see the module); `hold_workdir` is the way
  to take it."""

  def __init__(self, workdir, lease: bool | None = None, lease_s: float = 120.0,
               heartbeat_s: float = 30.0):
    self.workdir = epath.Path(workdir)
    self.lease = is_remote(workdir) if lease is None else lease
    self.lease_s, self.heartbeat_s = lease_s, heartbeat_s
    self._fd = None
    self._record = None
    self._made = False
    self._stop = threading.Event()
    self._beat = None

  def acquire(self) -> None:
    self._made = not self.workdir.exists()
    self.workdir.mkdir(parents=True, exist_ok=True)
    (self._take_lease if self.lease else self._take_flock)()

  # -- a local or network file system: flock ---------------------------------------------

  def _take_flock(self) -> None:
    path = os.fspath(self.workdir / LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      record = _read(epath.Path(path))
      os.close(fd)
      raise WorkdirInUseError(
          f"{self.workdir}: another run holds this work directory ("
          + (_describe(record) if record else "its holder wrote no record yet")
          + "); wait for it to end, or choose another --config.workdir") from None
    previous = _read(epath.Path(path))
    if previous:  # the lock was free, yet a holder is named: it ended without releasing
      print(f"{self.workdir}: taking over the lock of a run that is gone ("
            f"{_describe(previous)})", flush=True)
    self._record = _holder_record(uuid.uuid4().hex)
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(self._record).encode(), 0)
    os.fsync(fd)
    self._fd = fd

  # -- an object store: a lease with a heartbeat ------------------------------------------

  def _take_lease(self) -> None:
    path = self.workdir / LEASE_FILE
    current = _read(path)
    if current and time.time() - current.get("heartbeat", 0) < self.lease_s:
      raise WorkdirInUseError(
          f"{self.workdir}: another run holds this work directory ({_describe(current)}; "
          f"heartbeat {time.time() - current['heartbeat']:.0f} s ago, stale after "
          f"{self.lease_s:.0f} s); wait for it to end, or choose another --config.workdir")
    if current:
      print(f"{self.workdir}: taking over the lease of a run that stopped beating "
            f"{time.time() - current.get('heartbeat', 0):.0f} s ago ({_describe(current)})",
            flush=True)
    self._record = _holder_record(uuid.uuid4().hex)
    path.write_text(json.dumps(self._record))
    time.sleep(min(1.0, self.heartbeat_s))  # two runs that wrote at once: the last wins
    won = _read(path)
    if not won or won.get("token") != self._record["token"]:
      raise WorkdirInUseError(f"{self.workdir}: another run took the lease at the same time ("
                              + (_describe(won) if won else "unreadable") + ")")
    self._stop.clear()
    self._beat = threading.Thread(target=self._heartbeat, args=(path,), daemon=True,
                                  name="workdir-lease")
    self._beat.start()

  def _remove_if_unused(self) -> None:
    """A folder this lock made that holds nothing but the lock file (a run that stopped
    before writing, e.g. on a missing flag) goes, so a failed launch leaves nothing behind.
    Unlinked while still locked: a run that opened the old file fails to lock it."""
    if not self._made:
      return
    try:
      if [p.name for p in self.workdir.iterdir()] == [LOCK_FILE]:
        (self.workdir / LOCK_FILE).unlink()
        self.workdir.rmdir()
    except OSError:  # something appeared meanwhile: it stays
      pass

  def _heartbeat(self, path) -> None:
    while not self._stop.wait(self.heartbeat_s):
      self._record["heartbeat"] = time.time()
      try:
        path.write_text(json.dumps(self._record))
      except OSError as error:  # a blip: the next beat retries; the lease lasts lease_s
        print(f"{self.workdir}: lease heartbeat failed ({error})", file=sys.stderr, flush=True)

  def release(self) -> None:
    if self.lease:
      self._stop.set()
      if self._beat is not None:
        self._beat.join()
      try:
        if (_read(self.workdir / LEASE_FILE) or {}).get("token") == self._record["token"]:
          (self.workdir / LEASE_FILE).unlink()
      except OSError:
        pass
      return
    if self._fd is not None:
      os.ftruncate(self._fd, 0)  # empty: released cleanly (a record left means a crash)
      self._remove_if_unused()
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None
