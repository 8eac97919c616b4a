"""TFDS builder for the embedded synthetic spatial dataset (ArrayRecord, no TensorFlow).

One example per scene: its point cloud, its rig's rendered views (PNG), depths and
cameras, its objects, and all of its questions (as JSON). `data_pipelines.loader`
turns examples into batches of padded `Task`s, one task per question.

    builder = SyntheticSpatial(data_dir="~/jaxspatial_data", config="tiny")
    builder.download_and_prepare()

Configs (scenes per split, points per scene, view size): tiny builds in well under a
minute on a 2-core CPU and is what tests and `make demo` use.
"""

from __future__ import annotations

import dataclasses
import io
import json

import numpy as np
import tensorflow_datasets as tfds
from PIL import Image

from data_pipelines.synthetic import RIGS, SampleConfig, make_sample

SPLITS = ("train", "validation", "test")


@dataclasses.dataclass
class SyntheticSpatialConfig(tfds.core.BuilderConfig):
  scenes: tuple[int, int, int] = (40, 8, 16)   # train, validation, test
  num_points: int = 32_768
  width: int = 96
  height: int = 72


def _png(image: np.ndarray) -> bytes:
  buffer = io.BytesIO()
  Image.fromarray(image).save(buffer, format="PNG")
  return buffer.getvalue()


class SyntheticSpatial(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Procedural rooms, benchmark-like camera rigs and geometric questions."""

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [
      SyntheticSpatialConfig(name="tiny", description="64 scenes, for tests and the demo"),
      SyntheticSpatialConfig(name="small", scenes=(400, 50, 100), num_points=100_000,
                             width=160, height=120),
      SyntheticSpatialConfig(name="base", scenes=(4000, 200, 500), num_points=200_000,
                             width=320, height=240),
  ]

  def __init__(self, **kwargs):
    kwargs.setdefault("file_format", "array_record")
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    f = tfds.features
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=f.FeaturesDict({
            "scene_seed": f.Scalar(np.int64),
            "rig": f.Text(),
            "xyz": f.Tensor(shape=(None, 3), dtype=np.float32),
            "rgb": f.Tensor(shape=(None, 3), dtype=np.uint8),
            "instance": f.Tensor(shape=(None,), dtype=np.int32),
            "scene_min": f.Tensor(shape=(3,), dtype=np.float32),
            "scene_max": f.Tensor(shape=(3,), dtype=np.float32),
            "images": f.Sequence(f.Image(shape=(None, None, 3), encoding_format="png")),
            "depth": f.Tensor(shape=(None, None, None), dtype=np.float32,
                              encoding=f.Encoding.ZLIB),
            "intrinsics": f.Tensor(shape=(None, 4), dtype=np.float32),  # fx, fy, cx, cy
            "world_from_camera": f.Tensor(shape=(None, 4, 4), dtype=np.float32),
            "object_names": f.Sequence(f.Text()),
            "object_centres": f.Tensor(shape=(None, 3), dtype=np.float32),
            "questions": f.Text(),  # JSON list of SpatialQuestion fields
        }))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._generate_examples(split, count)
            for split, count in zip(SPLITS, self.builder_config.scenes)}

  def _generate_examples(self, split: str, count: int):
    config = SampleConfig(num_points=self.builder_config.num_points,
                          width=self.builder_config.width, height=self.builder_config.height)
    for index in range(count):
      sample = make_sample(split, index, RIGS[index % len(RIGS)], config)
      cloud, cameras = sample.room.cloud, sample.cameras
      yield f"{split}-{index}", {
          "scene_seed": sample.scene_seed,
          "rig": sample.rig,
          "xyz": np.asarray(cloud.xyz),
          "rgb": np.asarray(cloud.rgb),
          "instance": np.asarray(cloud.instance),
          "scene_min": np.asarray(sample.room.bounds_min, np.float32),
          "scene_max": np.asarray(sample.room.bounds_max, np.float32),
          "images": [_png(view) for view in sample.rgb],
          "depth": sample.depth.astype(np.float32),
          "intrinsics": np.stack([np.asarray(cameras.fx), np.asarray(cameras.fy),
                                  np.asarray(cameras.cx), np.asarray(cameras.cy)], 1),
          "world_from_camera": np.asarray(cameras.world_from_camera),
          "object_names": [o.name for o in sample.room.objects],
          "object_centres": np.asarray([o.centre for o in sample.room.objects], np.float32),
          "questions": json.dumps([dataclasses.asdict(q) for q in sample.questions]),
      }
