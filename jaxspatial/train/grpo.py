"""One GRPO iteration after the rollout: advantages from the episodes' rewards, the old (and
reference) log-probabilities under the parameters that sampled, then the optimizer steps
(`epochs` passes over `mini_batches` slices; the PPO clip is active after the first).

Advantages come from the estimator registry (`register_advantage_estimator`, as losses
from theirs): "grpo" gives every generated token of an episode its group-normalised reward;
"rloo" its reward less the mean of the group's other episodes; "or_gigpo" gives each turn's
tokens A_E + omega A_S (PERIA eq.: episode groups, and step groups of equal observations:
the image each call produced), with an outcome reward placed on the episode's last turn. A
recipe adds one with a decorated function:

    @register_advantage_estimator("my_estimator")
    def mine(trajectory, rewards_PxG, config):  # -> [B] per episode or [B, S] per token
      ...
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
from flax import nnx

from typing import Callable

from jaxspatial.rl.advantages import (group_normalize, or_gigpo_advantages, rloo_advantages,
                                      token_advantages)
from jaxspatial.train.registry import registrar
from jaxspatial.train.steps import (StepConfig, TrainBatch, batch_logprobs, shard_batch,
                                    split_train_step)

Array = jax.Array


# name -> fn(trajectory, rewards_PxG, config) -> [B] or [B, S]
ESTIMATORS: dict[str, Callable] = {}
register_advantage_estimator = registrar(ESTIMATORS, "register_advantage_estimator")


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
  estimator: str = "grpo"       # a registered estimator: "grpo", "rloo", "or_gigpo"
  group_size: int = 8
  ddof: int = 1
  eps: float = 1e-6
  gamma: float = 0.99           # OR-GIGPO
  omega: float = 1.0
  delta: float = 0.9            # text similarity threshold (image observations match exactly)

  def __post_init__(self):
    if self.estimator not in ESTIMATORS:
      raise ValueError(f"AdvantageConfig.estimator: expected one of {sorted(ESTIMATORS)}, got "
                       f"{self.estimator!r}")


def token_turns(trajectory) -> Array:
  """[B, S] the turn each generated token belongs to, -1 on prompt and observation slots.
  Turns are packed (turn t + 1 starts after the batch's longest turn-t reply and the
  observation), so a turn is its recorded slot range [turn_start, turn_end)."""
  slots = jnp.arange(trajectory.tokens.shape[1])
  starts, ends = trajectory.turn_start, trajectory.turn_end  # [T], shared by the batch
  inside = (slots[None, :] >= starts[:, None]) & (slots[None, :] < ends[:, None])  # [T, S]
  turn = jnp.where(jnp.any(inside, 0), jnp.argmax(inside, 0), -1)
  return jnp.where(trajectory.loss_mask, turn[None, :], -1)


def advantages(trajectory, rewards_B: Array, config: AdvantageConfig) -> Array:
  """[B] per episode (grpo, rloo) or [B, S] per token (or_gigpo) advantages from the
  config's estimator; B = prompts x group_size, groups adjacent."""
  batch = rewards_B.shape[0]
  if batch % config.group_size:
    raise ValueError(f"advantages: batch {batch} is not a multiple of group_size "
                     f"{config.group_size}")
  rewards_PxG = rewards_B.reshape(batch // config.group_size, config.group_size)
  return ESTIMATORS[config.estimator](trajectory, rewards_PxG, config)


@register_advantage_estimator("grpo")
def grpo_estimator(trajectory, rewards_PxG: Array, config: AdvantageConfig) -> Array:
  del trajectory
  return group_normalize(rewards_PxG, ddof=config.ddof, eps=config.eps).reshape(-1)


@register_advantage_estimator("rloo")
def rloo_estimator(trajectory, rewards_PxG: Array, config: AdvantageConfig) -> Array:
  del trajectory, config
  return rloo_advantages(rewards_PxG).reshape(-1)


@register_advantage_estimator("or_gigpo")
def or_gigpo_estimator(trajectory, rewards_PxG: Array, config: AdvantageConfig) -> Array:
  prompts = rewards_PxG.shape[0]
  rewards_B = rewards_PxG.reshape(-1)
  batch = rewards_B.shape[0]
  valid = trajectory.turn_active                      # [B, T]
  turns = valid.shape[1]
  last = jnp.sum(valid, -1) - 1                       # the outcome lands on the last turn
  step_rewards = jnp.where(jnp.arange(turns)[None] == last[:, None], rewards_B[:, None], 0.0)
  hashes = trajectory.observation_hashes[:, 1:]       # the view each turn produced
  shape = (prompts, config.group_size, turns)
  text = getattr(trajectory, "observation_text", None)
  texts = {}
  if text is not None and text.shape[-1]:  # host tools' text results: matched by similarity
    texts = dict(text_ids_PxGxTxN=text.reshape(shape + text.shape[-1:]),
                 text_lens_PxGxT=trajectory.observation_text_length.reshape(shape))
  step = or_gigpo_advantages(rewards_PxG, step_rewards.reshape(shape), valid.reshape(shape),
                             hashes.reshape(shape), gamma=config.gamma, omega=config.omega,
                             delta=config.delta, ddof=config.ddof, eps=config.eps, **texts)
  return token_advantages(step.reshape(batch, turns), token_turns(trajectory))


def update(model, optimizer, batch: TrainBatch, config: StepConfig, mesh, reference=None,
           mini_batches: int = 1, epochs: int = 1, timings: dict | None = None,
           old_logprobs: Array | None = None) -> dict:
  """Old (and reference) log-probabilities, then `epochs` x `mini_batches` optimizer steps.
  Returns the last step's metrics, with `finite` False if any step was refused. With
  `timings`, the seconds of the log-probabilities and of the updates are recorded, and the
  token slots the updates ran on ("update_token_slots": epochs x rows x sequence length).
  `old_logprobs` [B, S]: the rollout's (an on-policy update, `Phase.old_logprobs`
  "rollout"); None: recomputed under the current parameters."""
  if batch.batch_size % mini_batches:
    raise ValueError(f"update: batch {batch.batch_size} does not split into {mini_batches} "
                     "mini-batches")
  started = time.perf_counter()
  with jax.set_mesh(mesh):
    old = (batch_logprobs(model, batch, config.temperature) if old_logprobs is None
           else old_logprobs)
    if reference is not None:
      batch = batch.replace(ref_logprobs=reference.logprobs(model, batch, config.temperature))
  batch = batch.replace(old_logprobs=old)
  if timings is not None:
    jax.block_until_ready(batch)
    timings["logprobs"] = time.perf_counter() - started
    started = time.perf_counter()
  size = batch.batch_size // mini_batches
  metrics = {}
  # Split once for all the optimizer steps: each takes the held state (no graph walk per
  # call), written back to the modules before anything else reads them.
  graphdef, state = nnx.split((model, optimizer))
  try:
    for _ in range(epochs):
      for part in range(mini_batches):
        piece = jax.tree.map(lambda x: x[part * size:(part + 1) * size], batch)
        with jax.set_mesh(mesh):
          state, metrics = split_train_step(graphdef, state, shard_batch(piece, mesh), config)
        if not bool(metrics["finite"]):
          return {**metrics, "finite": jnp.asarray(False)}
  finally:
    nnx.update((model, optimizer), state)
  if timings is not None:
    timings["update"] = time.perf_counter() - started
    timings["update_token_slots"] = epochs * batch.batch_size * batch.tokens.shape[1]
  return metrics
