"""Image benchmarks -> BenchmarkScene records: the real MindCube-Tiny question file over
small generated images (every question, per-setting counts, letterboxing against PIL, a
missing image), Think3D caches from a manifest, and BLINK, VSI-Bench (tiny mp4 files),
ChartQA and HR-Bench in their published layouts; malformed rows name file, row and field."""

import base64
import collections
import csv
import io
import json
import pathlib

import numpy as np
import pytest
from PIL import Image

from data_pipelines.benchmarks.images import (MAX_ANSWER_BYTES, MAX_QUESTION_BYTES,
                                              SceneCacheError, blink_scenes, chartqa_scenes,
                                              frame_indices, hrbench_scenes, mindcube_scenes,
                                              vsibench_scenes)
from data_pipelines.benchmarks.scene import nominal_cameras
from data_pipelines.caches import write_think3d_cache
from data_pipelines.readers import (BenchmarkFormatError, MissingImageError, read_chartqa,
                                    read_hrbench)
from data_pipelines.scene_caches import MANIFEST, cache_name
from jaxspatial.geometry import PointCloud

SHARED = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data" / "benchmarks"
MINDCUBE_TINY = SHARED / "mindcube_tiny_questions.jsonl"
W, H = 32, 24  # the letterboxed views' size in these tests


