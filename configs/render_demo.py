r"""Render a procedural room from an orbit of cameras into a PNG contact sheet.

    python -m launch.render_demo --config configs/render_demo.py \
        --config.num_points=1000000 --config.width=640 --config.height=480

Cost: about 10 s on a 2-core CPU at the defaults, most of it compiling; no accelerator.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.num_points = 400_000
  config.num_objects = 8
  config.num_views = 6
  config.width = 320
  config.height = 240
  config.hfov_deg = 70.0
  config.splat_radius = 1
  # The last row: depth-dependent disc splats, world radius `point_radius`, capped in pixels.
  config.point_radius = 0.015
  config.max_splat_radius = 4
  config.out = "outputs/render_demo.png"
  return config
