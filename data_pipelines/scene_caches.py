"""Think3D's RL caches for a benchmark: one reconstruction per distinct image set.

    sets = image_sets(read_mindcube(questions_path, image_root=root), root)
    build_scene_caches(sets, reconstructor, out_dir, root)

Each question's image list (paths relative to the benchmark folder, in the order the
question gives them: the cameras' order) is one set; questions with the same list share
it. Set k is reconstructed once (any object with `reconstruct(frames) -> Reconstruction`:
`jaxspatial.perception`'s Pi3 / VGGT / Depth-Anything-3 adapters, ...) and written to
`out_dir/<cache_name(list)>.npz` in Think3D's cache format (`caches.write_reconstruction_cache`,
atomic: a file that exists is whole). A set whose file exists is skipped, so an
interrupted run resumes where it stopped. `out_dir/manifest.json` maps each finished
list to its file and questions; it is rewritten atomically every `manifest_every` sets and
at the end (the files, not the manifest, decide what is done).

`reconstruct_benchmark` does it for a benchmark file by name (`launch/reconstruct_scenes.py`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import sys
import tempfile
import time
from typing import Callable

import numpy as np

from data_pipelines import readers
from data_pipelines.caches import write_reconstruction_cache

MANIFEST = "manifest.json"
ON_ERROR = ("raise", "skip")
# Benchmarks whose questions list image files; VSI-Bench gives videos and ScanQA scene
# folders, which need frames sampled first.
# Named as launch.build_benchmark names them.
BENCHMARKS = {"mindcube": readers.read_mindcube, "mindcube_tiny": readers.read_mindcube,
              "blink_mv": readers.read_blink}


@dataclasses.dataclass(frozen=True)
class ImageSet:
  """One reconstruction's frames: relative image paths and the questions that use them."""
  images: tuple[str, ...]
  questions: tuple[str, ...]

  @property
  def cache(self) -> str:
    return cache_name(self.images)


def cache_name(images) -> str:
  """The cache file of an image list: a hash of the list (order kept), so reruns and
  other machines find the same file wherever the benchmark folder is."""
  digest = hashlib.sha1("\n".join(images).encode("utf-8")).hexdigest()
  return f"{digest[:20]}.npz"


def _relative(path: str, root) -> str:
  if root is None:
    return path
  return pathlib.PurePath(path).relative_to(pathlib.PurePath(root)).as_posix()


def image_sets(questions, root=None) -> list[ImageSet]:
  """The distinct image lists of `questions` (`BenchmarkQuestion`s; their paths joined to
  `root` by the reader are made relative to it again), in first-seen order."""
  order: dict[tuple[str, ...], list[str]] = {}
  for question in questions:
    if not question.images:
      raise ValueError(f"image_sets: question {question.question_id!r} of "
                       f"{question.benchmark} has no image files (embedded images must be "
                       "written to files first)")
    images = tuple(_relative(p, root) for p in question.images)
    order.setdefault(images, []).append(question.question_id)
  return [ImageSet(images, tuple(ids)) for images, ids in order.items()]


def load_frames(paths) -> np.ndarray:
  """The images as uint8 RGB [N, H, W, 3]; they must share one size."""
  from PIL import Image  # pylint: disable=import-outside-toplevel
  frames = []
  for path in paths:
    with Image.open(path) as image:
      frames.append(np.asarray(image.convert("RGB")))
  sizes = sorted({f.shape[:2] for f in frames})
  if len(sizes) > 1:
    shown = ", ".join(f"{p}: {f.shape[1]}x{f.shape[0]}" for p, f in zip(paths, frames))
    raise ValueError(f"load_frames: one reconstruction needs frames of one size, got {shown}")
  return np.stack(frames)


def _write_json(path: pathlib.Path, value) -> None:
  handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".json")
  try:
    with os.fdopen(handle, "w") as f:
      json.dump(value, f, indent=1)
    os.replace(tmp, path)
  except BaseException:
    pathlib.Path(tmp).unlink(missing_ok=True)
    raise


def read_manifest(out_dir) -> dict:
  """The manifest: {"sets": [{"images", "cache", "questions"}], "failed": [...]}."""
  return json.loads((pathlib.Path(out_dir) / MANIFEST).read_text())


