"""SFT and GRPO steps: the loss over a trajectory batch, gradient accumulation over
micro-batches, the optimizer update, and a guard that refuses non-finite updates.

Losses are (sum, denominator) pairs so that micro-batches accumulate exactly: the step's
loss is the sum over micro-batches divided by the summed denominators, the same number a
single pass over the whole batch gives.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx, struct

from jaxspatial.rl.objectives import PolicyLossConfig
from jaxspatial.train.logprobs import token_logprobs
from jaxspatial.train.losses import get_loss

Array = jax.Array


@struct.dataclass
class TrainBatch:
  """tokens, attention_mask, loss_mask [B, S]; images [B, K, H, W, 3] uint8 (the K views in
  token order); advantages [B] (GRPO) or [B, S] (per token: OR-GIGPO); old_logprobs, ref_logprobs [B, S] (GRPO; zeros when
  unused); features [B, K, F, H] (3DThinker stage 1's target features, else None)."""
  tokens: Array
  attention_mask: Array
  loss_mask: Array
  images: Array
  advantages: Array
  old_logprobs: Array
  ref_logprobs: Array
  features: Array | None = None

  @classmethod
  def from_trajectory(cls, trajectory, advantages=None, old_logprobs=None,
                      ref_logprobs=None) -> "TrainBatch":
    """The views in token order are all but the last (the view after the final turn is
    never shown)."""
    zeros = jnp.zeros(trajectory.tokens.shape, jnp.float32)
    return cls(tokens=trajectory.tokens, attention_mask=trajectory.attention_mask,
               loss_mask=trajectory.loss_mask, images=trajectory.images[:, :-1],
               advantages=(jnp.zeros(trajectory.tokens.shape[0], jnp.float32)
                           if advantages is None else advantages),
               old_logprobs=zeros if old_logprobs is None else old_logprobs,
               ref_logprobs=zeros if ref_logprobs is None else ref_logprobs)

  @classmethod
  def from_completions(cls, rollout, advantages=None) -> "TrainBatch":
    """From a single-turn rollout holding tokens, attention_mask, loss_mask and the images
    in token order (3DThinker's `Thinker3DRollout`)."""
    zeros = jnp.zeros(rollout.tokens.shape, jnp.float32)
    return cls(tokens=rollout.tokens, attention_mask=rollout.attention_mask,
               loss_mask=rollout.loss_mask, images=rollout.images,
               advantages=(jnp.zeros(rollout.tokens.shape[0], jnp.float32)
                           if advantages is None else advantages),
               old_logprobs=zeros, ref_logprobs=zeros)

  @property
  def batch_size(self) -> int:
    return self.tokens.shape[0]


@dataclasses.dataclass(frozen=True)
class StepConfig:
  objective: str = "sft"                 # a name in the loss registry (train/losses.py)
  loss: PolicyLossConfig = PolicyLossConfig()
  options: Any = None                    # the objective's own settings (hashable), e.g.
                                         # 3DThinker stage 1's Stage1Config
  temperature: float = 1.0               # the rollout's, for GRPO log-probabilities
  micro_batches: int = 1
  inject_nan: bool = False               # fault injection: a NaN loss (tests of the guard)


def loss_parts(model, batch: TrainBatch, config: StepConfig):
  """(loss sum, (denominator, metrics)) of one (micro-)batch, by the registered objective."""
  total, (denominator, metrics) = get_loss(config.objective)(model, batch, config)
  if config.inject_nan:
    total = total + jnp.nan
  return total, (denominator, metrics)


def _slice(batch: TrainBatch, index: int, size: int) -> TrainBatch:
  return jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, index * size, size, 0), batch)


def train_step(model, optimizer, batch: TrainBatch, config: StepConfig):
  """One optimizer step over the batch (micro-batches accumulated). Returns metrics with
  `loss`, `grad_norm` and `finite`; when the loss or a gradient is not finite the update is
  not applied (parameters and optimizer state are unchanged) and `finite` is False. A loop
  of steps splits once and calls `split_train_step` (see `grpo.update`)."""
  graphdef, state = nnx.split((model, optimizer))
  state, metrics = split_train_step(graphdef, state, batch, config)
  nnx.update((model, optimizer), state)
  return metrics


