"""What XLA made of a jitted program: trace + lower and compile times, the compiled
program's cost analysis (FLOPs, bytes accessed) and memory analysis, the best run time, and
a `jax.profiler` trace when given a folder (view it with `xprof server --logdir DIR`).

Cost analysis counts each loop body once (XLA does not know trip counts): for a rollout the
FLOPs are per decode step and per turn body, not per episode.
"""

from __future__ import annotations

import time

import jax

MEMORY_FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
                 "generated_code_size_in_bytes")


def format_bytes(n: float) -> str:
  for unit in ("B", "KiB", "MiB", "GiB"):
    if abs(n) < 1024:
      return f"{n:.1f} {unit}"
    n /= 1024
  return f"{n:.1f} TiB"


def profile_compiled(fn, args, repeats: int = 3, trace_dir: str | None = None,
                     verbose: bool = True):
  """(report, the last run's output) for `jax.jit(fn)(*args)`. The report holds lower_s,
  compile_s, flops and bytes_accessed (when the backend reports them), the MEMORY_FIELDS,
  and run_s, the best of `repeats` runs after a warm-up."""
  say = print if verbose else (lambda *_, **__: None)
  say("tracing and compiling (tens of seconds to minutes; nothing runs meanwhile) ...",
      flush=True)
  start = time.perf_counter()
  lowered = jax.jit(fn).lower(*args)
  lowered_s = time.perf_counter() - start
  compiled = lowered.compile()
  compile_s = time.perf_counter() - start - lowered_s
  say(f"trace + lower: {lowered_s:.1f} s, compile: {compile_s:.1f} s")
  report = {"lower_s": lowered_s, "compile_s": compile_s}
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  if cost:
    flops, accessed = cost.get("flops", 0.0), cost.get("bytes accessed", 0.0)
    say(f"cost analysis (loop bodies once): {flops / 1e9:.3f} GFLOP, "
        f"{format_bytes(accessed)} accessed")
    report.update(flops=flops, bytes_accessed=accessed)
  memory = compiled.memory_analysis()
  if memory is not None:
    for name in MEMORY_FIELDS:
      value = getattr(memory, name, None)
      if value is not None:
        say(f"  {name.replace('_in_bytes', '')}: {format_bytes(value)}")
        report[name] = value
  say(f"running: a warm-up and {max(repeats, 1)} timed run(s) ...", flush=True)
  out = jax.block_until_ready(compiled(*args))
  times = []
  for _ in range(max(repeats, 1)):
    start = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - start)
  report["run_s"] = min(times)
  if trace_dir:
    with jax.profiler.trace(trace_dir):
      jax.block_until_ready(compiled(*args))
    say(f"profiler trace: {trace_dir}; to view it: xprof server --logdir {trace_dir} --port 8791 "
        "(the dev install has xprof), then open http://localhost:8791 in a browser")
  return report, out
