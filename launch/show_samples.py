"""Writes a PNG contact sheet of synthetic samples: each sample's views, then its
questions with their answers, for people to look at.

    python -m launch.show_samples --split train --count 6 --out outputs/samples.png

Cost: a few seconds per sample on a 2-core CPU.
"""

from __future__ import annotations

import pathlib
import textwrap

from absl import flags
from PIL import Image, ImageDraw

from recipes import cli
from data_pipelines.synthetic import RIGS, SampleConfig, make_sample

LINE = 13
_SPLIT = flags.DEFINE_string("split", "train", "the split the samples are drawn from")
_COUNT = flags.DEFINE_integer("count", 6, "how many samples", lower_bound=1)
_OUT = flags.DEFINE_string("out", "outputs/samples.png", "the PNG to write")


def sample_panel(sample, max_views: int = 4, text_width: int = 110) -> Image.Image:
  views = [Image.fromarray(v) for v in sample.rgb[:max_views]]
  width, height = views[0].size
  lines = [f"scene {sample.scene_seed}, rig {sample.rig}: "
           + ", ".join(o.name for o in sample.room.objects)]
  for q in sample.questions:
    explore = " [needs exploration]" if q.needs_exploration else ""
    wrapped = textwrap.wrap(f"{q.family}: {q.question}", text_width)
    lines += wrapped + [f"    answer: {q.answer} ({q.answer_text}){explore}"]
  panel = Image.new("RGB", (max(max_views * (width + 4), 7 * text_width),
                            height + 8 + LINE * len(lines)), (25, 25, 25))
  for k, view in enumerate(views):
    panel.paste(view, (k * (width + 4), 0))
  draw = ImageDraw.Draw(panel)
  for k, line in enumerate(lines):
    draw.text((4, height + 4 + k * LINE), line, fill=(235, 235, 235))
  return panel


def main(argv) -> None:
  del argv
  config = SampleConfig(width=192, height=144)
  panels = [sample_panel(make_sample(_SPLIT.value, i, RIGS[i % len(RIGS)], config))
            for i in range(_COUNT.value)]
  sheet = Image.new("RGB", (max(p.width for p in panels),
                            sum(p.height + 6 for p in panels)), (10, 10, 10))
  top = 0
  for panel in panels:
    sheet.paste(panel, (0, top))
    top += panel.height + 6
  out = pathlib.Path(_OUT.value)
  out.parent.mkdir(parents=True, exist_ok=True)
  sheet.save(out)
  print(f"{len(panels)} samples: {out.resolve()}")


if __name__ == "__main__":
  cli.run(main)
