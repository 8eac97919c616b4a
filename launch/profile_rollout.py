"""Compiles a rollout for a config and reports what XLA made of it: compile time, the
compiled program's cost analysis (FLOPs, bytes accessed) and memory analysis, run time per
episode; optionally a `jax.profiler` trace for TensorBoard / XProf.

    python -m launch.profile_rollout --config configs/rollout_demo.py \
        [--config.batch=32] [--config.trace_dir=outputs/rollout_trace]

Cost analysis counts each loop body once (XLA does not know trip counts), so FLOPs are
per decode step and per turn body, not per episode.
"""

from absl import app
from ml_collections import config_flags

from recipes import rollout_demo

_CONFIG = config_flags.DEFINE_config_file("config", "configs/rollout_demo.py",
                                          "the rollout config file")


def main(argv) -> None:
  del argv
  rollout_demo.profile(_CONFIG.value)


if __name__ == "__main__":
  app.run(main)
