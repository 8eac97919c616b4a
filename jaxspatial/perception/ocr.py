"""OCR backends and PERIA's five OCR tools, run on the host (numpy in, text out).

A backend reads an image [H, W, 3] uint8 RGB into `TextLine`s in reading order (top to
bottom, left to right); a VLM backend can also `recognize(image, task)` with a task in
`TASKS` (paddleocr_vl.py: PaddleOCR-VL, PERIA's model). `RapidOCRBackend` runs PP-OCRv4
detection + recognition from the `rapidocr_onnxruntime` wheel, whose ONNX weights ship
inside the wheel (nothing to download).

The tools take the image itself (the caller resolves PERIA's `image_index`) and the tool's
other public argument, `bounding_box` = [x1, y1, x2, y2] on PERIA's 0-1000 grid over width
and height (optional; the image is cropped to it first, pixels int(c * size / 1000) as the
public server maps coordinates). Each returns the observation text of PERIA's tool server:
"Tool executed successfully.\\nResult: " + compact JSON shaped like the public PaddleOCR
tool's ({"task": ..., "text": ...}). Arguments are model-written: a bad one returns
"Error executing {tool}: ..." and never raises; the JSON stays within `max_chars`, dropping
whole items from the end and saying how many (`"truncated": true, "omitted": n`).
`run_tool(name, image, arguments, backend)` dispatches a parsed call by name (`TOOLS`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import re
import threading
from typing import Callable, Protocol, runtime_checkable

import numpy as np

# GRID, SUCCESS, check_image and parse_box are also this module's public names (the tests
# and paddleocr_vl.py import them from here).
from jaxspatial.perception.tool_args import (GRID, SUCCESS, ToolArgumentError, check_image,
                                             error_text, parse_box, short, tool_arguments)

TASKS = ("ocr", "table", "formula", "chart")
DEFAULT_MAX_CHARS = 4096
MIN_MAX_CHARS = 128  # room for an empty payload with its truncation mark


@dataclasses.dataclass(frozen=True, eq=False)
class TextLine:
  """One detected text line: corners [4, 2] float32 pixels (x, y), clockwise from the
  top-left, its text and the recogniser's confidence in [0, 1]."""
  box_4x2: np.ndarray
  text: str
  score: float

  def __post_init__(self):
    box = np.array(self.box_4x2, np.float32)
    if box.shape != (4, 2) or not np.isfinite(box).all():
      raise ValueError(f"TextLine.box_4x2: expected 4 finite (x, y) corners [4, 2], got "
                       f"{np.shape(self.box_4x2)}")
    box.setflags(write=False)
    object.__setattr__(self, "box_4x2", box)
    object.__setattr__(self, "text", str(self.text))
    object.__setattr__(self, "score", float(self.score))

  @property
  def bounds(self) -> tuple[float, float, float, float]:
    """(x0, y0, x1, y1): the axis-aligned box around the corners, in pixels."""
    (x0, y0), (x1, y1) = self.box_4x2.min(0), self.box_4x2.max(0)
    return float(x0), float(y0), float(x1), float(y1)

  def __eq__(self, other):
    if not isinstance(other, TextLine):
      return NotImplemented
    return (self.text == other.text and self.score == other.score
            and np.array_equal(self.box_4x2, other.box_4x2))

  __hash__ = None


@runtime_checkable
class OCRBackend(Protocol):
  """Reads text lines, in reading order, from an image [H, W, 3] uint8 RGB."""

  def read(self, image_HxWx3: np.ndarray) -> list[TextLine]:
    ...


@runtime_checkable
class RecognizingBackend(OCRBackend, Protocol):
  """A VLM backend: also the whole image as text for a task in TASKS."""

  def recognize(self, image_HxWx3: np.ndarray, task: str) -> str:
    ...


def order_corners(box_4x2) -> np.ndarray:
  """Corners [4, 2] clockwise on screen (y down) from the top-left one (smallest x + y)."""
  box = np.asarray(box_4x2, np.float32).reshape(4, 2)
  centre = box.mean(0)
  angle = np.arctan2(box[:, 1] - centre[1], box[:, 0] - centre[0])
  box = box[np.argsort(angle, kind="stable")]  # increasing angle is clockwise with y down
  return np.roll(box, -int(np.argmin(box.sum(1))), axis=0)


