"""Rewards: device rules agree with the string rules; the papers' worked examples hold."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspatial.rl.rewards import (Act3DRewardConfig, act3d_flags_text, act3d_reward,
                                   act3d_reward_text, device_text, latent_similarity,
                                   maptrace_reward, normalized_dtw, parse_letter_text,
                                   peria_reward_text, text, think3d_reward, think3d_reward_text,
                                   thinker3d_format_text, thinker3d_reward)

L = 96
FRAGMENTS = ["<answer>", "</answer>", "<answer>", "</answer>", "(B)", " C.", "A", "E:", "F",
             " ", "  ", "\n", "\t", "(", ")", "D sofa", "B.", "answer", "<think>x</think>",
             "C", "the", "a", "(E", "AB", "c", ".", ":", "<answer", "/answer>", "é"]


def random_completion(rng) -> str:
  return "".join(FRAGMENTS[i] for i in rng.integers(len(FRAGMENTS), size=rng.integers(0, 14)))


def to_bytes(texts):
  out = np.full((len(texts), L), -1, np.int32)
  for i, t in enumerate(texts):
    data = list(t.encode("utf-8"))[:L]
    out[i, :len(data)] = data
  return out


def test_think3d_device_and_string_rewards_agree_on_thousands_of_answers():
  rng = np.random.default_rng(0)
  texts = [random_completion(rng) for _ in range(3000)]
  texts += ["<answer>B</answer>", "<answer> (C) the sofa</answer>", "<answer>E.</answer>",
            "<answer>F</answer>", "<answer>AB</answer>", "<answer>\n\tD:</answer>",
            "<answer></answer>", "<answer>(A</answer>", "no tags", "<answer>A", "A</answer>",
            "<answer>x</answer><answer>B</answer>", "<answer>a</answer>", "<answer>(B)"]
  texts = [t for t in texts if len(t.encode("utf-8")) <= L]
  truth = rng.integers(0, 5, len(texts))
  device = jax.jit(jax.vmap(think3d_reward))(to_bytes(texts), truth)
  host = [think3d_reward_text(t, "ABCDE"[k]) for t, k in zip(texts, truth)]
  np.testing.assert_array_equal(np.asarray(device), host)
  letters = jax.vmap(lambda ids: device_text.answer_letter(ids)[1])(to_bytes(texts))
  np.testing.assert_array_equal(np.asarray(letters), [parse_letter_text(t) for t in texts])
  assert len({float(x) for x in host}) == 3, "right, wrong and untagged answers all occur"


def test_act3d_worked_examples():
  config = Act3DRewardConfig()
  reward = lambda **k: float(act3d_reward(jnp.asarray(k["judge"]), jnp.asarray(k["em"]),
                                          jnp.asarray(k["malformed"]), jnp.asarray(k["n"]),
                                          jnp.asarray(k["grounded"]), config))
  # Correct and grounded: the interaction credit hits its cap 0.05 * 12 = 0.60.
  assert reward(judge=True, em=True, malformed=False, n=3, grounded=True) == pytest.approx(1.1)
  assert reward(judge=True, em=False, malformed=False, n=5, grounded=False) == pytest.approx(
      0.3 + 0.25)
  assert reward(judge=True, em=False, malformed=False, n=30, grounded=False) == pytest.approx(
      0.3 + 0.60)
  assert reward(judge=False, em=False, malformed=False, n=12, grounded=True) == 0.0
  assert reward(judge=False, em=False, malformed=True, n=0, grounded=False) == pytest.approx(-0.2)


def test_act3d_device_and_string_agree():
  rng = np.random.default_rng(1)
  answers = ["the blue box", "Blue box.", "a red chair", "sofa", "", "left of the table",
             "blue", "The Blue Box"]
  references = ["blue box", "the blue crate"]
  for _ in range(500):
    final = rng.choice([f"<think>..</think><answer>{rng.choice(answers)}</answer>",
                        "<think>..</think>", f"<answer>{rng.choice(answers)}"])
    n, grounded = int(rng.integers(0, 15)), bool(rng.integers(2))
    judge, em, malformed = act3d_flags_text(final, references)
    device = act3d_reward(jnp.asarray(judge), jnp.asarray(em), jnp.asarray(malformed),
                          jnp.asarray(n), jnp.asarray(grounded))
    assert float(device) == pytest.approx(act3d_reward_text(final, references, n, grounded))
  assert text.exact_match("The Blue Box!", references)
  assert text.rule_judge("a big blue box", references) and not text.rule_judge("red", references)


def with_cosine(target, cosine, rng):
  """Vectors whose cosine with each target row (over channels) is exactly `cosine`."""
  unit = target / np.linalg.norm(target, axis=-1, keepdims=True)
  noise = rng.normal(size=target.shape)
  noise -= np.sum(noise * unit, -1, keepdims=True) * unit
  noise /= np.linalg.norm(noise, axis=-1, keepdims=True)
  return (cosine * unit + np.sqrt(1 - cosine ** 2) * noise) * rng.uniform(0.5, 2.0)


@pytest.mark.parametrize("cosine,reward", [(0.71, 0.855), (-0.04, 0.480)])
def test_thinker3d_latent_similarity_worked_examples(cosine, reward):
  rng = np.random.default_rng(2)
  target = rng.normal(size=(2, 20, 32))
  predicted = with_cosine(target, cosine, rng)
  assert float(latent_similarity(predicted, target)) == pytest.approx(reward, abs=1e-5)


def test_thinker3d_token_axis_quirk_matches_reference_code():
  rng = np.random.default_rng(3)
  predicted, target = rng.normal(size=(2, 20, 32)), rng.normal(size=(2, 20, 32))
  # The reference: L2-normalise over channels, then torch's cosine_similarity on dim=1.
  p = predicted / np.linalg.norm(predicted, axis=-1, keepdims=True)
  t = target / np.linalg.norm(target, axis=-1, keepdims=True)
  cos = np.sum(p * t, 1) / (np.linalg.norm(p, axis=1) * np.linalg.norm(t, axis=1))
  assert float(latent_similarity(predicted, target, token_axis_quirk=True)) == pytest.approx(
      (cos.mean() + 1) / 2, abs=1e-5)
  assert float(latent_similarity(predicted, target)) != pytest.approx(
      float(latent_similarity(predicted, target, token_axis_quirk=True)), abs=1e-4)


def test_thinker3d_full_reward_and_format():
  good = "<|latent_start|><|latent_pad|><|latent_end|>\n<think>hmm</think> <answer>B</answer>"
  assert thinker3d_format_text(good)
  assert not thinker3d_format_text("<think>hmm</think><answer>B</answer>")
  rng = np.random.default_rng(4)
  target = rng.normal(size=(1, 10, 8))
  predicted = with_cosine(target, 0.71, rng)
  reward = thinker3d_reward(jnp.asarray(True), to_bytes([good])[0], jnp.asarray(1), predicted,
                            target)
  assert float(reward) == pytest.approx(1 + 1 + 0.855, abs=1e-5)


def test_peria_format_repetition_and_maptrace():
  assert text.peria_format("no tags at all") == -1
  assert text.peria_format("<think>a</think><action>{}</action>") == 0
  assert text.peria_format("<think>a</think><answer>x</answer>") == 1
  assert text.peria_format("<think>a</think><action>1</action><action>2</action>"
                           "<answer>x</answer>") == -1
  assert text.peria_format("<action>1</action><think>a</think><answer>x</answer>") == -1
  assert text.peria_repetition("a" * 60, 2) == -3.0
  assert text.peria_repetition("go " * 21, 2) == -3.0
  assert text.peria_repetition("we turn left now " * 10, 2) == -2.0
  assert text.peria_repetition("Stop. " * 10, 4) == pytest.approx(-1.5 * 2 / 4)
  assert text.peria_repetition("Stop. " * 7, 2) == pytest.approx(-1.0)
  assert text.peria_repetition("a fine normal sentence.", 2) == 0.0
  assert peria_reward_text("<think>a</think><answer>x</answer>", 1, 1.0) == 2.0
  d = jnp.asarray([0.2, 0.3, 0.5, 0.55, 0.8, 1.0, 1.2])
  np.testing.assert_allclose(maptrace_reward(d, "paper"), [1, 1, 0.6, 0.5, 0, 0, 0], atol=1e-6)
  np.testing.assert_allclose(maptrace_reward(d, "code"), [1, 1, 1, 0.95, 0.7, 0.5, 0], atol=1e-6)


def numpy_dtw(a, b):
  table = np.full((len(a) + 1, len(b) + 1), np.inf)
  table[0, 0] = 0
  for i in range(1, len(a) + 1):
    for j in range(1, len(b) + 1):
      table[i, j] = np.linalg.norm(a[i - 1] - b[j - 1]) + min(table[i - 1, j], table[i, j - 1],
                                                               table[i - 1, j - 1])
  return table[-1, -1] / len(b)


def test_normalized_dtw_against_numpy():
  rng = np.random.default_rng(5)
  for _ in range(10):
    n, m = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    a, b = np.zeros((10, 2), np.float32), np.zeros((10, 2), np.float32)
    a[:n], b[:m] = rng.uniform(size=(n, 2)), rng.uniform(size=(m, 2))
    assert float(normalized_dtw(a, b, n, m)) == pytest.approx(numpy_dtw(a[:n], b[:m]), rel=1e-5)


PERIA_FRAGMENTS = ["<think>", "</think>", "<action>", "</action>", "<answer>", "</answer>",
                   "x", " ", "{}", "</thi", "nk>", "<act", "ion>"]


def test_peria_format_device_agrees_with_string_rule():
  rng = np.random.default_rng(6)
  texts = ["".join(PERIA_FRAGMENTS[i] for i in rng.integers(len(PERIA_FRAGMENTS),
                                                             size=rng.integers(0, 16)))
           for _ in range(3000)]
  texts += ["<think>a</think><action>1</action><think>b</think><action>2</action><answer>x",
            "<think>a</think><action>1</action><action>2</action><answer>x</answer>",
            "</think><action>", "<action></think><answer>"]
  texts = [t for t in texts if len(t.encode()) <= L]
  device = jax.jit(jax.vmap(device_text.peria_format))(to_bytes(texts))
  np.testing.assert_array_equal(np.asarray(device), [text.peria_format(t) for t in texts])
  assert set(np.asarray(device).tolist()) == {-1, 0, 1}
