"""TFDS builder for the papers' benchmarks (ArrayRecord, no TensorFlow): a benchmark's
published files plus its images, videos or scans -> one example per scene, in the
synthetic set's fields plus `benchmark`, `scene_id` and `geometry`
(`data_pipelines/benchmarks/scene.py`), so `loader.task_batches(..., limits=
task_limits(name))` turns them into `Task`s.

    python -m launch.build_benchmark --benchmark mindcube_tiny --source ~/data/MindCube/data \\
        --data_dir ~/jaxspatial_data [--caches DIR]

Configs (the names `launch.build_benchmark --benchmark` takes) and what `source` holds:

  mindcube       raw/MindCube.jsonl (split test), raw/MindCube_train.jsonl (train), and the
                 images the rows name (other_all_image/...)
  mindcube_tiny  raw/MindCube_tinybench.jsonl (test) + images
  blink_mv       Multi-view_Reasoning/val-*.parquet (BLINK's Hugging Face export, images
                 embedded; split test = BLINK's val, the split with answers)
  vsibench       test*.parquet or test.jsonl (the Hugging Face export) and videos at
                 <dataset>/<scene_name>.mp4; `frames` (7, Think3D's) sampled per video
  scanqa         ScanQA_v1.0_val.json (test), ScanQA_v1.0_train.json (train), scans/
                 <scene_id>/ in ScanNet v2's layout
  sqa3d          balanced/v1_balanced_{questions,sqa_annotations}_test_scannetv2.json
                 (test; train likewise) and scans/
  chartqa        test/test_human.json, test/test_augmented.json, test/png/ (test); train/
                 likewise (train: PERIA's recipe trains on it)
  hrbench        hr_bench_4k.tsv (split test_4k), hr_bench_8k.tsv (test_8k)

Options (`options=`, `launch.build_benchmark` flags): width / height of the stored views,
`frames`, `caches` (a folder of Think3D caches with manifest.json: the image sets' clouds),
`points` (a scan's point budget), `questions` (one question file in place of the default
names: only the default split is built).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import pathlib
from typing import Iterator

import numpy as np
import tensorflow_datasets as tfds

from data_pipelines.loader import TaskLimits

# Real questions are longer than the synthetic set's: MindCube's reach 569 bytes, ScanQA's
# answers 162 bytes (8 per question, 25 objects), SQA3D lists 10 answers, and a ScanNet
# scene holds up to 170 ScanQA questions.
BENCHMARK_LIMITS = TaskLimits(question_bytes=1024, answer_bytes=192, answers=10,
                              answer_objects=32, questions_per_scene=512)


def task_limits(name: str) -> TaskLimits:
  """The padded task sizes of a benchmark config (one for all of them)."""
  if name not in NAMES:
    raise ValueError(f"benchmark: expected one of {NAMES}, got {name!r}")
  return BENCHMARK_LIMITS


@dataclasses.dataclass
class SpatialBenchmarkConfig(tfds.core.BuilderConfig):
  width: int = 640
  height: int = 480


# name -> split -> (the split's files, as glob patterns under source, in the order its
# scene generator takes them). A split whose files are absent is not built (MindCube's
# train file is optional); none present is an error naming what was looked for.
SPLITS = {
    "mindcube": {"test": ("raw/MindCube.jsonl",), "train": ("raw/MindCube_train.jsonl",)},
    "mindcube_tiny": {"test": ("raw/MindCube_tinybench.jsonl",)},
    "blink_mv": {"test": ("Multi-view_Reasoning/val-*",)},
    "vsibench": {"test": ("test*",)},
    "scanqa": {"test": ("ScanQA_v1.0_val.json",), "train": ("ScanQA_v1.0_train.json",)},
    "sqa3d": {split: (f"balanced/v1_balanced_questions_{split}_scannetv2.json",
                      f"balanced/v1_balanced_sqa_annotations_{split}_scannetv2.json")
              for split in ("test", "train")},
    "chartqa": {"test": ("test/test_human.json",), "train": ("train/train_human.json",)},
    "hrbench": {"test_4k": ("hr_bench_4k.tsv",), "test_8k": ("hr_bench_8k.tsv",)},
}


def _scenes(name: str, source: pathlib.Path, files: list[pathlib.Path], options: dict):
  """The BenchmarkScenes of one split, from its files."""
  # pylint: disable=import-outside-toplevel
  from data_pipelines.benchmarks import images, scannet
  options = dict(options)
  if name in ("mindcube", "mindcube_tiny"):
    return images.mindcube_scenes(files[0], source, benchmark=name, **options)
  if name == "blink_mv":
    return images.blink_scenes(files[0], source, benchmark=name, **options)
  if name == "vsibench":
    return images.vsibench_scenes(files[0], source, **options)
  if name == "chartqa":
    return images.chartqa_scenes(files[0].parent.parent, split=files[0].parent.name,
                                 **options)
  if name == "hrbench":
    return images.hrbench_scenes(files[0], **options)
  scans = pathlib.Path(options.pop("scans", source / "scans"))
  if name == "scanqa":
    return scannet.scanqa_scenes(files[0], scans, **options)
  if name == "sqa3d":
    return scannet.sqa3d_scenes(files[0], files[1], scans, **options)
  raise ValueError(f"benchmark: expected one of {NAMES}, got {name!r}")


def _files(source: pathlib.Path, patterns) -> list[pathlib.Path] | None:
  """Each pattern's one file under source; None when one is absent."""
  out = []
  for pattern in patterns:
    found = sorted(glob.glob(str(source / pattern)))
    if not found:
      return None
    if len(found) > 1:
      raise ValueError(f"{len(found)} files match {source / pattern}: {found[:4]}; give the "
                       "one to build with --questions")
    out.append(pathlib.Path(found[0]))
  return out


