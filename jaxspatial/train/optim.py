"""AdamW with linear warm-up, cosine decay and global-norm clipping."""

from __future__ import annotations

import dataclasses

import jax
import optax
from flax import nnx


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  learning_rate: float = 1e-5
  warmup_steps: int = 0
  total_steps: int = 1000
  final_fraction: float = 0.1     # cosine decays to this fraction of the peak
  weight_decay: float = 0.0
  b1: float = 0.9
  b2: float = 0.999
  clip_norm: float | None = 1.0


def schedule(config: OptimizerConfig) -> optax.Schedule:
  return optax.warmup_cosine_decay_schedule(
      0.0 if config.warmup_steps else config.learning_rate, config.learning_rate,
      config.warmup_steps, max(config.total_steps, config.warmup_steps + 1),
      config.learning_rate * config.final_fraction)


def trainable(frozen: tuple[str, ...] = (), adapters_only: bool = False):
  """The filter of trained parameters: every nnx.Param (LoRA adapters count as Params), or
  the adapters alone; minus those under any path component in `frozen` (e.g. "visual",
  the vision tower; "projector")."""
  base = nnx.LoRAParam if adapters_only else nnx.Param
  if not frozen:
    return base
  return nnx.All(base, nnx.Not(nnx.Any(*(nnx.PathContains(name) for name in frozen))))


def make_optimizer(model, config: OptimizerConfig, wrt=nnx.Param, mesh=None) -> nnx.Optimizer:
  """An nnx.Optimizer over the parameters `wrt` selects (see `trainable`); `train_step`
  takes gradients with respect to the same filter. With `mesh`, its state is created under
  it (sharded like the parameters), as under `jax.set_mesh(mesh)`."""
  if mesh is not None:
    with jax.set_mesh(mesh):
      return make_optimizer(model, config, wrt)
  chain = [optax.clip_by_global_norm(config.clip_norm)] if config.clip_norm else []
  chain.append(optax.adamw(schedule(config), b1=config.b1, b2=config.b2,
                           weight_decay=config.weight_decay))
  return nnx.Optimizer(model, optax.chain(*chain), wrt=wrt)
