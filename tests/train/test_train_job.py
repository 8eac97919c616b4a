"""The library trainer on the demo recipe (SFT, then GRPO with a KL term), against one
uninterrupted run: a run killed with SIGKILL after a save resumes to the same losses and
metrics; a NaN loss stops the run naming its step with nothing saved; SIGTERM saves and
exits with status 143, and the resumed run matches; a resume with a changed config, or a
used work directory without resume, is refused with the differences named."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import recipes
from tests.train.tiny_demo import demo_config, step_metrics

# About 5 CPU-minutes; `make train-checks` runs it with every recipe's fault checks.
pytestmark = pytest.mark.recipe_checks

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMALL = {"model.hidden": 64, "model.intermediate": 128, "model.layers": 1,
         "model.vision_hidden": 32, "model.vocab": 500, "scene.points": 2000,
         "data.train_tasks": 12, "data.test_tasks": 6, "data.sft_trajectories": 16,
         "sft.steps": 3, "sft.batch": 8, "sft.optimizer.warmup_steps": 1, "rl.steps": 3,
         "rl.prompts": 2, "rl.optimizer.warmup_steps": 1, "advantage.group_size": 2,
         # beta > 0: a resumed run must also restore the frozen reference policy exactly
         "objective.beta": 0.04, "checkpoint.every": 1, "checkpoint.keep": 10,
         "evaluate": False, "snapshot_every": 0, "log_every": 1}


def tiny_config(workdir):
  return demo_config(workdir, SMALL)


def _same_run(got: dict, expected: dict) -> None:
  assert sorted(got) == sorted(expected)
  for step in expected:
    assert sorted(got[step]) == sorted(expected[step]), step
    np.testing.assert_allclose([got[step][k] for k in sorted(expected[step])],
                               [expected[step][k] for k in sorted(expected[step])],
                               rtol=1e-5, atol=1e-7, err_msg=f"step {step}")


def _saved(workdir) -> list[int]:
  return sorted(int(p.name) for p in (pathlib.Path(workdir) / "checkpoints" / "latest")
                .iterdir() if p.name.isdigit())


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("straight")
  recipes.train(tiny_config(workdir))
  rows = step_metrics(workdir)
  assert sorted(rows) == list(range(1, 7))
  kl = [rows[s]["rl/kl"] for s in range(4, 7)]
  assert kl[0] == pytest.approx(0.0, abs=1e-6) and kl[-1] > 0
  return rows


def test_a_killed_run_resumes_exactly(tmp_path, straight):
  killed = tmp_path / "killed"
  overrides = [f"--config.{k}={v}" for k, v in {**SMALL, "workdir": killed,
                                                "faults.kill_after_step": 4}.items()]
  result = subprocess.run([sys.executable, "-m", "launch.train", "--config",
                           "configs/demo.py", *overrides], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == -9, result.stderr[-3000:]  # SIGKILL
  assert max(step_metrics(killed)) == 4 and max(_saved(killed)) == 4
  recipes.train(tiny_config(killed))  # resumes from step 4
  _same_run(step_metrics(killed), straight)


def test_nan_sigterm_and_config_changes(tmp_path, straight):
  c = tiny_config(tmp_path)
  c.faults.nan_at_step = 5
  with pytest.raises(FloatingPointError, match="step 5: the loss or a gradient is not finite"):
    recipes.train(c)
  assert max(_saved(tmp_path)) == 4  # steps 1..4 saved; the NaN step 5 was not
  c.faults.nan_at_step = -1
  c.faults.sigterm_after_step = 5
  with pytest.raises(SystemExit) as preempted:
    recipes.train(c)  # resumes from 4, takes step 5, then SIGTERM: saves and exits 143
  assert preempted.value.code == 143 and max(_saved(tmp_path)) == 5
  changed = tiny_config(tmp_path)
  changed.seed = 1
  changed.rl.optimizer.learning_rate = 1e-3
  with pytest.raises(ValueError, match=r"changes the run \(2\): rl.optimizer.learning_rate: "
                                       r"0.0002 -> 0.001; seed: 0 -> 1"):
    recipes.train(changed)
  fresh = tiny_config(tmp_path)
  fresh.resume = False
  with pytest.raises(ValueError, match="holds another run's checkpoints and metrics.jsonl"):
    recipes.train(fresh)
  c.faults.sigterm_after_step = -1
  recipes.train(c)  # resumes from 5 with finite parameters and finishes
  _same_run(step_metrics(tmp_path), straight)
