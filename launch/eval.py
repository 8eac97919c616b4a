"""Evaluates a training run's checkpoint with its recipe's evaluation, or a model on a
prepared benchmark with the papers' protocols.

    python -m launch.eval --config configs/<recipe>.py[:variant] [--checkpoint DIR]
        [--split NAME] [--best]

    python -m launch.eval --benchmark NAME --data_dir DIR
        (--checkpoint HF_FOLDER | --endpoint URL --model NAME)
        [--agent think3d|act3d|peria|spatialclaw|none] [--seeds 3] [--limit N | --ids FILE]
        --out DIR [--letter_rule mindcube|thinker3d|think3d|vsibench|blink|letter]

The first: the recipe's evaluation of a run's work directory (default: the config's
`workdir`). The second: recipes/benchmark_command.py (each option, the outputs, resuming).
"""

from __future__ import annotations

# Before anything starts the XLA backend (it reads XLA_FLAGS once).
from jaxspatial import xla_workarounds

xla_workarounds.apply()
# pylint: disable=wrong-import-position

import json
import signal
import sys

from absl import app, flags, logging

import recipes
from recipes import benchmark_command, cli
from recipes.benchmark_command import BenchmarkOptions

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "a run's work directory (default: "
                                  "the config's workdir); with --benchmark, a Hugging Face "
                                  "policy folder")
_SPLIT = flags.DEFINE_string("split", None, "the split to evaluate (default: the config's)")
_BEST = flags.DEFINE_bool("best", False, "evaluate the best checkpoint instead of the latest")
cli.define_flags(BenchmarkOptions)

def _stop(signum, frame) -> None:
  del frame
  raise KeyboardInterrupt(f"signal {signum}")


def main(argv) -> None:
  del argv
  logging.set_verbosity(logging.WARNING)
  if not flags.FLAGS.benchmark:
    cli.need_run(_CHECKPOINT.value, _CONFIG.value)
    print("restoring the run and compiling its evaluation (a minute or more on a CPU) ...",
          file=sys.stderr, flush=True)
    print(json.dumps(recipes.evaluate(_CONFIG.value, _CHECKPOINT.value, _SPLIT.value,
                                      _BEST.value), indent=2))
    return
  options = cli.flag_values(BenchmarkOptions)
  if _CHECKPOINT.value:
    cli.need_policy(_CHECKPOINT.value)
  # SIGTERM (a scheduler's stop) as SIGINT: the recorded answers are kept and the results
  # written from them before the run ends.
  signal.signal(signal.SIGTERM, _stop)
  try:
    given = any(a == "--config" or a.startswith("--config=") for a in sys.argv[1:])
    overrides = any(a.startswith("--config.") for a in sys.argv[1:])
    config = benchmark_command.agent_config(options, _CONFIG.value, given, overrides)
    document = benchmark_command.run(options, _CHECKPOINT.value, _SPLIT.value, config)
  except benchmark_command.UsageError as error:
    raise app.UsageError(str(error)) from None
  except KeyboardInterrupt:
    sys.exit(f"launch.eval: interrupted; every finished answer is in {options.out}/"
             "predictions.jsonl (results.json: the partial results): rerun the same "
             "command to finish")
  benchmark_command.report(document, options)


if __name__ == "__main__":
  _CONFIG = cli.config_flag("config", "configs/demo.py", "the training config")
  cli.run(main)