def _manifest(sets, out_dir: pathlib.Path, failed: list, backend: str) -> None:
  done = [{"images": list(s.images), "cache": s.cache, "questions": list(s.questions)}
          for s in sets if (out_dir / s.cache).is_file()]
  _write_json(out_dir / MANIFEST, {"format": "think3d-cache", "backend": backend,
                                   "sets": done, "failed": failed})


def build_scene_caches(sets, reconstructor, out_dir, root=None, *, on_error: str = "raise",
                       manifest_every: int = 20,
                       log: Callable[[str], None] | None = None) -> dict:
  """Reconstructs each `ImageSet` (frames from `root`/path) with `reconstructor` into
  `out_dir`, skipping sets whose cache exists. on_error "raise": a failing set stops the
  run (the finished ones stay, and the manifest lists them); "skip": it is recorded in
  the manifest's "failed" with its error and the run goes on. Progress goes to `log`
  (default: stderr). Returns counts {"written", "skipped", "failed"} and the manifest
  path."""
  if on_error not in ON_ERROR:
    raise ValueError(f"build_scene_caches.on_error: expected one of {ON_ERROR}, got "
                     f"{on_error!r}")
  if not callable(getattr(reconstructor, "reconstruct", None)):
    raise TypeError(f"build_scene_caches.reconstructor: expected an object with a "
                    f"reconstruct(frames) method, got {type(reconstructor).__name__}")
  log = log or (lambda line: print(line, file=sys.stderr, flush=True))
  sets = list(sets)
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  backend = type(reconstructor).__name__
  failed: list[dict] = []
  counts = {"written": 0, "skipped": 0, "failed": 0}
  try:
    for k, image_set in enumerate(sets, 1):
      where = f"[{k}/{len(sets)}] {image_set.cache} ({len(image_set.images)} images)"
      path = out_dir / image_set.cache
      if path.is_file():
        counts["skipped"] += 1
        log(f"{where}: cached, skipped")
        continue
      start = time.perf_counter()
      try:
        files = [str(pathlib.Path(root) / p) if root is not None else p
                 for p in image_set.images]
        recon = reconstructor.reconstruct(load_frames(files))
        write_reconstruction_cache(path, recon, image_set.images)
      except Exception as error:  # reported with the set it happened on
        message = f"{type(error).__name__}: {error}"
        if on_error == "raise":
          raise RuntimeError(f"build_scene_caches: set {image_set.images} "
                             f"({image_set.cache}) failed: {message}") from error
        failed.append({"images": list(image_set.images), "error": message[:500]})
        counts["failed"] += 1
        log(f"{where}: FAILED {message[:200]}")
        continue
      counts["written"] += 1
      log(f"{where}: {recon.num_points} points in {time.perf_counter() - start:.1f} s")
      if counts["written"] % max(manifest_every, 1) == 0:
        _manifest(sets, out_dir, failed, backend)
  finally:  # an interrupted run still indexes what it finished
    _manifest(sets, out_dir, failed, backend)
  return {**counts, "manifest": str(out_dir / MANIFEST)}


def reconstruct_benchmark(benchmark: str, questions_path, out_dir, root=None, *,
                          backend: str = "pi3", checkpoint=None, device: str = "cpu",
                          reconstructor=None, on_error: str = "raise", log=None,
                          **options) -> dict:
  """A benchmark's image sets (`BENCHMARKS`: its reader over `questions_path`, images
  under `root`, default the file's folder) reconstructed into `out_dir`. The
  reconstructor: `reconstructor`, or `backend` ("pi3", "vggt", "da3") from `checkpoint`
  with the adapter's `options` (`jaxspatial.perception.load_reconstructor`)."""
  if benchmark not in BENCHMARKS:
    raise ValueError(f"reconstruct_benchmark.benchmark: expected one of {tuple(BENCHMARKS)} "
                     f"(benchmarks that list image files), got {benchmark!r}")
  root = pathlib.Path(questions_path).parent if root is None else pathlib.Path(root)
  questions = BENCHMARKS[benchmark](questions_path, image_root=str(root))
  sets = image_sets(questions, str(root))
  if reconstructor is None:
    from jaxspatial import perception  # pylint: disable=import-outside-toplevel
    reconstructor = perception.load_reconstructor(backend, checkpoint, device, **options)
  return build_scene_caches(sets, reconstructor, out_dir, root, on_error=on_error, log=log)
