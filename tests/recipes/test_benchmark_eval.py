"""Benchmark evaluation from predictions: a scripted backend whose answers are known, on
the real MindCube-Tiny questions, reproduces per-category accuracy computed independently;
VSI-Bench's MRA columns and macro overall."""

import hashlib
import json
import pathlib

import numpy as np
import pytest

from data_pipelines.readers import read_mindcube, read_vsibench
from recipes.benchmark_eval import evaluate_predictions
from tests.data_pipelines.test_protocols import write_vsibench

SHARED = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data" / "benchmarks"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is not present")
FORMATS = ("<think>...</think><answer>{}</answer>", "<answer>({})</answer>", "{}. because")


def knows(question_id: str, setting: str, seed: int) -> bool:
  """The scripted backend answers correctly exactly when this hash is even."""
  return hashlib.sha256(f"{setting}/{seed}/{question_id}".encode()).digest()[0] % 2 == 0


def scripted(raw_rows, setting, seed):
  out = {}
  for k, row in enumerate(raw_rows):
    truth = row["gt_answer"]
    letter = truth if knows(row["id"], setting, seed) else ("B" if truth == "A" else "A")
    out[row["id"]] = FORMATS[k % 3].format(letter)
  return out


@needs_shared
def test_mindcube_tiny_scripted_backend(tmp_path):
  path = SHARED / "mindcube_tiny_questions.jsonl"
  raw = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  questions = read_mindcube(path, check_images=False)
  predictions = {s: {seed: scripted(raw, s, seed) for seed in (0, 1, 2)}
                 for s in ("tools", "no_tools")}
  document = evaluate_predictions(questions, predictions, "mindcube_tiny", tmp_path / "out")

  # The same numbers from the raw file alone.
  def expected(setting, rows):
    per_seed = [np.mean([knows(r["id"], setting, seed) for r in rows]) for seed in (0, 1, 2)]
    return np.mean(per_seed), np.std(per_seed, ddof=1), len(rows)

  written = json.loads((tmp_path / "out" / "results.json").read_text())
  assert written == json.loads(json.dumps(document))
  for setting in ("tools", "no_tools"):
    result = written["settings"][setting]
    for name in ("rotation", "around", "among"):
      rows = [r for r in raw if r["id"].startswith(name + "_")]
      mean, std, n = expected(setting, rows)
      entry = result["categories"][name]
      assert (entry["n"], entry["accuracy"], entry["std"]) == (n, pytest.approx(mean),
                                                              pytest.approx(std))
    mean, std, n = expected(setting, raw)
    assert (result["overall"]["n"], result["overall"]["accuracy"]) == (1050,
                                                                     pytest.approx(mean))
    assert result["overall"]["std"] == pytest.approx(std)
  assert written["categories"] == written["settings"]["tools"]["categories"]
  assert written["overall"]["n"] == 1050 and written["seeds"]["tools"] == ["0", "1", "2"]
  delta = written["comparisons"]["tools - no_tools"]["overall"]["accuracy"]
  assert delta == pytest.approx(written["settings"]["tools"]["overall"]["accuracy"]
                                - written["settings"]["no_tools"]["overall"]["accuracy"])
  table = (tmp_path / "out" / "results.md").read_text().splitlines()
  assert table[2] == "| Setting | Rotation | Around | Among | Overall |"
  assert table[4].startswith("| tools | ") and table[5].startswith("| no_tools | ")
  assert table[6].startswith("| Δ tools - no_tools | ")

  missing = dict(predictions["tools"][0])
  missing.pop(raw[7]["id"])
  with pytest.raises(ValueError, match=r"predictions\['tools'\]\[0\]: 1 of 1050 questions have "
                                       r"no prediction, first \['" + raw[7]["id"]):
    evaluate_predictions(questions, {"tools": {0: missing}}, "mindcube_tiny")
  with pytest.raises(ValueError, match=r"1 ids are no question of mindcube_tiny, first \['x'\]"):
    evaluate_predictions(questions, {"tools": {0: {**predictions["tools"][0], "x": "A"}}},
                         "mindcube_tiny")


def test_vsibench_mra_and_macro_overall(tmp_path):
  questions = read_vsibench(write_vsibench(tmp_path / "vsi.jsonl"), check_videos=False)
  truth = {q.question_id: q.answer for q in questions}
  numeric = {q.question_id for q in questions if not q.options}
  # Numbers 1.29x the truth (relative error 0.29 < 1 - theta for theta 0.50 .. 0.70: MRA 0.5)
  # and every letter right except the hard relative direction's.
  answers = {}
  for q in questions:
    if q.question_id in numeric:
      answers[q.question_id] = f"{1.29 * float(truth[q.question_id])}"
    else:
      answers[q.question_id] = "A." if q.category == "object_rel_direction_hard" else q.answer
  document = evaluate_predictions(questions, {"no_tools": {0: answers}}, "vsibench",
                                  tmp_path / "out")
  cats = document["categories"]
  for name in ("object_counting", "object_abs_distance", "object_size_estimation",
               "room_size_estimation"):
    assert cats[name]["accuracy"] == pytest.approx(0.5)
  assert cats["object_rel_direction"]["accuracy"] == pytest.approx(2 / 3)  # (1 + 1 + 0) / 3
  assert cats["object_rel_direction"]["n"] == 6
  expected = np.mean([0.5] * 4 + [1.0, 2 / 3, 1.0, 1.0])
  assert document["overall"]["accuracy"] == pytest.approx(expected)
  assert document["metrics"] == ["accuracy", "mra"]
  header = (tmp_path / "out" / "results.md").read_text().splitlines()[2]
  assert header == ("| Setting | Obj. Count | Abs. Dist. | Obj. Size | Room Size | Rel. Dist. | "
                    "Rel. Dir. | Route Plan | Appr. Order | Overall |")
  answers[questions[0].question_id] = 3  # a score outside [0, 1], named with its question
  with pytest.raises(ValueError, match=r"predictions\['no_tools'\]\[0\]\['0'\] \(vsibench, "
                                       r"answer '4'\): score.prediction: expected a score in"):
    evaluate_predictions(questions, {"no_tools": {0: answers}}, "vsibench")
