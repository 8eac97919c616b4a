"""GRPO steps per second on the demo config, and where the time goes.

    python -m benchmarks.train_bench [--steps 5] [--config.key=value ...]

Cost on a 2-core CPU: about 2 minutes (most of it compiling). One GRPO step is: compiled
rollouts of prompts x group episodes (`grpo.prompts` x `grpo.group`), the log-probabilities
recomputed under the current parameters, and the update (forward and backward, AdamW).
The policy is the demo's untrained one (episode lengths then differ from a trained
policy's; the rollout does the same work per slot either way).
"""

from __future__ import annotations

import sys
import time

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from jaxspatial.rl.objectives import PolicyLossConfig
from jaxspatial.train import (OptimizerConfig, StepConfig, batch_logprobs, make_optimizer,
                              shard_batch, train_step)
from launch import train

_STEPS = flags.DEFINE_integer("steps", 5, "timed GRPO steps (after one warm-up step)")


def main(argv) -> None:
  del argv
  logging.set_verbosity(logging.WARNING)
  c = _CONFIG.value
  c.data.test_tasks = 8
  job = train.build(c)
  with jax.set_mesh(job.mesh):
    optimizer = make_optimizer(job.model, OptimizerConfig(learning_rate=c.grpo.learning_rate))
  config = StepConfig(objective="grpo", temperature=c.rollout.temperature,
                      loss=PolicyLossConfig(beta=c.grpo.beta))
  key = jax.random.PRNGKey(0)
  phases = {"rollout": 0.0, "logprobs": 0.0, "update": 0.0}
  tokens = 0.0
  for step in range(_STEPS.value + 1):
    start = time.perf_counter()
    batch, traj, metrics = train._grpo_batch(job, step, key)
    jax.block_until_ready(batch)
    rollout_s = time.perf_counter() - start
    start = time.perf_counter()
    with jax.set_mesh(job.mesh):
      old = jax.block_until_ready(batch_logprobs(job.model, batch, c.rollout.temperature))
    logprob_s = time.perf_counter() - start
    start = time.perf_counter()
    with jax.set_mesh(job.mesh):
      jax.block_until_ready(train_step(job.model, optimizer,
                                       shard_batch(batch.replace(old_logprobs=old), job.mesh),
                                       config))
    update_s = time.perf_counter() - start
    if step == 0:
      print(f"first step (compiling): rollout {rollout_s:.1f} s, log-probabilities "
            f"{logprob_s:.1f} s, update {update_s:.1f} s")
      continue
    phases["rollout"] += rollout_s
    phases["logprobs"] += logprob_s
    phases["update"] += update_s
    tokens += metrics["tokens"]
  total = sum(phases.values())
  steps = _STEPS.value
  episodes = c.grpo.prompts * c.grpo.group
  print(f"device: {jax.devices()[0].device_kind}; {episodes} episodes per step "
        f"({c.grpo.prompts} prompts x {c.grpo.group}), {c.rollout.max_turns} turns x "
        f"{c.rollout.max_turn_tokens} tokens")
  print(f"GRPO steps/s: {steps / total:.3f} ({total / steps:.2f} s per step, "
        f"{tokens / total:.0f} generated tokens/s)")
  print(f"{'phase':>10} | {'s per step':>10} | share")
  for name, seconds in phases.items():
    print(f"{name:>10} | {seconds / steps:10.3f} | {100 * seconds / total:5.1f}%")


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", "configs/demo.py", "the training config")
  app.run(main, argv=sys.argv)
