"""Hostile dataset records and trajectory files: every record the loader turns into tasks,
and every trajectory SFT pairs with a scene's question, is checked; a bad one raises an
error naming the scene (or file and line), the field, what was expected and what it got.

The records are built in memory in the stored format (what the ArrayRecord data source
decodes: numpy arrays of the builder's dtypes, bytes for text, a list of decoded views),
so no TFDS dataset is built here; tests/data_pipelines/test_dataset.py runs the real one.
"""

import copy
import json
import time

import numpy as np
import pytest

pytest.importorskip("grain")

from data_pipelines import loader  # noqa: E402
from data_pipelines.loader import RecordError, check_example, scene_tasks, task_batches  # noqa: E402
from data_pipelines.synthetic import teachers  # noqa: E402
from data_pipelines.synthetic.questions import LETTERS  # noqa: E402
from data_pipelines.synthetic.teachers import TrajectoryError, read_trajectories  # noqa: E402
from jaxspatial.envs import decode_text  # noqa: E402
from tests.deadline import deadline

SEED = 10000042
WIDTH, HEIGHT = 32, 24


def yaw_pose(angle: float, position) -> np.ndarray:
  c, s = np.cos(angle), np.sin(angle)
  pose = np.eye(4, dtype=np.float32)
  pose[:3, :3] = [[c, 0, s], [s, 0, -c], [0, 1, 0]]  # camera z forward, horizontal
  pose[:3, 3] = position
  return pose


def stored_example(seed: int = SEED, views: int = 3, points: int = 600) -> dict:
  """One scene in the stored format: 3 objects, `views` cameras, 3 questions (multiple
  choice, open, open with several reference answers)."""
  rng = np.random.default_rng(seed)
  instance = rng.integers(-1, 3, points).astype(np.int32)
  instance[:3] = [0, 1, 2]
  questions = [
      {"family": "relative_direction", "question": "From view 1, what is left of the red box? "
       "A. blue barrel B. green chair C. red box", "options": ["blue barrel", "green chair",
                                                             "red box"],
       "answer": "B", "answer_text": "green chair", "answer_objects": [1], "views": [0, 1],
       "initial_view": 1, "needs_exploration": False},
      {"family": "open_direction", "question": "What is to the left of the blue barrel?",
       "options": [], "answer": "red box", "answer_text": "red box", "answer_objects": [0, 2],
       "views": [2], "initial_view": views - 1, "needs_exploration": True},
      {"family": "count", "question": "How many chairs are in the room?", "options": [],
       "answer": "one", "answer_text": "one", "answers": ["one", "1", "a single chair"],
       "answer_objects": [], "views": [0], "initial_view": 0, "needs_exploration": False},
  ]
  return {
      "scene_seed": seed,
      "rig": b"around",
      "xyz": rng.uniform([-2, -2, 0], [2, 2, 2.5], (points, 3)).astype(np.float32),
      "rgb": rng.integers(0, 256, (points, 3)).astype(np.uint8),
      "instance": instance,
      "scene_min": np.array([-2, -2, 0], np.float32),
      "scene_max": np.array([2, 2, 2.5], np.float32),
      "images": [rng.integers(0, 256, (HEIGHT, WIDTH, 3)).astype(np.uint8)
                 for _ in range(views)],
      "depth": rng.uniform(0.5, 4, (views, HEIGHT, WIDTH)).astype(np.float32),
      "intrinsics": np.tile(np.array([[30, 30, (WIDTH - 1) / 2, (HEIGHT - 1) / 2]],
                                     np.float32), (views, 1)),
      "world_from_camera": np.stack([yaw_pose(2 * np.pi * v / views, [0, 0, 1.5])
                                     for v in range(views)]),
      "object_names": [b"red box", b"green chair", b"blue barrel"],
      "object_centres": np.array([[1, 1, 0.5], [-1, 1, 0.5], [0, -1, 0.5]], np.float32),
      "questions": json.dumps(questions).encode(),
  }


