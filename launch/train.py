"""Trains a recipe: the config's `recipe` names its experiment (recipes/), which the library
trainer (jaxspatial.train.Trainer) runs: phases, checkpoints, resume, evaluation, report.

    python -m launch.train --config configs/<recipe>.py[:variant] [--config.key=value ...]

A run restarts from its last intact checkpoint and continues exactly. SIGTERM saves the
step and exits with status 143 (schedulers requeue on it).
"""

from __future__ import annotations

# Before anything starts the XLA backend (it reads XLA_FLAGS once).
from jaxspatial import xla_workarounds

xla_workarounds.apply()
# pylint: disable=wrong-import-position

from absl import logging

from recipes import cli
import recipes


def main(argv) -> None:
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  recipes.train(_CONFIG.value)


if __name__ == "__main__":
  _CONFIG = cli.config_flag("config", "configs/demo.py", "the training config")
  cli.run(main)
