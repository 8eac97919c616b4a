"""Evaluates a training run's checkpoint with its recipe's evaluation.

    python -m launch.eval --config configs/<recipe>.py[:variant] [--checkpoint DIR]
        [--split NAME] [--best]

The demo: the test split, the policy and the same policy answering from the first view;
the agent recipes: greedy accuracy per question family on `--split` (default: the config's
`data.eval_split`); 3DThinker: the held-out metrics. DIR is a run's work directory
(default: the config's `workdir`).
"""

from __future__ import annotations

# Before anything starts the XLA backend (it reads XLA_FLAGS once).
from jaxspatial import xla_workarounds

xla_workarounds.apply()
# pylint: disable=wrong-import-position

import json

from absl import app, flags, logging
from ml_collections import config_flags

import recipes

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "a run's work directory")
_SPLIT = flags.DEFINE_string("split", None, "the split to evaluate")
_BEST = flags.DEFINE_bool("best", False, "evaluate the best checkpoint instead of the latest")


def main(argv) -> None:
  del argv
  logging.set_verbosity(logging.WARNING)
  results = recipes.evaluate(_CONFIG.value, _CHECKPOINT.value, _SPLIT.value, _BEST.value)
  print(json.dumps(results, indent=2))


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", "configs/demo.py", "the training config")
  app.run(main)
