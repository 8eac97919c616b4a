"""Every recipe through the one trainer, at tiny size (`make train-checks`; too slow for
`make test`, which keeps one of each on the demo: tests/train/test_train_job.py):

- a run killed with SIGKILL after a save and resumed gives the same losses and metrics as
  an uninterrupted run;
- a NaN stops the run naming the step, with nothing saved for it;
- `launch.eval` evaluates the run's checkpoint;
- a 2-process `jax.distributed` CPU run completes an RL step, each process reading its
  own data.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest
from tests.conftest import xla_flags

pytestmark = pytest.mark.recipe_checks

ROOT = pathlib.Path(__file__).resolve().parents[2]
TIMING = ("time", "rl/tokens_per_s")
AGENT = {"sft.steps": 2, "sft.batch": 4, "rl.steps": 2, "rl.prompts": 2, "eval.batch": 4,
         "eval.tasks": 0, "checkpoint.every": 1, "snapshot_every": 0, "log_every": 1,
         "data.build": False, "advantage.group_size": 2}
THINKER = {"data.train": 24, "data.test": 8, "scene.points": 2000, "eval.batch": 8,
           "evaluate": False, "checkpoint.every": 1, "log_every": 1}
DEMO = {"model.hidden": 64, "model.intermediate": 128, "model.layers": 1,
        "model.vision_hidden": 32, "model.vocab": 500, "scene.points": 2000,
        "data.train_tasks": 12, "data.test_tasks": 6, "data.sft_trajectories": 16,
        "sft.steps": 3, "sft.batch": 8, "rl.steps": 2, "rl.prompts": 2,
        "advantage.group_size": 2, "checkpoint.every": 1, "evaluate": False,
        "snapshot_every": 0, "log_every": 1, "eval.batch": 6}
RECIPES = {  # name: (config, overrides, the step the killed run dies after)
    "demo": ("configs/demo.py", DEMO, 4),
    "think3d_rl": ("configs/think3d_rl.py:cpu", AGENT, 3),
    "act3d_grpo": ("configs/act3d_grpo.py:cpu", {**AGENT, "rl.mini_batches": 1}, 3),
    "peria_or_gigpo": ("configs/peria_or_gigpo.py:cpu", AGENT, 3),
    "thinker3d_stage1": ("configs/thinker3d_stage1.py:cpu", {**THINKER, "sft.steps": 3,
                                                           "sft.batch": 8}, 2),
    "thinker3d_stage2": ("configs/thinker3d_stage2.py:cpu", {**THINKER, "rl.steps": 3,
                                                           "rl.prompts": 2,
                                                           "advantage.group_size": 2}, 2),
}


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
  """The tiny task dataset, and a stage-1 run for stage 2 to start from."""
  root = tmp_path_factory.mktemp("shared")
  from data_pipelines.builders import SyntheticSpatial
  SyntheticSpatial(data_dir=str(root / "tfds"), config="tiny").download_and_prepare()
  out = _train(root / "stage1", "thinker3d_stage1", root)
  assert out.returncode == 0, out.stderr[-3000:]
  return root


def _overrides(name, workdir, root, extra=None) -> list[str]:
  config, overrides, _ = RECIPES[name]
  values = {**overrides, "workdir": workdir, **(extra or {})}
  if config == "configs/demo.py":
    pass
  elif config.startswith("configs/thinker3d"):
    values["data.cache"] = root / "thinker3d_data"
    if "stage2" in config:
      values["init_from"] = root / "stage1"
  else:
    values["data.data_dir"] = root / "tfds"
  return ["--config", config] + [f"--config.{k}={v}" for k, v in values.items()]


def _train(workdir, name, root, extra=None, env=None, module="launch.train"):
  return subprocess.run([sys.executable, "-m", module, *_overrides(name, workdir, root, extra)],
                        cwd=ROOT, capture_output=True, text=True, timeout=1500,
                        env=dict(os.environ, JAX_PLATFORMS="cpu", **(env or {})))


def _rows(workdir) -> dict:
  rows = [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").read_text()
          .splitlines() if line.strip()]
  steps = [row["step"] for row in rows]
  assert len(steps) == len(set(steps)), steps
  return {row["step"]: {k: v for k, v in row.items() if k not in TIMING} for row in rows}


def _saved(workdir) -> list[int]:
  return sorted(int(p.name) for p in (pathlib.Path(workdir) / "checkpoints" / "latest")
                .iterdir() if p.name.isdigit())


@pytest.mark.parametrize("name", list(RECIPES))
def test_kill_resume_nan_and_eval(tmp_path, shared, name):
  straight = _train(tmp_path / "straight", name, shared)
  assert straight.returncode == 0, straight.stderr[-3000:]
  expected = _rows(tmp_path / "straight")
  kill = RECIPES[name][2]
  killed = _train(tmp_path / "killed", name, shared, {"faults.kill_after_step": kill})
  assert killed.returncode == -9, killed.stderr[-3000:]
  assert max(_saved(tmp_path / "killed")) == kill
  resumed = _train(tmp_path / "killed", name, shared)
  assert resumed.returncode == 0 and f"resumed from step {kill}" in resumed.stdout, (
      resumed.stdout[-2000:] + resumed.stderr[-3000:])
  got = _rows(tmp_path / "killed")
  assert sorted(got) == sorted(expected)
  for step, row in expected.items():
    assert sorted(got[step]) == sorted(row), step
    np.testing.assert_allclose([got[step][k] for k in sorted(row)],
                               [row[k] for k in sorted(row)], rtol=1e-5, atol=1e-7,
                               err_msg=f"{name} step {step}")
  nan = _train(tmp_path / "nan", name, shared, {"faults.nan_at_step": kill})
  assert nan.returncode != 0
  assert f"step {kill}: the loss or a gradient is not finite" in nan.stderr
  assert max(_saved(tmp_path / "nan")) == kill - 1
  evaluated = _train(tmp_path / "straight", name, shared, module="launch.eval")
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert f"step {max(expected)}" in evaluated.stdout


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.mark.parametrize("name", list(RECIPES))
def test_two_processes_complete_an_rl_step(tmp_path, shared, name):
  """Two `jax.distributed` CPU processes (one device each) train the recipe's first RL step
  (SFT skipped) on one mesh, each reading its own rows of the batch."""
  port = _free_port()
  extra = {"checkpoint.every": 1}
  if name.startswith("thinker3d_stage1"):
    extra.update({"sft.steps": 1})
  else:
    extra.update({"rl.steps": 1, "sft.steps": 0} if not name.startswith("thinker3d") else
                 {"rl.steps": 1})
  procs = []
  for i in range(2):
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
               JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(i),
               XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=1"),
               JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")
    # Output to files: a full pipe would block one process inside a collective.
    log = open(tmp_path / f"process{i}.log", "w", encoding="utf-8")  # pylint: disable=consider-using-with
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "launch.train", *_overrides(name, tmp_path / "run", shared,
                                                           extra)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True))
  for i, p in enumerate(procs):
    p.wait(timeout=1500)
    out = (tmp_path / f"process{i}.log").read_text()
    assert p.returncode == 0, out[-4000:]
  rows = _rows(tmp_path / "run")
  assert max(rows) == 1 and np.isfinite(next(iter(rows.values()))[
      "sft/loss" if name == "thinker3d_stage1" else "rl/loss"])
