"""Writes a training run's policy as a Hugging Face folder, for `launch.serve`,
`launch.eval --checkpoint` (with --benchmark) and transformers' `from_pretrained`.

    python -m launch.export --config configs/<recipe>.py[:variant] [--checkpoint WORKDIR]
        [--best | --step N] --out DIR [--overwrite] [--config.key=value ...]

The config is the one the run trained with (its recipe rebuilds the policy; the same
`--config.*` overrides, e.g. `--config.model.checkpoint=` for a recipe that started from a
pretrained folder). WORKDIR is the run's work directory (default: the config's `workdir`);
the latest step is exported, or step N, or the best RL step. DIR receives config.json,
model.safetensors (LoRA adapters merged into the base weights), the tokenizer, the image
processor config, the chat template and generation_config.json, written into a temporary
sibling and renamed into place; an existing non-empty DIR needs --overwrite. Prints one
line naming the folder and the step. The demo:

    python -m launch.export --config configs/demo.py --out outputs/demo_policy
    python -m launch.serve --checkpoint outputs/demo_policy --port 8000
"""

from __future__ import annotations

# Before anything starts the XLA backend (it reads XLA_FLAGS once).
from jaxspatial import xla_workarounds

xla_workarounds.apply()
# pylint: disable=wrong-import-position

import sys

from absl import app, flags, logging

from recipes import cli
from recipes.export import export_checkpoint

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "the run's work directory (default: "
                                  "the config's workdir)")
_STEP = flags.DEFINE_integer("step", None, "the step to export (default: the latest)")
_BEST = flags.DEFINE_bool("best", False, "export the best RL step instead of the latest")
_OUT = flags.DEFINE_string("out", None, "the Hugging Face folder to write (required)",
                           required=True)
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "replace an existing model folder at --out")


def main(argv) -> None:
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every read at INFO
  if _BEST.value and _STEP.value is not None:
    raise app.UsageError("--best and --step: choose one")
  try:
    cli.need_run(_CHECKPOINT.value, _CONFIG.value)
    exported = export_checkpoint(_CONFIG.value, _OUT.value, checkpoint=_CHECKPOINT.value,
                                 step=_STEP.value, best=_BEST.value,
                                 overwrite=_OVERWRITE.value)
  except (FileNotFoundError, FileExistsError, ValueError) as error:
    sys.exit(f"launch.export: {error}")
  print(f"exported step {exported.step} ({exported.family}) to {exported.folder}", flush=True)


if __name__ == "__main__":
  _CONFIG = cli.config_flag("config", "configs/demo.py", "the training config")
  cli.run(main)
