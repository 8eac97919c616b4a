"""Timing shared by the benchmarks."""

from __future__ import annotations

import statistics
import time

import jax


def timed_first(fn, repeats: int) -> tuple[float, float]:
  """(seconds of the first call of `fn()`, compilation included; median seconds of the
  `repeats` calls after it), each blocked until its arrays are ready."""
  start = time.perf_counter()
  jax.block_until_ready(fn())
  first = time.perf_counter() - start
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return first, statistics.median(times)


def timed(fn, repeats: int) -> float:
  """Median seconds of `fn()` (blocked until its arrays are ready) after one warm-up call."""
  return timed_first(fn, repeats)[1]
