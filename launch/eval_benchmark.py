r"""Evaluates an OpenAI-compatible chat model with no tools on a benchmark's questions.

    python -m launch.eval_benchmark --benchmark mindcube_tiny \
        --questions data/MindCube_tinybench.jsonl --image-root data/MindCube \
        --endpoint http://127.0.0.1:8000/v1 --model Qwen2.5-VL-3B --seeds 3 --out out/mc

Each question's images go as data URLs with its text, one request per question per seed
(the request's `seed` field; temperature 0 unless --temperature), --concurrency at a time;
the key, if any, from the environment variable --api-key-env. Writes OUT/results.json,
OUT/results.md, OUT/predictions.jsonl (every reply) and OUT/run.json
(recipes.endpoint_eval).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from data_pipelines.readers import BenchmarkFormatError, MissingImageError
from recipes.endpoint_eval import READERS, run_endpoint_eval


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m launch.eval_benchmark", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--benchmark", required=True, choices=sorted(READERS))
  p.add_argument("--questions", required=True, help="the benchmark's question file")
  p.add_argument("--image-root", "--image_root", dest="image_root", required=True,
                 help="the folder the question file's image paths are relative to")
  p.add_argument("--endpoint", required=True, help="the API's base URL (.../v1)")
  p.add_argument("--model", required=True, help="the model name the endpoint serves")
  p.add_argument("--out", required=True, help="the output folder")
  p.add_argument("--seeds", type=int, default=3, help="runs, with request seeds 0..N-1")
  p.add_argument("--concurrency", type=int, default=16, help="requests in flight")
  p.add_argument("--limit", type=int, default=None, help="only the first N questions")
  p.add_argument("--temperature", type=float, default=0.0)
  p.add_argument("--max-tokens", "--max_tokens", dest="max_tokens", type=int, default=32)
  p.add_argument("--api-key-env", "--api_key_env", dest="api_key_env",
                 default="OPENAI_API_KEY", help="the environment variable holding the key "
                 "(unset: no Authorization header)")
  p.add_argument("--timeout-s", "--timeout_s", dest="timeout_s", type=float, default=120.0,
                 help="seconds per attempt")
  p.add_argument("--retries", type=int, default=3)
  p.add_argument("--max-requests", "--max_requests", dest="max_requests", type=int,
                 default=None, help="the request budget, retries included")
  return p


def main(argv=None) -> int:
  args = parser().parse_args(argv)
  try:
    document = run_endpoint_eval(
        args.benchmark, args.questions, args.image_root, args.endpoint, args.model, args.out,
        seeds=args.seeds, concurrency=args.concurrency, limit=args.limit,
        temperature=args.temperature, max_tokens=args.max_tokens,
        api_key_env=args.api_key_env, timeout_s=args.timeout_s, retries=args.retries,
        max_requests=args.max_requests)
  except (MissingImageError, BenchmarkFormatError) as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  out = pathlib.Path(args.out)
  overall = document["overall"]
  print(f"{args.benchmark}: {document.get('questions', '?')} questions x {args.seeds} seeds, "
        f"overall {100 * overall['accuracy']:.1f} ± {100 * overall['std']:.1f}", flush=True)
  print(f"results: {out / 'results.json'}, {out / 'results.md'}; replies: "
        f"{out / 'predictions.jsonl'}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
