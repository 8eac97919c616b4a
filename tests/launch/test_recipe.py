"""The papers' agent recipes run end to end through `launch.train`: a policy loaded from a
Hugging Face folder, tasks from the TFDS dataset through grain, teacher SFT, GRPO or
OR-GIGPO, evaluation per question family, checkpoints with the data iterator's state, and
resume. `make recipes` runs the three CPU variants in full (Act3D and PERIA's OR-GIGPO
end to end; their pieces have unit tests: tests/rollout/test_peria_agent.py,
tests/train/test_grpo.py)."""

import json

import pytest
from flax import nnx

from configs import think3d_rl
from data_pipelines.builders import SyntheticSpatial
from data_pipelines.loader import task_batches
from jaxspatial.models.qwen2_5_vl.export import save_pretrained
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.models.qwen2_5_vl.tokenizer import save_processor
from jaxspatial.rollout import tiny
from jaxspatial.train import read_jsonl
from launch import eval as eval_launch
from launch import train


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("tfds")
  SyntheticSpatial(data_dir=str(path), config="tiny").download_and_prepare()
  return str(path)


def _small(config, workdir, data_dir):
  config.workdir = str(workdir)
  config.data.data_dir = data_dir
  config.data.build = False
  config.snapshot_every = 1
  config.checkpoint.every = 1
  return config


def test_think3d_recipe_from_a_pretrained_folder_trains_evaluates_and_resumes(tmp_path,
                                                                                data_dir):
  tok = tiny.tokenizer()
  folder = tmp_path / "policy"
  save_pretrained(Qwen25VL(tiny.model_config(tok), rngs=nnx.Rngs(0)), folder)
  save_processor(folder, tok)
  config = _small(think3d_rl.get_config("cpu"), tmp_path / "run", data_dir)
  config.model.checkpoint = str(folder)
  config.sft.update(steps=2, batch=8)
  config.grpo.update(steps=2, prompts=2)
  config.eval.update(batch=16, tasks=16)
  results = train.run(config)
  assert results["sft"]["all"]["n"] == 16 and results["final"]["all"]["n"] == 16
  assert sum(r["n"] for k, r in results["final"].items() if k != "all") == 16
  steps = read_jsonl(tmp_path / "run" / "metrics.jsonl")
  assert [s["step"] for s in steps] == [1, 2, 3, 4]
  assert "sft/loss" in steps[0] and "grpo/kl" in steps[3] and steps[3]["grpo/finite"] == 1.0
  for name in ("results.json", "reward_curve.png", "rollouts_train_00003.html",
               "teacher_think3d.jsonl"):
    assert (tmp_path / "run" / name).is_file(), name
  # The data iterator's state saved with step 4 is the stream after its two GRPO batches.
  saved = json.loads((tmp_path / "run" / "checkpoints" / "data_state" / "4.process0.json")
                     .read_text())
  stream = iter(task_batches(SyntheticSpatial(data_dir=data_dir, config="tiny")
                             .as_data_source()["train"], 2, seed=config.seed, num_epochs=None,
                             points=config.data.points))
  next(stream), next(stream)
  assert saved == json.loads(json.dumps(stream.get_state()))
  # One more GRPO step resumes from step 4 (the SFT phase is not repeated).
  config.grpo.steps = 3
  config.eval.tasks = 0
  train.run(config)
  steps = read_jsonl(tmp_path / "run" / "metrics.jsonl")
  assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]
  # launch.eval re-evaluates the last checkpoint on another split, per question family.
  config.eval.tasks = 16
  evaluated = eval_launch.run_recipe(config, split="validation")
  assert evaluated["step"] == 5 and evaluated["policy"]["all"]["n"] == 16