def text_rows(lines: list[TextLine], min_overlap: float = 0.5) -> list[list[TextLine]]:
  """Lines grouped into rows, top to bottom, each row left to right. A line joins the row
  above it when their vertical extents overlap by `min_overlap` of the shorter height."""
  order = sorted(lines, key=lambda l: ((l.bounds[1] + l.bounds[3]) / 2, l.bounds[0], l.text))
  rows: list[list[TextLine]] = []
  spans: list[list[float]] = []  # top, bottom, smallest height of each row
  for line in order:
    _, y0, _, y1 = line.bounds
    height = max(y1 - y0, 1e-3)
    if rows:
      top, bottom, smallest = spans[-1]
      if min(y1, bottom) - max(y0, top) >= min_overlap * min(height, smallest):
        rows[-1].append(line)
        spans[-1] = [min(top, y0), max(bottom, y1), min(smallest, height)]
        continue
    rows.append([line])
    spans.append([y0, y1, height])
  return [sorted(row, key=lambda l: (l.bounds[0], l.bounds[1], l.text)) for row in rows]


def reading_order(lines: list[TextLine]) -> list[TextLine]:
  """Top to bottom by rows (`text_rows`), left to right within a row."""
  return [line for row in text_rows(lines) for line in row]


def pad_to_aspect(image: np.ndarray, max_aspect: float) -> np.ndarray:
  """Pads the short side (bottom or right, so pixel coordinates stay) with the border's
  median colour until long / short <= max_aspect."""
  height, width = image.shape[:2]
  if max(height, width) <= max_aspect * min(height, width):
    return image
  border = np.concatenate([image[0], image[-1], image[:, 0], image[:, -1]])
  colour = np.median(border, axis=0).astype(np.uint8)
  new_h = max(height, math.ceil(width / max_aspect))
  new_w = max(width, math.ceil(height / max_aspect))
  out = np.empty((new_h, new_w, 3), np.uint8)
  out[...] = colour
  out[:height, :width] = image
  return out


class RapidOCRBackend:
  """PP-OCRv4 text detection + recognition (and PP-OCR's 180-degree line classifier)
  through `rapidocr_onnxruntime`, whose ONNX weights ship inside the wheel.

  det_box_thresh: detector box score below which a box is dropped; text_score: recogniser
  confidence below which a line is dropped; det_limit_side_len: the detector upsamples
  the short side to at least this many pixels (RapidOCR's default). The engine is built
  on first use; a lock serialises calls (host callbacks may come from several threads and
  the engine keeps per-call state). Hostile sizes are bounded before RapidOCR sees them,
  whose own resizing would grow a 1 x 2000 strip to gigabytes: the long side is reduced
  to `max_side` first (RapidOCR's own cap), an image then under `min_side` pixels on a
  side holds no legible text and reads as [], and the short side is padded until
  long / short <= `max_aspect` (4, what RapidOCR's letterbox pads strips to).
  """

  name = "rapidocr-ppocrv4"

  def __init__(self, det_box_thresh: float = 0.5, text_score: float = 0.5,
               det_limit_side_len: int = 736, use_angle_cls: bool = True,
               num_threads: int | None = None, min_side: int = 8, max_aspect: float = 4.0,
               max_side: int = 2000):
    for field, value in (("det_box_thresh", det_box_thresh), ("text_score", text_score)):
      if not (isinstance(value, numbers.Real) and 0.0 <= value <= 1.0):
        raise ValueError(f"RapidOCRBackend.{field}: expected a number in [0, 1], got {value!r}")
    if not (isinstance(det_limit_side_len, int) and 32 <= det_limit_side_len <= 4096):
      raise ValueError(f"RapidOCRBackend.det_limit_side_len: expected an int in [32, 4096], "
                       f"got {det_limit_side_len!r}")
    if num_threads is not None and not (isinstance(num_threads, int) and num_threads >= 1):
      raise ValueError(f"RapidOCRBackend.num_threads: expected None or an int >= 1, got "
                       f"{num_threads!r}")
    if not (isinstance(min_side, int) and min_side >= 1):
      raise ValueError(f"RapidOCRBackend.min_side: expected an int >= 1, got {min_side!r}")
    if not (isinstance(max_side, int) and 64 <= max_side <= 8192):
      raise ValueError(f"RapidOCRBackend.max_side: expected an int in [64, 8192], got "
                       f"{max_side!r}")
    if not (isinstance(max_aspect, numbers.Real) and 1.0 <= max_aspect <= 64.0):
      raise ValueError(f"RapidOCRBackend.max_aspect: expected a number in [1, 64], got "
                       f"{max_aspect!r}")
    self.det_box_thresh, self.text_score = float(det_box_thresh), float(text_score)
    self.det_limit_side_len, self.use_angle_cls = det_limit_side_len, bool(use_angle_cls)
    self.num_threads, self.min_side, self.max_aspect = num_threads, min_side, float(max_aspect)
    self.max_side = max_side
    self._engine = None
    self._lock = threading.Lock()

  def _build(self):
    try:
      from rapidocr_onnxruntime import RapidOCR  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise ImportError("RapidOCRBackend needs the `rapidocr_onnxruntime` package (PP-OCRv4 "
                        "ONNX weights ship inside its wheel)") from e
    threads = -1 if self.num_threads is None else self.num_threads
    return RapidOCR(text_score=self.text_score, det_box_thresh=self.det_box_thresh,
                    det_limit_side_len=self.det_limit_side_len, use_cls=self.use_angle_cls,
                    intra_op_num_threads=threads, inter_op_num_threads=1 if threads > 0 else -1)

  def read(self, image_HxWx3) -> list[TextLine]:
    """Text lines in reading order; [] for an image without text or under `min_side`."""
    image = check_image(image_HxWx3, "RapidOCRBackend.read")
    height, width = image.shape[:2]
    scale = min(1.0, self.max_side / max(height, width))
    if scale < 1.0:
      import cv2  # pylint: disable=import-outside-toplevel
      size = (max(1, round(width * scale)), max(1, round(height * scale)))
      image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
    if min(image.shape[:2]) < self.min_side:
      return []
    padded = pad_to_aspect(image, self.max_aspect)
    bgr = np.ascontiguousarray(padded[..., ::-1])  # RapidOCR takes arrays as OpenCV BGR
    with self._lock:
      if self._engine is None:
        self._engine = self._build()
      result, _ = self._engine(bgr)
    lines = []
    for box, text, score in result or ():
      text = str(text).strip()
      box = order_corners(box) / np.float32(scale)
      box[:, 0] = np.clip(box[:, 0], 0, width)
      box[:, 1] = np.clip(box[:, 1], 0, height)
      x0, y0 = box.min(0)
      x1, y1 = box.max(0)
      if text and x1 > x0 and y1 > y0:  # a box wholly in the padding clips to nothing
        lines.append(TextLine(box, text, float(score)))
    return reading_order(lines)


