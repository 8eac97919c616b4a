"""One RL step of the Think3D-RL, Act3D and PERIA `:cpu` recipes (`jaxspatial.train.rl_step`:
rollout, rewards, advantages, old log-probabilities, update), each group's prompt prefilled
once (`rl.share_prompts`, the default) against every row prefilling its own copy (the
earlier path), in one run: rollout seconds, bytes copied to the host, step seconds.

    python -m benchmarks.rl_step_bench [--recipes think3d_rl act3d_grpo peria_or_gigpo]
        [--steps 3] [--pairs 9]

Cost on a 2-core CPU: about 4 minutes (3m36s measured), most of it compiling (two rollout programs per
recipe). Rollout: the two paths on one task batch, one key and one policy (the rollout of
`rl_step`: the compiled episodes and their rewards), in `--pairs` interleaved pairs, the
order alternating; the speed-up is the median of the pairs' ratios. Step: whole steps
alternating between the paths (medians over `--steps` each, after one warm-up step of
each); each step updates the policy the next one samples, so the two paths' steps sample
different policies, and a rollout right after an update runs slower on this machine (tens
of milliseconds, either path). Host bytes: what the step copied off the device through
`jaxspatial.models.sharding.local_rows` (host rewards, snapshots; the metrics' scalars
aside), against the whole trajectory (what the step copied before `HostRows`). The
policies are the recipes' untrained tiny ones; the rollout does the same work per slot
whatever the policy.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import statistics
import tempfile
import time

import jax
from absl import logging

from benchmarks.rl_setup import PATHS, rl_phase, rollout_pairs
from jaxspatial.models import sharding
from jaxspatial.train import rl_step

@contextlib.contextmanager
def counting_host_copies(counter: list):
  """Adds the bytes of every `local_rows` copy to counter[0] (HostRows reads through the
  module's global; recipes import the name)."""
  original = sharding.local_rows

  def counted(array):
    rows = original(array)
    counter[0] += rows.nbytes
    return rows

  modules = (sharding, importlib.import_module("recipes.agents"))
  for module in modules:
    module.local_rows = counted
  try:
    yield
  finally:
    for module in modules:
      module.local_rows = original


def bench_recipe(name: str, steps: int, pairs: int, data_dir: str) -> dict:
  c = importlib.import_module(f"configs.{name}").get_config("cpu")
  c.workdir = tempfile.mkdtemp(prefix=f"rl_step_{name}_")
  c.data.data_dir = data_dir
  c.snapshot_every = 0
  experiment, mesh, module, phase, optimizer, reference = rl_phase(c)
  key = jax.random.PRNGKey(0)
  results = {path: {"rollout": [], "step": [], "host": [], "first": 0.0} for path in PATHS}
  for step in range(steps + 1):
    for path, shared in PATHS.items():
      c.rl.share_prompts = shared
      timings, copied = {}, [0]
      started = time.perf_counter()
      with counting_host_copies(copied):
        metrics = rl_step(experiment, phase, step, jax.random.fold_in(key, step), module,
                          optimizer, mesh, reference, timings=timings)
        jax.block_until_ready(metrics)
      seconds = time.perf_counter() - started
      if step == 0:
        results[path]["first"] = seconds
        continue
      results[path]["rollout"].append(timings["rollout"])
      results[path]["step"].append(seconds)
      results[path]["host"].append(copied[0])
  out = experiment.rollout(phase, 0, key)
  trajectory_bytes = sum(x.nbytes for x in jax.tree.leaves(out.trajectory))
  group = c.advantage.group_size
  rollouts = rollout_pairs(experiment, c, module, mesh, key, pairs)
  return dict(name=name, episodes=f"{c.rl.prompts} x {group}", trajectory=trajectory_bytes,
              rollouts=rollouts,
              **{path: {k: (statistics.median(v) if isinstance(v, list) else v)
                        for k, v in r.items()} for path, r in results.items()})


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--recipes", nargs="+",
                      default=["think3d_rl", "act3d_grpo", "peria_or_gigpo"])
  parser.add_argument("--steps", type=int, default=3, help="timed steps of each path")
  parser.add_argument("--pairs", type=int, default=9,
                      help="interleaved rollout pairs on one batch and policy")
  args = parser.parse_args()
  logging.set_verbosity(logging.WARNING)
  data_dir = tempfile.mkdtemp(prefix="rl_step_data_")
  rows = []
  for name in args.recipes:
    print(f"{name}: building and compiling ...", flush=True)
    rows.append(bench_recipe(name, args.steps, args.pairs, data_dir))
  print(f"device: {jax.devices()[0].device_kind}; rollouts: medians of {args.pairs} "
        f"interleaved pairs; steps: medians of {args.steps} per path")
  print(f"{'recipe':>15} | {'episodes':>8} | {'rollout s (row / shared)':>24} | speed-up | "
        f"{'step s (row / shared)':>21} | {'its rollout s':>13} | "
        "host bytes (whole traj. / copied)")
  for r in rows:
    old, new, pair = r["per row"], r["shared"], r["rollouts"]
    print(f"{r['name']:>15} | {r['episodes']:>8} | {pair['per row']:11.3f} / "
          f"{pair['shared']:10.3f} | {pair['speed-up']:7.2f}x | {old['step']:9.3f} / "
          f"{new['step']:9.3f} | {old['rollout']:.3f} / {new['rollout']:.3f} | "
          f"{r['trajectory']:,} / {int(new['host']):,}")


if __name__ == "__main__":
  main()
