"""The agent recipes' reference variants (configs/think3d_rl.py, act3d_grpo.py,
peria_or_gigpo.py) on stand-ins of their real data, written here in the published formats
and built with `launch.build_benchmark`, and tiny random checkpoint folders of the papers'
policy architectures (Qwen3-VL for Think3D and PERIA, Qwen2.5-VL for Act3D; Hugging Face
layout, processor, chat template, generation config):

- Think3D-RL: MindCube's layout (real MindCube-Tiny rows as raw/MindCube_train.jsonl and
  raw/MindCube.jsonl) over generated images, with Think3D caches (a cloud per image set
  and manifest.json);
- Act3D: ScanQA's layout (real validation rows as the train and val files) on tiny
  ScanNet-layout scans, and a teacher trajectory file by question_id;
- PERIA: ChartQA's layout (train/ and test/, generated charts) and a teacher file by
  question_id.

Each runs one step of each of its phases through `launch.train` with the reference
settings, overridden only where a CPU needs it (steps, batch and group sizes, float32, no
remat, einsum attention, short turns and prompts, the stored view size, a small cloud
padding, no perception model folders, no evaluation). Think3D's GRPO step runs here;
Act3D's and PERIA's SFT + RL steps (two rollout programs each, about 2.5 minutes apiece on
2 cores) run with `make train-checks`, and here their data paths are checked without a
policy: teacher records matched by question_id, PERIA's image 0 the stored chart. The
refusals name what is missing and the command that makes it."""

import hashlib
import json
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from PIL import Image

from configs import act3d_grpo, peria_or_gigpo, think3d_rl
from data_pipelines.builders import load_benchmark, task_limits
from data_pipelines.caches import write_think3d_cache
from data_pipelines.loader import task_batches
from data_pipelines.scene_caches import cache_name
from jaxspatial import models
from jaxspatial.geometry import PointCloud
from jaxspatial.models.qwen2_5_vl.tokenizer import save_processor
from jaxspatial.rollout import tiny
from jaxspatial.rollout.agents import Act3DAgent
from jaxspatial.rollout.peria_agent import PeriaAgent
from recipes.agents import AgentRecipe, TeacherData
from tests import chat_templates

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data" / "benchmarks"
MINDCUBE = SHARED / "mindcube_tiny_questions.jsonl"
SCANQA = SHARED / "scanqa_v1.0_val.json"
SIZE = 56  # the stored views' width and height (4 vision tokens each)
CPU = {"model.dtype": "float32", "model.param_dtype": "float32",
       "model.cache_dtype": "float32", "model.remat": False, "model.attention": "einsum",
       "agent.width": SIZE, "agent.height": SIZE, "rollout.max_turns": 2,
       "rollout.max_turn_tokens": 72, "rl.steps": 1, "rl.prompts": 1, "rl.mini_batches": 1,
       "advantage.group_size": 2, "checkpoint.every": 1, "log_every": 1,
       "snapshot_every": 0, "eval.tasks": 0, "data.points": 1024,
       "data.prompt_tokens": 1024}

pytestmark = pytest.mark.skipif(not (MINDCUBE.is_file() and SCANQA.is_file()),
                                reason="needs shared/data/benchmarks (the real question files)")


def _run(module: str, *args) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=ROOT,
                        capture_output=True, text=True, timeout=900, check=False)


def _build(benchmark: str, source, data, *extra) -> None:
  done = _run("launch.build_benchmark", "--benchmark", benchmark, "--source", source,
              "--data_dir", data, "--width", SIZE, "--height", SIZE, *extra)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


def _flags(checkpoint, data, workdir, extra) -> dict:
  return {**CPU, "model.checkpoint": checkpoint, "data.data_dir": data, "workdir": workdir,
          **extra}


def _train(config: str, checkpoint, data, workdir, extra=None) -> subprocess.CompletedProcess:
  values = _flags(checkpoint, data, workdir, extra or {})
  return _run("launch.train", "--config", config,
              *[f"--config.{k}={v}" for k, v in values.items()])


def _config(module, checkpoint, data, workdir, extra=None):
  """The reference config with the same overrides, for in-process checks."""
  c = module.get_config()
  for key, value in _flags(checkpoint, data, workdir, extra or {}).items():
    node = c
    *path, last = key.split(".")
    for part in path:
      node = node[part]
    node[last] = str(value) if isinstance(value, pathlib.Path) else value
  return c


