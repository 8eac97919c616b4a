"""GRPO steps per second on the demo config, and where the time goes: the trainer's own RL
step (`jaxspatial.train.rl_step`) on the demo recipe, timed part by part.

    python -m benchmarks.train_bench [--steps 5] [--config.key=value ...]

Cost on a 2-core CPU: about 2 minutes (most of it compiling). One GRPO step is: compiled
rollouts of prompts x group episodes (`rl.prompts` x `advantage.group_size`), the
log-probabilities recomputed under the current parameters (and the reference's, when
beta > 0), and the update (forward and backward, AdamW). The policy is the demo's
untrained one (episode lengths then differ from a trained policy's; the rollout does the
same work per slot either way).
"""

from __future__ import annotations

import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from benchmarks.rl_setup import rl_phase
from jaxspatial.train import rl_step

_STEPS = flags.DEFINE_integer("steps", 5, "timed GRPO steps (after one warm-up step)")


def main(argv) -> None:
  del argv
  logging.set_verbosity(logging.WARNING)
  c = _CONFIG.value
  c.data.test_tasks = 8
  c.snapshot_every = 0
  experiment, mesh, module, phase, optimizer, reference = rl_phase(c)
  key = jax.random.PRNGKey(0)
  totals = {"rollout": 0.0, "logprobs": 0.0, "update": 0.0}
  tokens = 0.0
  for step in range(_STEPS.value + 1):
    timings = {}
    metrics = rl_step(experiment, phase, step, jax.random.fold_in(key, step), module,
                      optimizer, mesh, reference, timings=timings)
    if step == 0:
      print(f"first step (compiling): rollout {timings['rollout']:.1f} s, log-probabilities "
            f"{timings['logprobs']:.1f} s, update {timings['update']:.1f} s")
      continue
    for name in totals:
      totals[name] += timings[name]
    tokens += float(metrics["tokens"])
  total = sum(totals.values())
  steps = _STEPS.value
  group = c.advantage.group_size
  print(f"device: {jax.devices()[0].device_kind}; {c.rl.prompts * group} episodes per step "
        f"({c.rl.prompts} prompts x {group}), {c.rollout.max_turns} turns x "
        f"{c.rollout.max_turn_tokens} tokens")
  print(f"GRPO steps/s: {steps / total:.3f} ({total / steps:.2f} s per step, "
        f"{tokens / total:.0f} generated tokens/s)")
  print(f"{'phase':>10} | {'s per step':>10} | share")
  for name, seconds in totals.items():
    print(f"{name:>10} | {seconds / steps:10.3f} | {100 * seconds / total:5.1f}%")


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", "configs/demo.py", "the training config")
  app.run(main, argv=sys.argv)
