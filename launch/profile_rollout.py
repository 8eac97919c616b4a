"""Compiles a rollout for a config and reports what XLA made of it: compile time, the
compiled program's cost analysis (FLOPs, bytes accessed) and memory analysis, run time per
episode; optionally a `jax.profiler` trace for TensorBoard / XProf.

    python -m launch.profile_rollout --config configs/rollout_demo.py \
        [--config.batch=32] [--config.trace_dir=outputs/rollout_trace]

Cost analysis counts each loop body once (XLA does not know trip counts), so FLOPs are
per decode step and per turn body, not per episode.
"""

from __future__ import annotations

import time

import jax
from absl import app
from flax import nnx
from ml_collections import config_flags

from jaxspatial.rollout import episode
from recipes import rollout_demo as rollout_setup

def _fmt_bytes(n: float) -> str:
  for unit in ("B", "KiB", "MiB", "GiB"):
    if abs(n) < 1024:
      return f"{n:.1f} {unit}"
    n /= 1024
  return f"{n:.1f} TiB"


def run(c) -> dict:
  s = rollout_setup.build(c)
  graphdef, state = nnx.split(s.model)

  def program(state, automaton, tasks, ids, mask, key, forced):
    model = nnx.merge(graphdef, state)
    return episode.rollout(model, s.agent, automaton, s.template, tasks, ids, mask, key,
                           s.config, None, forced)

  args = (state, s.automaton, s.tasks, s.prompt_ids, s.prompt_mask, jax.random.PRNGKey(c.seed),
          s.forced)
  start = time.perf_counter()
  lowered = jax.jit(program).lower(*args)
  lowered_s = time.perf_counter() - start
  compiled = lowered.compile()
  compile_s = time.perf_counter() - start - lowered_s
  print(f"trace + lower: {lowered_s:.1f} s, compile: {compile_s:.1f} s "
        f"(batch {c.batch}, {c.max_turns} turns x {c.max_turn_tokens} tokens)")
  report = {"lower_s": lowered_s, "compile_s": compile_s}
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  if cost:
    flops, accessed = cost.get("flops", 0.0), cost.get("bytes accessed", 0.0)
    print(f"cost analysis (loop bodies once): {flops / 1e9:.3f} GFLOP, "
          f"{_fmt_bytes(accessed)} accessed")
    report.update(flops=flops, bytes_accessed=accessed)
  memory = compiled.memory_analysis()
  if memory is not None:
    for name in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
                 "generated_code_size_in_bytes"):
      value = getattr(memory, name, None)
      if value is not None:
        print(f"  {name.replace('_in_bytes', '')}: {_fmt_bytes(value)}")
        report[name] = value
  jax.block_until_ready(compiled(*args))
  times = []
  for _ in range(c.repeats):
    start = time.perf_counter()
    trajectory = jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - start)
  best = min(times)
  tokens = float(trajectory.loss_mask.sum())
  print(f"run: {best:.3f} s for {c.batch} episodes = {1e3 * best / c.batch:.1f} ms per episode, "
        f"{tokens / best:.0f} generated tokens/s")
  report.update(run_s=best, ms_per_episode=1e3 * best / c.batch)
  if c.trace_dir:
    with jax.profiler.trace(c.trace_dir):
      jax.block_until_ready(compiled(*args))
    print(f"profiler trace: {c.trace_dir} (tensorboard --logdir {c.trace_dir})")
  return report


def main(argv) -> None:
  del argv
  run(_CONFIG.value)


if __name__ == "__main__":
  # Defined here, not at import, so that several launch modules can be imported together.
  _CONFIG = config_flags.DEFINE_config_file("config", "configs/rollout_demo.py",
                                            "the rollout config file")
  app.run(main)