def test_an_ordinary_record_loads_unchanged():
  example = stored_example()
  tasks = scene_tasks(example, input_images=True)
  assert len(tasks) == 3
  (mc, meta), (open_, _), (several, _) = tasks
  n = len(example["xyz"])
  np.testing.assert_array_equal(mc.cloud.xyz[:n], example["xyz"])
  np.testing.assert_array_equal(mc.cloud.rgb[:n], example["rgb"])
  np.testing.assert_array_equal(mc.cloud.instance[:n], example["instance"])
  assert mc.cloud.valid.sum() == n and (mc.cloud.instance[n:] == -1).all()
  assert int(mc.answer_choice) == 1 and int(open_.answer_choice) == -1
  np.testing.assert_array_equal(mc.answer_objects, [1, -1, -1, -1])
  np.testing.assert_array_equal(open_.answer_objects, [0, 2, -1, -1])
  np.testing.assert_array_equal(mc.initial_camera.world_from_camera,
                                example["world_from_camera"][1])
  np.testing.assert_array_equal(open_.initial_camera.world_from_camera,
                                example["world_from_camera"][2])
  assert [decode_text(r) for r in several.answer_ids if r[0] >= 0] == ["one", "1",
                                                                       "a single chair"]
  assert decode_text(mc.question_ids).startswith("From view 1")
  assert int(meta["scene_seed"]) == SEED and mc.input_images.shape == (8, HEIGHT, WIDTH, 3)


def _question(k: int, **change):
  def mutate(example):
    questions = json.loads(example["questions"])
    questions[k].update(change)
    example["questions"] = json.dumps(questions).encode()
  return mutate


def _set(name, value):
  def mutate(example):
    example[name] = value(example[name]) if callable(value) else value
  return mutate


def _rigid_scaled(poses):
  poses = poses.copy()
  poses[1, :3, :3] *= 2
  return poses


HOSTILE = [  # (mutation, field, what the message says)
    (_set("rgb", lambda a: a[:-10]), "rgb", "expected 600 rows (one per xyz point), got 590"),
    (_set("instance", lambda a: a[:-1]), "instance",
     "expected 600 rows (one per xyz point), got 599"),
    (_set("rgb", lambda a: a.astype(np.float32)), "rgb", "expected dtype uint8, got float32"),
    (_set("xyz", lambda a: a.astype(np.float64)), "xyz", "expected dtype float32, got float64"),
    (_set("xyz", lambda a: a.reshape(-1)), "xyz", "expected shape [N, 3], got (1800,)"),
    (_set("xyz", lambda a: np.where(np.arange(600)[:, None] == 5, np.nan, a).astype(np.float32)),
     "xyz", "expected finite values, got nan at index (5, 0)"),
    (_set("instance", lambda a: np.where(a == 2, 5, a).astype(np.int32)), "instance",
     "expected object ids -1..2 (3 objects), -1 for none, got 5"),
    (_set("intrinsics", lambda a: a[:2]), "intrinsics",
     "expected 3 rows (one per camera of world_from_camera), got 2"),
    (_set("world_from_camera", lambda a: np.concatenate([a] * 3)), "world_from_camera",
     "expected 1..8 views, got 9"),
    (_set("world_from_camera", _rigid_scaled), "world_from_camera",
     "expected rigid camera-to-world poses"),
    (_set("images", lambda a: a[:2]), "images", "expected 3 views (one per camera), got 2"),
    (_set("scene_seed", True), "scene_seed", "expected an integer, got bool True"),
    (_set("questions", b'[{"family": "count"'), "questions",
     "expected JSON text, got text that does not parse"),
    (_question(0, initial_view=-1), "questions[0].initial_view",
     "expected 0..2 (the scene's 3 views), got -1"),
    (_question(1, initial_view=3), "questions[1].initial_view",
     "expected 0..2 (the scene's 3 views), got 3"),
    (_question(0, initial_view=True), "questions[0].initial_view",
     "expected an integer view index, got bool True"),
    (_question(0, answer="D"), "questions[0].answer",
     "expected one of 'ABC' (the letters of its 3 options), got 'D'"),
    (_question(0, answer="C"), "questions[0].answer_text",
     "expected option C 'red box', got 'green chair'"),
    (_question(1, answer_objects=[0, 1, 2, 0, 1]), "questions[1].answer_objects",
     "expected at most MAX_ANSWER_OBJECTS 4 ids, got 5"),
    (_question(1, answer_objects=[7]), "questions[1].answer_objects",
     "expected instance ids of the cloud's objects ([0, 1, 2]), got int 7"),
    (_question(2, family="counting"), "questions[2].family", "expected one of ("),
    (_question(2, answers=["one"] * 5), "questions[2].answers",
     "has 5 reference answers, more than MAX_ANSWERS 4"),
    (_question(1, views=[0, 3]), "questions[1].views", "expected view indices in 0..2"),
]


