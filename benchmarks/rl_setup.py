"""A recipe's RL phase set up as the trainer sets it up, for the step benchmarks."""

from __future__ import annotations

import jax

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
