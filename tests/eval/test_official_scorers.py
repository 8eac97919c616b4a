"""Every benchmark protocol's default scorer against its official evaluation code's behaviour
(tests/eval/official_scorers.py), over a few hundred generated replies each, realistic chatty
forms included; the named options (Think3D's and 3DThinker's own scripts, the strict
leading letter) against theirs."""

import numpy as np
import pytest

from data_pipelines.protocols import protocol
from data_pipelines.readers.common import BenchmarkQuestion
from jaxspatial.eval.metrics import predicted_letter, relaxed_correctness, score
from tests.eval import official_scorers as official

LETTERS = "ABCD"


def _question(benchmark, answer, options=4, category="among", answers=()):
  return BenchmarkQuestion(benchmark=benchmark, question_id="q", question="?", answer=answer,
                           answers=tuple(answers) or (answer,),
                           options=tuple(f"{c}. x" for c in "ABCDE"[:options]),
                           category=category, scene_id="s")


def _noise(rng, text):
  """Hostile edits: letters and tags that decoy extractors."""
  edits = [text, text.upper(), text.lower(), text + " E.", "B. " + text, text + "\n\nC",
           "<Answer>" + text, text.replace(" ", "\n"), "(" + text + ")", "*" + text + "*",
           text + ".", "   " + text, text + " (D)", "(A) (B) " + text]
  return edits[rng.integers(len(edits))]


def _replies(seed, count):
  rng = np.random.default_rng(seed)
  out = []
  for k in range(count):
    answer = LETTERS[rng.integers(4)]
    reply = official.chatty_replies(rng, answer)
    out.append((_noise(rng, reply) if k % 3 == 2 else reply, LETTERS[rng.integers(4)]
                if k % 5 == 4 else answer))
  return out


def test_mindcube_default_is_the_official_extractor():
  replies = _replies(0, 640)
  spec = protocol("mindcube_tiny")
  ours = [spec.score(_question("mindcube_tiny", gt), reply) for reply, gt in replies]
  reference = [float(official.mindcube_correct(reply, gt)) for reply, gt in replies]
  disagree = [r for r, a, b in zip(replies, ours, reference) if a != b]
  assert not disagree, f"{len(disagree)} of 640 disagree, first {disagree[0]!r}"
  strict = [score("accuracy", reply, gt, letter_rule="letter") for reply, gt in replies]
  # The strict rule scores far lower on chatty replies; the official one is the default.
  assert np.mean(reference) > np.mean(strict) + 0.1
  assert protocol("mindcube").letter_rule == "mindcube"
  # Reading the whole reply: the last "X." wins over a later <answer> block.
  assert predicted_letter("Option B. is tempting, not B. <answer>C</answer>", "mindcube") == "B"
  assert predicted_letter("A. red B. blue ... the answer is C", "mindcube") == "B"


def test_think3d_and_thinker3d_options():
  for reply, gt in _replies(1, 400):
    assert (predicted_letter(reply, "think3d") == gt) == (official.spagent_normalize(reply)
                                                         == official.spagent_normalize(gt))
    inside = reply.split("<answer>", 1)[1].split("</answer>", 1)[0].strip() if (
        "<answer>" in reply and "</answer>" in reply.split("<answer>", 1)[1]) else reply
    assert predicted_letter(reply, "thinker3d") == official.mindcube_extract(inside), reply
  assert predicted_letter("Based on image 2, C", "think3d") == "B"  # spagent's first capital
  assert predicted_letter("The answer is C.", "thinker3d") == "C"  # no block: whole reply


def test_vsibench_default_is_the_official_scorer():
  rng = np.random.default_rng(2)
  spec = protocol("vsibench")
  checked = 0
  for reply, gt in _replies(3, 300):
    q = _question("vsibench", gt, category="route_planning")
    assert spec.score(q, reply) == official.vsi_multiple_choice(reply, gt), reply
    checked += 1
  numbers = ["3.5", "3.5 meters", "about 3.5", "3.5.", "<answer>3.5</answer>", "4", "2.",
             "1e1", "nan", "inf", "-3", "12 chairs", "", "three", "3,5", "0.5m", "7.0"]
  for k in range(300):
    gt = f"{rng.uniform(0.3, 12):.1f}"
    reply = numbers[k % len(numbers)] if k % 2 else f"{float(gt) * rng.uniform(0.3, 1.8):.2f}"
    q = _question("vsibench", gt, category="object_abs_distance")
    assert spec.score(q, reply) == pytest.approx(official.vsi_numeric(reply, gt)), (reply, gt)
    checked += 1
  assert checked == 600
  # The boundary case the code's "<=" decides: gt 2, pred 3 scores at theta 0.5.
  assert spec.score(_question("vsibench", "2", category="object_counting"), "3") == \
      pytest.approx(0.1)


def test_chartqa_is_pix2struct_relaxed_correctness():
  rng = np.random.default_rng(4)
  targets = ["12", "12.5", "0", "0.0", "37.62%", "40%", "Yes", "no", "1,000", "-4", "125",
             "0.25", "Blue", "2019"]
  predictions = ["12", "12.4", "12.0", "0", "0.0", "0.3762", "37.62%%", "0.41", "yes",
                 "No", "1000", "-4.1", "12.5", "125", "0.26", "blue", " 12", "12 ", "2019.5",
                 "40", "1,000", "37.6%", "12%", "nan", "inf"]
  pairs = [(targets[rng.integers(len(targets))], predictions[rng.integers(len(predictions))])
           for _ in range(400)]
  for target, prediction in pairs:
    assert relaxed_correctness(target, prediction) == official.chart_relaxed(target, prediction)
    q = _question("chartqa", target, options=0, category="human")
    assert protocol("chartqa").score(q, prediction) == float(
        official.chart_relaxed(target, prediction.strip())), (target, prediction)
  assert not relaxed_correctness("0", "0.0") and relaxed_correctness("37.62%", "0.3762")


def test_blink_is_its_analyze_answer():
  rng = np.random.default_rng(5)
  forms = ["{a}", "({a})", "The answer is ({a}).", "({a}) because ...", "({o}) or ({a})",
           "Looking closely.\n\n({a})", "({o}) seems close.\n\nSo ({a})", "{a}.", "(E)",
           "({a}) ({a})", "no idea", "({a})\n\n({o}) ({a})"]
  for _ in range(300):
    num = int(rng.integers(2, 5))
    answer, other = rng.choice(list("ABCD"[:num]), 2, replace=num < 2)
    reply = forms[rng.integers(len(forms))].format(a=answer, o=other)
    q = _question("blink_mv", answer, options=num, category="Multi-view_Reasoning")
    expected = official.blink_choice(reply, num) == f"({answer})"
    assert protocol("blink_mv").score(q, reply) == float(expected), reply


def test_protocol_options_are_checked():
  assert protocol("mindcube", letter_rule="think3d").letter_rule == "think3d"
  with pytest.raises(ValueError, match="letter_rule: expected one of"):
    protocol("mindcube", letter_rule="fuzzy")
  with pytest.raises(ValueError, match="unknown rule options \\['metric'\\]"):
    protocol("mindcube", metric="x")
