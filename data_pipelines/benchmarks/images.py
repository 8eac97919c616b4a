"""Image benchmarks -> `BenchmarkScene`s: one scene per distinct image set.

    for scene in mindcube_scenes("MindCube_tinybench.jsonl", "MindCube", benchmark="mindcube_tiny"):
      ...

Questions that show the same images in the same order share a scene (as
`scene_caches.image_sets` groups them); its views are those images, each letterboxed to
width x height (`scene.letterbox`), and each question's `views` lists all of them
(`initial_view` 0). A set holds at most `MAX_VIEWS` images.

Geometry: without `caches` a scene is geometry "none" (an empty cloud, `nominal_cameras`).
With `caches` (a folder of Think3D caches and the manifest.json that
`scene_caches.build_scene_caches` writes) the set's cache gives the cloud (colours to
uint8, no instance ids) and the cameras' poses: geometry "reconstruction", intrinsics still
the nominal ones of the letterboxed size (a Think3D cache holds none). A set that failed
its reconstruction or is not in the manifest is a `SceneCacheError` naming the set and
the folder. Caches are keyed by image files (paths relative to the benchmark folder), so
benchmarks whose images are embedded (HR-Bench, BLINK's parquet) or sampled from videos
(VSI-Bench) are geometry "none" only.

Question text (`question`), as each benchmark writes it for the model:
  MindCube      its `question` (options already written in);
  BLINK         its `prompt` (question, "Select from the following choices.", "(A) ..."
                lines); a row without one gets that layout from `question` and `choices`;
  VSI-Bench     the question, then "Options:" and the option lines "A. ..." (VSI-Bench's
                prompt without its pre- and post-prompt instructions, which are the
                agent's); numeric questions: the question alone;
  ChartQA       its `query`;
  HR-Bench      the question, then "Options:" and "A. ..." lines (VLMEvalKit's layout
                without its closing instruction).
Open questions (ChartQA, VSI-Bench's numeric types) have options [] and answer =
answer_text = the reference. A question's text may take `MAX_QUESTION_BYTES` UTF-8 bytes,
an answer (letter, option text, reference) `MAX_ANSWER_BYTES`; more is a
`BenchmarkFormatError` naming the file, row, id and field. Every question is checked
before the first scene is yielded, and so is every image file: one missing is a
`MissingImageError`, several a `MissingImagesError` with their count and the first ten
(file, row, id, path), so one build reports them all.

VSI-Bench frames (Think3D's protocol: 7 frames per video): with N the video's frame count,
frame k of `frames` is frame floor(t_k + 0.5), t = numpy.linspace(0, N - 1, frames) (the
first and the last frame always; min(frames, N) frames when the video is shorter). N is the
container's frame count (the mp4 sample table; the video packets counted when it has none),
or the number of frames the decoder yields when that is smaller. Videos are decoded with
PyAV (`av`).
"""

from __future__ import annotations

import collections
import hashlib
import io
import json
import pathlib
from typing import Callable, Iterator

import numpy as np
from PIL import Image

from jaxspatial import errors
from data_pipelines.benchmarks.scene import BenchmarkScene, letterbox, nominal_cameras
from data_pipelines.caches import CacheFormatError, read_think3d_cache
from data_pipelines.readers.blink import read_blink
from data_pipelines.readers.chartqa import read_chartqa
from data_pipelines.readers.common import (OPTION_LETTERS, BenchmarkFormatError,
                                           BenchmarkQuestion, MissingImageError, check_file,
                                           read_json_rows)
from data_pipelines.readers.hrbench import read_hrbench
from data_pipelines.readers.mindcube import read_mindcube
from data_pipelines.readers.tables import read_table_rows
from data_pipelines.readers.vsibench import read_vsibench
from data_pipelines.scene_caches import MANIFEST, cache_name

MAX_VIEWS = 8
MAX_QUESTION_BYTES = 1024
MAX_ANSWER_BYTES = 192
VSI_FRAMES = 7


class SceneCacheError(errors.InputError):
  """An image set without a usable Think3D cache in the caches folder."""


