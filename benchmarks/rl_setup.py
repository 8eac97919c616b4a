"""A recipe's RL phase set up as the trainer sets it up, and its rollout timed with and
without group-shared prompts, for the step benchmarks (rl_step_bench, the device suite)."""

from __future__ import annotations

import statistics
import time

import jax
import numpy as np

import recipes
from jaxspatial.train import ReferencePolicy, make_optimizer, mesh_from_config


def rl_phase(c):
  """(experiment, mesh, module, phase, optimizer, reference) of config `c`'s RL phase: the
  module built on the config's mesh, the phase prepared, its optimizer, and the KL's
  reference policy when beta > 0 (else None)."""
  experiment = recipes.experiment(c)
  mesh = mesh_from_config(c.mesh)
  with jax.set_mesh(mesh):
    module = experiment.build(mesh)
  phase = next(p for p in experiment.phases() if p.is_rl)
  experiment.prepare(phase, module)
  optimizer = make_optimizer(module, phase.optimizer_config(), phase.trainable, mesh=mesh)
  reference = None
  if phase.step.loss.beta > 0:
    with jax.set_mesh(mesh):
      reference = ReferencePolicy.create(phase.reference, module)
  return experiment, mesh, module, phase, optimizer, reference


# rl.share_prompts of each path: a group's prompt prefilled once, or once per row
PATHS = {"shared": True, "per row": False}


def rollout_pairs(experiment, c, module, mesh, key, pairs: int) -> dict:
  """Seconds of the step's rollout (compiled episodes and their rewards) on one task batch
  for each path, in interleaved pairs (the order alternating) after one untimed call of
  each (its seconds, a compile where the program is new, under "first"), and the median of
  the pairs' ratios."""
  group = c.advantage.group_size
  tasks, _ = next(experiment.data_iterator)
  tasks = jax.tree.map(lambda x: np.repeat(x, group, axis=0), tasks)

  def seconds(shared):
    started = time.perf_counter()
    traj = experiment.run(module, tasks, key, mesh=mesh, group=group if shared else 1)
    jax.block_until_ready((traj, experiment.rewards(traj, tasks)))
    return time.perf_counter() - started

  first = {path: seconds(shared) for path, shared in PATHS.items()}
  times = {path: [] for path in PATHS}
  for pair in range(pairs):
    order = list(PATHS.items()) if pair % 2 else list(PATHS.items())[::-1]
    for path, shared in order:
      times[path].append(seconds(shared))
  ratios = [row / shared for row, shared in zip(times["per row"], times["shared"])]
  return {path: statistics.median(t) for path, t in times.items()} | {
      "speed-up": statistics.median(ratios), "first": first}
