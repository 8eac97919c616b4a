"""Rewards: device rules agree with the string rules; the papers' worked examples hold;
PERIA's R_rep and 3DThinker's option letter against references written from their public
reward code's behaviour."""

import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspatial.rl.rewards import (Act3DRewardConfig, act3d_flags_text, act3d_reward,
                                   act3d_reward_text, device_text, latent_similarity,
                                   maptrace_reward, normalized_dtw, parse_letter_text,
                                   peria_reward_text, text, think3d_reward, think3d_reward_text,
                                   thinker3d_format_text, thinker3d_reward)
from jaxspatial.rl.rewards.papers import thinker3d_letter_text

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
  reward = jax.jit(thinker3d_reward)(jnp.asarray(True), to_bytes([good])[0], jnp.asarray(1),
                                     predicted, target)
  assert float(reward) == pytest.approx(1 + 1 + 0.855, abs=1e-5)


def test_peria_format_repetition_and_maptrace():
  assert text.peria_format("no tags at all") == -1
  assert text.peria_format("<think>a</think><action>{}</action>") == 0
  assert text.peria_format("<think>a</think><answer>x</answer>") == 1
  # An action is fine once some </think> has ended before it (the public rule).
  assert text.peria_format("<think>a</think><action>1</action><action>2</action>"
                           "<answer>x</answer>") == 1
  assert text.peria_format("<action>1</action><think>a</think><answer>x</answer>") == -1
  assert peria_reward_text("<think>a</think><answer>x</answer>", 1, ["x"]) == 2.0
  assert peria_reward_text("<think>a</think><answer>x</answer>", 1, correct=1.0) == 2.0
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


# PERIA's R_rep, from the public reward manager's behaviour: text shorter than 20
# characters scores 0; n = max(turns, 2); the first tier that holds, in this order:
#   one character other than a newline, 50 times in a row               -3
#   a word (regex \w+) followed by 19 copies of itself, each after whitespace only   -3
#   a phrase of >= 4 words (whitespace inside repeated exactly) followed by 9 copies
#     of its text, each after whitespace (the last copy may end inside a word)       -2
#   a sentence (split at runs of . ! ? newline, stripped, > 10 characters) counted
#     10 times anywhere -1.5 * 2 / n, 7 times -1.0 * 2 / n
#   a word followed by 9 copies of itself                                             -1.5
def reference_repetition(model_text: str, turns: int) -> float:
  if len(model_text) < 20:
    return 0.0
  n = max(turns, 2)
  word_copies = lambda copies: rf"(?<!\w)(\w+)(?:\s+\1(?!\w)){{{copies}}}"
  if re.search(r"([^\n])\1{49}", model_text) or re.search(word_copies(19), model_text):
    return -3.0
  if re.search(r"(?<!\w)(\w+(?:\s+\w+){3,})(?:\s+\1){9}", model_text):
    return -2.0
  sentences = [s.strip() for s in re.split(r"[.!?\n]+", model_text)]
  counts = collections.Counter(s for s in sentences if len(s) > 10)
  most = max(counts.values(), default=0)
  if most >= 10:
    return -1.5 * 2 / n
  if most >= 7:
    return -1.0 * 2 / n
  return -1.5 if re.search(word_copies(9), model_text) else 0.0


ORDINARY_ANSWER = (
    "<think>The question asks where the lamp is relative to the sofa. In the first view the "
    "sofa is near the window and a lamp stands to the left of that sofa, close to the "
    "wall, near a small corner shelf.</think><action>{}</action> <think>After the turn the "
    "lamp is still left of the sofa and the rug lies between the table and the door. So the "
    "lamp is on the left of the sofa, and the answer follows from the map of the room and "
    "the position of the camera.</think><answer>the left</answer>")


def test_peria_repetition_ordinary_prose_scores_zero():
  words = re.findall(r"\w+", ORDINARY_ANSWER.lower())
  assert len(words) == 97 and words.count("the") == 23
  assert text.peria_repetition(ORDINARY_ANSWER, 2) == 0.0 == reference_repetition(
      ORDINARY_ANSWER, 2)