class MissingImagesError(MissingImageError):
  """Several images the questions refer to are not on disk: `missing` holds each one's
  MissingImageError (the first question naming it), the message their count and the first
  `SHOWN`; the fields of MissingImageError are the first one's."""

  SHOWN = 10

  def __init__(self, missing: list[MissingImageError], questions: int):
    self.missing, self.questions = list(missing), questions
    first = self.missing[0]
    self.path, self.row, self.record_id, self.image = (first.path, first.row,
                                                       first.record_id, first.image)
    files = list(dict.fromkeys(m.path for m in self.missing))
    lines = [(f"{m.path}: " if len(files) > 1 else "") + f"row {m.row} (id {m.record_id!r}):"
             f" {m.image}" for m in self.missing[:self.SHOWN]]
    errors.MissingInputError.__init__(
        self, f"{', '.join(files)}: {len(self.missing)} images not found, named by "
        f"{questions} questions (restore the files or fix the rows' paths); the first "
        f"{len(lines)}:\n" + "\n".join(f"  {line}" for line in lines))

  def __reduce__(self):
    return type(self), (self.missing, self.questions)


# -- where a question came from ------------------------------------------------------------

class _Source:
  """A question file's names for its fields, and each question's row (looked up by id
  only when an error needs it, or read from meta["file"] / meta["row"])."""

  def __init__(self, path, id_field: str | None, reader=read_table_rows, *,
               question="question", answer="answer", options="options", images="images",
               image="images[{k}]"):
    self.path, self.id_field, self.reader = str(path), id_field, reader
    self.fields = {"question": question, "answer": answer, "options": options,
                   "images": images}
    self.image = image  # image k's field: a format of k (from 0) and n = k + 1
    self._rows: dict[str, int] | None = None

  def locate(self, question: BenchmarkQuestion) -> tuple[str, int]:
    if "row" in question.meta and "file" in question.meta:
      return question.meta["file"], question.meta["row"]
    if self._rows is None:
      self._rows = {}
      try:
        for row, record in self.reader(self.path):
          self._rows.setdefault(str(record.get(self.id_field)), row)
      except (OSError, ValueError):
        pass
    return self.path, self._rows.get(question.question_id, 0)

  def fail(self, question: BenchmarkQuestion, field: str, problem: str):
    path, row = self.locate(question)
    name = self.fields.get(field, field)
    if name is None:  # options in columns named by their letters (HR-Bench)
      name = question.answer
    raise BenchmarkFormatError(path, row, question.question_id, name, problem)


def _record(source: _Source, question: BenchmarkQuestion, text: str, views: int,
            text_field: str = "question", *, order: int) -> dict:
  """The question's JSON object (scene.py's fields), its sizes checked; `text_field`: the
  file's field the text comes from; `order`: its place in the question file."""
  if views > MAX_VIEWS:
    source.fail(question, "images", f"{views} images; a scene holds at most {MAX_VIEWS}")
  if question.options:
    choice = OPTION_LETTERS.index(question.answer)
    answer_text = question.options[choice]
  else:
    answer_text = question.answer
  size = len(text.encode("utf-8"))
  if size > MAX_QUESTION_BYTES:
    source.fail(question, text_field, f"the question text takes {size} UTF-8 bytes, over "
                f"the limit of {MAX_QUESTION_BYTES}")
  answers = list(question.answers) or [question.answer]
  for name, value in (("answer", question.answer), ("options", answer_text),
                      *(("answer", a) for a in answers)):
    size = len(value.encode("utf-8"))
    if size > MAX_ANSWER_BYTES:
      what = "the answer" if name == "answer" else "the answer's option text"
      source.fail(question, name, f"{what} takes {size} UTF-8 bytes, over the limit of "
                  f"{MAX_ANSWER_BYTES}")
  return {"question_id": question.question_id, "question": text,
          "options": list(question.options), "answer": question.answer,
          "answer_text": answer_text, "answers": answers, "category": question.category,
          "answer_objects": [], "initial_view": 0, "views": list(range(views)),
          "needs_exploration": True, "order": order}


def _options_block(question: BenchmarkQuestion) -> str:
  """The question, then "Options:" and one "A. text" line per option (none: the question)."""
  if not question.options:
    return question.question
  lines = [f"{letter}. {option}" for letter, option in zip(OPTION_LETTERS, question.options)]
  return "\n".join([question.question, "Options:", *lines])


# -- images --------------------------------------------------------------------------------