NAMES = ("mindcube", "mindcube_tiny", "blink_mv", "vsibench", "scanqa", "sqa3d", "chartqa",
         "hrbench")
# Where each benchmark's options go: image benchmarks take the views' size and caches
# (image files only: VSI-Bench's sampled frames and HR-Bench's embedded images have none),
# scans a point budget; `frames` is VSI-Bench's.
_OPTIONS = {
    "mindcube": ("width", "height", "caches"), "mindcube_tiny": ("width", "height", "caches"),
    "blink_mv": ("width", "height", "caches"), "vsibench": ("width", "height", "frames"),
    "chartqa": ("width", "height", "caches"), "hrbench": ("width", "height"),
    "scanqa": ("width", "height", "points", "scans"), "sqa3d": ("width", "height", "points",
                                                               "scans"),
}
# HR-Bench's 4K / 8K images keep more of their detail; ChartQA's charts are small.
_SIZES = {"hrbench": (1344, 1008), "chartqa": (800, 600)}


class SpatialBenchmark(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """The papers' evaluation (and training) questions as jaxspatial scenes."""

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [SpatialBenchmarkConfig(name=n, width=_SIZES.get(n, (640, 480))[0],
                                            height=_SIZES.get(n, (640, 480))[1])
                     for n in NAMES]

  def __init__(self, *, source=None, options=None, questions=None, **kwargs):
    self.source = None if source is None else pathlib.Path(source).expanduser()
    self.options = {k: v for k, v in (options or {}).items() if v is not None}
    self.questions = questions
    kwargs.setdefault("file_format", "array_record")
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    f = tfds.features
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=f.FeaturesDict({
            "scene_seed": f.Scalar(np.int64),
            "benchmark": f.Text(),
            "scene_id": f.Text(),
            "geometry": f.Text(),
            "xyz": f.Tensor(shape=(None, 3), dtype=np.float32),
            "rgb": f.Tensor(shape=(None, 3), dtype=np.uint8),
            "instance": f.Tensor(shape=(None,), dtype=np.int32),
            "scene_min": f.Tensor(shape=(3,), dtype=np.float32),
            "scene_max": f.Tensor(shape=(3,), dtype=np.float32),
            "images": f.Sequence(f.Image(shape=(None, None, 3), encoding_format="png")),
            "intrinsics": f.Tensor(shape=(None, 4), dtype=np.float32),
            "world_from_camera": f.Tensor(shape=(None, 4, 4), dtype=np.float32),
            "object_names": f.Sequence(f.Text()),
            "object_centres": f.Tensor(shape=(None, 3), dtype=np.float32),
            "questions": f.Text(),
        }))

  def _options(self) -> dict:
    name = self.builder_config.name
    unknown = sorted(set(self.options) - set(_OPTIONS[name]))
    if unknown:
      raise ValueError(f"{name}: options {unknown} do not apply; it takes {_OPTIONS[name]}")
    options = {"width": self.builder_config.width, "height": self.builder_config.height}
    options.update(self.options)
    return options

  def _split_generators(self, dl_manager):
    del dl_manager
    name = self.builder_config.name
    if self.source is None:
      raise ValueError(f"{name}: building needs source= (the folder of the benchmark's "
                       "published files)")
    if not self.source.is_dir():
      raise FileNotFoundError(f"{name}: source folder not found: {self.source}")
    splits = SPLITS[name]
    if self.questions:
      # One question file (SQA3D: its questions file; the annotations sit beside it).
      split, patterns = next(iter(splits.items()))
      files = [pathlib.Path(self.questions)]
      if name == "sqa3d":
        files.append(pathlib.Path(str(self.questions).replace("_questions_",
                                                              "_sqa_annotations_")))
      for file in files:
        if not file.is_file():
          raise FileNotFoundError(f"{name}: question file not found: {file}")
      found = {split: files}
    else:
      found = {split: _files(self.source, patterns) for split, patterns in splits.items()}
      found = {split: files for split, files in found.items() if files is not None}
      if not found:
        wanted = " and ".join(str(self.source / p) for p in next(iter(splits.values())))
        raise FileNotFoundError(f"{name}: no question file found: expected {wanted} (the "
                                "benchmark's published layout), or give one with --questions")
    return {split: self._generate_examples(_scenes(name, self.source, files, self._options()))
            for split, files in found.items()}

  def _generate_examples(self, scenes: Iterator) -> Iterator:
    for index, scene in enumerate(scenes):
      yield f"{index:07d}-{scene.scene_id}", scene.example(index)


