"""Compiles a rollout for a config and reports what XLA made of it: compile time, the
compiled program's cost analysis (FLOPs, bytes accessed) and memory analysis, run time per
episode, and a `jax.profiler` trace (default outputs/rollout_trace; `--config.trace_dir=` none).

    python -m launch.profile_rollout --config configs/rollout_demo.py \
        [--config.batch=32] [--config.trace_dir=outputs/rollout_trace]
    xprof server --logdir outputs/rollout_trace --port 8791   (its trace, written by default)

Cost analysis counts each loop body once (XLA does not know trip counts), so FLOPs are
per decode step and per turn body, not per episode.
"""


from recipes import cli
from recipes import rollout_demo

_CONFIG = cli.config_flag("config", "configs/rollout_demo.py",
                                          "the rollout config file")


def main(argv) -> None:
  del argv
  rollout_demo.profile(_CONFIG.value)


if __name__ == "__main__":
  cli.run(main)
