"""`jax.jit` for programs that read a model: the module goes in as a pytree.

`nnx.jit` walks the module graph on the host at every call: 61 ms for an empty program over
a 3B-shaped Qwen2.5-VL graph of 824 arrays on a 2-core CPU, against 11 ms for `jax.jit` with
the module passed as the pytree it is (benchmarks/call_overhead_bench.py). The program may
only read the model: it gets copies of the Variables, so a write inside would be lost, except
RNG streams (dropout), which are handed back and written to the module.
"""

from __future__ import annotations

import jax
from flax import nnx


def reading_jit(fn, **jit_options):
  """f(model, *args, **kwargs) = fn(model, *args, **kwargs) under `jax.jit(**jit_options)`,
  for an `fn` that reads `model` (parameter writes are not kept; RNG draws are)."""

  def pure(model, *args, **kwargs):
    return fn(model, *args, **kwargs), nnx.state(model, nnx.RngState)

  jitted = jax.jit(pure, **jit_options)

  def run(model, *args, **kwargs):
    out, rngs = jitted(model, *args, **kwargs)
    if jax.tree.leaves(rngs):  # dropout drew keys: the module's streams move on
      nnx.update(model, rngs)
    return out

  run.lower = jitted.lower  # f.lower(model, ...): the HLO, cost and memory analyses
  return run