def build_benchmark(name: str, source, data_dir, *, questions=None,
                    **options) -> SpatialBenchmark:
  """Prepares benchmark `name` from `source` under `data_dir` and returns the builder."""
  if name not in NAMES:
    raise ValueError(f"benchmark: expected one of {NAMES}, got {name!r}")
  builder = SpatialBenchmark(data_dir=str(data_dir), config=name, source=source,
                             options=options, questions=questions)
  builder.download_and_prepare()
  write_question_index(builder)
  return builder


# Beside the prepared files: every split's questions with their record and scene, so an
# evaluation of a few questions finds their records without reading the others.
QUESTION_INDEX = "questions_index.json"


def write_question_index(builder: SpatialBenchmark) -> pathlib.Path:
  """Writes QUESTION_INDEX into the prepared folder: {split: [{"record", "scene_id",
  "questions": [the record's question objects]}]} (written atomically)."""
  # pylint: disable-next=import-outside-toplevel
  from data_pipelines.loader import scene_questions
  index = {}
  for split, source in builder.as_data_source(decoders={"images": _Encoded()}).items():
    index[str(split)] = [
        {"record": k, "scene_id": stored_text(source[k]["scene_id"]),
         "questions": scene_questions(source[k], k, BENCHMARK_LIMITS)}
        for k in range(len(source))]
  path = pathlib.Path(str(builder.data_path)) / QUESTION_INDEX
  temporary = path.with_name(f".{QUESTION_INDEX}.tmp")
  temporary.write_text(json.dumps(index))
  os.chmod(temporary, 0o644)
  os.replace(temporary, path)
  return path


def question_index(name: str, data_dir, split: str = "test") -> list[dict] | None:
  """The prepared split's QUESTION_INDEX entries, None when the build wrote none (prepared
  before it existed) or the file does not parse."""
  builder = SpatialBenchmark(data_dir=str(data_dir), config=name)
  path = pathlib.Path(str(builder.data_path)) / QUESTION_INDEX
  try:
    return json.loads(path.read_text())[split]
  except (OSError, ValueError, KeyError, TypeError):
    return None


def stored_text(value) -> str:
  """A stored Text field (str, bytes or a 0-d array of either) as str."""
  if isinstance(value, np.ndarray) and value.ndim == 0:
    value = value[()]
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class _Encoded(tfds.decode.SkipDecoding):
  """Leaves a sequence of images encoded (TFDS's SkipDecoding lacks the numpy batch path)."""

  def decode_batch_example_np(self, serialized_example):
    return serialized_example


def load_benchmark(name: str, data_dir, split: str = "test", images: bool = True):
  """The prepared split as a random-access data source (loader.task_batches' input);
  `images=False`: the views are left encoded (PNG bytes), for reading questions fast."""
  builder = SpatialBenchmark(data_dir=str(data_dir), config=name)
  if not builder.is_prepared():
    raise FileNotFoundError(f"benchmark {name} is not prepared under {data_dir}: run python "
                            f"-m launch.build_benchmark --benchmark {name} --source DIR "
                            f"--data_dir {data_dir}")
  decoders = None if images else {"images": _Encoded()}
  sources = builder.as_data_source(decoders=decoders)
  if split not in sources:
    raise ValueError(f"benchmark {name}: split {split!r} not built; it has {sorted(sources)}")
  return sources[split]
