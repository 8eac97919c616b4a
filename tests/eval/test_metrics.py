"""jaxspatial.eval: per-question metrics against independent implementations, aggregation
over seeds, and the results files' layout."""

import json

import numpy as np
import pytest

from jaxspatial.eval import (markdown_table, mean_relative_accuracy, option_correct,
                             parse_number, results_document, score, summarize, write_results)
from jaxspatial.eval.metrics import maptrace_correct, normalized_dtw, predicted_letter


def mra_from_definition(prediction, truth):
  """VSI-Bench's MRA as the paper writes it: the mean over C = {0.50, 0.55, ..., 0.95} of
  1[|pred - gt| / gt < 1 - theta]."""
  hits = [abs(prediction - truth) / truth < 1 - (0.50 + 0.05 * k) for k in range(10)]
  return float(np.mean(hits))


def mra_public_code(prediction, truth):
  """The public scorer's form: linspace over int((end - start) / interval + 2) points,
  compared with <=."""
  num_pts = (0.95 - 0.5) / 0.05 + 2
  thresholds = np.linspace(0.5, 0.95, int(num_pts))
  return float((abs(prediction - truth) / truth <= 1 - thresholds).mean())


def test_mra_matches_its_definition():
  rng = np.random.default_rng(0)
  truth = rng.uniform(0.2, 20.0, 400)
  prediction = truth * rng.uniform(0.0, 2.2, 400)
  ours = mean_relative_accuracy(prediction, truth)
  assert ours.shape == (400,)
  np.testing.assert_array_equal(ours, [mra_from_definition(p, t)
                                       for p, t in zip(prediction, truth)])
  np.testing.assert_array_equal(mean_relative_accuracy(prediction, truth, inclusive=True),
                                [mra_public_code(p, t) for p, t in zip(prediction, truth)])
  assert 0.0 < ours.mean() < 1.0 and len(set(ours.tolist())) == 11  # every level 0 .. 1 met


def test_mra_cases():
  assert mean_relative_accuracy(7.0, 7.0) == 1.0
  assert mean_relative_accuracy(12.9, 10.0) == 0.5  # relative error 0.29: theta 0.50 .. 0.70
  assert mean_relative_accuracy(30.0, 10.0) == 0.0
  # The boundary: gt 2, pred 3 is a relative error of exactly 0.5 (theta 0.5).
  assert mean_relative_accuracy(3.0, 2.0) == 0.0
  assert mean_relative_accuracy(3.0, 2.0, inclusive=True) == pytest.approx(0.1)
  assert mean_relative_accuracy(np.nan, 2.0) == 0.0
  with pytest.raises(ValueError, match="target: expected finite non-zero values, got \\[0.0\\]"):
    mean_relative_accuracy([1.0, 2.0], [1.0, 0.0])
  assert score("mra", "<answer>12.9</answer>", "10") == 0.5
  assert score("mra", "12.9 meters", "10") == 0.5
  assert score("mra", "about 12.9 meters", "10") == 0.0  # the public rule: first token only
  assert score("mra", "I cannot tell", "10") == 0.0


def test_numbers_and_letters():
  assert parse_number("3.") == 3.0 and parse_number("<answer> 4.5 m</answer>") == 4.5
  assert parse_number("about 3.5 meters") is None
  assert parse_number("about 3.5 meters", "first_number") == 3.5
  assert parse_number("nan") is None and parse_number(None) is None
  assert option_correct("<think>x</think><answer>(B) the sofa</answer>", "B")
  assert option_correct("B. sofa", "B") and not option_correct("sofa", "B")
  assert not option_correct("<answer>A</answer> B", "B")
  # 3DThinker's evaluation reads the whole reply when it has no <answer> block.
  assert predicted_letter("The answer is C.", "thinker3d") == "C"
  assert predicted_letter("<answer>I choose C.</answer>", "thinker3d") == "C"
  assert predicted_letter("<answer>C. left</answer>", "thinker3d") == "C"
  assert predicted_letter("b. the chair", "vsibench") == "B"
  assert predicted_letter("(B)", "vsibench") is None
  assert score("accuracy", "<answer>D</answer>", "D") == 1.0
  assert score("accuracy", True, "D") == 1.0 and score("exact_match", 0.0, "x") == 0.0
  assert score("exact_match", "<answer>The Brown</answer>", "dark brown",
               ("dark brown", "brown")) == 1.0
  with pytest.raises(ValueError, match=r"score.prediction: expected a score in \[0, 1\], got 2"):
    score("accuracy", 2, "A")
  with pytest.raises(ValueError, match="score.metric: expected one of"):
    score("bleu", "x", "A")


def test_normalized_dtw_host_equals_device():
  from jaxspatial.rl.rewards.papers import normalized_dtw as device_ndtw  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(1)
  path, reference = rng.uniform(0, 5, (7, 2)), rng.uniform(0, 5, (5, 2))
  padded_path = np.zeros((9, 2), np.float32)
  padded_path[:7] = path
  padded_ref = np.zeros((6, 2), np.float32)
  padded_ref[:5] = reference
  device = float(device_ndtw(padded_path, padded_ref, 7, 5))
  assert normalized_dtw(path, reference) == pytest.approx(device, rel=1e-5)
  # By hand: the same path is 0 away; a copy shifted by 1 is |R| / |R| = 1 away.
  line = np.stack([np.arange(4.0), np.zeros(4)], -1)
  assert normalized_dtw(line, line) == 0.0
  assert normalized_dtw(line + [0.0, 1.0], line) == pytest.approx(1.0)
  assert maptrace_correct(line + [0.0, 1.0], line) and not maptrace_correct(line + 2, line)
  assert normalized_dtw(np.zeros((0, 2)), line) == float("inf")