def batch_logprobs(model, batch: TrainBatch, temperature: float = 1.0) -> Array:
  """Log-probabilities under the model's current parameters (old / reference policy)."""
  logprobs, rngs = split_logprobs(*nnx.split(model), batch, temperature)
  if jax.tree.leaves(rngs):  # LoRA dropout drew keys: the module's streams move on
    nnx.update(model, rngs)
  return logprobs


# The jitted programs take the split state, not the modules: `nnx.jit` walks the module
# graph on every call (113 ms for a 3B-shaped graph of 2,474 arrays on a 2-core CPU, against
# 15 ms for `jax.jit` over held state: benchmarks/call_overhead_bench.py). Parameters and optimizer state are donated: the step
# updates them in place instead of holding two copies (the caller writes the returned state
# back before anything reads the modules).
@functools.partial(jax.jit, static_argnames=("graphdef", "config"), donate_argnames=("state",))
def split_train_step(graphdef, state, batch: TrainBatch, config: StepConfig):
  """`train_step` on `nnx.split((model, optimizer))`: (the new state, metrics)."""
  model, optimizer = nnx.merge(graphdef, state)
  if batch.batch_size % config.micro_batches:
    raise ValueError(f"train_step: batch {batch.batch_size} does not split into "
                     f"{config.micro_batches} micro-batches")
  size = batch.batch_size // config.micro_batches
  # Gradients of the parameters the optimizer trains (frozen towers, LoRA-only).
  grad_fn = nnx.value_and_grad(lambda m, b: loss_parts(m, b, config), has_aux=True,
                               argnums=nnx.DiffState(0, optimizer.wrt))
  total, denominator, grads, metrics = 0.0, 0.0, None, {}
  for index in range(config.micro_batches):
    (part, (part_denominator, part_metrics)), part_grads = grad_fn(model, _slice(batch, index,
                                                                                  size))
    total = total + part
    denominator = denominator + part_denominator
    grads = part_grads if grads is None else jax.tree.map(jnp.add, grads, part_grads)
    for name, value in part_metrics.items():
      metrics[name] = metrics.get(name, 0.0) + value / config.micro_batches
  scale = 1.0 / jnp.maximum(denominator, 1e-9)
  grads = jax.tree.map(lambda g: g * scale, grads)
  loss = total * scale
  grad_norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  # Snapshot values (pure dicts of arrays), not Variables, which the update mutates.
  params_before = nnx.to_pure_dict(nnx.state(model, optimizer.wrt))
  optimizer_before = nnx.to_pure_dict(nnx.state(optimizer))
  optimizer.update(model, jax.tree.map(lambda g: jnp.where(finite, g, 0.0), grads))

  def keep_if_not_finite(node, before):
    state = nnx.state(node, optimizer.wrt) if node is model else nnx.state(node)
    kept = jax.tree.map(lambda a, b: jnp.where(finite, a, b), nnx.to_pure_dict(state), before)
    nnx.replace_by_pure_dict(state, kept)
    nnx.update(node, state)

  keep_if_not_finite(model, params_before)
  keep_if_not_finite(optimizer, optimizer_before)
  return nnx.state((model, optimizer)), {**metrics, "loss": loss, "grad_norm": grad_norm,
                                         "finite": finite}


@functools.partial(jax.jit, static_argnames=("graphdef", "temperature"))
def split_logprobs(graphdef, state, batch: TrainBatch, temperature: float = 1.0):
  """`batch_logprobs` on `nnx.split(model)`: (log-probabilities, the model's RNG state after
  them: empty unless dropout drew keys)."""
  model = nnx.merge(graphdef, state)
  logprobs = token_logprobs(model, batch.tokens, batch.attention_mask, batch.images,
                            temperature)
  return logprobs, nnx.state(model, nnx.RngState)


def shard_batch(batch, mesh):
  """Puts every leaf's leading (batch) axis over the mesh's ('data', 'fsdp') axes."""
  from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=import-outside-toplevel
  spec = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
  return jax.tree.map(lambda x: jax.device_put(x, spec), batch)
