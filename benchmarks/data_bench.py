"""Synthetic data throughput: tasks generated per second, and tasks loaded per second
through tfds.data_source and grain into padded Task batches.

    python -m benchmarks.data_bench [--data-dir /tmp/jaxspatial_bench_data]

Cost: about a minute on a 2-core CPU (it builds the tiny config first).
Generation counts questions (tasks) made per second, rendering included; loading
counts tasks per second out of the ArrayRecord files as batches of 8.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time

from data_pipelines.builders import SyntheticSpatial
from data_pipelines.loader import task_batches
from data_pipelines.synthetic import RIGS, SampleConfig, make_sample


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data-dir", default=None, help="default: a temporary folder")
  parser.add_argument("--scenes", type=int, default=24, help="scenes for the generation row")
  parser.add_argument("--batch-size", type=int, default=8)
  args = parser.parse_args(argv)
  data_dir = args.data_dir or tempfile.mkdtemp(prefix="jaxspatial_bench_")

  config = SampleConfig(num_points=32_768, width=96, height=72)
  make_sample("train", 0, RIGS[0], config)  # compile the renderer outside the timing
  start = time.perf_counter()
  generated = sum(len(make_sample("train", i, RIGS[i % len(RIGS)], config).questions)
                  for i in range(args.scenes))
  generate_seconds = time.perf_counter() - start

  start = time.perf_counter()
  builder = SyntheticSpatial(data_dir=data_dir, config="tiny")
  builder.download_and_prepare()
  build_seconds = time.perf_counter() - start

  source = builder.as_data_source()["train"]
  start = time.perf_counter()
  loaded = sum(len(meta["family"]) for _, meta in task_batches(source, args.batch_size, seed=0))
  load_seconds = time.perf_counter() - start
  questions = sum(len(json.loads(source[i]["questions"])) for i in range(len(source)))

  print(f"{'stage':<52}{'tasks':>8}{'seconds':>10}{'tasks/s':>10}")
  print("-" * 80)
  print(f"{'generate (room, rig, renders, questions)':<52}{generated:>8}{generate_seconds:>10.2f}"
        f"{generated / generate_seconds:>10.1f}")
  print(f"{'build tiny (3 splits, 64 scenes, ArrayRecord)':<52}{'':>8}{build_seconds:>10.2f}")
  print(f"{f'load via data_source + grain, batches of {args.batch_size}':<52}{loaded:>8}"
        f"{load_seconds:>10.2f}{loaded / load_seconds:>10.1f}")
  print(f"\n(train split: {len(source)} scenes, {questions} questions; data in {data_dir})")
  if args.data_dir is None:
    shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
  main()
