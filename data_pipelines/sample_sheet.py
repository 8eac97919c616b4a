"""A PNG sheet of built dataset records (the synthetic set or a benchmark split), for
a person to check a build at a glance: each scene's views, every one framed and numbered as
the questions count them (View 1, View 2, ...), then its questions, each option on a line
of its own, and the answer.

    sheet, layout = sample_sheet([source[i] for i in range(6)])
    sheet.save("outputs/samples.png")

`layout` gives each scene's view boxes and text lines: what the sheet shows, to check it.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from data_pipelines.builders.spatial_benchmark import stored_text
from data_pipelines.readers.common import OPTION_LETTERS, parse_options

BACKGROUND, PANEL, FRAME, CAPTION = (250, 250, 250), (255, 255, 255), (40, 40, 40), (215, 215, 215)
INK, ANSWER, MUTED = (20, 20, 20), (0, 110, 40), (110, 110, 110)
TILE = 192           # a view's width on the sheet (upscaled by whole pixels, never blurred)
COLUMNS = 4
MARGIN, GAP, BORDER = 12, 8, 2


@dataclasses.dataclass
class SceneLayout:
  """Where one scene's parts sit on the sheet: view k's box (left, top, right, bottom) of
  its pixels, and the text lines in drawing order."""
  views: list[tuple[int, int, int, int]]
  lines: list[str]


def _font(size: int) -> ImageFont.FreeTypeFont:
  return ImageFont.load_default(size=size)


def wrap(text: str, font, width: int, indent: str = "") -> list[str]:
  """`text` in lines at most `width` pixels wide (its leading spaces kept; a word longer
  than a line is cut), lines after the first starting with `indent`."""
  def fits(candidate: str) -> bool:
    return font.getlength(candidate) <= width

  lines, line = [], text[:len(text) - len(text.lstrip())]
  for word in text.split():
    joined = line + (" " if line.strip() else "") + word
    if fits(joined):
      line = joined
      continue
    if line.strip():
      lines.append(line)
      line = indent
    while len(word) > 1 and not fits(line + word):
      cut = max([k for k in range(1, len(word)) if fits(line + word[:k])] or [1])
      lines.append(line + word[:cut])
      line, word = indent, word[cut:]
    line += word
  return lines + [line] if line.strip() or not lines else lines


def _questions(example) -> list[dict]:
  return json.loads(stored_text(example["questions"]))


def _title(example, views: int) -> str:
  names = [stored_text(n) for n in example.get("object_names", [])]
  scene = (stored_text(example["scene_id"]) if "scene_id" in example
           else f"scene {int(example['scene_seed'])}")
  rig = f" · {stored_text(example['rig'])} rig" if "rig" in example else ""
  return f"{scene}{rig} · {views} views" + (f" · objects: {', '.join(names)}" if names else "")


def _text_lines(example, font, width: int) -> list[tuple[str, tuple]]:
  """(line, colour) of the title and every question: the stem wrapped, each option on lines
  of its own (never split across options), then the answer."""
  views = len(example["images"])
  out = []
  for number, q in enumerate(_questions(example), 1):
    stem, parsed = parse_options(q["question"])
    options = list(q.get("options") or parsed)
    tags = [q.get("family") or q.get("category") or ""]
    if q.get("needs_exploration"):
      tags.append("needs exploration")
    head = f"Q{number} [{', '.join(t for t in tags if t)}] {stem if options else q['question']}"
    out += [(line, INK) for line in wrap(head, font, width, "    ")]
    for letter, option in zip(OPTION_LETTERS, options):
      out += [(line, INK) for line in wrap(f"    {letter}. {option}", font, width, "        ")]
    answer = q.get("answer_text") or q.get("answer", "")
    if options and q.get("answer") in OPTION_LETTERS:
      answer = f"{q['answer']} ({options[OPTION_LETTERS.index(q['answer'])]})"
    out += [(line, ANSWER) for line in wrap(f"    answer: {answer}", font, width, "        ")]
  return out


def scene_panel(example, columns: int = COLUMNS, tile: int = TILE,
                font_size: int = 13) -> tuple[Image.Image, SceneLayout]:
  """One record's panel: its views in rows of `columns`, each `tile` pixels wide at most
  (upscaled by a whole factor), framed, captioned "View k"; then its text."""
  images = [np.asarray(v) for v in example["images"]]
  font = _font(font_size)
  height_, width_ = images[0].shape[:2]
  scale = max(1, tile // width_)
  w, h = width_ * scale, height_ * scale
  caption = font_size + 6
  cell_w, cell_h = w + 2 * BORDER, h + 2 * BORDER + caption
  rows = -(-len(images) // columns)
  width = max(columns * (cell_w + GAP) - GAP, 720) + 2 * MARGIN
  title = wrap(_title(example, len(images)), font, width - 2 * MARGIN)
  lines = _text_lines(example, font, width - 2 * MARGIN)
  step = font_size + 4
  head = MARGIN + len(title) * step + GAP // 2
  height = head + rows * (cell_h + GAP) + len(lines) * step + MARGIN
  panel = Image.new("RGB", (width, height), PANEL)
  draw = ImageDraw.Draw(panel)
  for k, line in enumerate(title):
    draw.text((MARGIN, MARGIN + k * step), line, fill=MUTED, font=font)
  boxes = []
  for k, image in enumerate(images):
    left = MARGIN + (k % columns) * (cell_w + GAP)
    top = head + (k // columns) * (cell_h + GAP)
    draw.rectangle([left, top, left + cell_w - 1, top + cell_h - 1], fill=CAPTION,
                   outline=FRAME, width=BORDER)
    view = Image.fromarray(image).resize((w, h), Image.Resampling.NEAREST)
    panel.paste(view, (left + BORDER, top + BORDER))
    boxes.append((left + BORDER, top + BORDER, left + BORDER + w, top + BORDER + h))
    draw.text((left + cell_w // 2, top + BORDER + h + caption // 2), f"View {k + 1}",
              fill=INK, font=font, anchor="mm")
  top = head + rows * (cell_h + GAP)
  for k, (line, colour) in enumerate(lines):
    draw.text((MARGIN, top + k * step), line, fill=colour, font=font)
  return panel, SceneLayout(views=boxes, lines=title + [line for line, _ in lines])


def sample_sheet(examples, columns: int = COLUMNS,
                  tile: int = TILE) -> tuple[Image.Image, list[SceneLayout]]:
  """The panels of `examples` (records as a data source returns them, images decoded)
  stacked on one sheet; each layout's boxes are in sheet coordinates."""
  panels = [scene_panel(example, columns, tile) for example in examples]
  if not panels:
    raise ValueError("sample_sheet: no records to show")
  width = max(panel.width for panel, _ in panels) + 2 * GAP
  sheet = Image.new("RGB", (width, sum(p.height + GAP for p, _ in panels) + GAP), BACKGROUND)
  top, layouts = GAP, []
  for panel, layout in panels:
    sheet.paste(panel, (GAP, top))
    layouts.append(SceneLayout(
        views=[(a + GAP, b + top, c + GAP, d + top) for a, b, c, d in layout.views],
        lines=layout.lines))
    top += panel.height + GAP
  return sheet, layouts