def test_summarize_over_seeds_and_groups():
  rng = np.random.default_rng(2)
  categories = ["a"] * 5 + ["b"] * 3 + ["c1"] * 4 + ["c2"] * 2
  scores = (rng.uniform(size=(3, 14)) > 0.5).astype(float)
  out = summarize(scores, categories, columns=["b", "a", "c"], groups={"c": ("c1", "c2")},
                  overall="micro")
  assert list(out["categories"]) == ["b", "a", "c"]
  cats = np.array(categories)
  for name, parts in (("a", ["a"]), ("b", ["b"]), ("c", ["c1", "c2"])):
    per_seed = np.mean([scores[:, cats == p].mean(1) for p in parts], 0)
    entry = out["categories"][name]
    assert entry["accuracy"] == pytest.approx(per_seed.mean())
    assert entry["std"] == pytest.approx(np.std(per_seed, ddof=1))
    assert entry["seeds"] == pytest.approx(per_seed.tolist())
    assert entry["n"] == sum(int((cats == p).sum()) for p in parts)
  assert out["overall"]["accuracy"] == pytest.approx(scores.mean())
  assert out["overall"]["std"] == pytest.approx(np.std(scores.mean(1), ddof=1))
  assert out["overall"]["n"] == 14 and out["overall"]["mode"] == "micro"
  macro = summarize(scores, categories, columns=["b", "a", "c"], groups={"c": ("c1", "c2")},
                    overall="macro")["overall"]
  assert macro["accuracy"] == pytest.approx(np.mean(
      [out["categories"][c]["accuracy"] for c in ("a", "b", "c")]))
  one = summarize(scores[0], categories)
  assert one["overall"]["std"] == 0.0 and list(one["categories"]) == ["a", "b", "c1", "c2"]
  with pytest.raises(ValueError, match=r"expected one per question \(14\), got 3"):
    summarize(scores, ["a", "b", "c"])


def test_summarize_standard_errors_and_pooled_columns():
  """One seed of right-or-wrong answers: se is the binomial sqrt(p (1 - p) / n); a pooled
  column is the accuracy over all its questions (not the mean of its parts)."""
  correct = np.array([1, 0, 1, 1, 0, 0, 1, 1, 1, 0], float)
  sides = ["left"] * 3 + ["right"] * 5 + ["front"] * 2
  out = summarize(correct, sides, columns=["front", "left", "right"],
                  pooled={"explore": ("left", "right")})
  def binomial(x):
    p = np.mean(x)
    return p, np.sqrt(p * (1 - p) / len(x))
  for name, where in (("left", slice(0, 3)), ("right", slice(3, 8)), ("front", slice(8, 10)),
                      ("explore", slice(0, 8))):
    p, se = binomial(correct[where])
    assert out["categories"][name]["accuracy"] == pytest.approx(p)
    assert out["categories"][name]["se"] == pytest.approx(se)
  assert out["overall"]["se"] == pytest.approx(binomial(correct)[1])
  macro = summarize(correct, sides, overall="macro")
  parts = [binomial(correct[s])[1] for s in (slice(0, 3), slice(3, 8), slice(8, 10))]
  assert macro["overall"]["se"] == pytest.approx(np.sqrt(np.sum(np.square(parts))) / 3)


def _setting(values, n=(10, 20)):
  cats = {}
  for name, count, per_seed in zip(("x", "y"), n, values[:2]):
    cats[name] = {"accuracy": float(np.mean(per_seed)), "n": count,
                  "std": float(np.std(per_seed, ddof=1)), "seeds": list(per_seed)}
  overall = {"accuracy": float(np.mean(values[2])), "n": sum(n),
             "std": float(np.std(values[2], ddof=1)), "seeds": list(values[2]), "mode": "micro"}
  return {"overall": overall, "categories": cats}


def test_markdown_table_layout(tmp_path):
  tools = _setting([[0.5, 0.6, 0.7], [0.25, 0.25, 0.25], [0.4, 0.5, 0.6]])
  plain = _setting([[0.5, 0.5, 0.5], [0.1, 0.2, 0.3], [0.3, 0.3, 0.3]])
  document = results_document({"tools": tools, "no_tools": plain}, benchmark="toy",
                              columns=["x", "y"], labels={"x": "X cat"},
                              compare=[("tools", "no_tools")])
  assert document["overall"] == tools["overall"] and document["primary"] == "tools"
  assert document["comparisons"]["tools - no_tools"]["categories"]["x"]["accuracy"] == \
      pytest.approx(0.1)
  table = markdown_table(document)
  assert table.splitlines()[:7] == [
      "## toy", "",
      "| Setting | X cat | y | Overall |",
      "|:---|---:|---:|---:|",
      "| tools | 60.00 ± 10.00 | 25.00 ± 0.00 | 50.00 ± 10.00 |",
      "| no_tools | 50.00 ± 0.00 | 20.00 ± 10.00 | 30.00 ± 0.00 |",
      "| Δ tools - no_tools | +10.00 | +5.00 | +20.00 |"]
  assert "Questions: X cat 10, y 20; overall 30 (over all questions)." in table
  assert "3 seeds" in table
  paths = write_results(tmp_path / "out", document)
  assert json.loads(paths["json"].read_text()) == json.loads(json.dumps(document))
  assert paths["md"].read_text() == table
  assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["results.json", "results.md"]
