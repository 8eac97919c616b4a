"""Hostile benchmark rows: image, scene and video paths that leave the benchmark's folder
(absolute, `..`) are refused naming the file, row and field, even when the file they point
at exists; a fuzz of mutated paths either reads a path inside the folder or raises one of
the readers' errors."""

import json
import os

import numpy as np
import pytest

from data_pipelines.readers import (BenchmarkFormatError, MissingImageError, read_blink,
                                    read_mindcube, read_scanqa, read_vsibench)
from tests.deadline import deadline


@pytest.fixture()
def layout(tmp_path):
  """<tmp>/bench (the benchmark folder: images, a scene folder, a video) next to
  <tmp>/secret.png and <tmp>/secret/ (outside it)."""
  root = tmp_path / "bench"
  (root / "sub").mkdir(parents=True)
  for name in ("a.png", "sub/b.png"):
    (root / name).write_bytes(b"png")
  (root / "scene0001_00").mkdir()
  (root / "scannet").mkdir()
  (root / "scannet" / "scene0001_00.mp4").write_bytes(b"mp4")
  (tmp_path / "secret.png").write_bytes(b"png")
  (tmp_path / "secret").mkdir()
  (tmp_path / "secret.mp4").write_bytes(b"mp4")
  return tmp_path, root


def mindcube_row(images, record_id="rotation_x_q0"):
  return {"id": record_id, "category": ["c"], "type": "three_view", "meta_info": [],
          "question": "Which? A. left B. right", "images": images, "gt_answer": "B"}


def blink_row(image):
  return {"idx": "v1", "question": "Left or right?", "sub_task": "Multi-view_Reasoning",
          "image_1": image, "choices": ["left", "right"], "answer": "(B)"}


def scanqa_row(scene_id):
  return {"answers": ["brown"], "object_ids": [1], "object_names": ["chair"],
          "question": "What colour is the chair?", "question_id": "val-1", "scene_id": scene_id}


def vsi_row(dataset="scannet", scene="scene0001_00"):
  return {"id": 1, "dataset": dataset, "scene_name": scene,
          "question_type": "object_rel_direction_easy", "question": "Left or right?",
          "options": ["A. left", "B. right"], "ground_truth": "A"}


def write_rows(path, rows):
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  return path


def read(kind: str, tmp, root, value, check=True):
  """Reads one row of `kind` whose path field is `value` (MindCube's second row)."""
  if kind == "mindcube":
    path = write_rows(tmp / "mc.jsonl", [mindcube_row(["a.png"]), mindcube_row(value, "rotation_x_q1")])
    return read_mindcube(path, image_root=root, check_images=check)
  if kind == "blink":
    return read_blink(write_rows(tmp / "blink.jsonl", [blink_row(value)]), image_root=root,
                      check_images=check)
  if kind == "scanqa":
    return read_scanqa(write_rows(tmp / "scanqa.jsonl", [scanqa_row(value)]), scene_root=root,
                       check_scenes=check)
  dataset, scene = value
  return read_vsibench(write_rows(tmp / "vsi.jsonl", [vsi_row(dataset, scene)]),
                       video_root=root, check_videos=check)


ESCAPES = [  # (reader, value, row, field, message part): each names a file that exists
    ("mindcube", ["a.png", "../secret.png"], 2, "images[1]", "which leaves it"),
    ("mindcube", ["sub/../../secret.png"], 2, "images[0]", "which leaves it"),
    ("mindcube", ["{outside}/secret.png"], 2, "images[0]", "got the absolute path"),
    ("blink", "../secret.png", 1, "image_1", "which leaves it"),
    ("blink", {"bytes": None, "path": "{outside}/secret.png"}, 1, "image_1",
     "got the absolute path"),
    ("scanqa", "../secret", 1, "scene_id", "which leaves it"),
    ("scanqa", "{outside}/secret", 1, "scene_id", "got the absolute path"),
    ("scanqa", "./", 1, "scene_id", "which names the folder itself"),
    ("scanqa", "scene0001_00/../scene0001_00", 1, "scene_id", "which climbs with '..'"),
    ("vsibench", ("..", "secret"), 1, "dataset", "which leaves it"),
    ("vsibench", ("scannet", "../../secret"), 1, "scene_name", "which leaves it"),
    ("vsibench", ("{outside}", "secret"), 1, "dataset", "got the absolute path"),
]


@pytest.mark.parametrize("kind,value,row,field,problem", ESCAPES,
                         ids=[f"{k}:{f}:{p}" for k, _, _, f, p in ESCAPES])
def test_paths_that_leave_the_benchmark_folder_are_refused(layout, kind, value, row, field,
                                                           problem):
  tmp, root = layout
  value = json.loads(json.dumps(value).replace("{outside}", str(tmp)))
  for check in (True, False):  # refused whether or not the files are looked up
    with pytest.raises(BenchmarkFormatError) as error:
      read(kind, tmp, root, value, check)
    assert (error.value.row, error.value.field) == (row, field)
    message = str(error.value)
    assert message.startswith(f"{tmp}/") and f"row {row} " in message
    assert f"field {field!r}: expected a path" in message and problem in message
    assert f"benchmark folder {root}" in message


