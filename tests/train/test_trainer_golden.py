"""`Trainer.run` on a tiny demo experiment (two SFT steps, one GRPO step), preempted after
the SFT phase and resumed, against golden metrics: the core training loop in `make test`.

A failure lists each metric that moved. If the change is intended (a new loss term, a
changed default), regenerate the golden file and say why in the commit:

    JAX_PLATFORMS=cpu python -m tests.train.test_trainer_golden --update
"""

import json
import pathlib
import sys

import numpy as np
import pytest

import recipes
from jaxspatial.train import Trainer
from tests.train.tiny_demo import demo_config, step_metrics

GOLDEN = pathlib.Path(__file__).with_name("golden") / "trainer_demo_tiny.json"
TINY = {"model.hidden": 64, "model.intermediate": 128, "model.layers": 1,
        "model.vision_hidden": 32, "model.vocab": 500, "scene.points": 2000,
        "data.train_tasks": 8, "data.test_tasks": 4, "data.sft_trajectories": 16,
        "sft.steps": 2, "sft.batch": 8, "sft.optimizer.warmup_steps": 1, "rl.steps": 1,
        "rl.prompts": 2, "rl.optimizer.warmup_steps": 1, "advantage.group_size": 2,
        # beta 0: no reference program to compile (25 of 75 s); the KL reference's resume is
        # checked by tests/train/test_train_job.py (make train-checks)
        "objective.beta": 0.0, "checkpoint.every": 1, "checkpoint.keep": 3,
        "evaluate": False, "snapshot_every": 0, "log_every": 1}
RTOL, ATOL = 1e-4, 1e-6  # a zero-advantage step's gradient norm is rounding noise


def tiny_config(workdir):
  return demo_config(workdir, TINY)


def metrics(workdir) -> dict:
  """{step (a string, as JSON keys are): metrics without timings}."""
  return {str(step): row for step, row in step_metrics(workdir).items()}


def differences(got: dict, golden: dict) -> list[str]:
  out = []
  for step in sorted(set(got) | set(golden), key=int):
    if step not in got or step not in golden:
      out.append(f"step {step}: {'missing' if step not in got else 'not in the golden run'}")
      continue
    for name in sorted(set(got[step]) | set(golden[step])):
      want, have = golden[step].get(name), got[step].get(name)
      if want is None or have is None:
        out.append(f"step {step} {name}: golden {want}, got {have}")
      elif not np.isclose(have, want, rtol=RTOL, atol=ATOL):
        out.append(f"step {step} {name}: golden {want:.6g}, got {have:.6g}")
  return out


def run(workdir) -> dict:
  """Trains to the SFT phase's end, preempted there (SIGTERM: saves, exits 143), then
  resumes for the GRPO step; returns the metrics of both processes' steps."""
  c = tiny_config(workdir)
  c.faults.sigterm_after_step = TINY["sft.steps"]
  with pytest.raises(SystemExit) as preempted:
    Trainer(c, recipes.experiment(c)).run()
  assert preempted.value.code == 143
  c = tiny_config(workdir)
  Trainer(c, recipes.experiment(c)).run()
  return metrics(workdir)


def test_trainer_matches_the_golden_run(tmp_path):
  got = run(tmp_path)
  golden = json.loads(GOLDEN.read_text())
  changed = differences(got, golden)
  assert not changed, ("the tiny demo run no longer matches " + str(GOLDEN.name) + ":\n  "
                       + "\n  ".join(changed) + "\nIf intended, regenerate: " +
                       "JAX_PLATFORMS=cpu python -m tests.train.test_trainer_golden --update")
  sft, grpo = got["1"], got[str(TINY["sft.steps"] + 1)]
  assert sft["sft/loss"] > 0 and grpo["rl/tokens"] > 0  # both phases ran and were logged


if __name__ == "__main__":
  if sys.argv[1:] != ["--update"]:
    sys.exit(__doc__)
  import tempfile  # pylint: disable=import-outside-toplevel
  with tempfile.TemporaryDirectory() as folder:
    # The golden run is uninterrupted: the test's preempted run must equal it.
    config = tiny_config(folder)
    Trainer(config, recipes.experiment(config)).run()
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(metrics(folder), indent=1, sort_keys=True) + "\n")
  print(f"wrote {GOLDEN}")
