"""Builds a config of the synthetic spatial dataset as TFDS ArrayRecord files.

    python -m launch.build_data --config tiny --data-dir outputs/data

Cost on a 2-core CPU: tiny about 20 s (64 scenes), small a few minutes, base about an hour.
"""

from __future__ import annotations

import argparse
import json
import time

from data_pipelines.builders import SyntheticSpatial


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="tiny", choices=("tiny", "small", "base"))
  parser.add_argument("--data-dir", default="outputs/data")
  args = parser.parse_args(argv)
  start = time.perf_counter()
  builder = SyntheticSpatial(data_dir=args.data_dir, config=args.config)
  builder.download_and_prepare()
  sources = builder.as_data_source()
  for split, source in sources.items():
    questions = sum(len(json.loads(source[i]["questions"])) for i in range(len(source)))
    print(f"{split:<11} {len(source):>6} scenes {questions:>7} questions")
  print(f"synthetic_spatial/{args.config} ready in {time.perf_counter() - start:.1f} s: "
        f"{builder.data_path}")


if __name__ == "__main__":
  main()
