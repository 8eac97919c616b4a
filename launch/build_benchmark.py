"""Builds a benchmark's tasks (TFDS ArrayRecord) from its published files.

    python -m launch.build_benchmark --benchmark mindcube_tiny --source DIR \\
        --data-dir outputs/data [--caches DIR] [--width 640 --height 480] [--frames 7]
        [--points 200000] [--scans DIR] [--questions FILE]

NAME: mindcube, mindcube_tiny, blink_mv, vsibench, scanqa, sqa3d, chartqa, hrbench (what
each expects under DIR: data_pipelines/builders/spatial_benchmark.py). Prints the scenes,
questions and questions per category of each split. Cost on a 2-core CPU: MindCube-Tiny
(1,050 questions, 408 image sets at 640 x 480) 91 s; a ScanNet scan about 2 s (300k
vertices read, subsampled to 200k points, 184 candidate views rendered for the initial one).
"""

from __future__ import annotations

import argparse
import collections
import json
import time

from data_pipelines.builders import BENCHMARKS, build_benchmark


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--benchmark", required=True, choices=BENCHMARKS)
  parser.add_argument("--source", required=True, help="the benchmark's published files")
  parser.add_argument("--data-dir", default="outputs/data")
  parser.add_argument("--questions", default=None, help="one question file to build")
  parser.add_argument("--caches", default=None, help="Think3D caches with manifest.json")
  parser.add_argument("--scans", default=None, help="ScanNet scans (default SOURCE/scans)")
  parser.add_argument("--width", type=int, default=None)
  parser.add_argument("--height", type=int, default=None)
  parser.add_argument("--frames", type=int, default=None, help="VSI-Bench frames per video")
  parser.add_argument("--points", type=int, default=None, help="a scan's point budget")
  args = parser.parse_args(argv)
  start = time.perf_counter()
  builder = build_benchmark(args.benchmark, args.source, args.data_dir,
                            questions=args.questions, caches=args.caches, scans=args.scans,
                            width=args.width, height=args.height, frames=args.frames,
                            points=args.points)
  for split, source in builder.as_data_source().items():
    categories = collections.Counter()
    for i in range(len(source)):
      categories.update(q["category"] for q in json.loads(source[i]["questions"]))
    print(f"{split:<8} {len(source):>6} scenes {sum(categories.values()):>7} questions  "
          + "  ".join(f"{k} {v}" for k, v in sorted(categories.items())))
  print(f"{args.benchmark} ready in {time.perf_counter() - start:.1f} s: {builder.data_path}")


if __name__ == "__main__":
  main()
