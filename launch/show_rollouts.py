"""Runs a batch of compiled rollouts and writes an HTML page: each turn's text beside the
view the agent saw, the parsed actions, the rewards.

    python -m launch.show_rollouts --config configs/rollout_demo.py [--config.key=value ...]
"""


from recipes import cli
from recipes import rollout_demo

_CONFIG = cli.config_flag("config", "configs/rollout_demo.py",
                                          "the rollout config file")


def main(argv) -> None:
  del argv
  rollout_demo.show(_CONFIG.value)


if __name__ == "__main__":
  cli.run(main)
