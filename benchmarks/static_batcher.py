"""The static batcher serving used before continuous batching (`serving.Scheduler`), kept
as benchmarks/serving_bench.py's baseline. Batching of concurrent requests: request threads `submit` prepared prompts and wait;
one worker thread collects what arrives within `window_s` of the oldest waiting request
(or until a full batch), takes the oldest request's group (requests whose max_tokens fall
in the same new-token bucket, each sampled with its own settings; a request with a seed
runs alone, with that seed's key) up to the
engine's largest batch, and runs it as one batch. What is left waits for the next turn,
so requests arriving while a batch runs form the next one.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time

import jax

from jaxspatial.serving.engine import Engine, Reply, Sampling
from jaxspatial.serving.prompt import Prompt


@dataclasses.dataclass(eq=False)  # compared by identity (queue removal)
class _Item:
  prompt: Prompt
  max_tokens: int
  sampling: Sampling
  stop: tuple
  seed: int | None
  future: concurrent.futures.Future
  arrived: float
  budget: int = 0      # the engine's new-token bucket of max_tokens

  @property
  def group(self):
    return (self.budget, id(self) if self.seed is not None else None)


class Batcher:
  """Runs `engine` on a worker thread over batches of submitted requests; a request whose
  future is cancelled before its batch starts is dropped unrun."""

  def __init__(self, engine: Engine, window_s: float = 0.01, seed: int = 0):
    self.engine, self.window_s = engine, float(window_s)
    self._key = jax.random.PRNGKey(seed)
    self._queue: collections.deque[_Item] = collections.deque()
    self._cond = threading.Condition()
    self._stop = False
    self._counts = collections.Counter()
    self._thread = threading.Thread(target=self._run, name="chat-batcher", daemon=True)
    self._thread.start()

  def submit(self, prompt: Prompt, max_tokens: int, sampling: Sampling, stop=(),
             seed: int | None = None) -> concurrent.futures.Future:
    """A future of the `Reply`."""
    future = concurrent.futures.Future()
    with self._cond:
      if self._stop:
        raise RuntimeError("the batcher is stopped")
      budget = self.engine.shapes([prompt], int(max_tokens))[2]
      self._queue.append(_Item(prompt, int(max_tokens), sampling, tuple(stop), seed, future,
                               time.monotonic(), budget))
      self._counts["requests"] += 1
      self._cond.notify()
    return future

  def stats(self) -> dict:
    """requests, batches, rows (requests run), padded_rows, failed_batches, cancelled
    (dropped before running), waiting, programs."""
    with self._cond:
      counts = dict(self._counts)
      waiting = sum(not item.future.cancelled() for item in self._queue)
    names = ("requests", "batches", "rows", "padded_rows", "failed_batches", "cancelled")
    return {**{name: counts.get(name, 0) for name in names}, "waiting": waiting,
            "programs": len(self.engine.programs)}

  def close(self) -> None:
    with self._cond:
      self._stop = True
      self._cond.notify()
    self._thread.join(timeout=5)

  def _take(self) -> list[_Item] | None:
    with self._cond:
      while not self._queue and not self._stop:
        self._cond.wait()
      if self._stop:
        for item in self._queue:
          item.future.set_exception(RuntimeError("the server is stopping"))
        self._queue.clear()
        return None
      deadline = self._queue[0].arrived + self.window_s
      group = self._queue[0].group
      while not self._stop and (left := deadline - time.monotonic()) > 0 and sum(
          item.group == group for item in self._queue) < self.engine.max_batch:
        self._cond.wait(left)
      chosen = [item for item in self._queue if item.group == group][:self.engine.max_batch]
      for item in chosen:
        self._queue.remove(item)
      return chosen

  def _run(self) -> None:
    while (items := self._take()) is not None:
      running = [i for i in items if i.future.set_running_or_notify_cancel()]
      if len(running) < len(items):
        with self._cond:
          self._counts["cancelled"] += len(items) - len(running)
      items = running
      if not items:
        continue
      try:
        seed = items[0].seed
        if seed is not None:
          key = jax.random.PRNGKey(seed % (1 << 32))
        else:
          self._key, key = jax.random.split(self._key)
        tokens, size = self.engine.generate([i.prompt for i in items],
                                            max(i.max_tokens for i in items),
                                            [i.sampling for i in items], key)
        replies = [self.engine.reply(row, len(i.prompt.ids), i.max_tokens, i.stop)
                   for row, i in zip(tokens, items)]
      except Exception as error:  # the batch's requests get the error; the worker goes on
        with self._cond:
          self._counts["failed_batches"] += 1
        for item in items:
          item.future.set_exception(error)
        continue
      with self._cond:
        self._counts["batches"] += 1
        self._counts["rows"] += len(items)
        self._counts["padded_rows"] += size - len(items)
      for item, reply in zip(items, replies):
        item.future.set_result(reply)


__all__ = ["Batcher", "Reply"]