@pytest.mark.parametrize("mutate,field,problem", HOSTILE,
                         ids=[f"{field}:{problem[:30]}" for _, field, problem in HOSTILE])
def test_hostile_records_name_scene_field_expected_and_got(mutate, field, problem):
  example = stored_example()
  mutate(example)
  with pytest.raises(RecordError) as error:
    scene_tasks(example)
  scene = "<no valid scene_seed>" if field == "scene_seed" else SEED
  assert (error.value.scene, error.value.field) == (scene, field)
  assert str(error.value).startswith(f"scene {scene}: {field}: ") and problem in str(error.value)


def test_the_grain_pipeline_refuses_a_bad_record():
  bad = stored_example(SEED + 1)
  bad["rgb"] = bad["rgb"][:100]
  batches = task_batches([stored_example(), bad], batch_size=2, shuffle=False,
                         drop_remainder=False)
  with pytest.raises(RecordError, match=rf"scene {SEED + 1}: rgb: expected 600 rows"):
    list(batches)


# --- The fuzz: mutated records either load faithfully or raise a RecordError naming a field.

_VALUES = [None, True, 0, 1, -1, 2, 3, 7, 2**40, -2**70, 1.5, float("nan"), "", "A", "Z", "b",
           "x" * 400, "\ud800", [], [0], [-1], [True], [0, 1, 2, 0, 1], ["a", "b"], {"k": 1},
           np.int32(1)]


def _array_mutations(rng, value: np.ndarray):
  ops = [
      lambda a: a[:-1], lambda a: a[:0], lambda a: np.concatenate([a, a[:1]]),
      lambda a: a.astype(np.float64), lambda a: a.astype(np.int64), lambda a: a.astype(np.uint8),
      lambda a: a.astype(np.float32), lambda a: a.astype(np.int32), lambda a: a.reshape(-1),
      lambda a: a[None], lambda a: a.tolist(), lambda a: a[..., :-1] if a.ndim else a,
      lambda a: (a - 5).astype(a.dtype) if a.dtype.kind == "f" else (
          a.astype(np.int64) - 5).astype(a.dtype),
      lambda a: np.full_like(a, np.iinfo(a.dtype).max if a.dtype.kind in "iu" else np.inf),
      lambda a: a[::-1].copy(), lambda a: a * 0,
  ]
  return ops[rng.integers(len(ops))](value)


def mutate_record(rng, example: dict) -> str:
  """One random change; returns what it did."""
  if rng.random() < 0.45:  # a question's field
    questions = json.loads(example["questions"])
    k = int(rng.integers(len(questions)))
    keys = sorted(questions[k]) + ["answers"]
    key = keys[rng.integers(len(keys))]
    if rng.random() < 0.1:
      questions[k].pop(key, None)
      what = f"questions[{k}] without {key}"
    else:
      value = _VALUES[rng.integers(len(_VALUES))]
      questions[k][key] = value.item() if isinstance(value, np.generic) else value
      what = f"questions[{k}].{key} = {value!r:.40}"
    if rng.random() < 0.05:
      questions = questions * 6  # more than MAX_QUESTIONS_PER_SCENE
      what += ", x6 questions"
    example["questions"] = json.dumps(questions).encode()  # ASCII: "\ud800" escaped
    return what
  key = sorted(example)[rng.integers(len(example))]
  roll = rng.random()
  if roll < 0.1:
    del example[key]
    return f"without {key}"
  value = example[key]
  if isinstance(value, np.ndarray) and roll < 0.85:
    example[key] = _array_mutations(rng, value)
    return f"{key} array mutated"
  if key == "questions" and roll < 0.9:
    text = bytearray(value)
    text[rng.integers(len(text))] = int(rng.integers(256))
    example[key] = bytes(text[: rng.integers(len(text) + 1)] if rng.random() < 0.5 else text)
    return "questions bytes mutated"
  if key == "images" and roll < 0.95:
    images = list(value)
    images[rng.integers(len(images))] = images[0][:, :-2] if rng.random() < 0.5 else None
    example[key] = images
    return "an image mutated"
  example[key] = _VALUES[rng.integers(len(_VALUES))]
  return f"{key} replaced"