@pytest.fixture(scope="module")
def tokenizer():
  return tiny.tokenizer()


def _policy(tok, folder: pathlib.Path, family: str, template: str) -> pathlib.Path:
  """A random policy of the family's real architecture at tiny widths, saved as a Hugging
  Face folder with its processor, chat template and generation config."""
  if not (folder / "config.json").is_file():
    model = tiny.model(tok, family, seed=1)
    models.export(model, folder)
    tok.chat_template = template
    save_processor(folder, tok, model)
    chat_templates.write_generation_config(folder, tok)
  return folder


def _write_jsonl(path: pathlib.Path, rows) -> pathlib.Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


def _picture(path: pathlib.Path, seed, size=(8, 6)) -> None:
  """A small picture (its size differs from the stored one: letterboxed at build)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  rng = np.random.default_rng(int(hashlib.sha256(str(seed).encode()).hexdigest()[:8], 16))
  Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), np.uint8)).save(path)


def _trained(workdir: pathlib.Path, done: subprocess.CompletedProcess, metrics) -> list[dict]:
  """The run's metrics rows, one per step from 1, each named metric present and finite,
  the last step's checkpoint written."""
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()
          if line.strip()]
  for metric in metrics:
    values = [r[metric] for r in rows if metric in r]
    assert values and np.all(np.isfinite(values)), (metric, rows)
  steps = [r["step"] for r in rows]
  assert steps == list(range(1, len(steps) + 1)), steps
  assert (workdir / "checkpoints" / "latest" / str(steps[-1])).is_dir()
  assert (workdir / "results.json").is_file()
  return rows


# -- stand-in data ----------------------------------------------------------------------------


