"""The papers' agent recipes run end to end through the trainer (`recipes.train`, what
`launch.train` calls): a policy loaded from a
Hugging Face folder, tasks from the TFDS dataset through grain, teacher SFT, GRPO or
OR-GIGPO, evaluation per question family, checkpoints with the data iterator's state, and
resume. `make recipes` runs the three CPU variants in full (Act3D and PERIA's OR-GIGPO
end to end; their pieces have unit tests: tests/rollout/test_peria_agent.py,
tests/train/test_grpo.py)."""

import json

import pytest

from configs import think3d_rl
from data_pipelines.builders import SyntheticSpatial
from data_pipelines.loader import task_batches
from jaxspatial.models import export
from jaxspatial.models.qwen2_5_vl.tokenizer import save_processor
from jaxspatial.rollout import tiny
from jaxspatial.train import read_jsonl
import recipes


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


@pytest.mark.slow
def test_think3d_recipe_from_a_pretrained_folder_trains_evaluates_and_resumes(tmp_path,
                                                                                data_dir):
  # A Qwen3-VL folder, the paper's family: config.json's model_type picks it.
  tok = tiny.tokenizer()
  folder = tmp_path / "policy"
  model = tiny.model(tok, "qwen3_vl")
  export(model, folder)
  save_processor(folder, tok, model)
  config = _small(think3d_rl.get_config("cpu"), tmp_path / "run", data_dir)
  config.model.checkpoint = str(folder)
  config.sft.update(steps=2, batch=8)
  config.rl.update(steps=2, prompts=2)
  config.eval.update(batch=16, tasks=16)
  results = recipes.train(config)
  assert results["sft"]["overall"]["n"] == 16 and results["final"]["overall"]["n"] == 16
  assert sum(r["n"] for r in results["final"]["categories"].values()) == 16
  steps = read_jsonl(tmp_path / "run" / "metrics.jsonl")
  assert [s["step"] for s in steps] == [1, 2, 3, 4]
  assert "sft/loss" in steps[0] and "rl/kl" in steps[3] and steps[3]["rl/finite"] == 1.0
  for name in ("results.json", "curve.png", "rollouts_train_00003.html",
               "teacher_think3d.jsonl"):
    assert (tmp_path / "run" / name).is_file(), name
  # The data iterator's state saved in step 4's checkpoint is the stream after its two GRPO
  # batches: a resumed run reads the next batch.
  stream = iter(task_batches(SyntheticSpatial(data_dir=data_dir, config="tiny")
                             .as_data_source()["train"], 2, seed=config.seed, num_epochs=None,
                             points=config.data.points, input_images=True))
  next(stream), next(stream)
  restored = iter(task_batches(SyntheticSpatial(data_dir=data_dir, config="tiny")
                               .as_data_source()["train"], 2, seed=config.seed,
                               num_epochs=None, points=config.data.points, input_images=True))
  record = json.loads((tmp_path / "run" / "checkpoints" / "latest" / "4" / "data" /
                       "process_0-of-1.json").read_text())
  restored.set_state(record["state"]["json"])
  assert json.dumps(restored.get_state()) == json.dumps(stream.get_state())
  # One more GRPO step resumes from step 4 (the SFT phase is not repeated); the changed
  # step count must be allowed explicitly.
  config.rl.steps = 3
  config.eval.tasks = 0
  with pytest.raises(ValueError, match=r"rl.steps: 2 -> 3"):
    recipes.train(config)
  config.resume_overrides = ("rl.steps",)
  recipes.train(config)
  steps = read_jsonl(tmp_path / "run" / "metrics.jsonl")
  assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]
  # launch.eval re-evaluates the last checkpoint on another split, per question family.
  config.eval.tasks = 16
  evaluated = recipes.evaluate(config, split="validation")
  assert evaluated["step"] == 5 and evaluated["policy"]["overall"]["n"] == 16



@pytest.mark.recipe_checks  # 60 SFT steps, twice: the tiny policy must answer (about 8 minutes)
def test_act3d_recipe_scores_answers_with_a_served_or_an_on_device_judge(tmp_path, data_dir):
  """Act3D's R_judge from an OpenAI-compatible endpoint started here (it answers CORRECT to
  every request): the RL rollouts ask the training judge (temperature 0.1, 64 tokens), the
  evaluation the evaluation judge (0, 4 tokens), and the verdicts are the accuracy. Then
  from a jaxspatial policy judging inside the rollout, with the same verdicts."""
  from configs import act3d_grpo  # pylint: disable=import-outside-toplevel
  from tests.perception.chat_server import ChatServer  # pylint: disable=import-outside-toplevel
  config = _small(act3d_grpo.get_config("cpu"), tmp_path / "run", data_dir)
  config.sft.update(steps=60, batch=8)  # enough for the tiny policy to answer
  config.snapshot_every = 0
  config.rollout.temperature = 0.1  # near-greedy RL rollouts answer as the evaluation does
  config.rl.update(steps=1, prompts=2)
  config.eval.update(batch=16, tasks=16)
  with ChatServer() as server:
    server.reply_body = json.dumps({"choices": [{"index": 0, "message": {
        "role": "assistant", "content": "CORRECT"}}]}).encode()
    config.judge.update(url=server.base_url, model="judge-model")
    results = recipes.train(config)
  bodies = [r["body"] for r in server.requests]
  assert bodies and all(b["model"] == "judge-model" for b in bodies)
  training = [b for b in bodies if b["temperature"] == 0.1]
  evaluation = [b for b in bodies if b["temperature"] == 0]
  assert len(training) + len(evaluation) == len(bodies)
  assert training and evaluation  # (teacher replays in SFT ask no judge)
  assert all(b["max_tokens"] == 64 for b in training) and all(
      b["max_tokens"] == 4 for b in evaluation)
  # Every evaluated episode with a prediction was judged CORRECT; the rest (no request) 0.
  judged = sum(round(results[when]["overall"]["accuracy"] * results[when]["overall"]["n"])
               for when in ("sft", "final"))
  assert judged == len(evaluation)
  steps = read_jsonl(tmp_path / "run" / "metrics.jsonl")
  rl = [s for s in steps if "rl/accuracy" in s][-1]
  assert rl["rl/accuracy"] == pytest.approx(len(training) / (2 * config.advantage.group_size))

  # The same run judged on device by a jaxspatial policy (`judge.checkpoint`) that also
  # replies CORRECT to everything: the same verdicts, so the same training and results.
  from tests import judge_policies  # pylint: disable=import-outside-toplevel
  judge_policies.always_correct(tmp_path / "judge")
  config.workdir = str(tmp_path / "on_device")
  config.judge.update(url="", model="", checkpoint=str(tmp_path / "judge"))
  on_device = recipes.train(config)
  for when in ("sft", "final"):
    assert on_device[when] == results[when], when
  steps = read_jsonl(tmp_path / "on_device" / "metrics.jsonl")
  assert [s for s in steps if "rl/accuracy" in s][-1]["rl/accuracy"] == rl["rl/accuracy"]

