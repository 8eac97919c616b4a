"""The shared argument helpers of the perception tools, against hand-written values."""

import numpy as np
import pytest

from jaxspatial.perception import ocr, segmentation, tool_args
from jaxspatial.perception.tool_args import (ToolArgumentError, check_image, error_text,
                                             parse_box, short, tool_arguments)

PREFIX = "bounding_box must be [x1, y1, x2, y2] or \\boxed{x1,y1,x2,y2} on the 0-1000 grid; "


def test_the_old_modules_share_one_copy():
  for module in (ocr, segmentation):
    assert module.parse_box is parse_box and module.ToolArgumentError is ToolArgumentError
    assert module.check_image is check_image and module.GRID == 1000
    assert module.SUCCESS == "Tool executed successfully.\nResult: "


@pytest.mark.parametrize("value, expected", [
    ([1, 2, 3, 4], (1.0, 2.0, 3.0, 4.0)),
    ((0, 0, 1000, 1000), (0.0, 0.0, 1000.0, 1000.0)),
    (np.array([10, 20, 30, 40]), (10.0, 20.0, 30.0, 40.0)),
    (np.array([0.5, 1.5, 2.5, 3.5], np.float32), (0.5, 1.5, 2.5, 3.5)),
    ("\\boxed{10,20,30,40}", (10.0, 20.0, 30.0, 40.0)),
    ("boxed{ 10 , 20, 30.5, 40 }", (10.0, 20.0, 30.5, 40.0)),
    # \boxed{} inside longer text wins over the text's other numbers.
    ("box 2 of 3: \\boxed{0,0,1000,1000}", (0.0, 0.0, 1000.0, 1000.0)),
    ("[5, 6, 7, 8]", (5.0, 6.0, 7.0, 8.0)),
    ("5 6 7 8", (5.0, 6.0, 7.0, 8.0)),
    ("left 1e2, top .5, right 2e2, bottom 300", (100.0, 0.5, 200.0, 300.0)),
])
def test_parse_box_reads_every_form_either_tool_read(value, expected):
  box = parse_box(value)
  assert box == expected and all(type(c) is float for c in box)


@pytest.mark.parametrize("value, problem", [
    (None, "bounding_box is missing"),
    ([500, 0, 400, 100], "got [500, 0, 400, 100], which needs x1 < x2 and y1 < y2"),
    ([0, 300, 100, 300], "got [0, 300, 100, 300], which needs x1 < x2 and y1 < y2"),
    ([0, 0, 1001, 10], "got [0, 0, 1001, 10], outside the 0-1000 grid"),
    ([-5, 0, 10, 10], "got [-5, 0, 10, 10], outside the 0-1000 grid"),
    ([0, 0, float("nan"), 10], "got [0, 0, nan, 10], which has a non-finite coordinate"),
    ("\\boxed{0,0,inf,10}", "\\boxed{} must hold 4 comma-separated numbers, got "
                            "'\\\\boxed{0,0,inf,10}'"),
    ([True, 0, 10, 10], "4 numbers, got [True, 0, 10, 10]"),
    ([0, 0, 10], "4 numbers, got [0, 0, 10]"),
    ([[0, 0], [10, 10]], "4 numbers, got [[0, 0], [10, 10]]"),
    (np.zeros((2, 2)), "4 numbers, got array([[0., 0.],\n       [0., 0.]])"),
    ("\\boxed{1,2,3}", "\\boxed{} must hold 4 comma-separated numbers, got '\\\\boxed{1,2,3}'"),
    ("\\boxed{a,1,2,3,4}", "\\boxed{} must hold 4 comma-separated numbers, got "
                           "'\\\\boxed{a,1,2,3,4}'"),
    ("0 0 1 1 2", "got '0 0 1 1 2' (5 numbers, not 4)"),
    ("", "got '' (0 numbers, not 4)"),
    ("1" * 300, "got a 300-character string without \\boxed{}"),
    ({"x1": 0}, "got dict {'x1': 0}"),
    (7, "got int 7"),
])
def test_parse_box_refuses_with_the_reason(value, problem):
  with pytest.raises(ToolArgumentError) as error:
    parse_box(value)
  assert str(error.value) == PREFIX + problem


def test_parse_box_names_the_argument_and_survives_hostile_values():
  with pytest.raises(ToolArgumentError, match=r"^region must be \[x1, y1, x2, y2\].*region is "
                     r"missing$"):
    parse_box(None, "region")
  # An int past float range and a list nested past Python's recursion limit.
  with pytest.raises(ToolArgumentError, match="outside the 0-1000 grid"):
    parse_box([10**400, 0, 1, 1])
  nested = []
  for _ in range(100_000):
    nested = [nested]
  with pytest.raises(ToolArgumentError, match=r"4 numbers, got \[\[\[\.\.\.\]\]\]"):
    parse_box(nested)
  assert issubclass(ToolArgumentError, ValueError)


def test_short_bounds_any_value():
  assert short(7) == "7" and short("cat") == "'cat'"
  assert short("x" * 500, 20) == "'xxxxxxxxxxxxxxxx..."
  assert short("x" * 18, 20) == "'" + "x" * 18 + "'"
  assert short(list(range(100))) == "[0, 1, 2, 3, 4, 5, ...]"
  assert short({"a": {"b": {"c": 1}}}) == "{'a': {'b': {...}}}"
  assert len(short(10**1000)) <= 80


def test_error_text_and_tool_arguments():
  assert error_text("text_ocr", ToolArgumentError("bad")) == "Error executing text_ocr: bad"
  assert tool_arguments(None, ("image_index",)) == {}
  call = {"image_index": 0, "bounding_box": [1, 2, 3, 4]}
  assert tool_arguments(call, ("image_index", "bounding_box")) is call
  with pytest.raises(ToolArgumentError, match=r"^arguments must be an object, got \[1, 2\]$"):
    tool_arguments([1, 2], ("image_index",))
  with pytest.raises(ToolArgumentError, match=r"^unexpected argument 'text'; expected "
                     r"\['image_index', 'text_prompt'\]$"):
    tool_arguments({"text": "cat", "image_index": 0}, ("image_index", "text_prompt"))


def test_check_image_is_the_callers_contract():
  image = np.zeros((4, 6, 3), np.uint8)[:, ::2]
  checked = check_image(image, "tool")
  assert checked.shape == (4, 3, 3) and checked.flags.c_contiguous
  cases = [(np.zeros((4, 4, 3), np.float32), "got dtype float32 (floats in [0, 1]: "
                                             "(image * 255).round().astype(np.uint8))"),
           (np.zeros((4, 4, 3), np.int64), "got dtype int64"),
           (np.zeros((4, 4), np.uint8), "got shape (4, 4) uint8"),
           (np.zeros((0, 4, 3), np.uint8), "got an empty image (0, 4, 3)")]
  for bad, shown in cases:
    with pytest.raises(ValueError) as error:
      check_image(bad, "tool")
    assert str(error.value) == f"tool: expected an image [H, W, 3] uint8 RGB, {shown}"
  assert tool_args.GRID == 1000