def _caches(rows, folder: pathlib.Path) -> None:
  """A Think3D cache per image set (a small cloud in front of the cameras) and the manifest
  `launch.reconstruct_scenes` writes."""
  sets = {}
  for row in rows:
    sets.setdefault(tuple(row["images"]), []).append(row["id"])
  rng = np.random.default_rng(0)
  manifest = {"format": "think3d-cache", "backend": "test", "sets": [], "failed": []}
  for images, ids in sets.items():
    xyz = rng.uniform(-1, 1, (256, 3)).astype(np.float32) + np.float32([0, 0, 3])
    colors = rng.uniform(0, 1, (256, 3)).astype(np.float32)
    poses = np.tile(np.eye(4, dtype=np.float32), (len(images), 1, 1))
    poses[:, 0, 3] = np.arange(len(images), dtype=np.float32) * 0.2
    write_think3d_cache(folder / cache_name(images), PointCloud.create(xyz, colors), poses,
                        images)
    manifest["sets"].append({"images": list(images), "cache": cache_name(images),
                             "questions": ids})
  folder.mkdir(parents=True, exist_ok=True)
  (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def mindcube(tmp_path_factory):
  """MindCube's layout (raw/MindCube_train.jsonl, raw/MindCube.jsonl: two-view rows of the
  real MindCube-Tiny file; the images they name) built with Think3D caches."""
  root = tmp_path_factory.mktemp("mindcube")
  rows = [json.loads(line) for line in MINDCUBE.read_text().splitlines() if line.strip()]
  two = sorted((r for r in rows if len(r["images"]) == 2), key=lambda r: len(r["question"]))
  train, test = two[:2], two[2:3]
  source = root / "MindCube" / "data"
  _write_jsonl(source / "raw" / "MindCube_train.jsonl", train)
  _write_jsonl(source / "raw" / "MindCube.jsonl", test)
  for row in train + test:
    for image in row["images"]:
      _picture(source / image, image)
  _caches(train + test, root / "caches")
  _build("mindcube", source, root / "data", "--caches", root / "caches")
  return root / "data"


@pytest.fixture(scope="module")
def scanqa(tmp_path_factory):
  """ScanQA's layout (ScanQA_v1.0_train.json, ScanQA_v1.0_val.json: real validation rows
  with short answers; scans/<scene_id>/ in ScanNet's layout) built: (data, train rows)."""
  from tests.data_pipelines.test_scannet import tiny_scan  # pylint: disable=import-outside-toplevel
  root = tmp_path_factory.mktemp("scanqa")
  records = json.loads(SCANQA.read_text())
  scenes = list(dict.fromkeys(r["scene_id"] for r in records))[:2]
  short = lambda scene: sorted((r for r in records if r["scene_id"] == scene),
                               key=lambda r: len(r["answers"][0]) + len(r["question"]))
  train, test = short(scenes[0])[:2], short(scenes[1])[:1]
  source = root / "ScanQA"
  source.mkdir()
  (source / "ScanQA_v1.0_train.json").write_text(json.dumps(train))
  (source / "ScanQA_v1.0_val.json").write_text(json.dumps(test))
  rng = np.random.default_rng(0)
  for scene, rows in ((scenes[0], train), (scenes[1], test)):
    ids = sorted({i for r in rows for i in r["object_ids"]})
    tiny_scan(source / "scans", scene, [(i, f"object{i}") for i in ids], rng)
  _build("scanqa", source, root / "data", "--points", 1000)
  return root / "data", train


def _act3d_teacher(path: pathlib.Path, train) -> pathlib.Path:
  writer = Act3DAgent()
  return _write_jsonl(path, [
      {"question_id": r["question_id"],
       "turns": [writer.call_turn("Step closer.", "forward", 0.5),
                 writer.answer_turn("I can see it.", r["answers"][0])]} for r in train])


CHARTS = {
    "train": {"human": [("101.png", "What is the highest value?", "42"),
                        ("102.png", "How many bars are red?", "3")],
              "augmented": [("101.png", "Which year is lowest?", "2011")]},
    "test": {"human": [("201.png", "What is the value of the last bar?", "7")],
             "augmented": [("202.png", "Is the blue line above the red one?", "Yes")]}}


@pytest.fixture(scope="module")
def chartqa(tmp_path_factory):
  """ChartQA's layout ("ChartQA Dataset"/{train,test}/{split}_{human,augmented}.json and
  png/) over generated charts, built: (data folder, {train question id: label})."""
  root = tmp_path_factory.mktemp("chartqa") / "ChartQA Dataset"
  train = {}
  for split, parts in CHARTS.items():
    for part, rows in parts.items():
      (root / split).mkdir(parents=True, exist_ok=True)
      (root / split / f"{split}_{part}.json").write_text(json.dumps(
          [{"imgname": name, "query": query, "label": label} for name, query, label in rows]))
      for k, (name, _, label) in enumerate(rows, 1):
        _picture(root / split / "png" / name, name, (40, 30))
        if split == "train":
          train[f"train_{part}_{k}"] = label
  _build("chartqa", root, root.parent / "data")
  return root.parent / "data", train


def _peria_teacher(path: pathlib.Path, train: dict) -> pathlib.Path:
  writer = PeriaAgent()
  return _write_jsonl(path, [
      {"question_id": qid,
       "turns": [writer.call_turn("Zoom in.", "image_crop", 0, [(250, 250), (750, 750)]),
                 writer.answer_turn("Read it.", label)]} for qid, label in train.items()])


# -- one step of each recipe --------------------------------------------------------------------


@pytest.mark.recipe_checks  # one step through launch.train: 1.5-2.5 min, `make train-checks`
def test_think3d_reference_runs_a_grpo_step_on_mindcube(mindcube, tokenizer, tmp_path):
  folder = _policy(tokenizer, tmp_path / "Qwen3-VL-tiny", "qwen3_vl", chat_templates.INSTRUCT)
  workdir = tmp_path / "run"
  done = _train("configs/think3d_rl.py", folder, mindcube, workdir)
  (row,) = _trained(workdir, done, ("rl/loss", "rl/reward", "rl/kl"))
  assert row["rl/tokens"] > 0 and row["rl/turns_used"] >= 1


@pytest.mark.recipe_checks  # two rollout programs: about 2.5 minutes on 2 cores
def test_act3d_reference_runs_sft_and_grpo_steps_on_scanqa(scanqa, tokenizer, tmp_path):
  data, train = scanqa
  folder = _policy(tokenizer, tmp_path / "Qwen2.5-VL-tiny", "qwen2_5_vl",
                   chat_templates.INSTRUCT)
  teacher = _act3d_teacher(tmp_path / "act3d_sft.jsonl", train)
  workdir = tmp_path / "run"
  done = _train("configs/act3d_grpo.py", folder, data, workdir,
                {"sft.steps": 1, "sft.batch": 2, "sft.trajectories": teacher,
                 "eval.tasks": 1, "eval.batch": 1})
  rows = _trained(workdir, done, ("sft/loss", "rl/loss", "rl/reward"))
  assert [("sft/loss" in r, "rl/loss" in r) for r in rows] == [(True, False), (False, True)]
  # Greedy accuracy on the val split after each phase, by ScanQA's category ("open").
  results = json.loads((workdir / "results.json").read_text())
  for when in ("sft", "final"):
    assert results[when]["overall"]["n"] == 1 and results[when]["categories"]["open"]["n"] == 1


@pytest.mark.recipe_checks  # two rollout programs: about 2.5 minutes on 2 cores
def test_peria_reference_runs_sft_and_or_gigpo_steps_on_chartqa(chartqa, tokenizer, tmp_path):
  data, train = chartqa
  folder = _policy(tokenizer, tmp_path / "Qwen3-VL-Thinking-tiny", "qwen3_vl",
                   chat_templates.THINKING)
  teacher = _peria_teacher(tmp_path / "peria_sft.jsonl", train)
  workdir = tmp_path / "run"
  done = _train("configs/peria_or_gigpo.py", folder, data, workdir,
                {"sft.steps": 1, "sft.batch": 2, "sft.trajectories": teacher,
                 "perception.tools": "()", "eval.tasks": 2, "eval.batch": 2})
  rows = _trained(workdir, done, ("sft/loss", "rl/loss", "rl/reward"))
  assert [("sft/loss" in r, "rl/loss" in r) for r in rows] == [(True, False), (False, True)]
  # Greedy accuracy on the test split after each phase, by ChartQA's part.
  results = json.loads((workdir / "results.json").read_text())
  for when in ("sft", "final"):
    assert results[when]["overall"]["n"] == 2
    parts = results[when]["categories"]
    assert parts["human"]["n"] == parts["augmented"]["n"] == 1


# -- the data paths without a policy ------------------------------------------------------------


def test_teacher_records_by_question_id_meet_their_benchmark_tasks(scanqa, chartqa, tmp_path):
  """Act3D's and PERIA's teacher files name ScanQA / ChartQA questions by id: each record
  pairs with its scene and question in the prepared train split."""
  for module, (data, _), path in ((act3d_grpo, scanqa, _act3d_teacher(
      tmp_path / "act3d.jsonl", scanqa[1])), (peria_or_gigpo, chartqa, _peria_teacher(
          tmp_path / "peria.jsonl", chartqa[1]))):
    c = _config(module, tmp_path / "no_policy", data, tmp_path / "run",
                {"sft.trajectories": path})
    source = load_benchmark(c.data.config, data, "train")
    teacher = TeacherData(type("Recipe", (), {"c": c})(), source, path)
    ids = [json.loads(line)["question_id"] for line in path.read_text().splitlines()]
    assert len(teacher.records) == len(ids)
    for qid, (scene, question, turns) in zip(ids, teacher.records):
      found = json.loads(source[scene]["questions"])[question]
      assert found["question_id"] == qid and len(turns) == 2


def test_peria_on_chartqa_starts_from_the_stored_chart(chartqa, tmp_path):
  """The reference recipe loads the charts with the tasks, and image 0 of an episode is the
  task's stored (letterboxed) chart, not a render of its empty cloud."""
  data, _ = chartqa
  (tmp_path / "policy").mkdir()
  (tmp_path / "policy" / "config.json").write_text("{}")  # only checked for presence here
  c = _config(peria_or_gigpo, tmp_path / "policy", data, tmp_path / "run",
              {"perception.tools": (), "sft.steps": 0})
  recipe = AgentRecipe(c)
  assert recipe.input_images
  source = load_benchmark("chartqa", data, "train")
  tasks, meta = next(iter(task_batches(source, 3, shuffle=False, points=c.data.points,
                                       input_images=recipe.input_images,
                                       limits=task_limits("chartqa"))))
  charts = {}
  for i in range(len(source)):
    for q in json.loads(source[i]["questions"]):
      charts[q["question_id"]] = np.asarray(source[i]["images"][0])
  for row, qid in enumerate(meta["question_id"]):
    task = jax.tree.map(lambda x, r=row: x[r], tasks)
    image, _, state = recipe.agent.reset(jax.random.PRNGKey(0), task)
    assert image.shape == (SIZE, SIZE, 3) and np.asarray(image).any()
    np.testing.assert_array_equal(np.asarray(image), charts[str(qid)])
    np.testing.assert_array_equal(np.asarray(state.images[0]), charts[str(qid)])


# -- refusals -------------------------------------------------------------------------------------


def test_missing_checkpoint_data_or_trajectories_are_named_with_their_commands(tmp_path):
  nowhere = tmp_path / "data"
  c = think3d_rl.get_config()
  c.data.data_dir = str(nowhere)
  with pytest.raises(ValueError) as error:
    AgentRecipe(c)
  message = str(error.value)
  for part in ("think3d_rl (variant 'reference')", "--config.model.checkpoint=",
               f"benchmark mindcube is not prepared under {nowhere}",
               f"python -m launch.build_benchmark --benchmark mindcube --source DIR "
               f"--data_dir {nowhere} --width 640 --height 480 --caches CACHES",
               "python -m launch.reconstruct_scenes", "raw/MindCube_train.jsonl",
               "raw/MindCube.jsonl", "':cpu' variant"):
    assert part in message, (part, message)

  c = act3d_grpo.get_config()
  c.model.checkpoint, c.data.data_dir = str(tmp_path / "no_policy"), str(nowhere)
  with pytest.raises(ValueError) as error:
    AgentRecipe(c)
  message = str(error.value)
  for part in ("--config.sft.trajectories=", f"model.checkpoint {tmp_path / 'no_policy'}: "
               "no such folder", "benchmark scanqa is not prepared",
               "--benchmark scanqa --source DIR", "ScanQA_v1.0_train.json",
               "ScanQA_v1.0_val.json", "scans/<scene_id>/ (ScanNet v2's layout)"):
    assert part in message, (part, message)
  assert "--caches" not in message and "--width" not in message  # Act3D renders its own

  c = peria_or_gigpo.get_config()
  c.model.checkpoint, c.data.data_dir = str(tmp_path / "no_policy"), str(nowhere)
  c.sft.trajectories = str(tmp_path / "peria_sft.jsonl")
  with pytest.raises(FileNotFoundError) as error:
    AgentRecipe(c)
  assert str(error.value) == (
      f"peria_or_gigpo (variant 'reference'): model.checkpoint {tmp_path / 'no_policy'}: no "
      f"such folder; sft.trajectories {tmp_path / 'peria_sft.jsonl'}: no such file; data: "
      f"benchmark chartqa is not prepared under {nowhere}: run python -m "
      f"launch.build_benchmark --benchmark chartqa --source DIR --data_dir {nowhere} "
      f"--width 800 --height 600; DIR holds train/train_human.json, test/test_human.json, "
      f"the charts under <split>/png/")


def test_a_split_the_build_lacks_and_a_wrong_view_size_or_geometry_are_named(chartqa,
                                                                              mindcube,
                                                                              tmp_path):
  data, _ = chartqa
  (tmp_path / "policy").mkdir()
  (tmp_path / "policy" / "config.json").write_text("{}")
  c = _config(peria_or_gigpo, tmp_path / "policy", data, tmp_path / "run",
              {"data.train_split": "validation", "sft.steps": 0})
  with pytest.raises(FileNotFoundError, match=r"benchmark chartqa under .* has splits "
                     r"\['test', 'train'\], not \['validation'\]: rebuild it with python -m "
                     r"launch.build_benchmark --benchmark chartqa"):
    AgentRecipe(c)
  # Think3D on MindCube stored at 56 x 56 but configured for 64 x 48: both sizes and the fix.
  c = _config(think3d_rl, tmp_path / "policy", mindcube, tmp_path / "run",
              {"agent.width": 64, "agent.height": 48})
  with pytest.raises(ValueError, match=r"made for 56x56 views: set --config.agent.width=56 "
                     r"--config.agent.height=56 \(got 64x48\)"):
    AgentRecipe(c).build_data()
  # Think3D on images without clouds (ChartQA's geometry "none"): the caches it needs.
  c = _config(think3d_rl, tmp_path / "policy", data, tmp_path / "run",
              {"data.config": "chartqa", "data.train_split": "train"})
  with pytest.raises(ValueError, match=r"built without clouds \(geometry 'none'\): python -m "
                     r"launch.build_benchmark --benchmark chartqa .*--caches CACHES"):
    AgentRecipe(c).build_data()