def test_paths_inside_the_folder_read_as_before(layout):
  tmp, root = layout
  (question,) = read("mindcube", tmp, root, ["./sub/b.png", "a.png"])[1:]
  assert question.images == (str(root / "sub/b.png"), str(root / "a.png"))
  assert read("blink", tmp, root, {"bytes": None, "path": "a.png"})[0].images == (
      str(root / "a.png"),)
  assert read("scanqa", tmp, root, "scene0001_00")[0].scene_id == "scene0001_00"
  assert read("vsibench", tmp, root, ("scannet", "scene0001_00"))[0].images == (
      str(root / "scannet" / "scene0001_00.mp4"),)
  # Without a root the row's relative paths come back as written; escapes are refused.
  path = write_rows(tmp / "mc.jsonl", [mindcube_row(["./sub/b.png"])])
  assert read_mindcube(path, check_images=False)[0].images == ("./sub/b.png",)
  path = write_rows(tmp / "mc.jsonl", [mindcube_row(["sub/../../x.png"])])
  with pytest.raises(BenchmarkFormatError, match=r"field 'images\[0\]': expected a path "
                                                 r"inside the benchmark folder without '\.\.'"):
    read_mindcube(path, check_images=False)
  path = write_rows(tmp / "mc.jsonl", [mindcube_row(["/etc/passwd"])])
  with pytest.raises(BenchmarkFormatError, match=r"row 1 .*field 'images\[0\]': expected a "
                                                 r"path relative to the benchmark folder, got "
                                                 r"the absolute path '/etc/passwd'"):
    read_mindcube(path, check_images=False)
  # A path the OS cannot look up is a format error, not an OSError from inside.
  with pytest.raises(BenchmarkFormatError, match=r"field 'images\[0\]': cannot look up"):
    read("mindcube", tmp, root, ["x" * 300 + ".png"])


# --- The fuzz: a few hundred mutated paths per reader.

PARTS = ["a.png", "sub", "b.png", "..", ".", "", "scene0001_00", "scannet", "secret",
         "secret.png", "~", "\x00", "é", " ", "...", "..a", "a..", "%2e%2e", "\\..", "x" * 300,
         "scene0001_00.mp4"]


def random_path(rng, tmp) -> object:
  roll = rng.random()
  if roll < 0.06:
    return [None, 3, 2.5, [], {}, True][rng.integers(6)]
  parts = [PARTS[rng.integers(len(PARTS))] for _ in range(rng.integers(1, 5))]
  text = "/".join(parts)
  if roll < 0.2:
    text = "/" + text
  elif roll < 0.3:
    text = f"{tmp}/{text}"
  elif roll < 0.35:
    text = f"{tmp}/bench/{text}"
  return text


def inside(root, file: str) -> bool:
  base = os.path.abspath(root)
  full = os.path.normpath(os.path.abspath(file))
  return full != base and os.path.commonpath([full, base]) == base


@pytest.mark.parametrize("kind", ["mindcube", "blink", "scanqa", "vsibench"])
def test_fuzz_paths_stay_inside_or_raise_a_readers_error(layout, kind):
  tmp, root = layout
  rng = np.random.default_rng(["mindcube", "blink", "scanqa", "vsibench"].index(kind))
  fields = {"mindcube": {"images"}, "blink": {"image_1"}, "scanqa": {"scene_id"},
            "vsibench": {"dataset", "scene_name"}}[kind]
  outcomes = {"read": 0, "format": 0, "missing": 0}
  for case in range(150):
    value = random_path(rng, tmp)
    if kind == "mindcube":
      value = [value] + ([random_path(rng, tmp)] if rng.random() < 0.3 else [])
    elif kind == "blink" and rng.random() < 0.3:
      value = {"bytes": None, "path": value}
    elif kind == "vsibench":
      value = (value, "scene0001_00") if rng.random() < 0.5 else ("scannet", value)
    check = bool(rng.random() < 0.8)
    with deadline(2.0):
      try:
        questions = read(kind, tmp, root, value, check)
      except BenchmarkFormatError as error:
        outcomes["format"] += 1
        assert error.field.split("[", 1)[0] in fields | {"images", "<line>"} or (
            kind == "blink" and error.field == "image_1"), (value, error)
        assert f"field {error.field!r}: " in str(error) and error.row >= 1, (value, error)
      except MissingImageError as error:
        outcomes["missing"] += 1
        assert check and inside(root, error.image), (value, error)
      except Exception as error:  # noqa: BLE001 (the point: nothing else may escape)
        pytest.fail(f"{kind} case {case} {value!r:.120}: {type(error).__name__}: {error}")
      else:
        outcomes["read"] += 1
        question = questions[-1]
        files = (question.images if kind != "scanqa"
                 else (str(root / question.scene_id),))
        assert files and all(inside(root, f) for f in files), (value, files)
        if check:
          assert all(os.path.exists(f) for f in files), (value, files)
  assert outcomes["format"] >= 30 and outcomes["read"] + outcomes["missing"] >= 10, outcomes