def boxed(image: np.ndarray, width: int = W, height: int = H) -> np.ndarray:
  """The expected view: PIL's bicubic resize to fit, pasted centred on a black canvas."""
  h, w = image.shape[:2]
  scale = min(width / w, height / h)
  size = (max(1, round(w * scale)), max(1, round(h * scale)))
  picture = Image.fromarray(image)
  if size != (w, h):
    picture = picture.resize(size, Image.BICUBIC)
  canvas = Image.new("RGB", (width, height))
  canvas.paste(picture, ((width - size[0]) // 2, (height - size[1]) // 2))
  return np.asarray(canvas)


def pixels(path) -> np.ndarray:
  with Image.open(path) as image:
    return np.asarray(image.convert("RGB"))


def picture(seed: int, h: int, w: int) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def png_bytes(image: np.ndarray) -> bytes:
  buffer = io.BytesIO()
  Image.fromarray(image).save(buffer, format="PNG")
  return buffer.getvalue()


def write_jsonl(path, rows) -> pathlib.Path:
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


def write_images(root: pathlib.Path, names, seed: int = 0) -> None:
  """A small picture at each path (its size varies, so both letterbox bars occur)."""
  for k, name in enumerate(sorted(names)):
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(picture(seed + k, 6 + k % 9, 5 + (3 * k) % 11)).save(path)


def scene_questions(scenes):
  return [q for s in scenes for q in s.questions]


# -- MindCube-Tiny, the real question file ----------------------------------------------------

@pytest.fixture(scope="module")
def mindcube_tiny(tmp_path_factory):
  if not MINDCUBE_TINY.is_file():
    pytest.skip(f"{MINDCUBE_TINY} is not present")
  rows = [json.loads(line) for line in MINDCUBE_TINY.open() if line.strip()]
  root = tmp_path_factory.mktemp("MindCube")
  write_images(root, {name for row in rows for name in row["images"]})
  return rows, root


def test_mindcube_tiny_every_question_one_scene_per_image_list(mindcube_tiny):
  rows, root = mindcube_tiny
  scenes = list(mindcube_scenes(MINDCUBE_TINY, root, benchmark="mindcube_tiny", width=W,
                                height=H))
  questions = scene_questions(scenes)
  assert len(rows) == 1050 and len(questions) == 1050
  assert sorted(q["question_id"] for q in questions) == sorted(r["id"] for r in rows)
  counted = collections.Counter(r["id"].split("_", 1)[0] for r in rows)
  assert counted == {"among": 600, "around": 250, "rotation": 200}
  assert collections.Counter(q["category"] for q in questions) == counted
  assert len(scenes) == len({tuple(r["images"]) for r in rows})

  by_id = {r["id"]: r for r in rows}
  expected_views = {}
  for scene in scenes:
    assert scene.benchmark == "mindcube_tiny" and scene.geometry == "none"
    lists = {tuple(by_id[q["question_id"]]["images"]) for q in scene.questions}
    assert len(lists) == 1  # one image list per scene
    (names,) = lists
    assert len(scene.images) == len(names)
    for name, view in zip(names, scene.images):
      if name not in expected_views:
        expected_views[name] = boxed(pixels(root / name))
      np.testing.assert_array_equal(view, expected_views[name], err_msg=name)
    intrinsics, poses = nominal_cameras(len(names), W, H)
    np.testing.assert_array_equal(scene.intrinsics, intrinsics)
    np.testing.assert_array_equal(scene.world_from_camera, poses)
    assert scene.xyz.shape == (0, 3)
    for q in scene.questions:
      row = by_id[q["question_id"]]
      assert q["question"] == row["question"] and q["answer"] == row["gt_answer"]
      assert q["answers"] == [row["gt_answer"]] and q["category"] == row["id"].split("_")[0]
      assert q["views"] == list(range(len(names))) and q["initial_view"] == 0
      assert q["answer_objects"] == [] and q["needs_exploration"] is True
      assert q["answer_text"] == q["options"]["ABCDEF".index(q["answer"])]
  assert len(expected_views) == len({n for r in rows for n in r["images"]})

  first = next(q for q in questions if q["question_id"] == rows[0]["id"])
  assert first["options"] == ["TV", "Wooden dining table", "Light purple sofa",
                              "Brown curtains and windows"]
  assert first["answer"] == "C" and first["answer_text"] == "Light purple sofa"
  record = scenes[0].example(0)
  assert json.loads(record["questions"]) == scenes[0].questions
  assert len(record["images"]) == len(scenes[0].images)


def test_mindcube_tiny_missing_image_names_its_path(mindcube_tiny):
  rows, root = mindcube_tiny
  name = rows[5]["images"][1]
  moved = root / (name + ".away")
  (root / name).rename(moved)
  row = next(k for k, r in enumerate(rows, 1) if name in r["images"])
  try:
    with pytest.raises(MissingImageError, match=rf"row {row} \(id '{rows[row - 1]['id']}'\), "
                       "field 'images': image not found") as error:
      mindcube_scenes(MINDCUBE_TINY, root, benchmark="mindcube_tiny", width=W, height=H)
    assert str(error.value).endswith(str(root / name))
  finally:
    moved.rename(root / name)


# -- Think3D caches ---------------------------------------------------------------------------

def mindcube_row(qid, images, question="Which is left? A. chair B. table", answer="A"):
  return {"id": qid, "category": ["c"], "type": "two_view", "meta_info": [],
          "question": question, "images": images, "gt_answer": answer}


@pytest.fixture()
def small_mindcube(tmp_path):
  root = tmp_path / "MindCube"
  names = ["v/a.png", "v/b.png", "v/c.jpg"]
  write_images(root, names, seed=7)
  ab, ca = ["v/a.png", "v/b.png"], ["v/c.jpg", "v/a.png"]
  path = write_jsonl(root / "q.jsonl", [mindcube_row("among_x_q0", ab),
                                        mindcube_row("around_y_q0", ca, answer="B"),
                                        mindcube_row("among_x_q1", ab, answer="B")])
  return path, root, tuple(ab), tuple(ca)


def write_cache(folder: pathlib.Path, images, seed: int):
  rng = np.random.default_rng(seed)
  xyz = rng.normal(size=(50, 3)).astype(np.float32)
  rgb = rng.integers(0, 256, (50, 3), dtype=np.uint8)
  poses = np.tile(np.eye(4, dtype=np.float32), (len(images), 1, 1))
  poses[:, :3, 3] = rng.normal(size=(len(images), 3))
  write_think3d_cache(folder / cache_name(images), PointCloud.create(xyz, rgb), poses, images)
  return xyz, rgb, poses


def write_manifest(folder: pathlib.Path, done, failed=()):
  """The manifest as scene_caches.build_scene_caches writes it."""
  (folder / MANIFEST).write_text(json.dumps({
      "format": "think3d-cache", "backend": "Test",
      "sets": [{"images": list(s), "cache": cache_name(s), "questions": []} for s in done],
      "failed": [{"images": list(s), "error": "RuntimeError: no points"} for s in failed]}))


def test_think3d_caches_give_the_cloud_and_poses(small_mindcube, tmp_path):
  path, root, ab, ca = small_mindcube
  caches = tmp_path / "caches"
  clouds = {ab: write_cache(caches, ab, 1), ca: write_cache(caches, ca, 2)}
  write_manifest(caches, [ab, ca])
  scenes = list(mindcube_scenes(path, root, width=W, height=H, caches=caches))
  assert [len(s.questions) for s in scenes] == [2, 1]
  for scene, key in zip(scenes, (ab, ca)):
    xyz, rgb, poses = clouds[key]
    assert scene.geometry == "reconstruction" and scene.scene_id == cache_name(key)[:-4]
    np.testing.assert_array_equal(scene.xyz, xyz)
    np.testing.assert_array_equal(scene.rgb, rgb)
    assert scene.rgb.dtype == np.uint8 and np.all(scene.instance == -1)
    np.testing.assert_allclose(scene.world_from_camera, poses)
    np.testing.assert_array_equal(scene.intrinsics, nominal_cameras(2, W, H)[0])
    for name, view in zip(key, scene.images):
      np.testing.assert_array_equal(view, boxed(pixels(root / name)))
    record = scene.example(3)
    assert record["xyz"].shape == (50, 3) and record["geometry"] == "reconstruction"


def test_think3d_caches_failed_or_absent_sets_are_named(small_mindcube, tmp_path):
  path, root, ab, ca = small_mindcube
  caches = tmp_path / "caches"
  write_cache(caches, ab, 1)
  write_manifest(caches, [ab], failed=[ca])
  with pytest.raises(SceneCacheError) as error:
    mindcube_scenes(path, root, width=W, height=H, caches=caches)
  assert "'v/c.jpg', 'v/a.png'" in str(error.value) and str(caches) in str(error.value)
  assert "failed" in str(error.value) and "no points" in str(error.value)
  write_manifest(caches, [ab])
  with pytest.raises(SceneCacheError, match=r"'v/c.jpg', 'v/a.png'.*not in the caches") as e:
    mindcube_scenes(path, root, width=W, height=H, caches=caches)
  assert str(caches) in str(e.value) and cache_name(ca) in str(e.value)
  with pytest.raises(SceneCacheError, match="no manifest.json"):
    mindcube_scenes(path, root, width=W, height=H, caches=tmp_path / "empty")


# -- limits -------------------------------------------------------------------------------------

def test_limits_name_the_row(small_mindcube, tmp_path):
  _, root, ab, _ = small_mindcube
  long_text = "Which? " + "é" * 600 + " A. chair B. table"  # 600 characters, 1200 bytes
  assert len(long_text) < MAX_QUESTION_BYTES < len(long_text.encode())
  path = write_jsonl(tmp_path / "long.jsonl", [mindcube_row("among_a_q0", list(ab)),
                                               mindcube_row("among_b_q0", list(ab),
                                                            question=long_text)])
  with pytest.raises(BenchmarkFormatError, match=r"long.jsonl: row 2 \(id 'among_b_q0'\), "
                     r"field 'question': the question text takes 1225 UTF-8 bytes"):
    mindcube_scenes(path, root, width=W, height=H)
  long_option = f"Which? A. {'x' * (MAX_ANSWER_BYTES + 1)} B. table"
  path = write_jsonl(tmp_path / "option.jsonl", [mindcube_row("among_c_q0", list(ab),
                                                              question=long_option)])
  with pytest.raises(BenchmarkFormatError, match=r"row 1 \(id 'among_c_q0'\).*option text "
                     "takes 193 UTF-8 bytes"):
    mindcube_scenes(path, root, width=W, height=H)
  nine = [ab[k % 2] for k in range(9)]
  path = write_jsonl(tmp_path / "nine.jsonl", [mindcube_row("among_a_q0", list(ab)),
                                               mindcube_row("among_a_q1", list(ab)),
                                               mindcube_row("rotation_z_q0", nine)])
  with pytest.raises(BenchmarkFormatError, match=r"nine.jsonl: row 3 \(id 'rotation_z_q0'\), "
                     r"field 'images': 9 images; a scene holds at most 8"):
    mindcube_scenes(path, root, width=W, height=H)


# -- BLINK --------------------------------------------------------------------------------------

def blink_row(idx, images, prompt="", task="Multi-view_Reasoning", answer="(B)"):
  row = {"idx": idx, "question": "Is the camera moving left or right?", "sub_task": task,
         "choices": ["left", "right"], "answer": answer, "prompt": prompt}
  row.update({f"image_{k + 1}": image for k, image in enumerate(images)})
  return row


def test_blink_multi_view_files_and_embedded_images(tmp_path):
  root = tmp_path / "BLINK"
  write_images(root, ["a.png", "b.png", "c.png"], seed=3)
  prompt = ("The images are frames from a video. Is the camera moving left or right? "
            "Select from the following choices.\n(A) left\n(B) right")
  path = write_jsonl(root / "val.jsonl", [
      blink_row("val_Multi-view_Reasoning_1", ["a.png", "b.png"], prompt),
      blink_row("val_Counting_1", ["c.png"], task="Counting", answer="(A)"),
      blink_row("val_Multi-view_Reasoning_2", ["a.png", "b.png"], answer="(A)"),
      blink_row("val_Multi-view_Reasoning_3", ["b.png", "c.png"], prompt)])
  scenes = list(blink_scenes(path, width=W, height=H))
  assert [[q["question_id"] for q in s.questions] for s in scenes] == [
      ["val_Multi-view_Reasoning_1", "val_Multi-view_Reasoning_2"],
      ["val_Multi-view_Reasoning_3"]]
  first, second = scenes[0].questions
  assert all(s.benchmark == "blink_mv" for s in scenes)
  assert first["question"] == prompt and first["answer"] == "B"
  assert first["answer_text"] == "right" and first["options"] == ["left", "right"]
  assert first["category"] == "Multi-view_Reasoning" and first["views"] == [0, 1]
  assert second["question"] == ("Is the camera moving left or right?\nSelect from the "
                                "following choices.\n(A) left\n(B) right")
  assert second["answer"] == "A" and second["answer_text"] == "left"
  for scene, names in zip(scenes, (["a.png", "b.png"], ["b.png", "c.png"])):
    for name, view in zip(names, scene.images):
      np.testing.assert_array_equal(view, boxed(pixels(root / name)))

  pa = pytest.importorskip("pyarrow")
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  images = [picture(11, 9, 14), picture(12, 20, 7)]
  embedded = [{"bytes": png_bytes(i), "path": f"{k}.png"} for k, i in enumerate(images)]
  pq.write_table(pa.Table.from_pylist([
      blink_row("val_Multi-view_Reasoning_1", embedded, prompt),
      blink_row("val_Multi-view_Reasoning_2", embedded + [None, None])]),
      tmp_path / "blink.parquet")
  (scene,) = list(blink_scenes(tmp_path / "blink.parquet", width=W, height=H))
  assert len(scene.questions) == 2 and scene.geometry == "none"
  for image, view in zip(images, scene.images):
    np.testing.assert_array_equal(view, boxed(image))
  with pytest.raises(SceneCacheError, match="embeds its images"):
    blink_scenes(tmp_path / "blink.parquet", width=W, height=H, caches=tmp_path)


def test_blink_bad_rows_name_file_row_field(tmp_path):
  root = tmp_path / "BLINK"
  write_images(root, ["a.png", "b.png"], seed=3)
  path = write_jsonl(root / "val.jsonl", [
      blink_row("v1", ["a.png", "b.png"]), blink_row("v2", ["a.png", "b.png"], answer="(C)")])
  with pytest.raises(BenchmarkFormatError, match=r"val.jsonl: row 2 \(id 'v2'\), "
                     "field 'answer'"):
    blink_scenes(path, width=W, height=H)
  (root / "b.png").write_bytes(b"not a picture")
  scenes = blink_scenes(write_jsonl(root / "ok.jsonl", [blink_row("v1", ["a.png", "b.png"])]),
                        width=W, height=H)
  with pytest.raises(BenchmarkFormatError, match=r"ok.jsonl: row 1 \(id 'v1'\), field "
                     r"'image_2': cannot read the image .*b.png"):
    list(scenes)


# -- VSI-Bench ----------------------------------------------------------------------------------

def write_mp4(path: pathlib.Path, frames) -> None:
  av = pytest.importorskip("av")
  path.parent.mkdir(parents=True, exist_ok=True)
  with av.open(str(path), "w") as out:
    stream = out.add_stream("mpeg4", rate=10)
    stream.height, stream.width = frames[0].shape[:2]
    stream.pix_fmt = "yuv420p"
    for frame in frames:
      out.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
    out.mux(stream.encode(None))


def decoded(path) -> list[np.ndarray]:
  av = pytest.importorskip("av")
  with av.open(str(path)) as video:
    return [f.to_ndarray(format="rgb24") for f in video.decode(video=0)]


def clip(count: int, h: int = 24, w: int = 40) -> list[np.ndarray]:
  """Frame k: grey level 10 k plus a fixed texture, recognisable after compression."""
  texture = (np.arange(w)[None, :, None] % 4 * 2).astype(np.int32)
  return [np.broadcast_to(np.clip(10 * k + texture, 0, 255), (h, w, 3)).astype(np.uint8)
          for k in range(count)]


def test_frame_indices_rule():
  assert frame_indices(20, 7) == [0, 3, 6, 10, 13, 16, 19]
  assert frame_indices(8, 7) == [0, 1, 2, 4, 5, 6, 7]  # 3.5 rounds up
  assert frame_indices(5, 7) == [0, 1, 2, 3, 4]
  assert frame_indices(1, 7) == [0]
  with pytest.raises(ValueError):
    frame_indices(0, 7)


def test_vsibench_seven_frames_per_video(tmp_path):
  videos = tmp_path / "videos"
  write_mp4(videos / "scannet" / "scene0001_00.mp4", clip(20))
  write_mp4(videos / "arkitscenes" / "42.mp4", clip(8, 30, 16))
  rows = [
      {"id": 1, "dataset": "scannet", "scene_name": "scene0001_00",
       "question_type": "object_rel_direction_easy", "question": "Is the sofa left of the bed?",
       "options": ["A. left", "B. right"], "ground_truth": "B"},
      {"id": 2, "dataset": "arkitscenes", "scene_name": "42", "question_type": "object_counting",
       "question": "How many chair(s) are in this room?", "options": None, "ground_truth": "4"},
      {"id": 3, "dataset": "scannet", "scene_name": "scene0001_00",
       "question_type": "object_abs_distance", "question": "How far apart?", "options": None,
       "ground_truth": 1.5}]
  path = write_jsonl(tmp_path / "test.jsonl", rows)
  scenes = list(vsibench_scenes(path, videos, width=W, height=H))
  assert [s.scene_id for s in scenes] == ["scannet/scene0001_00", "arkitscenes/42"]
  assert [[q["question_id"] for q in s.questions] for s in scenes] == [["1", "3"], ["2"]]
  for scene, video, indices in ((scenes[0], "scannet/scene0001_00.mp4",
                                 [0, 3, 6, 10, 13, 16, 19]),
                                (scenes[1], "arkitscenes/42.mp4", [0, 1, 2, 4, 5, 6, 7])):
    frames = decoded(videos / video)
    assert len(scene.images) == 7
    for k, view in zip(indices, scene.images):
      np.testing.assert_array_equal(view, boxed(frames[k]))
      assert abs(float(frames[k].mean()) - (10 * k + 3)) < 5  # it is frame k (10 apart)
    assert all(q["views"] == list(range(7)) for q in scene.questions)
  mca, distance = scenes[0].questions
  assert mca["question"] == "Is the sofa left of the bed?\nOptions:\nA. left\nB. right"
  assert mca["options"] == ["left", "right"] and mca["answer_text"] == "right"
  assert mca["category"] == "object_rel_direction_easy"
  assert distance["question"] == "How far apart?" and distance["options"] == []
  assert distance["answer"] == distance["answer_text"] == "1.5"
  assert distance["answers"] == ["1.5"]
  assert scenes[1].questions[0]["answer"] == "4"

  (videos / "scannet" / "scene0001_00.mp4").write_bytes(b"\x00" * 100)
  with pytest.raises(BenchmarkFormatError, match=r"test.jsonl: row 1 \(id '1'\), field "
                     r"'scene_name': video .*scene0001_00.mp4"):
    list(vsibench_scenes(path, videos, width=W, height=H))
  with pytest.raises(ValueError, match="frames"):
    vsibench_scenes(path, videos, frames=9)
  with pytest.raises(SceneCacheError, match="sampled from videos"):
    vsibench_scenes(path, videos, caches=tmp_path)


# -- ChartQA ------------------------------------------------------------------------------------

def test_chartqa_layout_one_scene_per_chart(tmp_path):
  root = tmp_path / "ChartQA Dataset"
  write_images(root / "test" / "png", ["41699051005347.png", "8127.png"], seed=5)
  (root / "test" / "test_human.json").write_text(json.dumps([
      {"imgname": "41699051005347.png", "query": "How many food item is shown in the bar "
       "graph?", "label": "14"},
      {"imgname": "8127.png", "query": "What's the value of the lowest bar?", "label": 23}]))
  (root / "test" / "test_augmented.json").write_text(json.dumps([
      {"imgname": "41699051005347.png", "query": "Which item has the highest value?",
       "label": "Lamb"}]))
  scenes = list(chartqa_scenes(root, width=W, height=H))
  assert [s.scene_id for s in scenes] == [cache_name(("test/png/41699051005347.png",))[:-4],
                                          cache_name(("test/png/8127.png",))[:-4]]
  assert [[q["question_id"] for q in s.questions] for s in scenes] == [
      ["test_human_1", "test_augmented_1"], ["test_human_2"]]
  human, augmented = scenes[0].questions
  assert human["category"] == "human" and augmented["category"] == "augmented"
  assert human["question"] == "How many food item is shown in the bar graph?"
  assert human["options"] == [] and human["answer"] == human["answer_text"] == "14"
  assert scenes[1].questions[0]["answers"] == ["23"]
  np.testing.assert_array_equal(scenes[1].images[0],
                                boxed(pixels(root / "test" / "png" / "8127.png")))
  counts = collections.Counter(q.category for q in read_chartqa(root))
  assert counts == {"human": 2, "augmented": 1}

  (root / "test" / "test_augmented.json").write_text(json.dumps([
      {"imgname": "8127.png", "query": "Which?", "label": "x" * (MAX_ANSWER_BYTES + 1)}]))
  with pytest.raises(BenchmarkFormatError, match=r"test_augmented.json: row 1 \(id "
                     r"'test_augmented_1'\), field 'label': the answer takes 193"):
    chartqa_scenes(root, width=W, height=H)
  (root / "test" / "test_augmented.json").write_text(json.dumps([
      {"imgname": "8127.png", "query": "Which?"}]))
  with pytest.raises(BenchmarkFormatError, match=r"test_augmented.json: row 1 \(id "
                     r"'test_augmented_1'\), field 'label': missing"):
    read_chartqa(root)
  (root / "test" / "test_augmented.json").write_text(json.dumps([
      {"imgname": "gone.png", "query": "Which?", "label": "1"}]))
  with pytest.raises(MissingImageError, match=r"row 1 .*image not found: .*test/png/gone.png"):
    read_chartqa(root)


# -- HR-Bench -----------------------------------------------------------------------------------

HR_COLUMNS = ["index", "question", "answer", "category", "A", "B", "C", "D", "image",
              "cycle_category"]


def write_tsv(path: pathlib.Path, rows) -> pathlib.Path:
  with path.open("w", newline="") as f:
    writer = csv.writer(f, delimiter="\t")
    writer.writerow(HR_COLUMNS)
    for row in rows:
      writer.writerow([row.get(c, "") for c in HR_COLUMNS])
  return path


def hr_rows(first: np.ndarray, second: np.ndarray):
  options = ["red", "green", "blue", "black"]
  rows = []
  for cycle in range(4):  # the question repeated with its options rotated
    rotated = options[cycle:] + options[:cycle]
    rows.append({"index": cycle, "question": "What colour is the car?",
                 "answer": "ABCD"[rotated.index("blue")], "category": "single_instance",
                 **dict(zip("ABCD", rotated)), "cycle_category": f"cycle_{cycle}",
                 "image": base64.b64encode(png_bytes(first)).decode() if cycle == 0 else "0"})
  rows.append({"index": 4, "question": "Is the bus left\tof the shop?", "answer": "A",
               "category": "cross_instance", "A": "yes", "B": "no",
               "cycle_category": "cycle_0", "image": base64.b64encode(png_bytes(second)).decode()})
  return rows


def test_hrbench_tsv_one_scene_per_picture(tmp_path):
  first, second = picture(21, 40, 64), picture(22, 30, 30)
  path = write_tsv(tmp_path / "hr_bench_4k.tsv", hr_rows(first, second))
  scenes = list(hrbench_scenes(path, benchmark="hrbench_4k", width=W, height=H))
  assert [len(s.questions) for s in scenes] == [4, 1]
  np.testing.assert_array_equal(scenes[0].images[0], boxed(first))
  np.testing.assert_array_equal(scenes[1].images[0], boxed(second))
  q0, q1 = scenes[0].questions[:2]
  assert q0["question"] == ("What colour is the car?\nOptions:\nA. red\nB. green\nC. blue\n"
                            "D. black")
  assert q0["answer"] == "C" and q1["answer"] == "B"
  assert q0["answer_text"] == q1["answer_text"] == "blue"
  assert q0["category"] == "single_instance" and q0["views"] == [0]
  (cross,) = scenes[1].questions
  assert cross["options"] == ["yes", "no"] and cross["category"] == "cross_instance"
  assert cross["question"] == "Is the bus left\tof the shop?\nOptions:\nA. yes\nB. no"
  questions = read_hrbench(path)
  assert [q.meta["cycle_category"] for q in questions] == [
      "cycle_0", "cycle_1", "cycle_2", "cycle_3", "cycle_0"]
  assert questions[1].meta["image_bytes"][0] is questions[0].meta["image_bytes"][0]


@pytest.mark.parametrize("change, field, problem", [
    ({"answer": "E"}, "answer", "expected one of the option letters"),
    ({"image": "!" * 80}, "image", "not base64"),
    ({"image": "99"}, "image", "'99' is neither base64 image data nor the index"),
    ({"C": ""}, "D", "option D follows the empty option C"),
    ({"question": " "}, "question", "empty"),
])
def test_hrbench_bad_rows_name_file_row_field(tmp_path, change, field, problem):
  rows = hr_rows(picture(21, 8, 8), picture(22, 8, 8))
  rows[2].update(change)
  path = write_tsv(tmp_path / "hr_bench_8k.tsv", rows)
  with pytest.raises(BenchmarkFormatError, match=rf"hr_bench_8k.tsv: row 3 \(id '2'\), "
                     rf"field '{field}': {problem}"):
    read_hrbench(path)


def test_hrbench_missing_column_and_bad_picture(tmp_path):
  path = tmp_path / "hr.tsv"
  path.write_text("index\tquestion\tanswer\tA\tB\timage\n0\tq\tA\tx\ty\t" + "QUJD" * 20 + "\n")
  with pytest.raises(BenchmarkFormatError, match=r"row 1 \(id '0'\), field 'category': "
                     "missing"):
    read_hrbench(path)
  rows = hr_rows(picture(21, 8, 8), picture(22, 8, 8))
  rows[4]["image"] = base64.b64encode(b"not a picture" * 8).decode()
  scenes = hrbench_scenes(write_tsv(tmp_path / "bad.tsv", rows), width=W, height=H)
  next(scenes)
  with pytest.raises(BenchmarkFormatError, match=r"bad.tsv: row 5 \(id '4'\), field 'image': "
                     "cannot read the embedded image"):
    next(scenes)
