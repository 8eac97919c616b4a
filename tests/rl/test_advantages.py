"""Advantages against numpy implementations written from the formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspatial.rl import (discounted_returns, group_normalize, image_hash, lcs_length,
                           or_gigpo_advantages, rloo_advantages, text_similarity,
                           token_advantages)


def numpy_group_normalize(r, ddof, eps, mean_only=False):
  out = np.zeros_like(r)
  for p in range(len(r)):
    centred = r[p] - r[p].mean()
    out[p] = centred if mean_only else centred / (r[p].std(ddof=ddof) + eps)
  return out


@pytest.mark.parametrize("ddof,eps", [(0, 1e-8), (1, 1e-6), (1, 1e-4)])
def test_group_normalize(ddof, eps):
  rng = np.random.default_rng(ddof)
  r = rng.normal(size=(6, 8)).astype(np.float32)
  r[2] = 0.7  # a degenerate group: all equal
  np.testing.assert_allclose(group_normalize(r, ddof, eps), numpy_group_normalize(r, ddof, eps),
                             rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(group_normalize(r, ddof, eps))[2] == 0)
  np.testing.assert_allclose(group_normalize(r, mean_only=True),
                             numpy_group_normalize(r, 1, 0, True), atol=1e-6)
  one = r[:, :1]
  assert np.all(np.asarray(group_normalize(one)) == 0)
  np.testing.assert_array_equal(group_normalize(one, singleton="passthrough"), one)


def test_rloo():
  r = np.random.default_rng(1).normal(size=(4, 5)).astype(np.float32)
  expected = np.stack([[r[p, i] - np.delete(r[p], i).mean() for i in range(5)]
                       for p in range(4)])
  np.testing.assert_allclose(rloo_advantages(r), expected, atol=1e-6)
  with pytest.raises(ValueError, match="at least 2 rollouts"):
    rloo_advantages(r[:, :1])


def test_discounted_returns():
  rng = np.random.default_rng(2)
  r = rng.normal(size=(2, 3, 6)).astype(np.float32)
  valid = np.arange(6)[None, None] < rng.integers(1, 7, (2, 3))[..., None]
  expected = np.zeros_like(r)
  for p in range(2):
    for g in range(3):
      n = valid[p, g].sum()
      for t in range(n):
        expected[p, g, t] = sum(0.9 ** (k - t) * r[p, g, k] for k in range(t, n))
  np.testing.assert_allclose(discounted_returns(r, valid, 0.9), expected, rtol=1e-5, atol=1e-6)


def python_lcs(a, b):
  table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
  for i in range(len(a)):
    for j in range(len(b)):
      table[i + 1][j + 1] = table[i][j] + 1 if a[i] == b[j] else max(table[i][j + 1],
                                                                      table[i + 1][j])
  return table[-1][-1]


def test_lcs_against_python():
  rng = np.random.default_rng(3)
  lcs = jax.jit(lcs_length)
  for size, alphabet in [(20, 5), (70, 3), (70, 40), (33, 2)]:  # one word and several
    for _ in range(15):
      a, b = rng.integers(0, alphabet, size), rng.integers(0, alphabet, size + 7)
      la, lb = int(rng.integers(0, size + 1)), int(rng.integers(0, size + 8))
      assert int(lcs(a, la, b, lb)) == python_lcs(list(a[:la]), list(b[:lb]))


def near_copy(a, changes, rng):
  """a with `changes` tokens replaced by fresh ids, so LCS(a, b) = len(a) - changes."""
  b = a.copy()
  where = rng.choice(len(a), changes, replace=False)
  b[where] = 10_000 + np.arange(changes)
  return b


def test_text_similarity_thresholds():
  rng = np.random.default_rng(4)
  a = rng.permutation(1000)[:100]
  assert float(text_similarity(a, 100, near_copy(a, 11, rng), 100)) == pytest.approx(0.89)
  assert float(text_similarity(a, 100, near_copy(a, 9, rng), 100)) == pytest.approx(0.91)
  assert float(text_similarity(a, 0, a, 0)) == 1.0


def numpy_or_gigpo(episode, step_r, valid, hashes, texts, lens, gamma, omega, delta, ddof, eps):
  P, G, T = step_r.shape
  a_e = numpy_group_normalize(episode, ddof, eps)
  out = np.zeros_like(step_r)
  for p in range(P):
    returns = {}
    for g in range(G):
      n = valid[p, g].sum()
      for t in range(n):
        returns[g, t] = sum(gamma ** (k - t) * step_r[p, g, k] for k in range(t, n))
    for (g, t), value in returns.items():
      def matches(h, s):
        ok = True
        if hashes is not None:
          ok &= hashes[p, g, t] == hashes[p, h, s]
        if texts is not None:
          x, y = list(texts[p, g, t, :lens[p, g, t]]), list(texts[p, h, s, :lens[p, h, s]])
          total = len(x) + len(y)
          ok &= (2 * python_lcs(x, y) / total if total else 1.0) >= delta
        return ok
      group = [returns[h, s] for (h, s) in returns if matches(h, s)]
      # A group of one, or of equal returns, carries no step signal (the rule group
      # normalisation follows: equal rewards give exactly 0).
      same = len(group) < 2 or max(group) == min(group)
      a_s = 0.0 if same else (value - np.mean(group)) / (np.std(group, ddof=ddof) + eps)
      out[p, g, t] = a_e[p, g] + omega * a_s
  return out


@pytest.mark.parametrize("kind", ["image", "text", "both"])
def test_or_gigpo_against_numpy(kind):
  rng = np.random.default_rng(5)
  P, G, T, N = 2, 4, 5, 12
  episode = rng.integers(0, 2, (P, G)).astype(np.float32)
  step_r = np.zeros((P, G, T), np.float32)
  valid = np.arange(T)[None, None] < rng.integers(1, T + 1, (P, G))[..., None]
  for p in range(P):
    for g in range(G):
      step_r[p, g, valid[p, g].sum() - 1] = episode[p, g]  # outcome reward on the last step
  hashes = rng.integers(0, 3, (P, G, T)).astype(np.uint32)  # few values: many groups
  base = rng.integers(0, 50, (3, N))
  texts = np.stack([[[near_copy(base[rng.integers(3)], int(rng.integers(0, 2)), rng)
                      for _ in range(T)] for _ in range(G)] for _ in range(P)])
  lens = np.full((P, G, T), N)
  h = hashes if kind in ("image", "both") else None
  x = (texts, lens) if kind in ("text", "both") else (None, None)
  ours = or_gigpo_advantages(episode, step_r, valid, h, *x, gamma=0.99, omega=1.0, delta=0.9)
  expected = numpy_or_gigpo(episode, step_r, valid, h, *x, 0.99, 1.0, 0.9, 1, 1e-6)
  np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-5)
  assert np.abs(np.asarray(ours) - np.where(valid, numpy_group_normalize(episode, 1, 1e-6)[
      ..., None], 0)).max() > 0.1, "some step groups contribute"


def test_or_gigpo_hand_built_groups():
  # One prompt, two rollouts of two steps. Step 0 of both saw the same image; step 1 saw
  # different images. Rollout 0 succeeded.
  episode = np.array([[1.0, 0.0]], np.float32)
  step_r = np.array([[[0.0, 1.0], [0.0, 0.0]]], np.float32)
  valid = np.ones((1, 2, 2), bool)
  images = jnp.zeros((2, 2, 4, 4, 3), jnp.uint8).at[:, 1].set(
      jnp.arange(1, 3, dtype=jnp.uint8)[:, None, None, None])
  hashes = jax.vmap(jax.vmap(image_hash))(images)[None]
  assert hashes[0, 0, 0] == hashes[0, 1, 0] and hashes[0, 0, 1] != hashes[0, 1, 1]
  adv = np.asarray(or_gigpo_advantages(episode, step_r, valid, hashes, eps=0.0))
  a_e = 1 / np.std([1.0, 0.0], ddof=1) * 0.5
  returns = [0.99, 0.0]  # step 0 returns
  a_s = (returns[0] - np.mean(returns)) / np.std(returns, ddof=1)
  np.testing.assert_allclose(adv[0, 0], [a_e + a_s, a_e], rtol=1e-5)  # step 1 is a singleton
  np.testing.assert_allclose(adv[0, 1], [-a_e - a_s, -a_e], rtol=1e-5)
  # Texts at 0.89 stay apart at delta 0.9, texts at 0.91 join; delta 1 is plain GiGPO.
  rng = np.random.default_rng(6)
  a = rng.permutation(1000)[:100]
  for changes, joined in [(11, False), (9, True)]:
    texts = np.stack([a, near_copy(a, changes, rng)])[:, None][None]  # [1, 2, 1, 100]
    lens = np.full((1, 2, 1), 100)
    adv = or_gigpo_advantages(episode, episode[..., None], np.ones((1, 2, 1), bool), None,
                              texts, lens, delta=0.9, eps=0.0)
    step_part = np.asarray(adv)[0, :, 0] - np.asarray(group_normalize(episode, eps=0.0))[0]
    assert (np.abs(step_part).max() > 0.1) == joined
    strict = or_gigpo_advantages(episode, episode[..., None], np.ones((1, 2, 1), bool), None,
                                 texts, lens, delta=1.0, eps=0.0)
    np.testing.assert_allclose(strict, np.asarray(group_normalize(episode, eps=0.0))[..., None])


def test_token_advantages():
  adv = np.array([[0.5, -1.0, 2.0]], np.float32)
  steps = np.array([[-1, -1, 0, 0, -1, 1, 1, 2, -1]])
  np.testing.assert_array_equal(token_advantages(adv, steps),
                                [[0, 0, 0.5, 0.5, 0, -1, -1, 2, 0]])


@pytest.mark.parametrize("size", [3, 5, 6, 7])
def test_or_gigpo_equal_returns_give_exactly_zero_step_advantage(size):
  """A step group whose returns are all equal gets A_S = 0 exactly, whatever the returns.
  The mean of 3, 5, 6 or 7 equal float32 values does not always round back to the value,
  and (value - mean) / (std + eps) then turns the rounding into a +-1-size signal."""
  rng = np.random.default_rng(size)
  values = rng.uniform(-2.0, 2.0, 256).astype(np.float32)
  episode = np.zeros((256, size), np.float32)  # equal episode rewards: A_E = 0 too
  step_r = np.broadcast_to(values[:, None, None], (256, size, 1)).copy()
  valid = np.ones((256, size, 1), bool)
  hashes = np.zeros((256, size, 1), np.uint32)  # one step group per prompt
  adv = np.asarray(jax.jit(or_gigpo_advantages)(episode, step_r, valid, hashes))
  assert np.count_nonzero(adv) == 0, adv[np.nonzero(adv)][:5]


@pytest.mark.parametrize("texts", [False, True])
def test_or_gigpo_statistics_never_go_through_a_matmul(texts):
  """Group sums and counts must be exact: on TPU (bf16 passes) and H100/H200 (TF32) a
  float32 matmul at default precision rounds its inputs, and XLA on CPU ignores
  `jax.default_matmul_precision`, so the compiled program itself must hold no dot."""
  P, G, T, N = 2, 4, 3, 6
  args = [np.zeros((P, G), np.float32), np.ones((P, G, T), np.float32),
          np.ones((P, G, T), bool), np.zeros((P, G, T), np.uint32)]
  if texts:
    args += [np.zeros((P, G, T, N), np.int32), np.full((P, G, T), N, np.int32)]
  program = jax.jit(or_gigpo_advantages).lower(*args).as_text()
  assert "dot_general" not in program and "stablehlo.dot" not in program