# ---- tool arguments ------------------------------------------------------------------

def crop_to_box(image: np.ndarray, bounding_box) -> tuple[np.ndarray, tuple[int, int]]:
  """(crop, (left, top)): the pixels of a 0-1000 box, int(c * size / 1000) per edge as the
  public server maps them, at least one pixel wide and tall; None keeps the image."""
  if bounding_box is None:
    return image, (0, 0)
  height, width = image.shape[:2]
  x1, y1, x2, y2 = parse_box(bounding_box)
  left, right = int(x1 * width / GRID), int(x2 * width / GRID)
  top, bottom = int(y1 * height / GRID), int(y2 * height / GRID)
  left, top = min(left, width - 1), min(top, height - 1)
  right, bottom = max(right, left + 1), max(bottom, top + 1)
  return image[top:bottom, left:right], (left, top)


# ---- observation JSON ----------------------------------------------------------------

def _dumps(payload: dict) -> str:
  return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def fit_json(task: str, key: str, items: list, max_chars: int, join: bool = False) -> str:
  """Compact JSON {"task": task, key: items} of at most `max_chars` characters: the longest
  prefix of `items` that fits, with "truncated": true and "omitted": n when some are left
  out. `join` writes string items as one newline-joined string. When not even one item
  fits, a string's first item is cut to what fits."""
  def payload(kept: list, omitted: int) -> str:
    body = {"task": task, key: "\n".join(kept) if join else kept}
    if omitted:
      body.update(truncated=True, omitted=omitted)
    return _dumps(body)

  total = len(items)
  whole = payload(items, 0)
  if len(whole) <= max_chars:
    return whole
  # Lengths grow with the items kept (each adds at least its separator while "omitted"
  # loses at most a digit), so the longest fitting prefix is found by bisection.
  low, high = 0, total - 1
  while low < high:
    mid = (low + high + 1) // 2
    if len(payload(items[:mid], total - mid)) <= max_chars:
      low = mid
    else:
      high = mid - 1
  if low == 0 and total and isinstance(items[0], str):
    first = items[0]
    short, long_ = 0, len(first)
    while short < long_:
      mid = (short + long_ + 1) // 2
      if len(payload([first[:mid]], total)) <= max_chars:
        short = mid
      else:
        long_ = mid - 1
    if short:
      # The cut item still counts as omitted: it is not whole.
      return payload([first[:short]], total)
  return payload(items[:low], total - low)