def assert_faithful(example: dict, tasks, input_images: bool) -> None:
  """An accepted record meets the schema (checked here independently of the loader) and
  its tasks carry exactly its data."""
  xyz, rgb, instance = example["xyz"], example["rgb"], example["instance"]
  n = len(xyz)
  assert xyz.dtype == np.float32 and xyz.shape == (n, 3) and np.isfinite(xyz).all() and n
  assert rgb.dtype == np.uint8 and rgb.shape == (n, 3)
  assert instance.dtype == np.int32 and instance.shape == (n,) and instance.min() >= -1
  poses, intrinsics = example["world_from_camera"], example["intrinsics"]
  views = len(poses)
  assert 1 <= views <= 8 and intrinsics.shape == (views, 4) and poses.shape == (views, 4, 4)
  questions = json.loads(example["questions"])
  assert len(tasks) == len(questions)
  for (task, meta), q in zip(tasks, questions):
    np.testing.assert_array_equal(task.cloud.xyz[:n], xyz)
    np.testing.assert_array_equal(task.cloud.rgb[:n], rgb)
    np.testing.assert_array_equal(task.cloud.instance[:n], instance)
    assert int(task.cloud.valid.sum()) == n
    assert type(q["initial_view"]) is int and 0 <= q["initial_view"] < views
    np.testing.assert_array_equal(task.initial_camera.world_from_camera,
                                  poses[q["initial_view"]])
    if q["options"]:
      assert q["answer"] in LETTERS[:len(q["options"])]
      assert int(task.answer_choice) == LETTERS.index(q["answer"])
      assert q["answer_text"] == q["options"][LETTERS.index(q["answer"])]
    else:
      assert int(task.answer_choice) == -1
    objects = q["answer_objects"]
    assert len(objects) <= loader.MAX_ANSWER_OBJECTS
    assert all(type(o) is int and o in instance for o in objects)
    np.testing.assert_array_equal(task.answer_objects[:len(objects)], objects)
    assert (task.answer_objects[len(objects):] == -1).all()
    assert decode_text(task.question_ids) == q["question"]
    references = q.get("answers") or [q["answer_text"]]
    assert [decode_text(r) for r in task.answer_ids if r[0] >= 0] == references
    assert int(task.num_input_cameras) == views
    assert int(meta["scene_seed"]) == int(example["scene_seed"])
    if input_images:
      np.testing.assert_array_equal(task.input_images[:views], np.stack(example["images"]))


def test_fuzz_records_load_faithfully_or_name_the_field():
  rng = np.random.default_rng(0)
  base = stored_example()
  fields = set(base) | {"<record>"}
  accepted, refused = 0, {}
  for case in range(400):
    example = copy.deepcopy(base)
    done = [mutate_record(rng, example) for _ in range(int(rng.integers(1, 3)))]
    input_images = bool(case % 2)
    start = time.perf_counter()
    with deadline(2.0):
      try:
        tasks = scene_tasks(example, input_images=input_images)
      except RecordError as error:
        name = error.field.split("[", 1)[0].split(".", 1)[0]
        assert name in fields, (done, error)
        assert f": {error.field}: " in str(error) and error.problem, (done, error)
        seed = example.get("scene_seed")
        named = (int(seed) if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool)
                 else "<no valid scene_seed>")
        assert error.scene == named, (done, error)
        refused[name] = refused.get(name, 0) + 1
      except Exception as error:  # noqa: BLE001 (the point: nothing else may escape)
        pytest.fail(f"case {case} {done}: {type(error).__name__} from inside: {error}")
      else:
        assert_faithful(example, tasks, input_images)
        accepted += 1
    assert time.perf_counter() - start < 2.0
  # The fuzz exercised both outcomes and most fields.
  assert accepted >= 20 and sum(refused.values()) >= 200, (accepted, refused)
  assert {"xyz", "rgb", "instance", "questions", "world_from_camera", "intrinsics"} <= set(
      refused), refused


# --- Trajectory files: SFT pairs each line's question index with its scene's question.

