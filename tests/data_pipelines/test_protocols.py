"""The papers' evaluation protocols: categories and counts from the real question files."""

import collections
import json
import pathlib

import pytest

from data_pipelines.protocols import PROTOCOLS, VSI_MULTIPLE_CHOICE, VSI_NUMERIC, protocol
from data_pipelines.readers import read_mindcube, read_vsibench

SHARED = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data" / "benchmarks"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is not present")


@needs_shared
@pytest.mark.parametrize("name", ["mindcube", "mindcube_tiny"])
def test_mindcube_counts_match_the_raw_file(name):
  path = SHARED / "mindcube_tiny_questions.jsonl"
  raw = collections.Counter(json.loads(line)["id"].split("_")[0]
                            for line in path.read_text().splitlines() if line.strip())
  questions = read_mindcube(path, check_images=False)
  spec = protocol(name)
  counts = spec.counts(questions)
  assert counts == dict(raw) == {"rotation": 200, "around": 250, "among": 600}
  assert list(counts) == ["rotation", "around", "among"]  # the papers' column order
  assert all(spec.metric(q) == "accuracy" for q in questions)


VSI_ROWS = [  # (question_type, options, ground_truth)
    ("object_counting", None, "4"), ("object_abs_distance", None, "2.3"),
    ("object_size_estimation", None, "75"), ("room_size_estimation", None, "21.5"),
    ("object_rel_distance", ["A. sofa", "B. bed", "C. tv", "D. desk"], "C"),
    ("object_rel_direction_easy", ["A. left", "B. right"], "A"),
    ("object_rel_direction_medium", ["A. left", "B. right", "C. back"], "B"),
    ("object_rel_direction_hard", ["A. front-left", "B. front-right", "C. back-left",
                                   "D. back-right"], "D"),
    ("route_planning", ["A. go", "B. turn", "C. stop", "D. wait"], "B"),
    ("obj_appearance_order", ["A. x", "B. y", "C. z", "D. w"], "A")]


def write_vsibench(path, repeats=2):
  rows = []
  for k in range(repeats):
    for j, (kind, options, truth) in enumerate(VSI_ROWS):
      rows.append({"id": len(rows), "dataset": "scannet", "scene_name": f"scene{k}{j}",
                   "question_type": kind, "question": f"q {kind}?", "options": options,
                   "ground_truth": truth})
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  return path


def test_vsibench_columns_and_metrics(tmp_path):
  questions = read_vsibench(write_vsibench(tmp_path / "vsi.jsonl"), check_videos=False)
  spec = protocol("vsibench")
  counts = spec.counts(questions)
  assert list(counts) == list(spec.columns) and len(counts) == 8
  assert counts["object_rel_direction"] == 6 and counts["object_counting"] == 2
  assert {q.category: spec.metric(q) for q in questions} == {
      **{t: "mra" for t in VSI_NUMERIC}, **{t: "accuracy" for t in VSI_MULTIPLE_CHOICE}}
  tiny = protocol("vsibench_tiny")
  assert tiny.counts(questions) == {"route_planning": 2, "object_rel_direction": 6,
                                    "obj_appearance_order": 2, "object_rel_distance": 2}
  assert len(tiny.select(questions)) == 12
  assert spec.overall == tiny.overall == "macro"
  with pytest.raises(ValueError, match="benchmark: expected one of"):
    protocol("nope")
  assert set(PROTOCOLS) >= {"mindcube", "mindcube_tiny", "vsibench", "blink_mv", "scanqa"}
