"""The policy loss and its gradient for a batch of 64 x 4096 tokens: jitted JAX against
numpy computing the same math (forward and analytic gradient), in one run.

    python -m benchmarks.rl_bench

Cost: under a minute on a 2-core CPU. Config: clipped surrogate (eps 0.2 / 0.28), dual
clip 3, k3 KL with beta 0.04, token-mean aggregation. Also times OR-GIGPO advantages for
16 prompts x 8 rollouts x 10 steps with image-hash and 64-token text observations.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.timing import timed
from jaxspatial.rl import PolicyLossConfig, or_gigpo_advantages, policy_loss

CONFIG = PolicyLossConfig(epsilon_low=0.2, epsilon_high=0.28, dual_clip=3.0, beta=0.04,
                          kl_estimator="k3", aggregation="token-mean")


def numpy_loss_and_grad(logp, old, adv, mask, ref, cfg=CONFIG):
  ratio = np.exp(np.clip(logp - old, -cfg.log_ratio_clamp, cfg.log_ratio_clamp))
  clipped = np.clip(ratio, 1 - cfg.epsilon_low, 1 + cfg.epsilon_high)
  unclipped_loss, clipped_loss = -ratio * adv, -clipped * adv
  use_unclipped = unclipped_loss >= clipped_loss
  loss = np.where(use_unclipped, unclipped_loss, clipped_loss)
  d_loss = np.where(use_unclipped, -ratio * adv, 0.0)  # d/dlogp; the clipped branch is flat
  bound = -cfg.dual_clip * adv
  dual = (adv < 0) & (loss > bound)
  loss = np.where(dual, bound, loss)
  d_loss = np.where(dual, 0.0, d_loss)
  delta = ref - logp
  loss = loss + cfg.beta * (np.exp(delta) - delta - 1)
  d_loss = d_loss + cfg.beta * (1 - np.exp(delta))
  denominator = mask.sum()
  return (loss * mask).sum() / denominator, d_loss * mask / denominator


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--length", type=int, default=4096)
  parser.add_argument("--repeats", type=int, default=10)
  args = parser.parse_args(argv)
  rng = np.random.default_rng(0)
  shape = (args.batch, args.length)
  logp = rng.normal(-1.5, 0.3, shape).astype(np.float32)
  old = (logp + rng.normal(0, 0.2, shape)).astype(np.float32)
  ref = (logp + rng.normal(0, 0.2, shape)).astype(np.float32)
  adv = np.repeat(rng.normal(size=(args.batch, 1)), args.length, 1).astype(np.float32)
  mask = np.arange(args.length)[None] < rng.integers(args.length // 4, args.length,
                                                    (args.batch, 1))

  def objective(lp, old, adv, mask, ref):
    total, denominator, _ = policy_loss(lp, old, adv, mask, CONFIG, ref)
    return total / denominator

  step = jax.jit(jax.value_and_grad(objective))
  device = [jnp.asarray(x) for x in (logp, old, adv, mask, ref)]
  jax_value, jax_grad = step(*device)
  np_value, np_grad = numpy_loss_and_grad(logp.astype(np.float64), old, adv, mask, ref)
  assert abs(float(jax_value) - np_value) < 1e-4 * max(1.0, abs(np_value))
  assert np.abs(np.asarray(jax_grad) - np_grad).max() < 1e-6
  jax_s = timed(lambda: step(*device), args.repeats)
  np_s = timed(lambda: numpy_loss_and_grad(logp, old, adv, mask, ref), max(3, args.repeats // 3))

  P, G, T, N = 16, 8, 10, 64
  episode = rng.integers(0, 2, (P, G)).astype(np.float32)
  steps = np.zeros((P, G, T), np.float32)
  steps[..., -1] = episode
  valid = np.ones((P, G, T), bool)
  hashes = rng.integers(0, 4, (P, G, T)).astype(np.uint32)
  texts = rng.integers(0, 30, (P, G, T, N)).astype(np.int32)
  lens = np.full((P, G, T), N)
  gigpo = jax.jit(lambda *a: or_gigpo_advantages(*a, delta=0.9))
  gigpo_s = timed(lambda: gigpo(episode, steps, valid, hashes, texts, lens), 3)

  tokens = args.batch * args.length
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}; loss + gradient, "
        f"{args.batch} x {args.length} tokens\n")
  print(f"{'implementation':<40}{'ms':>10}{'Mtokens/s':>12}{'speed-up':>10}")
  print("-" * 72)
  print(f"{'numpy (forward + analytic gradient)':<40}{np_s * 1e3:>10.1f}"
        f"{tokens / np_s / 1e6:>12.1f}{'':>10}")
  print(f"{'jaxspatial (jit, value_and_grad)':<40}{jax_s * 1e3:>10.1f}"
        f"{tokens / jax_s / 1e6:>12.1f}{np_s / jax_s:>9.1f}x")
  print(f"\nOR-GIGPO advantages, {P} prompts x {G} rollouts x {T} steps, images + "
        f"{N}-token texts (LCS on device): {gigpo_s * 1e3:.1f} ms")


if __name__ == "__main__":
  main()