@pytest.fixture(scope="module")
def trajectory_file(tmp_path_factory):
  """A real scripted trajectory file (teachers.write_scripted) over two in-memory scenes."""
  path = tmp_path_factory.mktemp("sft") / "teacher.jsonl"
  scenes = [stored_example(SEED), stored_example(SEED + 1)]
  assert teachers.write_scripted(scenes, "act3d", path) == 6
  return path, {SEED: 3, SEED + 1: 3}


def _lines(path):
  return [json.loads(line) for line in path.read_text().splitlines()]


def _write(tmp_path, records_or_text, name="t.jsonl"):
  path = tmp_path / name
  if isinstance(records_or_text, (str, bytes)):
    data = records_or_text
  else:
    data = "\n".join(r if isinstance(r, str) else json.dumps(r) for r in records_or_text) + "\n"
  (path.write_bytes if isinstance(data, bytes) else path.write_text)(data)
  return path


TRAJECTORY_HOSTILE = [  # (change to line 2, field, message part)
    ({"question": -1}, "question", "expected an index >= 0 into the scene's questions, got -1"),
    ({"question": 3}, "question", f"expected 0..2 (scene {SEED} has 3 questions), got 3"),
    ({"question": True}, "question", "expected an integer, got bool true"),
    ({"question": 1.0}, "question", "expected an integer, got float 1.0"),
    ({"scene_seed": 5}, "scene_seed", "expected the seed of one of the source's 2 scenes"),
    ({"scene_seed": "10000042"}, "scene_seed", "expected an integer, got str"),
    ({"turns": []}, "turns", "expected a non-empty list of model turns, got list []"),
    ({"turns": ["ok", 3]}, "turns[1]", "expected a non-empty string, got int 3"),
    ({"turns": ["ok", "  "]}, "turns[1]", "expected a non-empty string"),
]


@pytest.mark.parametrize("change,field,problem", TRAJECTORY_HOSTILE,
                         ids=[f"{f}:{p[:30]}" for _, f, p in TRAJECTORY_HOSTILE])
def test_hostile_trajectories_name_file_line_and_field(tmp_path, trajectory_file, change, field,
                                                       problem):
  source, counts = trajectory_file
  records = _lines(source)
  records[1] = {**records[1], "scene_seed": SEED, **change}
  path = _write(tmp_path, records)
  with pytest.raises(TrajectoryError) as error:
    read_trajectories(path, question_counts=counts)
  assert (error.value.line, error.value.field) == (2, field)
  assert str(error.value).startswith(f"{path}:2: {field}: ") and problem in str(error.value)


def test_trajectory_lines_that_are_not_records(tmp_path, trajectory_file):
  source, counts = trajectory_file
  good = source.read_text().splitlines()[0]
  cases = [
      ([good, "", "{not json"], 3, "<line>", "expected a JSON object, got text that does not"),
      ([good, "[1, 2]"], 2, "<line>", "expected a JSON object {'scene_seed': int"),
      ([good, json.dumps({"scene_seed": SEED, "turns": ["a"]})], 2, "question", "missing"),
  ]
  for lines, line, field, problem in cases:
    with pytest.raises(TrajectoryError, match=rf":{line}: {field}: {problem}"):
      read_trajectories(_write(tmp_path, lines), question_counts=counts)
  with pytest.raises(TrajectoryError, match=r":2: <line>: expected UTF-8 text, got byte b'\\xff'"):
    read_trajectories(_write(tmp_path, good.encode() + b"\n\xff{}\n"))
  with pytest.raises(TrajectoryError, match=r":0: <file>: expected at least one trajectory"):
    read_trajectories(_write(tmp_path, "\n\n"))
  # Without the source the indices still cannot be negative, and a good file reads as is.
  with pytest.raises(TrajectoryError, match=r":1: question: expected an index >= 0"):
    read_trajectories(_write(tmp_path, [{**json.loads(good), "question": -1}]))
  assert read_trajectories(source, question_counts=counts) == _lines(source)


