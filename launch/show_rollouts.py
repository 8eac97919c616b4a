"""Runs a batch of compiled rollouts and writes an HTML page: each turn's text beside the
view the agent saw, the parsed actions, the rewards.

    python -m launch.show_rollouts --config configs/rollout_demo.py [--config.key=value ...]
"""

from absl import app
from ml_collections import config_flags

from recipes import rollout_demo

_CONFIG = config_flags.DEFINE_config_file("config", "configs/rollout_demo.py",
                                          "the rollout config file")


def main(argv) -> None:
  del argv
  rollout_demo.show(_CONFIG.value)


if __name__ == "__main__":
  app.run(main)
