"""Contact sheets: tiles in place, depth and instance colouring."""

import numpy as np
import pytest

from jaxspatial.render.contact_sheet import contact_sheet, depth_to_rgb, instance_to_rgb


def test_tiles_land_where_expected():
  red = np.zeros((10, 20, 3), np.uint8)
  red[..., 0] = 255
  blue = np.zeros((10, 20, 3), np.uint8)
  blue[..., 2] = 255
  sheet = np.asarray(contact_sheet([[red, blue], [blue]], gap=4))
  assert sheet.shape == (2 * 14 + 4, 2 * 24 + 4, 3)
  np.testing.assert_array_equal(sheet[4 + 5, 4 + 10], [255, 0, 0])
  np.testing.assert_array_equal(sheet[4 + 5, 28 + 10], [0, 0, 255])
  np.testing.assert_array_equal(sheet[18 + 5, 4 + 10], [0, 0, 255])
  with pytest.raises(ValueError, match=r"tile \(0, 1\) is \(5, 20\), expected \(10, 20\)"):
    contact_sheet([[red, blue[:5]]])


def test_depth_and_instance_colouring():
  depth = np.array([[0.0, 1.0, 2.0, 3.0]], np.float32)
  rgb = depth_to_rgb(depth)
  assert (rgb[0, 0] == 0).all()  # empty is black
  assert rgb[0, 1, 0] > rgb[0, 2, 0] > rgb[0, 3, 0]  # nearer is brighter
  inst = instance_to_rgb(np.array([[-1, 0, 1, 0]]))
  assert (inst[0, 0] == 90).all()
  np.testing.assert_array_equal(inst[0, 1], inst[0, 3])
  assert not np.array_equal(inst[0, 1], inst[0, 2])
