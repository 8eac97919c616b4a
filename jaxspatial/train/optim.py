"""AdamW with linear warm-up, cosine or linear decay and global-norm clipping; which
parameters weight decay applies to.

Schedules match transformers' `get_cosine_schedule_with_warmup` /
`get_linear_schedule_with_warmup` (the learning rate at update k, counted from 0, rises
from 0 over the warm-up steps) when `final_fraction` is 0. `weight_decay_mask`:
  "all"           every trained parameter (optax's AdamW)
  "transformers"  the rule of transformers' Trainer (the version the 3DThinker scripts pin,
                  4.49): no decay for a parameter whose lower-cased name contains "bias",
                  "layernorm" or "rmsnorm", nor for LayerNorm modules' parameters. Our
                  parameter names are Hugging Face's, so the same ones are hit: the decoder
                  layers' norms and every bias are not decayed; the final `norm` and the
                  vision tower's `norm1` / `norm2` / `ln_q` are (newer transformers also
                  skip names matching "norm").
"""

from __future__ import annotations

import dataclasses

import jax
import optax
from flax import nnx

DECAYS = ("cosine", "linear")
WEIGHT_DECAY_MASKS = ("all", "transformers")
_NO_DECAY_NAMES = ("bias", "layernorm", "rmsnorm")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  learning_rate: float = 1e-5
  warmup_steps: int = 0
  warmup_ratio: float = 0.0       # or the warm-up as a fraction of total_steps (not both)
  total_steps: int = 1000
  final_fraction: float = 0.1     # the decay ends at this fraction of the peak
  decay: str = "cosine"           # or "linear" (transformers' default scheduler)
  weight_decay: float = 0.0
  weight_decay_mask: str = "all"  # or "transformers": no decay on biases and norms
  b1: float = 0.9
  b2: float = 0.999
  clip_norm: float | None = 1.0

  def __post_init__(self):
    if self.decay not in DECAYS:
      raise ValueError(f"OptimizerConfig.decay: expected one of {DECAYS}, got {self.decay!r}")
    if self.weight_decay_mask not in WEIGHT_DECAY_MASKS:
      raise ValueError(f"OptimizerConfig.weight_decay_mask: expected one of "
                       f"{WEIGHT_DECAY_MASKS}, got {self.weight_decay_mask!r}")
    if self.warmup_steps and self.warmup_ratio:
      raise ValueError(f"OptimizerConfig: give warmup_steps ({self.warmup_steps}) or "
                       f"warmup_ratio ({self.warmup_ratio}), not both")
    if not 0.0 <= self.warmup_ratio < 1.0:
      raise ValueError(f"OptimizerConfig.warmup_ratio: expected a fraction in [0, 1), got "
                       f"{self.warmup_ratio}")

  @property
  def warmup(self) -> int:
    """The warm-up in updates (`warmup_ratio` of `total_steps`, rounded, when given)."""
    return self.warmup_steps or int(round(self.warmup_ratio * self.total_steps))


def schedule(config: OptimizerConfig) -> optax.Schedule:
  peak, warmup = config.learning_rate, config.warmup
  end = peak * config.final_fraction
  if config.decay == "cosine":
    return optax.warmup_cosine_decay_schedule(0.0 if warmup else peak, peak, warmup,
                                              max(config.total_steps, warmup + 1), end)
  decay = optax.linear_schedule(peak, end, max(config.total_steps - warmup, 1))
  if not warmup:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


def trainable(frozen: tuple[str, ...] = (), adapters_only: bool = False):
  """The filter of trained parameters: every nnx.Param (LoRA adapters count as Params), or
  the adapters alone; minus those under any path component in `frozen` (e.g. "visual",
  the vision tower; "projector")."""
  base = nnx.LoRAParam if adapters_only else nnx.Param
  if not frozen:
    return base
  return nnx.All(base, nnx.Not(nnx.Any(*(nnx.PathContains(name) for name in frozen))))


def _path_names(path) -> tuple[str, ...]:
  """A pytree path's names, without the trailing `.value` of a Variable."""
  names = tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)
  return names[:-1] if names and names[-1] == "value" else names


def weight_decay_mask(model, rule: str):
  """optax's `mask` for AdamW's decay under `rule` (see the module docstring): None for
  "all", else a function of the parameter tree giving True where decay applies."""
  if rule == "all":
    return None
  if rule != "transformers":
    raise ValueError(f"weight_decay_mask: expected one of {WEIGHT_DECAY_MASKS}, got {rule!r}")
  layer_norms = {tuple(str(p) for p in path) for path, node in nnx.iter_graph(model)
                 if isinstance(node, nnx.LayerNorm)}

  def decays(path) -> bool:
    names = _path_names(path)
    if any(word in ".".join(names).lower() for word in _NO_DECAY_NAMES):
      return False
    return not any(names[:i] in layer_norms for i in range(len(names)))

  return lambda params: jax.tree_util.tree_map_with_path(lambda path, _: decays(path), params)


def make_optimizer(model, config: OptimizerConfig, wrt=nnx.Param, mesh=None) -> nnx.Optimizer:
  """An nnx.Optimizer over the parameters `wrt` selects (see `trainable`); `train_step`
  takes gradients with respect to the same filter. With `mesh`, its state is created under
  it (sharded like the parameters), as under `jax.set_mesh(mesh)`."""
  if mesh is not None:
    with jax.set_mesh(mesh):
      return make_optimizer(model, config, wrt)
  chain = [optax.clip_by_global_norm(config.clip_norm)] if config.clip_norm else []
  chain.append(optax.adamw(schedule(config), b1=config.b1, b2=config.b2,
                           weight_decay=config.weight_decay,
                           mask=weight_decay_mask(model, config.weight_decay_mask)))
  return nnx.Optimizer(model, optax.chain(*chain), wrt=wrt)