def _check_images(source: _Source, questions: list[BenchmarkQuestion]) -> None:
  """Every question's image files on disk, each looked up once: one missing is its
  MissingImageError, several one MissingImagesError; a directory or a device in place of
  an image is check_file's BenchmarkFormatError at once."""
  missing: dict[str, MissingImageError] = {}
  found: set[str] = set()
  naming = 0  # questions that name a missing image
  for question in questions:
    lacks = False
    for k, image in enumerate(question.images):
      if image not in found and image not in missing:
        file, row = source.locate(question)
        try:
          check_file(file, row, question.question_id, source.image.format(k=k, n=k + 1),
                     image)
          found.add(image)
        except MissingImageError as error:
          missing[image] = error
      lacks = lacks or image in missing
    naming += lacks
  if len(missing) == 1:
    raise next(iter(missing.values()))
  if missing:
    raise MissingImagesError(list(missing.values()), naming)


class _Views:
  """Letterboxed views, the last few kept (consecutive sets often share images)."""

  def __init__(self, width: int, height: int, keep: int = 32):
    if not (isinstance(width, int) and isinstance(height, int) and width > 0 and height > 0):
      raise ValueError(f"width, height: expected positive integers, got {width!r}, "
                       f"{height!r}")
    self.width, self.height, self.keep = width, height, keep
    self._kept: collections.OrderedDict = collections.OrderedDict()

  def _boxed(self, key, load: Callable[[], np.ndarray]) -> np.ndarray:
    if key in self._kept:
      self._kept.move_to_end(key)
      return self._kept[key]
    image = letterbox(load(), self.width, self.height)[0]
    self._kept[key] = image
    if len(self._kept) > self.keep:
      self._kept.popitem(last=False)
    return image

  def file(self, path: str, source: _Source, question: BenchmarkQuestion,
           k: int) -> np.ndarray:
    def load():
      try:
        with Image.open(path) as image:
          return np.asarray(image.convert("RGB"))
      except FileNotFoundError:
        file, row = source.locate(question)
        raise MissingImageError(file, row, question.question_id, path) from None
      except (OSError, ValueError, Image.DecompressionBombError) as error:
        source.fail(question, source.image.format(k=k, n=k + 1),
                    f"cannot read the image {path}: {error}")
    return self._boxed(("file", path), load)

  def data(self, data: bytes, source: _Source, question: BenchmarkQuestion,
           k: int) -> np.ndarray:
    def load():
      try:
        with Image.open(io.BytesIO(data)) as image:
          return np.asarray(image.convert("RGB"))
      except (OSError, ValueError, Image.DecompressionBombError) as error:
        source.fail(question, source.image.format(k=k, n=k + 1),
                    f"cannot read the embedded image ({len(data)} bytes): {error}")
    return self._boxed(("sha1", hashlib.sha1(data).hexdigest()), load)


# -- caches --------------------------------------------------------------------------------

