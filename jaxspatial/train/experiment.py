"""What a recipe gives the trainer: an `Experiment` (its policy, phases, batches, evaluation
and report) made of `Phase`s. The loop itself is `jaxspatial.train.Trainer`.

A phase is supervised (the experiment's `train_batch(phase, k)` gives step k's batch) or
reinforcement learning (`advantage` set: `rollout(phase, k, key)` gives step k's episodes
and rewards; the trainer computes advantages, old / reference log-probabilities and runs
`epochs x mini_batches` updates). Step k's data must be a function of the seed, k and the
experiment's `data_iterator` state (saved with every checkpoint), so a resumed run replays
the same batches.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from flax import nnx

from jaxspatial.train.grpo import AdvantageConfig
from jaxspatial.train.optim import OptimizerConfig
from jaxspatial.train.steps import StepConfig, TrainBatch


@dataclasses.dataclass(frozen=True)
class Phase:
  """One stage of a run. `optimizer.total_steps` is filled by the trainer (its updates)."""
  name: str                                # the metrics' prefix ("sft", "rl")
  steps: int
  optimizer: OptimizerConfig
  step: StepConfig                         # objective (loss registry), micro-batches, ...
  trainable: Any = nnx.Param               # the optimizer's filter (`train.trainable`)
  reference: str | None = None             # KL reference when step.loss.beta > 0:
                                           # "frozen" (the policy at the phase's start)
                                           # or "lora_disabled"
  advantage: AdvantageConfig | None = None  # set: a reinforcement-learning phase
  mini_batches: int = 1
  epochs: int = 1
  # The update's old log-probabilities: "recompute" (a forward over the batch before the
  # update) or "rollout" (the rollout's own; an on-policy update: one epoch, one
  # mini-batch, sampled from the policy's tempered distribution in the training precision).
  old_logprobs: str = "recompute"

  def __post_init__(self):
    if self.steps < 0:
      raise ValueError(f"Phase {self.name!r}: steps must be >= 0, got {self.steps}")
    if self.advantage is None and (self.mini_batches, self.epochs) != (1, 1):
      raise ValueError(f"Phase {self.name!r}: mini_batches / epochs apply to RL phases "
                       "(set advantage)")
    if self.old_logprobs not in ("recompute", "rollout"):
      raise ValueError(f"Phase {self.name!r}: old_logprobs must be 'recompute' or 'rollout', "
                       f"got {self.old_logprobs!r}")
    if self.old_logprobs == "rollout" and (not self.is_rl
                                           or (self.mini_batches, self.epochs) != (1, 1)):
      raise ValueError(f"Phase {self.name!r}: old_logprobs 'rollout' needs an on-policy RL "
                       f"update (one epoch, one mini-batch), got {self.epochs} epochs x "
                       f"{self.mini_batches} mini-batches; use 'recompute'")

  @property
  def is_rl(self) -> bool:
    return self.advantage is not None

  @property
  def updates(self) -> int:
    """Optimizer updates over the phase (the schedule's length)."""
    return self.steps * (self.epochs * self.mini_batches if self.is_rl else 1)

  def optimizer_config(self) -> OptimizerConfig:
    return dataclasses.replace(self.optimizer, total_steps=max(self.updates, 1))


@dataclasses.dataclass(frozen=True)
class ExportedPolicy:
  """What `launch.export` writes of a restored run (`Experiment.exported_policy`): the
  policy family's model inside the checkpoint's module (adapters still unmerged), the
  tokenizer the run trained with (tokens it added included), how its replies open and end,
  and the Hugging Face folder the run started from (None: built here), whose processor
  files, chat template and generation config the export carries over."""
  model: Any
  tokenizer: Any
  chat: Any = None            # models.ChatFormat; None: instruct, replies end at <|im_end|>
  source: str | None = None


@dataclasses.dataclass
class RolloutBatch:
  """Step k's episodes for an RL phase: the training batch (advantages filled in by the
  trainer), the episodes' rewards [B] (groups of `advantage.group_size` adjacent), the
  trajectory when the estimator needs turns (OR-GIGPO), and metrics to log."""
  batch: TrainBatch
  rewards: jax.Array
  trajectory: Any = None
  metrics: dict = dataclasses.field(default_factory=dict)


class Experiment:
  """A recipe's side of training; subclasses override what they use.

  `build(mesh)` is called under `jax.set_mesh(mesh)` and returns the module the optimizer
  trains and the checkpoints hold. `evaluate(module, when)` is called with when = "start"
  (a fresh run), each phase's name at its end (all but the last) and "final"; it returns
  entries merged into the run's results (saved with checkpoints, so a resumed run does not
  repeat them); `launch.eval` calls it with when = "checkpoint". `report(results, workdir)` writes pages and returns the text to print.
  `launch.export` builds the module with `build_for_export(mesh)` (default: `build`; a recipe
  may skip its data, rollouts and tools), restores a checkpoint into it and writes
  `exported_policy(module)` as a Hugging Face folder.
  """

  name: str = "experiment"
  data_iterator: Any = None          # get_state() / set_state(): saved per process
  curve_metrics: tuple[str, ...] = ()  # logged metrics drawn in curve.png

  def build(self, mesh) -> nnx.Module:
    raise NotImplementedError

  @classmethod
  def for_export(cls, config) -> "Experiment":
    """The experiment `launch.export` builds (default: `cls(config)`; a recipe may skip
    checking the data it trains on)."""
    return cls(config)

  def build_for_export(self, mesh) -> nnx.Module:
    """The module `build` returns (the checkpoints' structure), for `launch.export`: what
    the exported policy needs (its tokenizer, its chat format), nothing else."""
    return self.build(mesh)

  def exported_policy(self, module) -> ExportedPolicy:
    """The policy `launch.export` writes of a restored `module`."""
    del module
    raise NotImplementedError(f"{type(self).__name__} does not export a policy")

  def phases(self) -> list[Phase]:
    raise NotImplementedError

  def prepare(self, phase: Phase, module) -> None:
    """Called when a phase starts or a run resumes inside it."""

  def train_batch(self, phase: Phase, step: int) -> TrainBatch:
    raise NotImplementedError(f"{type(self).__name__} has no supervised phase")

  def rollout(self, phase: Phase, step: int, key) -> RolloutBatch:
    raise NotImplementedError(f"{type(self).__name__} has no RL phase")

  def evaluate(self, module, when: str, split: str | None = None) -> dict:
    """when: "start", a phase's name, "final", or "checkpoint" (`launch.eval`: a restored
    policy, on `split` or the config's evaluation split)."""
    del module, when, split
    return {}

  def report(self, results: dict, workdir) -> str:
    del results, workdir
    return ""

  def memory_estimate(self):
    """A `models.memory.MemoryEstimate` printed before anything compiles (or None)."""
    return None
