"""Evaluates a training run's checkpoint: accuracy per question type, with standard errors.

    python -m launch.eval --config configs/demo.py [--config.workdir=outputs/demo] [--best]
    python -m launch.eval --config configs/think3d_rl.py:cpu [--split validation] [--best]

The demo: the test split, the policy and the same policy answering from the first view.
Agent recipes (launch/recipe.py): greedy accuracy per question family on `--split`
(default: the config's `data.eval_split`), up to `eval.tasks` tasks.
"""

from __future__ import annotations

# Before anything starts the XLA backend (it reads XLA_FLAGS once).
from jaxspatial import xla_workarounds

xla_workarounds.apply()
# pylint: disable=wrong-import-position

import json
import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from jaxspatial.train import Checkpointer, OptimizerConfig, make_optimizer
from launch import train

_BEST = flags.DEFINE_bool("best", False, "evaluate the best checkpoint instead of the latest")
_SPLIT = flags.DEFINE_string("split", None, "agent recipes: the split to evaluate")


def run_recipe(c, best: bool = False, split: str | None = None) -> dict:
  from launch import recipe  # pylint: disable=import-outside-toplevel
  job = recipe.build(c)
  checkpointer = Checkpointer(f"{c.workdir}/checkpoints", keep=c.checkpoint.keep,
                              best_metric="reward")
  with jax.set_mesh(job.mesh):
    step = checkpointer.restore_params(job.model, best=best)
  if step is None:
    raise FileNotFoundError(f"launch.eval: no checkpoint under {c.workdir}/checkpoints")
  results = {"step": step, "split": split or c.data.eval_split,
             "policy": recipe.evaluate(job, split)}
  print(f"checkpoint step {step}, split {results['split']}")
  print(recipe.table({f"step {step}": results["policy"]}))
  return results


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
  c = _CONFIG.value
  results = (run_recipe(c, _BEST.value, _SPLIT.value) if c.get("recipe") == "agent"
             else run(c, _BEST.value))
  print(json.dumps(results, indent=2))


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", "configs/demo.py", "the training config")
  app.run(main, argv=sys.argv)
