"""The render demo writes a contact sheet of the expected size that shows the scene."""

import numpy as np
from PIL import Image

from configs import render_demo as demo_config
from recipes import render_demo


def test_demo_writes_a_contact_sheet(tmp_path):
  config = demo_config.get_config()
  config.num_points = 30_000
  config.num_views = 3
  config.width, config.height = 64, 48
  config.out = str(tmp_path / "sheet.png")
  out = render_demo.render_sheet(config)
  sheet = np.asarray(Image.open(str(out)))
  rows, label, gap = 4, 16, 4
  assert sheet.shape == (rows * (48 + gap + label) + gap, 3 * (64 + gap) + gap, 3)
  first_view = sheet[gap + label: gap + label + 48, gap: gap + 64]
  # Cameras inside the room see the room, not the background.
  assert (first_view != 255).any(axis=-1).mean() > 0.9
  assert len(np.unique(first_view.reshape(-1, 3), axis=0)) > 100
