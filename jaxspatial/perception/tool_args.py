"""Model-written tool arguments: PERIA's perception tools (OCR, SAM 3, detection) and
SpatialClaw's host tools (`jaxspatial.agents.tools`) check them here, one set for both.

A tool call's arguments come from the policy model, so any value can arrive. They become
checked Python values here (`parse_box`: a 0-1000 box; `parse_text`; `tool_arguments`: the
arguments object; SpatialClaw's `parse_int`, `parse_number`, `parse_array`, `parse_image`,
`parse_pixel_box`, `frame_indices`) or a `ToolArgumentError`, which PERIA's tools return as
the error observation "Error executing {tool}: ..." (`error_text`) and SpatialClaw's kernel
shows the model, instead of raising: a bad call is something the model should see and
recover from, not a crash of the rollout. The caller's own inputs (the image, settings)
still raise (`check_image`).
"""

from __future__ import annotations

import math
import numbers
import re
import reprlib
from typing import Any, Sequence

import numpy as np

from jaxspatial.errors import ToolArgumentError

GRID = 1000  # PERIA's coordinate grid over width and height
MAX_PROMPT_CHARS = 1000  # a longer model-written prompt is refused (it is echoed in the JSON)
SUCCESS = "Tool executed successfully.\nResult: "


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 2, 6, 6, 4
_REPR.maxstring, _REPR.maxlong, _REPR.maxother = 60, 40, 60


def short(value, limit: int = 80) -> str:
  """A repr of a model-written value cut to `limit` characters. Containers go through
  reprlib, so huge or deeply nested values cost little (plain repr recurses past Python's
  limit on a list nested 100,000 deep); a string keeps its first `limit` characters."""
  if isinstance(value, str):
    text = repr(value[:limit + 1])  # one past the limit, so a cut string is marked as cut
  else:
    text = _REPR.repr(value)
  return text if len(text) <= limit else text[:limit - 3] + "..."


def error_text(tool: str, message) -> str:
  """PERIA's error observation for a call of `tool`."""
  return f"Error executing {tool}: {message}"


def check_image(image_HxWx3, where: str) -> np.ndarray:
  """The image as a C-contiguous uint8 [H, W, 3] array, or ValueError naming `where`,
  the expected layout and what was given."""
  expected = f"{where}: expected an image [H, W, 3] uint8 RGB"
  try:
    image = np.asarray(image_HxWx3)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{expected}, got {type(image_HxWx3).__name__} ({e})") from e
  if image.ndim != 3 or image.shape[-1] != 3:
    raise ValueError(f"{expected}, got shape {tuple(image.shape)} {image.dtype}")
  if image.dtype != np.uint8:
    hint = (" (floats in [0, 1]: (image * 255).round().astype(np.uint8))"
            if np.issubdtype(image.dtype, np.floating) else "")
    raise ValueError(f"{expected}, got dtype {image.dtype}{hint}")
  if image.shape[0] == 0 or image.shape[1] == 0:
    raise ValueError(f"{expected}, got an empty image {tuple(image.shape)}")
  return np.ascontiguousarray(image)


_BOXED = re.compile(r"\\?boxed\{([^{}]*)\}")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_MAX_FREE_TEXT = 256  # a longer string without \boxed{} is refused, never cut mid-number


