"""`launch.eval --benchmark mindcube_tiny --limit 20` wall time, against the code before
`--limit` read only the records it needs (the baseline: commit e166332, which read and
decoded the whole benchmark whatever the limit), on MindCube-Tiny built from its real
question file with photo-like 640 x 480 views (written here, one per image path), a
scripted OpenAI-compatible endpoint on loopback answering "A".

    python -m benchmarks.eval_bench [--work DIR] [--limit 20] [--baseline e166332]

Cost: about 3 minutes on a 2-core CPU (the build, then each command twice); the build is
kept under --work and reused.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image

REPO = pathlib.Path(__file__).resolve().parents[1]
QUESTIONS = REPO.parent / "shared" / "data" / "benchmarks" / "mindcube_tiny_questions.jsonl"


def _photo(path: str) -> bytes:
  """A JPEG with a photo's detail (smooth colour fields plus grain), seeded by the path."""
  rng = np.random.default_rng(int(hashlib.sha256(path.encode()).hexdigest()[:8], 16))
  coarse = rng.uniform(0, 255, (12, 16, 3))
  image = np.kron(coarse, np.ones((40, 40, 1))) + rng.normal(0, 18, (480, 640, 3))
  buffer = io.BytesIO()
  Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(buffer, format="JPEG",
                                                               quality=90)
  return buffer.getvalue()


def build(work: pathlib.Path) -> pathlib.Path:
  data = work / "data"
  if (work / "built").exists():
    return data
  rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]
  for row in rows:
    for relative in row["images"]:
      path = work / "source" / relative
      if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_photo(relative))
  done = subprocess.run([sys.executable, "-m", "launch.build_benchmark", "--benchmark",
                         "mindcube_tiny", "--source", str(work / "source"), "--questions",
                         str(QUESTIONS), "--data_dir", str(data)], cwd=REPO,
                        capture_output=True, text=True, check=False)
  if done.returncode:
    raise SystemExit(f"build failed: {done.stderr[-2000:]}")
  (work / "built").write_text("ok\n")
  return data


def run_eval(code: pathlib.Path, data: pathlib.Path, out: pathlib.Path, url: str,
             limit: int) -> float:
  shutil.rmtree(out, ignore_errors=True)  # a fresh run: a kept --out would resume
  start = time.perf_counter()
  done = subprocess.run([sys.executable, "-m", "launch.eval", "--benchmark", "mindcube_tiny",
                         "--data_dir", str(data), "--endpoint", url, "--model", "scripted",
                         "--seeds", "1", "--limit", str(limit), "--out", str(out),
                         "--api_key_env", ""], cwd=code, capture_output=True, text=True,
                        check=False)
  seconds = time.perf_counter() - start
  if done.returncode:
    raise SystemExit(f"launch.eval in {code} failed: {done.stderr[-2000:]}")
  return seconds


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--work", default=None, help="default: a temporary folder")
  parser.add_argument("--limit", type=int, default=20)
  parser.add_argument("--baseline", default="e166332", help="the commit to compare with")
  parser.add_argument("--repeats", type=int, default=2)
  args = parser.parse_args(argv)
  sys.path.insert(0, str(REPO))
  from tests.perception.chat_server import ChatServer  # pylint: disable=import-outside-toplevel
  work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="jaxspatial_eval_bench_"))
  start = time.perf_counter()
  data = build(work)
  print(f"MindCube-Tiny built in {time.perf_counter() - start:.1f} s under {data}")
  baseline = work / f"code_{args.baseline}"
  if not baseline.exists():
    baseline.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", args.baseline], cwd=REPO, capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(baseline)], input=archive, check=True)
  times: dict[str, list[float]] = {"baseline": [], "now": []}
  with ChatServer() as server:
    server.reply_fn = lambda body: "A"
    for k in range(args.repeats):
      for name, code in (("baseline", baseline), ("now", REPO)):
        times[name].append(run_eval(code, data, work / f"out_{name}_{k}", server.base_url,
                                    args.limit))
  old, new = min(times["baseline"]), min(times["now"])
  print(f"| launch.eval --limit {args.limit} (MindCube-Tiny, 1 seed) | wall s (best of "
        f"{args.repeats}) |\n|---|---:|\n| baseline {args.baseline} | {old:.1f} |\n"
        f"| now | {new:.1f} |\n| now / baseline | {new / old:.2f} |")


if __name__ == "__main__":
  main()
