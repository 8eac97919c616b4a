"""The clipped policy-gradient objective with KL, importance correction and aggregation.

Per token, with rho = exp(clamp(logp - logp_old, +-log_ratio_clamp)) and advantage A:

  loss = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)           (PPO / GRPO / DAPO)
  A < 0 and dual_clip c:  loss = min(loss, -c A)                       (dual clip)
  tis_cap:  loss *= stop_gradient(min(exp(clamp(logp_old - logp_sampler)), tis_cap))
  beta > 0: loss += beta * KL(logp, logp_ref), estimator k1, k2 or k3 (optionally clamped)

Aggregation returns (sum, denominator) so micro-batches accumulate exactly:
  token-mean                    sum_i,t m l  /  sum_i,t m
  sequence-mean-token-mean      sum_i (sum_t m l / sum_t m)  /  #sequences with a token
  sequence-mean-token-sum-norm  sum_i,t m l / C  /  #sequences   (Dr.GRPO; C = L by default)
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp

Array = jax.Array
Aggregation = Literal["token-mean", "sequence-mean-token-mean", "sequence-mean-token-sum-norm"]
KLEstimator = Literal["k1", "k2", "k3"]


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
  epsilon_low: float = 0.2
  epsilon_high: float = 0.2          # DAPO: 0.28
  dual_clip: float | None = None     # c for negative advantages (verl: 3.0)
  log_ratio_clamp: float = 20.0      # before exp, as Tunix and verl
  tis_cap: float | None = None       # truncated importance sampling (Tunix 2.0)
  beta: float = 0.0                  # KL coefficient; 0 skips the reference entirely
  kl_estimator: KLEstimator = "k3"
  kl_clamp: float | None = None      # clamp of the per-token KL value
  aggregation: Aggregation = "token-mean"
  norm_constant: float | None = None  # Dr.GRPO's C; None = the padded length L

  def __post_init__(self):
    if self.aggregation not in ("token-mean", "sequence-mean-token-mean",
                                "sequence-mean-token-sum-norm"):
      raise ValueError(f"PolicyLossConfig.aggregation: unknown {self.aggregation!r}")
    if self.kl_estimator not in ("k1", "k2", "k3"):
      raise ValueError(f"PolicyLossConfig.kl_estimator: unknown {self.kl_estimator!r}")


def kl_divergence(logp: Array, ref_logp: Array, estimator: KLEstimator = "k3",
                  clamp: float | None = None) -> Array:
  """Per-token estimate of KL(pi || pi_ref) from samples of pi; delta = ref_logp - logp."""
  delta = ref_logp - logp
  if estimator == "k1":
    kl = -delta
  elif estimator == "k2":
    kl = 0.5 * delta ** 2
  else:
    # exp(d) - d - 1 as expm1(d) - d: the same value, without the cancellation against 1
    # that makes it slightly negative (-1e-10) when the policy is near its reference.
    kl = jnp.expm1(delta) - delta
  return kl if clamp is None else jnp.clip(kl, -clamp, clamp)


def aggregate(loss_BxL: Array, mask_BxL: Array, mode: Aggregation,
              norm_constant: float | None = None) -> tuple[Array, Array]:
  """(sum, denominator) of a masked per-token quantity; the loss is sum / denominator."""
  mask = mask_BxL.astype(loss_BxL.dtype)
  masked = loss_BxL * mask
  if mode == "token-mean":
    return jnp.sum(masked), jnp.sum(mask)
  tokens = jnp.sum(mask, axis=-1)
  has_tokens = (tokens > 0).astype(loss_BxL.dtype)
  if mode == "sequence-mean-token-mean":
    return jnp.sum(jnp.sum(masked, -1) / jnp.maximum(tokens, 1.0)), jnp.sum(has_tokens)
  constant = loss_BxL.shape[-1] if norm_constant is None else norm_constant
  return jnp.sum(masked) / constant, jnp.asarray(loss_BxL.shape[0], loss_BxL.dtype)


def policy_loss(logp_BxL: Array, old_logp_BxL: Array, advantages_BxL: Array, mask_BxL: Array,
                config: PolicyLossConfig = PolicyLossConfig(), ref_logp_BxL: Array | None = None,
                sampler_logp_BxL: Array | None = None, entropy_BxL: Array | None = None):
  """Returns (loss_sum, denominator, metrics). Gradients flow through logp_BxL only.
  `entropy_BxL` (from `token_entropy`) only feeds the entropy metric."""
  logp_BxL = jnp.asarray(logp_BxL)
  old_logp = jax.lax.stop_gradient(jnp.asarray(old_logp_BxL, logp_BxL.dtype))
  advantages = jax.lax.stop_gradient(jnp.asarray(advantages_BxL, logp_BxL.dtype))
  mask_BxL = jnp.asarray(mask_BxL)
  mask = mask_BxL.astype(logp_BxL.dtype)
  log_ratio = jnp.clip(logp_BxL - old_logp, -config.log_ratio_clamp, config.log_ratio_clamp)
  ratio = jnp.exp(log_ratio)
  clipped_ratio = jnp.clip(ratio, 1.0 - config.epsilon_low, 1.0 + config.epsilon_high)
  unclipped_loss = -ratio * advantages
  clipped_loss = -clipped_ratio * advantages
  loss = jnp.maximum(unclipped_loss, clipped_loss)
  clip_active = clipped_loss > unclipped_loss
  dual_active = jnp.zeros_like(clip_active)
  if config.dual_clip is not None:
    bound = -config.dual_clip * advantages
    dual_active = (advantages < 0) & (loss > bound)
    loss = jnp.where(advantages < 0, jnp.minimum(loss, bound), loss)
  if config.tis_cap is not None:
    if sampler_logp_BxL is None:
      raise ValueError("policy_loss: tis_cap needs sampler_logp_BxL")
    gap = jnp.clip(old_logp - jax.lax.stop_gradient(sampler_logp_BxL),
                   -config.log_ratio_clamp, config.log_ratio_clamp)
    loss = loss * jnp.minimum(jnp.exp(gap), config.tis_cap)
  kl = jnp.zeros_like(loss)
  if config.beta > 0:
    if ref_logp_BxL is None:
      raise ValueError("policy_loss: beta > 0 needs ref_logp_BxL")
    kl = kl_divergence(logp_BxL, jax.lax.stop_gradient(ref_logp_BxL), config.kl_estimator,
                       config.kl_clamp)
    loss = loss + config.beta * kl
  loss_sum, denominator = aggregate(loss, mask, config.aggregation, config.norm_constant)

  tokens = jnp.maximum(jnp.sum(mask), 1.0)
  mean = lambda x: jnp.sum(x * mask) / tokens
  low = clip_active & (advantages < 0)
  metrics = {
      "clip_fraction": mean(clip_active.astype(loss.dtype)),
      "clip_fraction_low": mean(low.astype(loss.dtype)),
      "clip_fraction_high": mean((clip_active & ~low).astype(loss.dtype)),
      "dual_clip_fraction": mean(dual_active.astype(loss.dtype)),
      "kl": mean(kl),
      "ratio_mean": mean(ratio),
      "ratio_max": jnp.max(jnp.where(mask > 0, ratio, -jnp.inf)),
      "ratio_min": jnp.min(jnp.where(mask > 0, ratio, jnp.inf)),
      "tokens": jnp.sum(mask),
  }
  if entropy_BxL is not None:
    metrics["entropy"] = mean(jax.lax.stop_gradient(entropy_BxL))
  return loss_sum, denominator, metrics


def token_entropy(logits_BxLxV: Array) -> Array:
  """Entropy of each position's next-token distribution (a metric; all five systems use
  no entropy bonus)."""
  logp = jax.nn.log_softmax(logits_BxLxV.astype(jnp.float32), axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)
