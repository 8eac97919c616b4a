"""Evaluates a training run's checkpoint on the test split: accuracy per question type,
with standard errors, for the policy and for answering from the first view.

    python -m launch.eval --config configs/demo.py [--config.workdir=outputs/demo] [--best]
"""

from __future__ import annotations

import json
import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from jaxspatial.train import Checkpointer, OptimizerConfig, make_optimizer
from launch import train

_BEST = flags.DEFINE_bool("best", False, "evaluate the best checkpoint instead of the latest")


def run(c, best: bool = False) -> dict:
  job = train.build(c)
  with jax.set_mesh(job.mesh):
    optimizer = make_optimizer(job.model, OptimizerConfig())
  checkpointer = Checkpointer(f"{c.workdir}/checkpoints", keep=c.checkpoint.keep,
                              best_metric="reward")
  restored = checkpointer.restore(job.model, optimizer, best=best)
  if restored is None:
    raise FileNotFoundError(f"launch.eval: no checkpoint under {c.workdir}/checkpoints")
  step, _ = restored
  results = {"step": step, "policy": train.evaluate(job),
             "first_view": train.evaluate(job, first_view_only=True)}
  print(f"checkpoint step {step}")
  print(train._table({"grpo": results["policy"], "first_view": results["first_view"]},
                     {"grpo": f"policy at step {step}",
                      "first_view": "same, answering from the first view"}))
  return results


def main(argv) -> None:
  del argv
  logging.set_verbosity(logging.WARNING)
  print(json.dumps(run(_CONFIG.value, _BEST.value), indent=2))


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", "configs/demo.py", "the training config")
  app.run(main, argv=sys.argv)
