"""Timing shared by the benchmarks."""

from __future__ import annotations

import statistics
import time

import jax


def timed(fn, repeats: int) -> float:
  """Median seconds of `fn()` (blocked until its arrays are ready) after one warm-up call."""
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)
