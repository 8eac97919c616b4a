"""A benchmark's question files as a careless or hostile publisher writes them: repeated
ids, bytes that are not UTF-8, an empty file, a multiple-choice question with one option,
an image that is a directory or a link to a device, NaN where JSON has no NaN. Each is
refused when the benchmark is built (or read), with one error naming the file, the row
(line), the id and the field; never a later failure or a value stored."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from data_pipelines.builders.spatial_benchmark import build_benchmark
from data_pipelines.readers import (BenchmarkFormatError, read_blink, read_mindcube,
                                    read_scanqa, read_vsibench)


def mindcube_row(record_id="rotation_x_q0", answer="B", images=("a.png",), **change):
  row = {"id": record_id, "category": ["c"], "type": "three_view", "meta_info": [1, 2],
         "question": "Which? A. left B. right", "images": list(images), "gt_answer": answer}
  row.update(change)
  return row


def write_lines(path, lines: list[bytes]):
  path.write_bytes(b"\n".join(lines) + b"\n")
  return path


@pytest.fixture()
def mindcube_folder(tmp_path):
  """<tmp>/src: raw/ for the question file, a.png and b.png (images the rows name)."""
  source = tmp_path / "src"
  (source / "raw").mkdir(parents=True)
  for name in ("a.png", "b.png"):
    Image.fromarray(np.full((8, 8, 3), 90, np.uint8)).save(source / name)
  return source


def build_tiny(source, tmp_path, lines: list[bytes]):
  write_lines(source / "raw" / "MindCube_tinybench.jsonl", lines)
  return build_benchmark("mindcube_tiny", source, tmp_path / "data")


def rows(*records) -> list[bytes]:
  return [json.dumps(r).encode() for r in records]


def refused(error, path, row, record_id, field, *parts):
  message = str(error.value)
  assert isinstance(error.value, BenchmarkFormatError), message
  assert (error.value.path, error.value.row, error.value.record_id, error.value.field) == (
      str(path), row, record_id, field), message
  for part in parts:
    assert part in message, message


def test_a_repeated_id_is_refused_at_build_naming_both_rows(mindcube_folder, tmp_path):
  lines = rows(mindcube_row("rotation_a"), mindcube_row("rotation_b"),
               mindcube_row("rotation_a", answer="A", images=["b.png"]))
  with pytest.raises(BenchmarkFormatError) as error:
    build_tiny(mindcube_folder, tmp_path, lines)
  refused(error, mindcube_folder / "raw" / "MindCube_tinybench.jsonl", 3, "rotation_a", "id",
          "row 1")
  assert not (tmp_path / "data").exists() or not any((tmp_path / "data").rglob("*.array_record*"))


def hostile_readers(tmp_path):
  """(reader of a file of rows, a row of it with id `i`, the id field) for each reader that
  takes ids from the file."""
  (tmp_path / "a.png").write_bytes(b"png")
  (tmp_path / "scene0001_00").mkdir()
  (tmp_path / "scannet").mkdir()
  (tmp_path / "scannet" / "scene0001_00.mp4").write_bytes(b"mp4")
  blink = lambda i: {"idx": i, "question": "Left or right?", "sub_task":
                     "Multi-view_Reasoning", "image_1": "a.png", "choices": ["l", "r"],
                     "answer": "(B)"}
  scanqa = lambda i: {"answers": ["brown"], "object_ids": [1], "object_names": ["chair"],
                      "question": "Colour?", "question_id": i, "scene_id": "scene0001_00"}
  vsi = lambda i: {"id": i, "dataset": "scannet", "scene_name": "scene0001_00",
                   "question_type": "object_rel_direction_easy", "question": "Left?",
                   "options": ["A. left", "B. right"], "ground_truth": "A"}
  return {
      "mindcube": (lambda p: read_mindcube(p, image_root=tmp_path),
                   lambda i: mindcube_row(f"rotation_{i}"), "id", "rotation_{}"),
      "blink": (lambda p: read_blink(p, image_root=tmp_path), blink, "idx", "{}"),
      "scanqa": (lambda p: read_scanqa(p, scene_root=tmp_path), scanqa, "question_id", "{}"),
      "vsibench": (lambda p: read_vsibench(p, video_root=tmp_path), vsi, "id", "{}"),
  }


@pytest.mark.parametrize("kind", ["mindcube", "blink", "scanqa", "vsibench"])
def test_every_reader_refuses_a_repeated_id_naming_both_rows(tmp_path, kind):
  read, row, id_field, shown = hostile_readers(tmp_path)[kind]
  path = write_lines(tmp_path / "q.jsonl", rows(row("7"), row("8"), row("9"), row("8")))
  with pytest.raises(BenchmarkFormatError) as error:
    read(path)
  refused(error, path, 4, shown.format("8"), id_field, "row 2")


def test_bytes_that_are_not_utf8_name_the_line_and_column(mindcube_folder, tmp_path):
  good = rows(mindcube_row("rotation_a"))[0]
  bad = rows(mindcube_row("rotation_b", question="Which? A. caf\u00e9 B. right"))[0]
  bad = bad.replace(b"caf\\u00e9", b"caf\xe9")  # Latin-1, not UTF-8
  with pytest.raises(BenchmarkFormatError) as error:
    build_tiny(mindcube_folder, tmp_path, [good, bad])
  column = bad.index(b"\xe9") + 1
  refused(error, mindcube_folder / "raw" / "MindCube_tinybench.jsonl", 2, None, "<line>",
          "not UTF-8", "0xe9", f"column {column}")


def test_a_json_list_that_is_not_utf8_names_its_line(tmp_path):
  read, row, _, _ = hostile_readers(tmp_path)["scanqa"]
  text = json.dumps([row("1"), row("2")], indent=1).encode()
  cut = text.index(b"Colour", text.index(b'"2"') - 200)
  text = text[:cut] + b"\xff" + text[cut:]
  path = tmp_path / "ScanQA_v1.0_val.json"
  path.write_bytes(text)
  with pytest.raises(BenchmarkFormatError) as error:
    read(path)
  line = text[:cut].count(b"\n") + 1
  refused(error, path, 0, None, "<file>", "not UTF-8", f"line {line}", "0xff")


@pytest.mark.parametrize("content", [b"", b"\n  \n"])
def test_an_empty_question_file_is_named_at_build(mindcube_folder, tmp_path, content):
  path = mindcube_folder / "raw" / "MindCube_tinybench.jsonl"
  path.write_bytes(content)
  with pytest.raises(BenchmarkFormatError) as error:
    build_benchmark("mindcube_tiny", mindcube_folder, tmp_path / "data")
  refused(error, path, 0, None, "<file>", "no records")


def test_an_empty_json_list_is_named(tmp_path):
  read, _, _, _ = hostile_readers(tmp_path)["scanqa"]
  path = tmp_path / "ScanQA_v1.0_val.json"
  path.write_text("[]")
  with pytest.raises(BenchmarkFormatError) as error:
    read(path)
  refused(error, path, 0, None, "<file>", "no records")


@pytest.mark.parametrize("kind", ["mindcube", "blink", "vsibench"])
def test_a_multiple_choice_question_with_one_option_is_named(tmp_path, kind):
  read, row, _, shown = hostile_readers(tmp_path)[kind]
  record = row("1")
  field = {"mindcube": "question", "blink": "choices", "vsibench": "options"}[kind]
  if kind == "mindcube":
    record.update(question="Which? A. left", gt_answer="A")
  elif kind == "blink":
    record.update(choices=["left"], answer="(A)")
  else:
    record.update(options=["A. left"])
  path = write_lines(tmp_path / "q.jsonl", rows(record))
  with pytest.raises(BenchmarkFormatError) as error:
    read(path)
  refused(error, path, 1, shown.format("1"), field, "1 option", "at least two")


@pytest.mark.parametrize("target", ["directory", "device"])
def test_an_image_that_is_not_a_regular_file_is_named_as_such(mindcube_folder, tmp_path,
                                                               target):
  image = mindcube_folder / "odd.png"
  if target == "directory":
    image.mkdir()
  else:
    os.symlink("/dev/zero", image)
  lines = rows(mindcube_row("rotation_a"), mindcube_row("rotation_b", images=["odd.png"]))
  with pytest.raises(BenchmarkFormatError) as error:
    build_tiny(mindcube_folder, tmp_path, lines)
  what = "a directory" if target == "directory" else "not a regular file"
  refused(error, mindcube_folder / "raw" / "MindCube_tinybench.jsonl", 2, "rotation_b",
          "images[0]", what)
  assert "not found" not in str(error.value)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_is_refused_naming_the_field_it_sits_in(mindcube_folder, tmp_path, constant):
  bad = rows(mindcube_row("rotation_b", meta_info={"angles": [1.0, 0.5]}))[0]
  bad = bad.replace(b"0.5", constant.encode())
  with pytest.raises(BenchmarkFormatError) as error:
    build_tiny(mindcube_folder, tmp_path, rows(mindcube_row("rotation_a")) + [bad])
  refused(error, mindcube_folder / "raw" / "MindCube_tinybench.jsonl", 2, "rotation_b",
          "meta_info.angles[1]", constant, "not JSON")


def test_hrbench_and_sqa3d_name_bytes_that_are_not_utf8(tmp_path):
  from data_pipelines.readers import read_hrbench, read_sqa3d  # pylint: disable=import-outside-toplevel
  tsv = tmp_path / "hr_bench_4k.tsv"
  head = b"index\tquestion\tanswer\tcategory\timage\tA\tB\n"
  tsv.write_bytes(head + b"1\tWhich?\tA\tsingle\t2\tleft\tright\n"
                  + b"2\tWh\xf8ich?\tA\tsingle\t1\tleft\tright\n")
  with pytest.raises(BenchmarkFormatError) as error:
    read_hrbench(tsv)
  refused(error, tsv, 2, "2", "question", "not UTF-8", "0xf8", "character 3")
  annotations = tmp_path / "v1_balanced_sqa_annotations_test_scannetv2.json"
  annotations.write_bytes(b'{"annotations": [\n{"question_id": 1, "scene_id": "\xc0"}]}')
  with pytest.raises(BenchmarkFormatError) as error:
    read_sqa3d(tmp_path / "questions.json", annotations)
  refused(error, annotations, 0, None, "<file>", "not UTF-8", "0xc0", "line 2")


def test_hrbench_with_one_option_names_the_missing_column(tmp_path):
  from data_pipelines.readers import read_hrbench  # pylint: disable=import-outside-toplevel
  import base64  # pylint: disable=import-outside-toplevel
  import io  # pylint: disable=import-outside-toplevel
  png = io.BytesIO()
  Image.fromarray(np.full((32, 32, 3), 90, np.uint8)).save(png, "PNG")
  picture = base64.b64encode(png.getvalue()).decode()
  tsv = tmp_path / "hr_bench_4k.tsv"
  tsv.write_text("index\tquestion\tanswer\tcategory\timage\tA\tB\n"
                 f"1\tWhich?\tA\tsingle\t{picture}\tleft\t\n")
  with pytest.raises(BenchmarkFormatError) as error:
    read_hrbench(tsv)
  refused(error, tsv, 1, "1", "B", "1 option", "at least two")