class _Caches:
  """A folder of Think3D caches and its manifest: image list -> cloud and poses."""

  def __init__(self, folder):
    self.folder = pathlib.Path(folder)
    manifest = self.folder / MANIFEST
    if not manifest.is_file():
      raise SceneCacheError(f"caches {self.folder}: no {MANIFEST} (data_pipelines."
                            "scene_caches.build_scene_caches writes one)")
    try:
      data = json.loads(manifest.read_text())
      self.sets = {tuple(entry["images"]): str(entry["cache"]) for entry in data["sets"]}
      self.failed = {tuple(entry["images"]): str(entry.get("error", ""))
                     for entry in data.get("failed", [])}
    except (OSError, ValueError, KeyError, TypeError) as error:
      raise SceneCacheError(f"caches {self.folder}: {MANIFEST} is not a scene-cache manifest "
                            f"({type(error).__name__}: {error})") from None

  def check(self, images: tuple[str, ...]) -> None:
    """SceneCacheError unless the set has a finished cache in the manifest."""
    if images in self.failed:
      raise SceneCacheError(f"image set {list(images)}: its reconstruction failed in the "
                            f"caches {self.folder} ({MANIFEST} 'failed': "
                            f"{self.failed[images]})")
    if images not in self.sets:
      raise SceneCacheError(f"image set {list(images)} ({cache_name(images)}): not in the "
                            f"caches {self.folder} ({MANIFEST} lists {len(self.sets)} sets)")
    name = self.sets[images]
    if pathlib.PurePath(name).name != name or name in ("", ".", ".."):
      raise SceneCacheError(f"image set {list(images)}: {MANIFEST} in {self.folder} names "
                            f"the cache {name!r}, not a file name inside the folder")

  def load(self, images: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(xyz [N, 3] float32, rgb [N, 3] uint8, poses [V, 4, 4] camera-to-world)."""
    self.check(images)
    path = self.folder / self.sets[images]
    try:
      cloud, poses, paths = read_think3d_cache(path)
    except (FileNotFoundError, CacheFormatError) as error:
      raise SceneCacheError(f"image set {list(images)} in the caches {self.folder}: "
                            f"{error}") from None
    if len(poses) != len(images):
      raise SceneCacheError(f"image set {list(images)}: the cache {path} holds "
                            f"{len(poses)} camera poses for {len(images)} images")
    if any(paths) and tuple(paths) != images:
      raise SceneCacheError(f"image set {list(images)}: the cache {path} was made from the "
                            f"images {paths}")
    valid = np.asarray(cloud.valid, bool)
    return (np.asarray(cloud.xyz, np.float32)[valid], np.asarray(cloud.rgb, np.uint8)[valid],
            np.asarray(poses, np.float32))


def _scene(benchmark: str, scene_id: str, images: list[np.ndarray], questions: list[dict],
           width: int, height: int, cached=None) -> BenchmarkScene:
  intrinsics, poses = nominal_cameras(len(images), width, height)
  if cached is None:
    return BenchmarkScene(benchmark=benchmark, scene_id=scene_id, geometry="none",
                          questions=questions, images=images, intrinsics=intrinsics,
                          world_from_camera=poses)
  xyz, rgb, poses = cached
  return BenchmarkScene(benchmark=benchmark, scene_id=scene_id, geometry="reconstruction",
                        questions=questions, images=images, intrinsics=intrinsics,
                        world_from_camera=poses, xyz=xyz, rgb=rgb,
                        instance=np.full(len(xyz), -1, np.int32))


def _relative(path: str, root) -> str:
  return pathlib.PurePath(path).relative_to(pathlib.PurePath(root)).as_posix()


def _file_sets(benchmark: str, source: _Source, groups: dict, root, width: int, height: int,
               caches) -> Iterator[BenchmarkScene]:
  """Scenes of file-image sets: groups maps relative image lists to [(question, record)]."""
  cache = _Caches(caches) if caches is not None else None
  if cache is not None:
    for key in groups:
      cache.check(key)

  def scenes():
    views = _Views(width, height)
    for key, items in groups.items():
      first = items[0][0]
      images = [views.file(str(pathlib.Path(root) / name), source, first, k)
                for k, name in enumerate(key)]
      yield _scene(benchmark, cache_name(key)[:-len(".npz")], images,
                   [record for _, record in items], width, height,
                   cache.load(key) if cache is not None else None)
  return scenes()


# -- benchmarks ----------------------------------------------------------------------------

def mindcube_scenes(questions_path, image_root, *, benchmark: str = "mindcube",
                    width: int = 640, height: int = 480,
                    caches=None) -> Iterator[BenchmarkScene]:
  """MindCube or MindCube-Tiny (one format; `benchmark` names which): images under
  `image_root` at the paths the rows give; category the setting (among / around /
  rotation). A missing image is a MissingImageError naming its path, several a
  MissingImagesError naming the first ten."""
  _Views(width, height)  # checks the size before any reading
  questions = read_mindcube(questions_path, image_root=str(image_root), check_images=False)
  source = _Source(questions_path, "id", read_json_rows, answer="gt_answer",
                   options="question")
  _check_images(source, questions)
  groups: dict = {}
  for order, question in enumerate(questions):
    record = _record(source, question, question.question, len(question.images), order=order)
    key = tuple(_relative(p, image_root) for p in question.images)
    groups.setdefault(key, []).append((question, record))
  return _file_sets(benchmark, source, groups, image_root, width, height, caches)


def _blink_text(question: BenchmarkQuestion) -> str:
  prompt = question.meta.get("prompt")
  if isinstance(prompt, str) and prompt.strip():
    return prompt
  lines = [f"({letter}) {option}" for letter, option in zip(OPTION_LETTERS, question.options)]
  return "\n".join([question.question, "Select from the following choices.", *lines])


def blink_scenes(path, image_root=None, *, benchmark: str | None = None,
                 sub_task: str | None = "Multi-view_Reasoning", width: int = 640,
                 height: int = 480, caches=None) -> Iterator[BenchmarkScene]:
  """BLINK's rows of `sub_task` (the multi-view subtask by default; None: all), images
  embedded in the table or files under `image_root` (default: the table's folder);
  category the sub_task; `benchmark` default "blink_mv" for the multi-view subtask (the
  protocol's name), else "blink". Embedded images have no cache (caches index files)."""
  if benchmark is None:
    benchmark = "blink_mv" if sub_task == "Multi-view_Reasoning" else "blink"
  _Views(width, height)
  root = pathlib.Path(path).parent if image_root is None else pathlib.Path(image_root)
  questions = read_blink(path, image_root=str(root), check_images=False, sub_task=sub_task)
  source = _Source(path, "idx", options="choices", images="image_1", image="image_{n}")
  _check_images(source, questions)
  files: dict = {}
  embedded: dict = {}
  for order, question in enumerate(questions):
    blobs = question.meta.get("image_bytes", ())
    if blobs and question.images:
      source.fail(question, "images", "the row mixes embedded images and image paths, "
                  "whose order the table does not keep")
    count = len(blobs) or len(question.images)
    prompt = question.meta.get("prompt")
    record = _record(source, question, _blink_text(question), count,
                     "prompt" if isinstance(prompt, str) and prompt.strip() else "question",
                     order=order)
    if blobs:
      key = tuple(hashlib.sha1(b).hexdigest() for b in blobs)
      embedded.setdefault(key, (blobs, []))[1].append((question, record))
    else:
      key = tuple(_relative(p, root) for p in question.images)
      files.setdefault(key, []).append((question, record))
  if caches is not None and embedded:
    _, items = next(iter(embedded.values()))
    raise SceneCacheError(f"{path}: question {items[0][0].question_id!r} embeds its images; "
                          f"the caches {caches} index image files only")
  with_files = _file_sets(benchmark, source, files, root, width, height, caches)

  def scenes():
    yield from with_files
    views = _Views(width, height)
    for key, (blobs, items) in embedded.items():
      images = [views.data(blob, source, items[0][0], k) for k, blob in enumerate(blobs)]
      scene_id = hashlib.sha1("\n".join(key).encode()).hexdigest()[:20]
      yield _scene(benchmark, scene_id, images, [r for _, r in items], width, height)
  return scenes()


def frame_indices(count: int, frames: int = VSI_FRAMES) -> list[int]:
  """The frames sampled from a video of `count` frames: floor(t + 0.5) for t in
  numpy.linspace(0, count - 1, min(frames, count))."""
  if count < 1 or frames < 1:
    raise ValueError(f"frame_indices: expected positive counts, got {count} frames in the "
                     f"video and {frames} to sample")
  steps = np.linspace(0, count - 1, min(frames, count))
  return [int(k) for k in np.floor(steps + 0.5)]


def sample_video_frames(video, frames: int = VSI_FRAMES) -> tuple[list[int], list[np.ndarray]]:
  """(indices, [H, W, 3] uint8 RGB frames) of `frame_indices` over the video, decoded with
  PyAV. A video that cannot be read raises ValueError naming it."""
  try:
    import av  # pylint: disable=import-outside-toplevel
  except ImportError as error:
    raise ImportError("VSI-Bench videos are decoded with PyAV: pip install av") from error
  video = str(video)

  def decode(indices):
    wanted, got, decoded = set(indices), {}, 0
    with av.open(video) as container:
      stream = container.streams.video[0]
      for frame in container.decode(stream):
        if decoded in wanted:
          got[decoded] = frame.to_ndarray(format="rgb24")
        decoded += 1
        if decoded > indices[-1]:
          break
    return got, decoded

  try:
    with av.open(video) as container:
      if not container.streams.video:
        raise ValueError(f"video {video}: no video stream")
      stream = container.streams.video[0]
      count = int(stream.frames or 0)
      if count <= 0:
        count = sum(1 for packet in container.demux(stream) if packet.size)
    if count <= 0:
      raise ValueError(f"video {video}: no frames")
    indices = frame_indices(count, frames)
    got, decoded = decode(indices)
    if len(got) < len(indices):  # the container counted more frames than the decoder gives
      if decoded < 1:
        raise ValueError(f"video {video}: no frame decodes")
      indices = frame_indices(decoded, frames)
      got, decoded = decode(indices)
  except av.FFmpegError as error:
    raise ValueError(f"video {video}: cannot decode ({error})") from None
  if len(got) < len(indices):
    raise ValueError(f"video {video}: decoded {decoded} frames, fewer than frame "
                     f"{indices[-1]}")
  return indices, [got[k] for k in indices]


def vsibench_scenes(path, video_root, *, benchmark: str = "vsibench",
                    frames: int = VSI_FRAMES, width: int = 640, height: int = 480,
                    question_types: tuple[str, ...] | None = None,
                    caches=None) -> Iterator[BenchmarkScene]:
  """VSI-Bench: one scene per video (`video_root/<dataset>/<scene_name>.mp4`), its views
  `frames` frames sampled by `frame_indices`; category the question_type. Numeric
  questions are open (options []). `caches` must be None (frames sampled from videos have
  no Think3D cache)."""
  if caches is not None:
    raise SceneCacheError(f"vsibench_scenes: the caches {caches} index image files; "
                          "VSI-Bench's frames are sampled from videos and have none")
  if not isinstance(frames, int) or not 1 <= frames <= MAX_VIEWS:
    raise ValueError(f"vsibench_scenes.frames: expected 1..{MAX_VIEWS} frames, got "
                     f"{frames!r}")
  _Views(width, height)
  questions = read_vsibench(path, video_root=str(video_root), check_videos=True,
                            question_types=question_types)
  source = _Source(path, "id", answer="ground_truth", images="scene_name")
  groups: dict = {}
  for order, question in enumerate(questions):
    record = _record(source, question, _options_block(question), frames, order=order)
    groups.setdefault(question.images[0], []).append((question, record))

  def scenes():
    for video, items in groups.items():
      question = items[0][0]
      try:
        _, sampled = sample_video_frames(video, frames)
      except ValueError as error:
        source.fail(question, "scene_name", str(error))
      images = [letterbox(frame, width, height)[0] for frame in sampled]
      records = [dict(r, views=list(range(len(images)))) for _, r in items]
      yield _scene(benchmark, f"{question.meta['dataset']}/{question.scene_id}", images,
                   records, width, height)
  return scenes()


def chartqa_scenes(root, split: str = "test", *, benchmark: str = "chartqa",
                   width: int = 640, height: int = 480,
                   caches=None) -> Iterator[BenchmarkScene]:
  """ChartQA's human and augmented questions of `split`; one scene per chart (its
  questions share it); category the part. Cache image lists are
  ["<split>/png/<imgname>"], relative to `root`."""
  _Views(width, height)
  questions = read_chartqa(root, split=split, check_images=False)
  source = _Source(root, None, answer="label", options="label", images="imgname",
                   image="imgname")
  _check_images(source, questions)
  groups: dict = {}
  for order, question in enumerate(questions):
    record = _record(source, question, question.question, 1, "query", order=order)
    key = (_relative(question.images[0], root),)
    groups.setdefault(key, []).append((question, record))
  return _file_sets(benchmark, source, groups, root, width, height, caches)


def hrbench_scenes(path, *, benchmark: str = "hrbench", width: int = 640,
                   height: int = 480) -> Iterator[BenchmarkScene]:
  """HR-Bench 4K or 8K (`benchmark` names which): one scene per distinct picture (the
  rotated repeats of a question share it); category the table's category."""
  _Views(width, height)
  questions = read_hrbench(path, benchmark=benchmark)
  source = _Source(path, "index", options=None, images="image", image="image")
  groups: dict = {}
  for order, question in enumerate(questions):
    record = _record(source, question, _options_block(question), 1, order=order)
    groups.setdefault(question.meta["image_sha1"], []).append((question, record))

  def scenes():
    views = _Views(width, height, keep=1)
    for digest, items in groups.items():
      question = items[0][0]
      image = views.data(question.meta["image_bytes"][0], source, question, 0)
      yield _scene(benchmark, digest[:20], [image], [r for _, r in items], width, height)
  return scenes()
