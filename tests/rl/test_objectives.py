"""The policy objective against a numpy implementation of the formulas, and its gradient
against finite differences."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspatial.rl import PolicyLossConfig, kl_divergence, policy_loss


def numpy_loss(logp, old, adv, mask, cfg: PolicyLossConfig, ref=None, sampler=None):
  logp, old, adv, mask = (np.asarray(x, np.float64) for x in (logp, old, adv, mask))
  ratio = np.exp(np.clip(logp - old, -cfg.log_ratio_clamp, cfg.log_ratio_clamp))
  loss = np.maximum(-ratio * adv, -np.clip(ratio, 1 - cfg.epsilon_low, 1 + cfg.epsilon_high) * adv)
  if cfg.dual_clip is not None:
    loss = np.where(adv < 0, np.minimum(loss, -cfg.dual_clip * adv), loss)
  if cfg.tis_cap is not None:
    loss = loss * np.minimum(np.exp(old - np.asarray(sampler, np.float64)), cfg.tis_cap)
  if cfg.beta > 0:
    d = np.asarray(ref, np.float64) - logp
    kl = {"k1": -d, "k2": 0.5 * d ** 2, "k3": np.exp(d) - d - 1}[cfg.kl_estimator]
    if cfg.kl_clamp is not None:
      kl = np.clip(kl, -cfg.kl_clamp, cfg.kl_clamp)
    loss = loss + cfg.beta * kl
  if cfg.aggregation == "token-mean":
    return (loss * mask).sum() / mask.sum()
  if cfg.aggregation == "sequence-mean-token-mean":
    rows = [(loss[i] * mask[i]).sum() / mask[i].sum() for i in range(len(mask)) if mask[i].sum()]
    return np.mean(rows)
  constant = cfg.norm_constant or loss.shape[-1]
  return (loss * mask).sum() / constant / len(mask)


def random_batch(seed, B=6, L=12):
  rng = np.random.default_rng(seed)
  logp = rng.normal(-1.5, 0.3, (B, L)).astype(np.float32)
  old = (logp + rng.normal(0, 0.3, (B, L))).astype(np.float32)
  adv = np.repeat(rng.normal(size=(B, 1)), L, 1).astype(np.float32)
  adv[0] = 0.0
  lengths = rng.integers(0, L + 1, B)
  lengths[1] = 0  # a sequence with no generated tokens
  mask = np.arange(L)[None] < lengths[:, None]
  mask[2, :3] = False  # a prompt prefix
  ref = (logp + rng.normal(0, 0.2, (B, L))).astype(np.float32)
  sampler = (old + rng.normal(0, 0.5, (B, L))).astype(np.float32)
  return logp, old, adv, mask, ref, sampler


CONFIGS = [
    PolicyLossConfig(),
    PolicyLossConfig(epsilon_high=0.28, aggregation="sequence-mean-token-mean"),
    PolicyLossConfig(dual_clip=3.0, aggregation="sequence-mean-token-sum-norm"),
    PolicyLossConfig(beta=0.04, kl_estimator="k3"),
    PolicyLossConfig(beta=0.1, kl_estimator="k1", aggregation="sequence-mean-token-mean"),
    PolicyLossConfig(beta=0.1, kl_estimator="k2", kl_clamp=0.05, tis_cap=2.0),
    PolicyLossConfig(aggregation="sequence-mean-token-sum-norm", norm_constant=100.0),
]


@pytest.mark.parametrize("cfg", CONFIGS)
def test_loss_matches_numpy(cfg):
  for seed in range(5):
    logp, old, adv, mask, ref, sampler = random_batch(seed)
    total, denominator, _ = policy_loss(logp, old, adv, mask, cfg, ref, sampler)
    np.testing.assert_allclose(total / denominator, numpy_loss(logp, old, adv, mask, cfg, ref,
                                                               sampler), rtol=1e-5)


@pytest.mark.parametrize("cfg", CONFIGS)
def test_gradient_matches_finite_differences(cfg):
  logp, old, adv, mask, ref, sampler = random_batch(9, B=3, L=5)
  grad = jax.grad(lambda lp: (lambda s, d, _: s / d)(*policy_loss(lp, old, adv, mask, cfg, ref,
                                                                   sampler)))(logp)
  h = 1e-4
  base = np.asarray(logp, np.float64)
  numeric = np.zeros_like(base)
  for index in np.ndindex(base.shape):
    up, down = base.copy(), base.copy()
    up[index] += h
    down[index] -= h
    numeric[index] = (numpy_loss(up, old, adv, mask, cfg, ref, sampler)
                      - numpy_loss(down, old, adv, mask, cfg, ref, sampler)) / (2 * h)
  np.testing.assert_allclose(grad, numeric, atol=2e-4, rtol=1e-3)


def test_surrogate_by_advantage_sign():
  """Positive advantages stop gaining above 1 + eps_high, negative ones below 1 - eps_low."""
  cfg = PolicyLossConfig(epsilon_low=0.2, epsilon_high=0.28, dual_clip=3.0)
  mask = np.ones((1, 1), bool)
  loss = lambda ratio, a: float(policy_loss(np.log([[ratio]]), np.zeros((1, 1)),
                                            np.array([[a]]), mask, cfg)[0])
  assert loss(1.5, 1.0) == pytest.approx(-1.28)       # clipped at 1 + eps_high
  assert loss(0.5, 1.0) == pytest.approx(-0.5)        # below 1: unclipped, min picks ratio
  assert loss(0.5, -1.0) == pytest.approx(0.8)        # clipped at 1 - eps_low
  assert loss(1.5, -1.0) == pytest.approx(1.5)        # above 1 with A < 0: unclipped
  assert loss(10.0, -1.0) == pytest.approx(3.0)       # dual clip bounds it at c |A|
  _, _, metrics = policy_loss(np.log([[1.5, 0.5, 1.0]]), np.zeros((1, 3)),
                              np.array([[1.0, -1.0, 1.0]]),
                              np.ones((1, 3), bool), cfg)
  assert float(metrics["clip_fraction"]) == pytest.approx(2 / 3)
  assert float(metrics["clip_fraction_high"]) == pytest.approx(1 / 3)
  assert float(metrics["clip_fraction_low"]) == pytest.approx(1 / 3)


def test_micro_batches_accumulate_exactly():
  logp, old, adv, mask, ref, sampler = random_batch(3, B=8)
  for cfg in CONFIGS:
    total, denominator, _ = policy_loss(logp, old, adv, mask, cfg, ref, sampler)
    parts = [policy_loss(logp[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2], cfg,
                         ref[i:i + 2], sampler[i:i + 2]) for i in range(0, 8, 2)]
    np.testing.assert_allclose(sum(p[0] for p in parts) / sum(p[1] for p in parts),
                               total / denominator, rtol=1e-5)


def test_kl_estimators_and_errors():
  logp, ref = jnp.log(jnp.array([0.5])), jnp.log(jnp.array([0.25]))
  d = np.log(0.5)
  np.testing.assert_allclose(kl_divergence(logp, ref, "k1"), [-d], rtol=1e-6)
  np.testing.assert_allclose(kl_divergence(logp, ref, "k2"), [0.5 * d * d], rtol=1e-6)
  np.testing.assert_allclose(kl_divergence(logp, ref, "k3"), [np.exp(d) - d - 1], rtol=1e-6)
  with pytest.raises(ValueError, match="beta > 0 needs ref_logp_BxL"):
    policy_loss(logp[None], logp[None], jnp.ones((1, 1)), jnp.ones((1, 1)),
                PolicyLossConfig(beta=0.1))
  with pytest.raises(ValueError, match="aggregation: unknown 'mean'"):
    PolicyLossConfig(aggregation="mean")


def test_entropy_metric():
  from jaxspatial.rl import token_entropy
  logits = jnp.zeros((1, 2, 4))  # uniform over 4 tokens: entropy log 4
  entropy = token_entropy(logits)
  np.testing.assert_allclose(entropy, np.full((1, 2), np.log(4)), rtol=1e-6)
  _, _, metrics = policy_loss(jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.ones((1, 2)),
                              jnp.ones((1, 2), bool), entropy_BxL=entropy)
  assert float(metrics["entropy"]) == pytest.approx(np.log(4), rel=1e-6)