def _check_max_chars(max_chars) -> int:
  # max_chars is the caller's setting, not the model's: a bad one raises.
  if not (isinstance(max_chars, int) and not isinstance(max_chars, bool)
          and max_chars >= MIN_MAX_CHARS):
    raise ValueError(f"OCR tools: max_chars must be an int >= {MIN_MAX_CHARS}, got "
                     f"{max_chars!r}")
  return max_chars


def _check_backend(backend) -> None:
  if not isinstance(backend, OCRBackend):
    raise TypeError(f"OCR tools: backend must have read(image) -> list[TextLine], got "
                    f"{type(backend).__name__}")


def _grid_box(line: TextLine, offset: tuple[int, int], height: int, width: int) -> list[int]:
  """A line's axis-aligned box in the full image, on the 0-1000 grid (rounded)."""
  x0, y0, x1, y1 = line.bounds
  left, top = offset

  def grid(value: float, size: int) -> int:
    return int(min(max(round(value * GRID / size), 0), GRID))

  return [grid(x0 + left, width), grid(y0 + top, height), grid(x1 + left, width),
          grid(y1 + top, height)]


def _row_texts(lines: list[TextLine]) -> list[str]:
  """One string per row: the row's lines left to right, joined by spaces."""
  return [" ".join(line.text for line in row) for row in text_rows(lines)]


def _tool(name: str) -> Callable:
  """Wraps a tool body: validates the caller's image, backend and max_chars (these raise),
  crops to the model's box, and turns model-caused argument errors into error text."""
  def decorate(body):
    def tool(image_HxWx3, bounding_box=None, *, backend, max_chars: int = DEFAULT_MAX_CHARS):
      image = check_image(image_HxWx3, name)
      _check_backend(backend)
      _check_max_chars(max_chars)
      try:
        crop, offset = crop_to_box(image, bounding_box)
      except ToolArgumentError as e:
        return error_text(name, e)
      return SUCCESS + body(crop, offset, image.shape[:2], backend, max_chars)

    tool.__name__ = tool.__qualname__ = name
    tool.__doc__ = (f"{body.__doc__}\n\n  Called as {name}(image_HxWx3, bounding_box=None, *, "
                    "backend, max_chars) -> the observation text.")
    return tool
  return decorate


@_tool("text_ocr")
def text_ocr(crop, offset, size, backend, max_chars):
  """PERIA's text_ocr: the text in reading order, one row per line (its pieces joined by
  spaces): {"task": "ocr", "text": "..."}."""
  del offset, size
  return fit_json("ocr", "text", _row_texts(backend.read(crop)), max_chars, join=True)


@_tool("formula_ocr")
def formula_ocr(crop, offset, size, backend, max_chars):
  """PERIA's formula_ocr: the backend's formula recognition (LaTeX) when it has
  `recognize`, else the text read: {"task": "formula", "text": "..."}."""
  del offset, size
  if isinstance(backend, RecognizingBackend):
    lines = backend.recognize(crop, "formula").strip().splitlines()
  else:
    lines = _row_texts(backend.read(crop))
  return fit_json("formula", "text", lines, max_chars, join=True)


def table_rows(lines: list[TextLine]) -> list[list[str]]:
  """A table from line geometry: rows by vertical overlap (`text_rows`), columns anchored
  on the row with the most cells; every other cell goes to the column its horizontal
  extent overlaps most (the nearest centre when none), cells sharing a column are joined
  by a space, and missing cells are "". Every row has the same number of columns."""
  rows = text_rows(lines)
  if not rows:
    return []
  anchor = max(rows, key=len)  # the first of the widest rows
  columns = [(line.bounds[0], line.bounds[2]) for line in anchor]
  table = []
  for row in rows:
    cells: list[list[str]] = [[] for _ in columns]
    for line in row:
      x0, _, x1, _ = line.bounds
      overlaps = [min(x1, c1) - max(x0, c0) for c0, c1 in columns]
      best = int(np.argmax(overlaps))
      if overlaps[best] <= 0:
        centre = (x0 + x1) / 2
        best = int(np.argmin([abs(centre - (c0 + c1) / 2) for c0, c1 in columns]))
      cells[best].append(line.text)
    table.append([" ".join(cell) for cell in cells])
  return table


