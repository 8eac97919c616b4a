"""Builds a benchmark's tasks (TFDS ArrayRecord) from its published files.

    python -m launch.build_benchmark --benchmark mindcube_tiny --source DIR \\
        --data_dir outputs/data [--caches DIR] [--width 640 --height 480] [--frames 7]
        [--points 200000] [--scans DIR] [--questions FILE]

NAME: mindcube, mindcube_tiny, blink_mv, vsibench, scanqa, sqa3d, chartqa, hrbench (what
each expects under DIR: data_pipelines/builders/spatial_benchmark.py). Prints the scenes,
questions and questions per category of each split. Cost on a 2-core CPU: MindCube-Tiny
(1,050 questions, 408 image sets at 640 x 480) 91 s; a ScanNet scan about 2 s (300k
vertices read, subsampled to 200k points, 184 candidate views rendered for the initial one).
"""

from __future__ import annotations

import collections
import json
import time

from absl import flags

from recipes import cli
from data_pipelines.builders import BENCHMARKS, build_benchmark

_BENCHMARK = flags.DEFINE_enum("benchmark", None, sorted(BENCHMARKS),
                               "the benchmark to build (required)")
_SOURCE = flags.DEFINE_string("source", None, "the folder of the benchmark's published "
                              "files (required)")
_DATA_DIR = flags.DEFINE_string("data_dir", "outputs/data", "where the tasks are written")
_QUESTIONS = flags.DEFINE_string("questions", None, "one question file to build (default: "
                                 "the benchmark's files under --source)")
_CACHES = flags.DEFINE_string("caches", None, "a folder of Think3D caches with manifest.json "
                              "(default: none: image sets without a point cloud)")
_SCANS = flags.DEFINE_string("scans", None, "ScanNet scans (default: SOURCE/scans)")
_WIDTH = flags.DEFINE_integer("width", None, "image width (default: the benchmark's)")
_HEIGHT = flags.DEFINE_integer("height", None, "image height (default: the benchmark's)")
_FRAMES = flags.DEFINE_integer("frames", None, "VSI-Bench frames per video (default: 7)")
_POINTS = flags.DEFINE_integer("points", None, "a scan's point budget (default: 200,000)")
flags.mark_flags_as_required(["benchmark", "source"])


def main(argv) -> None:
  del argv
  start = time.perf_counter()
  cli.need_folder(_SOURCE.value, "source", "give the folder of the benchmark's published "
                  "files (what each benchmark expects: data_pipelines/builders/"
                  "spatial_benchmark.py)")
  with cli.tfds_build(_QUESTIONS.value or _SOURCE.value):
    builder = build_benchmark(_BENCHMARK.value, _SOURCE.value, _DATA_DIR.value,
                              questions=_QUESTIONS.value, caches=_CACHES.value,
                              scans=_SCANS.value, width=_WIDTH.value, height=_HEIGHT.value,
                              frames=_FRAMES.value, points=_POINTS.value)
  for split, source in builder.as_data_source().items():
    categories = collections.Counter()
    for i in range(len(source)):
      categories.update(q["category"] for q in json.loads(source[i]["questions"]))
    print(f"{split:<8} {len(source):>6} scenes {sum(categories.values()):>7} questions  "
          + "  ".join(f"{k} {v}" for k, v in sorted(categories.items())))
  print(f"{_BENCHMARK.value} ready in {time.perf_counter() - start:.1f} s: {builder.data_path}")


if __name__ == "__main__":
  cli.run(main)
