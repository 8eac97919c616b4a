"""Reconstructs a benchmark's image sets into Think3D's RL caches (one .npz per set).

    python -m launch.reconstruct_scenes --benchmark mindcube \
        --questions /data/MindCube/MindCube_tinybench.jsonl --root /data/MindCube \
        --out outputs/think3d_cache --backend pi3 --checkpoint /ckpt/Pi3/model.safetensors

`--backend` pi3, vggt or da3 (their packages and local checkpoints installed by the user);
`--root` the folder the image paths are relative to (default: the questions file's).
Sets whose cache exists are skipped, so rerunning an interrupted command resumes it;
`<out>/manifest.json` maps image lists to cache files (data_pipelines/scene_caches.py).
"""

from __future__ import annotations

import json
import sys

from absl import flags

from recipes import cli
from data_pipelines import scene_caches

_BENCHMARK = flags.DEFINE_enum("benchmark", None, sorted(scene_caches.BENCHMARKS),
                               "the benchmark whose image sets are reconstructed (required)")
_QUESTIONS = flags.DEFINE_string("questions", None, "the benchmark's question file "
                                 "(required)")
_ROOT = flags.DEFINE_string("root", None, "the images' folder (default: the question "
                            "file's)")
_OUT = flags.DEFINE_string("out", None, "the cache folder (required)")
_BACKEND = flags.DEFINE_enum("backend", "pi3", ["pi3", "vggt", "da3"], "the reconstructor")
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "the backend's local checkpoint file or "
                                  "folder (required)")
_DEVICE = flags.DEFINE_string("device", "cpu", "torch device, e.g. cuda")
_ON_ERROR = flags.DEFINE_enum("on_error", "raise", list(scene_caches.ON_ERROR),
                              "an image set that fails: stop the run, or record it and go on")
flags.mark_flags_as_required(["benchmark", "questions", "out", "checkpoint"])


def main(argv) -> None:
  del argv
  try:
    summary = scene_caches.reconstruct_benchmark(
        _BENCHMARK.value, _QUESTIONS.value, _OUT.value, _ROOT.value, backend=_BACKEND.value,
        checkpoint=_CHECKPOINT.value, device=_DEVICE.value, on_error=_ON_ERROR.value)
  except (ImportError, FileNotFoundError, ValueError) as error:  # setup: a message, no trace
    sys.exit(f"reconstruct_scenes: {error}")
  print(json.dumps(summary))


if __name__ == "__main__":
  cli.run(main)