def parse_box(value, name: str = "bounding_box") -> tuple[float, float, float, float]:
  """(x1, y1, x2, y2) on the 0-1000 grid with 0 <= x1 < x2 <= 1000 and 0 <= y1 < y2 <= 1000.

  Read from a list, tuple or array of 4 numbers; from "\\boxed{x1,y1,x2,y2}" (PERIA's
  form, possibly inside longer text: its braces must hold exactly 4 comma-separated
  numbers); or from a short string holding exactly 4 numbers ("[x1, y1, x2, y2]",
  "x1 y1 x2 y2"). ToolArgumentError saying what is wrong otherwise.
  """
  expected = (f"{name} must be [x1, y1, x2, y2] or \\boxed{{x1,y1,x2,y2}} on the 0-1000 "
              "grid")

  def fail(problem: str):
    return ToolArgumentError(f"{expected}; {problem}")

  if value is None:
    raise fail(f"{name} is missing")
  if isinstance(value, str):
    match = _BOXED.search(value[:1000])
    if match:
      parts = match.group(1).split(",")
      if len(parts) != 4 or not all(_NUMBER.fullmatch(p.strip()) for p in parts):
        raise fail(f"\\boxed{{}} must hold 4 comma-separated numbers, got {short(value)}")
      coords = [float(p) for p in parts]
    elif len(value) > _MAX_FREE_TEXT:
      raise fail(f"got a {len(value)}-character string without \\boxed{{}}")
    else:
      coords = [float(v) for v in _NUMBER.findall(value)]
      if len(coords) != 4:
        raise fail(f"got {short(value)} ({len(coords)} numbers, not 4)")
  elif isinstance(value, (list, tuple, np.ndarray)):
    # An array must be flat; a list's items are checked one by one (np.ndim on a ragged or
    # deeply nested list raises or recurses).
    if isinstance(value, np.ndarray):
      items = value.tolist() if value.ndim == 1 else None
    else:
      items = list(value)
    # bool is an int to Python, but True is no coordinate.
    if items is None or len(items) != 4 or not all(
        isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) for v in items):
      raise fail(f"4 numbers, got {short(value)}")
    try:
      coords = [float(v) for v in items]
    except OverflowError:  # an int past float range
      raise fail(f"got {short(value)}, outside the 0-1000 grid") from None
  else:
    raise fail(f"got {type(value).__name__} {short(value)}")
  if not all(math.isfinite(c) for c in coords):
    raise fail(f"got {short(value)}, which has a non-finite coordinate")
  x1, y1, x2, y2 = coords
  if min(coords) < 0 or max(coords) > GRID:
    raise fail(f"got {short(value)}, outside the 0-1000 grid")
  if x2 <= x1 or y2 <= y1:
    raise fail(f"got {short(value)}, which needs x1 < x2 and y1 < y2")
  return x1, y1, x2, y2


def tool_arguments(arguments, allowed: Sequence[str]) -> dict:
  """The model's arguments object, checked: None is {}, else a dict whose keys are all in
  `allowed`; ToolArgumentError otherwise."""
  if arguments is None:
    return {}
  if not isinstance(arguments, dict):
    raise ToolArgumentError(f"arguments must be an object, got {short(arguments)}")
  unknown = sorted(str(k) for k in arguments if k not in allowed)
  if unknown:
    raise ToolArgumentError(f"unexpected argument {short(unknown[0], 40)}; expected "
                            f"{list(allowed)}")
  return arguments


def parse_text(value, name: str, limit: int = MAX_PROMPT_CHARS) -> str:
  """A model-written text argument, stripped; ToolArgumentError when missing, not a string,
  empty or longer than `limit`."""
  if value is None:
    raise ToolArgumentError(f"{name} is missing")
  if not isinstance(value, str):
    raise ToolArgumentError(f"{name} must be a string, got {type(value).__name__} "
                            f"{short(value)}")
  text = value.strip()
  if not text:
    raise ToolArgumentError(f"{name} is empty; expected a non-empty string")
  if len(text) > limit:
    raise ToolArgumentError(f"{name} is too long ({len(text)} characters, over the limit of "
                            f"{limit})")
  return text


# --- values in pixels, frames and arrays (SpatialClaw's host tools) ---------------------------

