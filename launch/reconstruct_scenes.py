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

import argparse
import json

from data_pipelines import scene_caches


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--benchmark", required=True, choices=sorted(scene_caches.BENCHMARKS))
  parser.add_argument("--questions", required=True, help="the benchmark's question file")
  parser.add_argument("--root", default=None, help="the images' folder")
  parser.add_argument("--out", required=True, help="the cache folder")
  parser.add_argument("--backend", default="pi3", choices=("pi3", "vggt", "da3"))
  parser.add_argument("--checkpoint", required=True, help="a local checkpoint file or folder")
  parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
  parser.add_argument("--on-error", default="raise", choices=scene_caches.ON_ERROR)
  args = parser.parse_args(argv)
  try:
    summary = scene_caches.reconstruct_benchmark(
        args.benchmark, args.questions, args.out, args.root, backend=args.backend,
        checkpoint=args.checkpoint, device=args.device, on_error=args.on_error)
  except (ImportError, FileNotFoundError, ValueError) as error:  # setup: a message, no trace
    parser.exit(2, f"reconstruct_scenes: {error}\n")
  print(json.dumps(summary))


if __name__ == "__main__":
  main()
