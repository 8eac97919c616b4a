"""Benchmark readers: every row of the real question files, and named errors on bad input."""

import json
import pathlib

import pytest

from data_pipelines.readers import (BenchmarkFormatError, MissingImageError, parse_options,
                                    read_blink, read_mindcube, read_scanqa, read_vsibench)

SHARED = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data" / "benchmarks"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is not present")


@needs_shared
def test_mindcube_tiny_every_row():
  questions = read_mindcube(SHARED / "mindcube_tiny_questions.jsonl", check_images=False)
  assert len(questions) == 1050
  counts = {s: sum(q.category == s for q in questions) for s in ("among", "around", "rotation")}
  assert counts == {"among": 600, "around": 250, "rotation": 200}
  for q in questions:
    assert 2 <= len(q.options) <= 5 and q.answer in "ABCDE"[:len(q.options)]
    assert all(q.options) and q.images
  first = questions[0]
  assert first.options == ("TV", "Wooden dining table", "Light purple sofa",
                           "Brown curtains and windows")
  assert first.answer == "C" and first.meta["type"] == "1_frame"
  with pytest.raises(MissingImageError, match=r"row 1 \(id 'among_group693_q1_5_2'\), field "
                                              r"'images': image not found: .*front_007.jpg"):
    read_mindcube(SHARED / "mindcube_tiny_questions.jsonl", image_root="/nonexistent")


@needs_shared
def test_scanqa_validation_every_row():
  questions = read_scanqa(SHARED / "scanqa_v1.0_val.json")
  assert len(questions) == 4675
  assert len({q.scene_id for q in questions}) == 71
  q = questions[0]
  assert q.question_id == "val-scene0011-0" and q.answers == ("dark brown", "brown")
  assert q.object_ids[:2] == (4, 5) and q.object_names[0] == "chair"
  assert all(q.answers and len(q.object_ids) == len(q.object_names) for q in questions)
  with pytest.raises(MissingImageError, match=r"row 1 \(id 'val-scene0011-0'\).*scene0011_00"):
    read_scanqa(SHARED / "scanqa_v1.0_val.json", scene_root="/nonexistent")


def write_jsonl(path, records):
  path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
  return path


GOOD_MINDCUBE = {"id": "rotation_x_q0", "category": ["c"], "type": "three_view",
                 "meta_info": [], "question": "Which? A. left B. right", "images": ["a.png"],
                 "gt_answer": "B"}


@pytest.mark.parametrize("change,field,problem", [
    ({"gt_answer": "C"}, "gt_answer", "expected one of the 2 option letters 'AB', got 'C'"),
    ({"images": "a.png"}, "images", "expected list, got str"),
    ({"id": "upside_x"}, "id", "expected a prefix in"),
    ({"question": "Which one?"}, "question", "0 options: a multiple-choice question needs"),
])
def test_mindcube_bad_rows_name_file_row_id_and_field(tmp_path, change, field, problem):
  bad = {**GOOD_MINDCUBE, "id": "rotation_x_q1", **change}
  path = write_jsonl(tmp_path / "mc.jsonl", [GOOD_MINDCUBE, bad])
  with pytest.raises(BenchmarkFormatError) as error:
    read_mindcube(path, check_images=False)
  assert error.value.row == 2 and error.value.field == field
  assert str(path) in str(error.value) and problem in str(error.value)


def test_missing_fields_and_broken_json(tmp_path):
  record = dict(GOOD_MINDCUBE)
  del record["meta_info"]
  path = write_jsonl(tmp_path / "mc.jsonl", [record])
  with pytest.raises(BenchmarkFormatError, match=r"row 1 \(id 'rotation_x_q0'\), field "
                                                 r"'meta_info': missing"):
    read_mindcube(path, check_images=False)
  path = tmp_path / "broken.jsonl"
  path.write_text(json.dumps(GOOD_MINDCUBE) + "\n{not json\n")
  with pytest.raises(BenchmarkFormatError, match="row 2.*not JSON"):
    read_mindcube(path, check_images=False)
  bad = [{"answers": ["x"], "object_ids": [1, 2], "object_names": ["a"], "question": "q",
          "question_id": "val-1", "scene_id": "s"}]
  path = tmp_path / "scanqa.json"
  path.write_text(json.dumps(bad))
  with pytest.raises(BenchmarkFormatError, match=r"field 'object_names': expected 2 names"):
    read_scanqa(path)
  with pytest.raises(FileNotFoundError, match="benchmark file not found"):
    read_scanqa(tmp_path / "nope.json")


def test_blink_parquet_and_vsibench_parquet(tmp_path):
  pa = pytest.importorskip("pyarrow")
  import pyarrow.parquet as pq
  image = {"bytes": b"\x89PNG fake", "path": "a.png"}
  blink = pa.Table.from_pylist([
      {"idx": "val_Multi-view_Reasoning_1", "question": "Is the camera moving left or right?",
       "sub_task": "Multi-view_Reasoning", "image_1": image, "image_2": image,
       "image_3": None, "image_4": None, "choices": ["left", "right"], "answer": "(B)",
       "prompt": "..."},
      {"idx": "val_Counting_1", "question": "How many?", "sub_task": "Counting",
       "image_1": image, "image_2": None, "image_3": None, "image_4": None,
       "choices": ["1", "2", "3"], "answer": "(C)", "prompt": "..."}])
  pq.write_table(blink, tmp_path / "blink.parquet")
  questions = read_blink(tmp_path / "blink.parquet")
  assert len(questions) == 1 and questions[0].answer == "B"
  assert questions[0].options == ("left", "right") and len(questions[0].meta["image_bytes"]) == 2
  assert len(read_blink(tmp_path / "blink.parquet", sub_task=None)) == 2

  vsi = pa.Table.from_pylist([
      {"id": 1, "dataset": "scannet", "scene_name": "scene0001_00",
       "question_type": "object_rel_direction_easy", "question": "Left or right?",
       "options": ["A. left", "B. right"], "ground_truth": "A"},
      {"id": 2, "dataset": "arkitscenes", "scene_name": "42",
       "question_type": "object_counting", "question": "How many chairs?", "options": None,
       "ground_truth": "4"}])
  pq.write_table(vsi, tmp_path / "vsi.parquet")
  questions = read_vsibench(tmp_path / "vsi.parquet")
  assert questions[0].options == ("left", "right") and questions[0].answer == "A"
  assert questions[1].options == () and questions[1].answer == "4"
  with pytest.raises(MissingImageError, match=r"row 1 \(id '1'\).*scannet/scene0001_00.mp4"):
    read_vsibench(tmp_path / "vsi.parquet", video_root=tmp_path)


def test_blink_bad_answer(tmp_path):
  path = write_jsonl(tmp_path / "blink.jsonl", [
      {"idx": "v1", "question": "q", "sub_task": "Multi-view_Reasoning", "image_1": "a.png",
       "choices": ["left", "right"], "answer": "(C)"}])
  with pytest.raises(BenchmarkFormatError, match=r"row 1 \(id 'v1'\), field 'answer'"):
    read_blink(path, check_images=False)


def test_parse_options():
  assert parse_options("Where? A. left B. right") == ("Where?", ("left", "right"))
  assert parse_options("(A) up (B) down (C) stay") == ("", ("up", "down", "stay"))
  assert parse_options("In image A. x is shown. What? A. cat B. dog") == (
      "In image A. x is shown. What?", ("cat", "dog"))
  assert parse_options("How many chairs?") == ("How many chairs?", ())
