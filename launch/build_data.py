"""Builds a config of the synthetic spatial dataset as TFDS ArrayRecord files.

    python -m launch.build_data --config tiny --data_dir outputs/data

Cost on a 2-core CPU: tiny about 20 s (64 scenes), small a few minutes, base about an hour.
"""

from __future__ import annotations

import json
import time

from absl import flags

from recipes import cli
from data_pipelines.builders import SyntheticSpatial

_CONFIG = flags.DEFINE_enum("config", "tiny", ["tiny", "small", "base"], "the dataset size")
_DATA_DIR = flags.DEFINE_string("data_dir", "outputs/data", "where the dataset is written")


def main(argv) -> None:
  del argv
  start = time.perf_counter()
  builder = SyntheticSpatial(data_dir=_DATA_DIR.value, config=_CONFIG.value)
  with cli.tfds_build("the synthetic scene generator"):
    builder.download_and_prepare()
  sources = builder.as_data_source()
  for split, source in sources.items():
    questions = sum(len(json.loads(source[i]["questions"])) for i in range(len(source)))
    print(f"{split:<11} {len(source):>6} scenes {questions:>7} questions")
  print(f"synthetic_spatial/{_CONFIG.value} ready in {time.perf_counter() - start:.1f} s: "
        f"{builder.data_path}")


if __name__ == "__main__":
  cli.run(main)
