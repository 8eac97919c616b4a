"""Renders a procedural room from several cameras and writes a PNG contact sheet.

    python -m launch.render_demo --config configs/render_demo.py [--config.key=value ...]

Rows: colour views, depth maps, instance maps, and the same views with depth-dependent
disc splats. The config file's header gives the cost.
"""

from absl import logging

from recipes import cli
from recipes import render_demo

_CONFIG = cli.config_flag("config", "configs/render_demo.py",
                                          "the demo's config file")


def main(argv) -> None:
  del argv
  logging.set_verbosity(logging.WARNING)  # absl would print JAX's backend probing at INFO
  render_demo.render_sheet(_CONFIG.value)


if __name__ == "__main__":
  cli.run(main)
