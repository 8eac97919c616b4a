"""Writes a PNG contact sheet of the built synthetic dataset (what `launch.build_data`
wrote): each scene's views, numbered as its questions count them, then its questions with
their options and answers (`data_pipelines.sample_sheet`).

    python -m launch.show_samples --data_dir outputs/data --split train --count 6 \
        --out outputs/samples.png

Cost: a second or two for six scenes.
"""

from __future__ import annotations

import pathlib

from absl import flags

from data_pipelines.builders import SyntheticSpatial
from data_pipelines.builders.synthetic_spatial import SPLITS
from data_pipelines.sample_sheet import sample_sheet
from jaxspatial.errors import MissingInputError
from recipes import cli

_DATA_DIR = flags.DEFINE_string("data_dir", "outputs/data", "where launch.build_data wrote "
                                "the dataset")
_CONFIG = flags.DEFINE_enum("config", "tiny", ["tiny", "small", "base"], "the dataset size "
                            "that was built")
_SPLIT = flags.DEFINE_string("split", "train", "the split the scenes are drawn from")
_COUNT = flags.DEFINE_integer("count", 6, "how many scenes (the split's first ones)",
                              lower_bound=1)
_OUT = flags.DEFINE_string("out", "outputs/samples.png", "the PNG to write")


def main(argv) -> None:
  del argv
  if _SPLIT.value not in SPLITS:
    raise ValueError(f"--split: unknown split {_SPLIT.value!r}; expected one of {SPLITS}")
  builder = SyntheticSpatial(data_dir=_DATA_DIR.value, config=_CONFIG.value)
  if not builder.is_prepared():
    raise MissingInputError(f"--data_dir {_DATA_DIR.value}: synthetic_spatial/{_CONFIG.value} "
                            f"is not built there; python -m launch.build_data --config "
                            f"{_CONFIG.value} --data_dir {_DATA_DIR.value} builds it")
  source = builder.as_data_source()[_SPLIT.value]
  sheet, _ = sample_sheet([source[i] for i in range(min(_COUNT.value, len(source)))])
  out = pathlib.Path(_OUT.value)
  out.parent.mkdir(parents=True, exist_ok=True)
  sheet.save(out)
  print(f"{min(_COUNT.value, len(source))} scenes of {builder.data_path} "
        f"({_SPLIT.value}): {out.resolve()}")


if __name__ == "__main__":
  cli.run(main)