@pytest.mark.parametrize("model_text,turns,expected", [
    ("a" * 50, 2, -3.0), ("x" + "a" * 49 + "y", 2, 0.0), ("\n" * 60 + "some text", 2, 0.0),
    ("go " * 20, 2, -3.0), ("go " * 19 + "gone", 2, -1.5),
    ("no, " * 25, 2, 0.0),                        # punctuation breaks the run
    (" ".join(f"go {c}{c}" for c in "abcdefghijklmnopqrst"), 2, 0.0),  # never in a row
    ("we turn left now " * 10, 2, -2.0), ("we turn left now " * 9, 2, 0.0),
    ("we turn left " * 13, 2, 0.0),                # three-word phrases do not count
    ("we turn left now " * 9 + "we turn left nowhere", 2, -2.0),  # the regex's prefix
    ("we turn  left now we turn left now " * 5, 2, 0.0),  # inner whitespace differs
    ("The robot turns left. " * 10, 4, -1.5 * 2 / 4), ("The robot turns left. " * 7, 1, -1.0),
    ("Stop. " * 10, 4, 0.0),                       # sentences of <= 10 characters
    ("go " * 12 + "then stop", 2, -1.5), ("a a a a a a a a a a", 2, 0.0),  # < 20 chars
    ("a a a a a a a a a a ", 2, -1.5), ("", 3, 0.0),
])
def test_peria_repetition_tiers(model_text, turns, expected):
  assert text.peria_repetition(model_text, turns) == pytest.approx(expected)
  assert reference_repetition(model_text, turns) == pytest.approx(expected)


def test_peria_repetition_agrees_with_the_reference_on_random_texts():
  rng = np.random.default_rng(7)
  pieces = ["go", "stop", "a b", " ", "  ", "\t", "\n", ".", ",", "x y z w", "é", "Go"]
  for _ in range(1500):
    pick = lambda k: "".join(pieces[i] for i in rng.integers(len(pieces), size=k))
    model_text = (pick(rng.integers(0, 4)) + pick(rng.integers(1, 6)) * int(rng.integers(1, 25))
                  + pick(rng.integers(0, 4)))
    turns = int(rng.integers(0, 5))
    assert text.peria_repetition(model_text, turns) == reference_repetition(
        model_text, turns), repr(model_text)


# 3DThinker's option letter, from the public reward's extraction: the content of the first
# <answer>...</answer>, stripped; then the first of these steps that finds a letter
# (A-E, upper case; each pattern takes its last match, scanning left to right):
PUBLIC_FIRST = r"([A-E])\."
PUBLIC_SECTION = (r"[Mm]y answer is ([A-E])", r"[Mm]y answer is ([A-E])\.",
                  r"[Tt]he answer is ([A-E])", r"(?:Answer: )?([A-E])\.", r"\b([A-E])\b")
PUBLIC_TEXT = (r"(?:Answer: )?([A-E])\. [A-Za-z0-9 \-\(\)\'\",]+(?=(?:\n|$|\.|\"))",
               r"(?:Answer: )?([A-E])\. [A-Za-z0-9 \-\(\)\'\"]+",
               r"(?:^|\n)(?:Answer: )?([A-E])(?:\.|$|\s)", r"[\*\"]([A-E])[\*\"]",
               r"\bAnswer:?\s*([A-E])\b", r"[Mm]y answer is ([A-E])",
               r"[Mm]y answer is ([A-E])\.", r"answer is ([A-E])")