@_tool("table_ocr")
def table_ocr(crop, offset, size, backend, max_chars):
  """PERIA's table_ocr: a VLM backend's table recognition, {"task": "table", "text": ...};
  otherwise rows of cells from the lines' geometry (`table_rows`),
  {"task": "table", "rows": [[cell, ...], ...]}."""
  del offset, size
  if isinstance(backend, RecognizingBackend):
    lines = backend.recognize(crop, "table").strip().splitlines()
    return fit_json("table", "text", lines, max_chars, join=True)
  return fit_json("table", "rows", table_rows(backend.read(crop)), max_chars)


@_tool("text_spotting")
def text_spotting(crop, offset, size, backend, max_chars):
  """PERIA's text_spotting: every line with its box on the full image's 0-1000 grid and its
  score, in reading order: {"task": "spotting", "text": [{"text", "bbox", "score"}, ...]}
  (the public tool's layout: the list under "text", bbox [x1, y1, x2, y2])."""
  height, width = size
  items = [{"text": line.text, "bbox": _grid_box(line, offset, height, width),
            "score": round(line.score, 3)} for line in backend.read(crop)]
  return fit_json("spotting", "text", items, max_chars)


_UNITS = r"(?:km|m|cm|mm|mi|ft|yd|nmi|miles?|feet|foot|meters?|metres?|kilomet(?:er|re)s?)"
# Numbers, scale bars ("0 100 200 m"), distances ("2 km", "1.5mi"), ratios ("1:5000",
# "Scale 1 : 25,000") and units alone. One character class then an optional unit: a
# failed match backtracks linearly, whatever the model's text.
_SCALE_MARK = re.compile(rf"(?:scale\s*:?\s*)?([\d.,:/+\-\u2013\s]*)({_UNITS}\.?)?",
                         re.IGNORECASE)
_ONLY_SYMBOLS = re.compile(r"[^\w\u4e00-\u9fff]+")


def is_map_noise(text: str) -> bool:
  """map_text_ocr's filter: the public rules (pure numbers, single characters, pure
  symbols) plus distances and scale marks, as the tool's description promises."""
  text = text.strip()
  if len(text) <= 1 or _ONLY_SYMBOLS.fullmatch(text):
    return True
  mark = _SCALE_MARK.fullmatch(text)
  return bool(mark) and (any(c.isdigit() for c in mark.group(1)) or bool(mark.group(2)))


@_tool("map_text_ocr")
def map_text_ocr(crop, offset, size, backend, max_chars):
  """PERIA's map_text_ocr: text lines in reading order without numbers, distances and
  scale marks (`is_map_noise`), repeats dropped case-insensitively (the public filter):
  {"task": "ocr", "text": "..."}."""
  del offset, size
  kept, seen = [], set()
  for line in backend.read(crop):
    for piece in line.text.splitlines():  # a VLM backend reads the image as one block
      piece = piece.strip()
      if is_map_noise(piece) or piece.lower() in seen:
        continue
      seen.add(piece.lower())
      kept.append(piece)
  return fit_json("ocr", "text", kept, max_chars, join=True)


TOOLS: dict[str, Callable[..., str]] = {
    "text_ocr": text_ocr, "formula_ocr": formula_ocr, "table_ocr": table_ocr,
    "text_spotting": text_spotting, "map_text_ocr": map_text_ocr,
}
ARGUMENTS = ("image_index", "bounding_box")  # the public names; image_index is the caller's


def run_tool(name, image_HxWx3, arguments, backend, max_chars: int = DEFAULT_MAX_CHARS) -> str:
  """A parsed call: the tool `name` on the image the caller resolved from `image_index`,
  with the model's `arguments` dict. An unknown tool, a non-dict or an unknown argument is
  error text, as the tools' own argument errors are."""
  label = name if isinstance(name, str) and len(name) <= 64 else short(name, 64)
  if not isinstance(name, str) or name not in TOOLS:
    return error_text(label, f"unknown OCR tool; expected one of {sorted(TOOLS)}")
  try:
    arguments = tool_arguments(arguments, ARGUMENTS)
  except ToolArgumentError as e:
    return error_text(name, e)
  return TOOLS[name](image_HxWx3, arguments.get("bounding_box"), backend=backend,
                     max_chars=max_chars)
