"""The training job: a run (GRPO with a KL term) killed with SIGKILL and resumed from its last checkpoint logs
the same losses as an uninterrupted run; a NaN loss stops the run with its step and is
never saved."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from configs import demo
from jaxspatial.train import read_jsonl
from launch import train

ROOT = pathlib.Path(__file__).resolve().parents[2]


def tiny_config(workdir):
  c = demo.get_config()
  c.workdir = str(workdir)
  c.model.update(hidden=64, intermediate=128, layers=1, vision_hidden=32, vocab=500)
  c.scene.update(points=2000)
  c.data.update(train_tasks=12, test_tasks=6, sft_trajectories=16)
  c.sft.update(steps=3, batch=8, warmup=1)
  # beta > 0: the resumed run must also restore the frozen reference policy exactly.
  c.grpo.update(steps=3, prompts=2, group=2, warmup=1, beta=0.04)
  c.checkpoint.update(every=1, keep=10)
  c.evaluate = False
  c.snapshot_every = 0
  c.log_every = 1
  return c


def _losses(workdir):
  out = {}
  for row in read_jsonl(pathlib.Path(workdir) / "metrics.jsonl"):
    out[row["step"]] = row.get("sft/loss", row.get("grpo/loss"))
  return out


def test_a_killed_run_resumes_exactly(tmp_path):
  train.run(tiny_config(tmp_path / "straight"))
  straight = _losses(tmp_path / "straight")
  assert sorted(straight) == list(range(1, 7))
  kl = [row["grpo/kl"] for row in read_jsonl(tmp_path / "straight" / "metrics.jsonl")
        if "grpo/kl" in row]
  assert len(kl) == 3 and kl[0] == pytest.approx(0.0, abs=1e-6) and kl[-1] > 0
  killed = tmp_path / "killed"
  overrides = [f"--config.{k}" for k in (
      f"workdir={killed}", "model.hidden=64", "model.intermediate=128", "model.layers=1",
      "model.vision_hidden=32", "model.vocab=500", "scene.points=2000", "data.train_tasks=12",
      "data.test_tasks=6", "data.sft_trajectories=16", "sft.steps=3", "sft.batch=8",
      "sft.warmup=1", "grpo.steps=3", "grpo.prompts=2", "grpo.group=2", "grpo.warmup=1",
      "grpo.beta=0.04",
      "checkpoint.every=1", "checkpoint.keep=10", "evaluate=False", "snapshot_every=0",
      "kill_after_step=4")]
  result = subprocess.run([sys.executable, "-m", "launch.train", "--config",
                           "configs/demo.py", *overrides], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == -9, result.stderr[-3000:]  # SIGKILL
  assert max(_losses(killed)) == 4
  train.run(tiny_config(killed))  # resumes from step 4
  resumed = _losses(killed)
  assert sorted(resumed) == list(range(1, 7))
  np.testing.assert_allclose([resumed[s] for s in range(1, 7)],
                             [straight[s] for s in range(1, 7)], rtol=1e-5)


def test_a_nan_loss_is_reported_with_its_step_and_not_saved(tmp_path):
  c = tiny_config(tmp_path)
  c.inject_nan_step = 5
  with pytest.raises(FloatingPointError, match="step 5: the loss or a gradient is not finite"):
    train.run(c)
  saved = sorted(int(p.name) for p in (tmp_path / "checkpoints" / "latest").iterdir()
                 if p.name.isdigit())
  assert saved and max(saved) == 4  # steps 1..4 saved; the NaN step 5 was not
  c.inject_nan_step = -1
  results = train.run(c)  # resumes from 4 with finite parameters and finishes
  assert isinstance(results, dict)
  assert all(np.isfinite(v) for v in _losses(tmp_path).values())