def test_sft_pairing_refuses_a_question_the_scene_does_not_have(tmp_path, trajectory_file):
  """recipes.agents.TeacherData pairs each trajectory with its scene's question: -1 used
  to pair with the scene's last question."""
  from recipes.agents import TeacherData  # pylint: disable=import-outside-toplevel
  source, _ = trajectory_file
  scenes = [stored_example(SEED), stored_example(SEED + 1)]
  data = TeacherData(None, scenes, source)
  assert [(s, q) for s, q, _ in data.records] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1),
                                                  (1, 2)]
  records = _lines(source)
  records[4]["question"] = -1
  with pytest.raises(TrajectoryError, match=r"t.jsonl:5: question: expected an index >= 0"):
    TeacherData(None, scenes, _write(tmp_path, records))
  records[4]["question"] = 3
  with pytest.raises(TrajectoryError, match=rf"t.jsonl:5: question: expected 0..2 \(scene "
                                            rf"{SEED + 1} has 3 questions\), got 3"):
    TeacherData(None, scenes, _write(tmp_path, records))


def mutate_line(rng, record: dict) -> str:
  """A mutated JSON line from a good record: a field changed, dropped or added, or the
  text damaged."""
  roll = rng.random()
  if roll < 0.7:
    record = dict(record)
    key = ["scene_seed", "question", "turns", "extra"][rng.integers(4)]
    if rng.random() < 0.15:
      record.pop(key, None)
    else:
      values = _VALUES[:-1] + [SEED, SEED + 1, ["<answer>x</answer>"], ["", "a"], [["a"]],
                               record["turns"] + [7]]
      record[key] = values[rng.integers(len(values))]
    return json.dumps(record).replace("NaN", "NaN" if rng.random() < 0.5 else "nan")
  text = json.dumps(record)
  if roll < 0.8:
    return text[: rng.integers(len(text))]
  if roll < 0.9:
    position = int(rng.integers(len(text)))
    return text[:position] + "\"{}[]:,\\"[rng.integers(8)] + text[position:]
  return json.dumps([record, 1, None, "x", 2.5][rng.integers(5)])


def test_fuzz_trajectory_files_read_faithfully_or_name_the_line_and_field(tmp_path,
                                                                          trajectory_file):
  source, counts = trajectory_file
  good = _lines(source)
  rng = np.random.default_rng(1)
  accepted, refused = 0, {}
  fields = {"scene_seed", "question", "turns", "<line>", "<file>"}
  for case in range(300):
    lines = [json.dumps(r) for r in good[:3]]
    k = int(rng.integers(3))
    lines[k] = mutate_line(rng, good[k])
    data = [line.encode() for line in lines]
    if rng.random() < 0.1:  # a byte that is not UTF-8
      at = int(rng.integers(len(data[k]) + 1))
      data[k] = data[k][:at] + b"\xc3\x28\xff"[rng.integers(2):] + data[k][at:]
    path = tmp_path / f"fuzz{case % 4}.jsonl"
    path.write_bytes(b"\n".join(data) + b"\n")
    with deadline(2.0):
      try:
        records = read_trajectories(path, question_counts=counts)
      except TrajectoryError as error:
        assert error.field.split("[", 1)[0] in fields, (lines[k], error)
        assert error.line == k + 1 or error.field == "<file>", (lines[k], error)
        assert str(error).startswith(f"{path}:{error.line}: {error.field}: "), error
        refused[error.field.split("[", 1)[0]] = refused.get(error.field.split("[", 1)[0], 0) + 1
      except Exception as error:  # noqa: BLE001
        pytest.fail(f"case {case} {lines[k]!r:.120}: {type(error).__name__}: {error}")
      else:
        accepted += 1
        assert records == [json.loads(line) for line in lines]
        for r in records:
          assert type(r["scene_seed"]) is int and r["scene_seed"] in counts
          assert type(r["question"]) is int and 0 <= r["question"] < counts[r["scene_seed"]]
          assert r["turns"] and all(isinstance(t, str) and t.strip() for t in r["turns"])
  assert accepted >= 20 and sum(refused.values()) >= 150, (accepted, refused)
  assert {"scene_seed", "question", "turns", "<line>"} <= set(refused), refused


def test_check_example_is_the_loaders_check():
  """The loader's task building goes through check_example (the fuzz's subject)."""
  example = stored_example()
  assert check_example(example) == json.loads(example["questions"])
  example["rgb"] = example["rgb"][:1]
  with pytest.raises(RecordError, match="rgb"):
    check_example(example)