def reference_thinker3d_letter(completion: str) -> str | None:
  found = re.search(r"<answer>\n?(.*?)\n?</answer>", completion, re.DOTALL)
  answer = found.group(1).strip() if found else ""
  if not answer:
    return None
  last = lambda pattern, where: ([m.group(1) for m in re.finditer(pattern, where)] or [None])[-1]
  if last(PUBLIC_FIRST, answer):                   # 1. "X." anywhere
    return last(PUBLIC_FIRST, answer)
  section = re.search(r"<Answer>(.*?)(?:<|$)", answer, re.DOTALL)
  for pattern in PUBLIC_SECTION if section else ():  # 2. inside "<Answer>" ... "<"
    if last(pattern, section.group(1)):
      return last(pattern, section.group(1))
  for pattern in PUBLIC_TEXT:                      # 3. the general patterns
    if last(pattern, answer):
      return last(pattern, answer)
  lines = answer.split("\n")
  described = [re.search(r"([A-E])\. [A-Za-z0-9 \-\(\)\'\",]+", line) for line in lines]
  described = [m.group(1) for m in described if m]
  if described:                                    # 4. the last line with "X. text"
    return described[-1]
  for line in reversed(lines):                     # 5. the last line's first lone letter
    match = re.search(r"\b([A-E])\b", line)
    if match:
      return match.group(1)
  return None


DEVICE_LETTER = jax.jit(jax.vmap(device_text.thinker3d_answer_letter))


@pytest.mark.parametrize("answer,letter", [
    ("The answer is (B).", "B"), ("B", "B"), ("(C) the sofa", "C"), ("answer: D", "D"),
    ("I pick E.", "E"), ("THE.", "E"), ("A cat, then B", "A"), ("x", None), ("F", None),
    ("Answer:\n  D", "D"), ("my answer is C, the answer is D", "C"), ('"A" or "B"', "B"),
    ("A\nB", "A"), ("A\n\nB", "B"), ('"A"B"', "A"), ("<Answer> the answer is E <b>", "E"),
    ("b", None), ("left of the sofa", None), ("AB", None), ("“B”", "B"), ("éB", None),
])
def test_thinker3d_letter_worked_examples(answer, letter):
  completion = f"<think>hmm</think><answer>{answer}</answer>"
  index = -1 if letter is None else "ABCDE".index(letter)
  assert reference_thinker3d_letter(completion) == letter
  assert thinker3d_letter_text(completion) == index
  assert int(DEVICE_LETTER(to_bytes([completion]))[0]) == index


THINKER3D_FRAGMENTS = [
    "A", "B", "C", "E", "F", "a", ".", ". ", " ", "  ", "\n", "\t", "(", ")", '"', "*", ":",
    "Answer", "Answer: ", "answer is ", "My answer is ", "my answer is ", "the answer is ",
    "The ", "<Answer>", "<", ">", "é", "“", "”", "\u00a0", "\u3000", "—", "x", "AB", "_",
    "1", "\x1c", "sofa", "-", "'", ",", "<answer>", "</answer>"]


def test_thinker3d_letter_device_host_and_reference_agree_on_adversarial_answers():
  rng = np.random.default_rng(8)
  texts = []
  for _ in range(3000):
    pick = lambda: "".join(THINKER3D_FRAGMENTS[i] for i in rng.integers(
        len(THINKER3D_FRAGMENTS), size=rng.integers(0, 12)))
    texts.append(f"{pick()}<answer>{pick()}</answer>{pick()}" if rng.random() < 0.9
                 else pick())
  texts = [t for t in texts if len(t.encode("utf-8")) <= L]
  reference = [reference_thinker3d_letter(t) for t in texts]
  reference = np.asarray([-1 if r is None else "ABCDE".index(r) for r in reference])
  host = np.asarray([thinker3d_letter_text(t) for t in texts])
  device = np.asarray(DEVICE_LETTER(to_bytes(texts)))
  np.testing.assert_array_equal(host, reference)
  np.testing.assert_array_equal(device, reference)
  assert set(reference.tolist()) >= {-1, 0, 1, 2, 4}
  # Think3D's leading-letter rule is a different paper's, and stays so.
  assert parse_letter_text("<answer>The answer is (B).</answer>") == -1


def test_thinker3d_reward_reads_the_letter_anywhere():
  rng = np.random.default_rng(9)
  target = rng.normal(size=(1, 10, 8))
  predicted = with_cosine(target, 0.71, rng)
  completion = to_bytes(["<think>hmm</think><answer>The answer is (B).</answer>"])[0]
  reward = jax.jit(thinker3d_reward)(jnp.asarray(False), completion, jnp.asarray(1), predicted,
                                     target)
  assert float(reward) == pytest.approx(1 + 0.855, abs=1e-5)
