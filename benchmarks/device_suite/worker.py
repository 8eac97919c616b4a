"""Background compiles: a worker thread that runs set-ups and compiles beside the
measurements (or serially, `--compiles serial`)."""

from __future__ import annotations

import queue
import threading
import time

import jax


class Job:
  """One background compile (or set-up); `result()` waits for it, or runs it in the caller
  when compiles are serial."""

  def __init__(self, name: str, fn, serial: bool):
    self.name, self.fn, self.serial = name, fn, serial
    self.done = threading.Event()
    self.value = self.error = None
    self.seconds = None
    self.lock = threading.Lock()

  def run(self) -> None:
    with self.lock:
      if self.done.is_set():
        return
      start = time.perf_counter()
      try:
        self.value = self.fn()
      except BaseException as exc:  # pylint: disable=broad-except
        self.error = exc
      self.seconds = time.perf_counter() - start
      self.done.set()

  def result(self, timeout: float | None = None):
    if self.serial:
      self.run()
    if not self.done.wait(timeout):
      raise TimeoutError(f"{self.name}: not compiled within {timeout:.0f} s")
    if self.error is not None:
      raise self.error
    return self.value


class Worker:
  """Runs jobs on one daemon thread in submission order, so that XLA compiles (minutes for
  a 36-layer program on a GPU host) overlap the main thread's device-bound measurements.
  One thread: two XLA compiles at once were slower than one after the other (measured on
  the CPU backend). A job may wait on jobs submitted before it, never after.
  serial=True: nothing runs until asked for (undisturbed timings, longer runs)."""

  def __init__(self, serial: bool):
    self.serial = serial
    self.jobs = []
    self.queue = queue.Queue()
    if not serial:
      threading.Thread(target=self._loop, daemon=True, name="compiles").start()

  def _loop(self):
    while True:
      self.queue.get().run()

  def submit(self, name: str, fn) -> Job:
    job = Job(name, fn, self.serial)
    self.jobs.append(job)
    if not self.serial:
      self.queue.put(job)
    return job

  def busy(self) -> bool:
    return not self.serial and any(not job.done.is_set() for job in self.jobs)

  def wait_idle(self, timeout: float) -> bool:
    end = time.perf_counter() + timeout
    for job in self.jobs if not self.serial else []:
      if not job.done.wait(max(end - time.perf_counter(), 0.0)):
        return False
    return True


def abstract(tree):
  """ShapeDtypeStructs of a pytree of arrays: lowering from them never touches buffers
  that the main thread may have donated meanwhile."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                     sharding=getattr(x, "sharding", None)),
                      tree)
