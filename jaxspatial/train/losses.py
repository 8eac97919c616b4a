"""The loss registry: an objective's name -> its (loss sum, (denominator, metrics)) function.

`train_step` looks the objective up here, so a recipe adds a loss with one decorated
function instead of a branch in the generic step:

    @register_loss("my_objective")
    def my_loss(model, batch, config):  # config: the StepConfig (config.options: its own)
      ...
      return total, (denominator, metrics)

Losses are (sum, denominator) pairs so micro-batches accumulate exactly.
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp

from jaxspatial.rl.objectives import policy_loss
from jaxspatial.train.logprobs import token_logprobs
from jaxspatial.train.registry import registrar

LOSSES: dict[str, Callable] = {}
register_loss = registrar(LOSSES, "register_loss")


def get_loss(name: str) -> Callable:
  if name not in LOSSES:
    raise ValueError(f"StepConfig.objective: expected one of {sorted(LOSSES)}, got {name!r}")
  return LOSSES[name]


@register_loss("sft")
def sft_loss(model, batch, config):
  """Negative log-likelihood of the loss-masked tokens (the model's turns)."""
  del config
  logp = token_logprobs(model, batch.tokens, batch.attention_mask, batch.images)
  mask = batch.loss_mask.astype(jnp.float32)
  return -jnp.sum(logp * mask), (jnp.sum(mask), {"tokens": jnp.sum(mask)})


@register_loss("grpo")
def grpo_loss(model, batch, config):
  """The clipped policy-gradient loss (`PolicyLossConfig`) on per-episode ([B]) or per-token
  ([B, S], OR-GIGPO) advantages, with the KL term against the batch's reference log-probs."""
  logp, entropy = token_logprobs(model, batch.tokens, batch.attention_mask, batch.images,
                                 config.temperature, with_entropy=True)
  advantages = (batch.advantages if batch.advantages.ndim == 2
                else jnp.broadcast_to(batch.advantages[:, None], logp.shape))
  total, denominator, metrics = policy_loss(
      logp, batch.old_logprobs, advantages, batch.loss_mask, config.loss,
      ref_logp_BxL=batch.ref_logprobs if config.loss.beta > 0 else None, entropy_BxL=entropy)
  return total, (denominator, metrics)