def parse_int(value: Any, name: str, low: int | None = None, high: int | None = None) -> int:
  """An integer (a 0-d integer array too; bools refused) in [low, high]."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iu":
      value = int(value)
    else:
      raise ToolArgumentError(f"{name}: expected an integer, got {type(value).__name__}")
  value = int(value)
  if (low is not None and value < low) or (high is not None and value > high):
    raise ToolArgumentError(f"{name}: {value} is out of range [{low}, {high}]")
  return value


def parse_number(value: Any, name: str, low: float | None = None,
                 high: float | None = None) -> float:
  """A finite number (bools refused) in [low, high], as a float."""
  if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
    raise ToolArgumentError(f"{name}: expected a number, got {type(value).__name__}")
  value = float(value)
  if not math.isfinite(value):
    raise ToolArgumentError(f"{name}: expected a finite number, got {value}")
  if (low is not None and value < low) or (high is not None and value > high):
    raise ToolArgumentError(f"{name}: {value:g} is out of range [{low}, {high}]")
  return value


def parse_array(value: Any, name: str, shape: tuple, dtype_kind: str = "fiu") -> np.ndarray:
  """A numeric array whose shape matches `shape` (None: any size on that axis)."""
  try:
    array = np.asarray(value)
  except (ValueError, TypeError) as error:
    raise ToolArgumentError(f"{name}: not an array ({error})") from None
  if array.dtype.kind not in dtype_kind or array.ndim != len(shape) or any(
      s is not None and s != a for s, a in zip(shape, array.shape)):
    want = "x".join("N" if s is None else str(s) for s in shape)
    raise ToolArgumentError(f"{name}: expected a numeric array of shape [{want}], got "
                            f"{array.dtype} {list(array.shape)}")
  if array.dtype.kind == "f" and not np.isfinite(array).all():
    raise ToolArgumentError(f"{name}: holds NaN or infinite values")
  return array


def parse_image(value: Any, name: str) -> np.ndarray:
  """A model-given RGB image as uint8 [H, W, 3] (gray [H, W] and floats in [0, 1]
  accepted); unlike `check_image` (the caller's own input) a bad one is the model's
  ToolArgumentError."""
  array = np.asarray(value)
  if array.ndim == 2:
    array = np.repeat(array[..., None], 3, axis=-1)
  if array.ndim != 3 or array.shape[-1] not in (3, 4) or min(array.shape[:2]) < 1:
    raise ToolArgumentError(f"{name}: expected an image [H, W, 3], got shape "
                            f"{list(array.shape)}")
  if array.shape[0] * array.shape[1] > 4096 * 4096:
    raise ToolArgumentError(f"{name}: {array.shape[1]} x {array.shape[0]} is over 4096 x 4096 "
                            "pixels")
  array = array[..., :3]
  if array.dtype == np.uint8:
    return array
  if array.dtype.kind == "f":
    if not np.isfinite(array).all():
      raise ToolArgumentError(f"{name}: holds NaN or infinite values")
    scale = 255.0 if array.max(initial=0.0) <= 1.0 else 1.0
    return np.clip(np.rint(array * scale), 0, 255).astype(np.uint8)
  if array.dtype.kind in "iub":
    return np.clip(array, 0, 255).astype(np.uint8)
  raise ToolArgumentError(f"{name}: expected a numeric image, got {array.dtype}")


def frame_indices(value: Any, count: int, limit: int, name: str = "frames") -> list[int]:
  """Distinct frame indices in [0, count): an int, a list, or None (all, if <= limit)."""
  if value is None:
    if count > limit:
      raise ToolArgumentError(f"{name}: this task has {count} frames, over the limit of {limit} "
                              "a call; pass frames=[...] (e.g. every "
                              f"{math.ceil(count / limit)}th)")
    return list(range(count))
  if isinstance(value, np.ndarray):
    value = value.tolist()
  if isinstance(value, (list, tuple)):
    if not value:
      raise ToolArgumentError(f"{name}: expected at least one frame index")
    if len(value) > limit:
      raise ToolArgumentError(f"{name}: {len(value)} frames, over the limit of {limit} a call")
    out = [parse_int(v, f"{name}[{k}]", 0, count - 1) for k, v in enumerate(value)]
  else:
    out = [parse_int(value, name, 0, count - 1)]
  if len(set(out)) != len(out):
    raise ToolArgumentError(f"{name}: repeated frame indices {out}")
  return out


def parse_pixel_box(value: Any, height: int, width: int, name: str = "box") -> np.ndarray:
  """[x1, y1, x2, y2] float64 in pixels of a height x width image (`parse_box`: PERIA's
  0-1000 grid instead)."""
  box = parse_array(value, name, (4,)).astype(np.float64)
  x1, y1, x2, y2 = box
  if not (0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height):
    raise ToolArgumentError(f"{name}: expected pixels [x1, y1, x2, y2] with 0 <= x1 < x2 <= "
                            f"{width} and 0 <= y1 < y2 <= {height}, got {box.tolist()}")
  return box
