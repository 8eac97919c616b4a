"""Serving throughput under a mixed load: `serving.Scheduler` (continuous batching over
decode slots) against the static batcher it replaced (benchmarks/static_batcher.py: bucketed batches
that run until their longest reply ends), on the same policy, prompts and replies, in one
run.

    python -m benchmarks.serving_bench                         # tiny and small policies
    python -m benchmarks.serving_bench --policies tiny --requests 32 --max_prompt 512

Load: `--requests` prompts (default 64, one client each, all sent at once) of log-uniform
length in [--min_prompt, --max_prompt] tokens (64-2,048), each asking for a uniform
[--min_reply, --max_reply] tokens (8-512) with no stop token, so every reply has its asked
length. Both engines get `--slots` rows (8); each runs the load once to compile, then once
timed. Rows: generated tokens per second, p50 / p99 latency (submit to reply), wall time,
and peak memory of the timed run (resident memory on CPU: the process's high-water mark,
reset before each run; device memory on an accelerator).
Cost on a 2-core CPU: about 10 minutes for both policies at the defaults, most of it the
static batcher's compiles and its padded decode.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import time

import jax
import numpy as np
from flax import nnx

from jaxspatial.models.policy import policy_class
from jaxspatial.models.qwen2_5_vl.config import Qwen25VLConfig
from jaxspatial.rollout import tiny
from benchmarks.static_batcher import Batcher
from jaxspatial.serving import Engine, Prompt, Sampling, Scheduler

POLICIES = {"tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2),
            "small": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                          num_attention_heads=8, num_key_value_heads=2,
                          mrope_section=(4, 6, 6))}  # head_dim 32


def policy(name: str, tok):
  base = Qwen25VLConfig.tiny(len(tok))
  text = dataclasses.replace(base.text, **POLICIES[name])
  config = tiny.model_config(tok, dataclasses.replace(base, text=text))
  return policy_class("qwen2_5_vl")(config, rngs=nnx.Rngs(0))


def load(args, seed: int = 0) -> list[tuple[Prompt, int]]:
  rng = np.random.default_rng(seed)
  lengths = np.exp(rng.uniform(np.log(args.min_prompt), np.log(args.max_prompt),
                               args.requests)).astype(int)
  replies = rng.integers(args.min_reply, args.max_reply + 1, args.requests)
  return [(Prompt(rng.integers(20, 600, n).astype(np.int32), ()), int(r))
          for n, r in zip(lengths, replies)]


def _reset_peak() -> None:
  try:
    pathlib.Path("/proc/self/clear_refs").write_text("5")
  except OSError:
    pass


def _peak_bytes() -> int | None:
  device = jax.devices()[0]
  stats = device.memory_stats() if device.platform != "cpu" else None
  if stats:
    return int(stats.get("peak_bytes_in_use", 0))
  for line in pathlib.Path("/proc/self/status").read_text().splitlines():
    if line.startswith("VmHWM:"):
      return int(line.split()[1]) * 1024
  return None


def _timed_futures(submit):
  """submit, with each future's completion time recorded (latency independent of the order
  the results are read in)."""
  def wrapped(prompt, budget):
    future = submit(prompt, budget)
    future.done_at = None
    future.add_done_callback(lambda f: setattr(f, "done_at", time.perf_counter()))
    return future
  return wrapped


def measure(name: str, make, requests) -> dict:
  """Compiles with one pass over the load, then times a second."""
  engine = make()
  try:
    submit = _timed_futures(engine.submit)
    for future in [submit(prompt, budget) for prompt, budget in requests]:
      future.result()  # compiles
    _reset_peak()
    start = time.perf_counter()
    futures = [(submit(prompt, budget), budget) for prompt, budget in requests]
    tokens = 0
    for future, budget in futures:
      reply = future.result()
      assert reply.completion_tokens == budget, (name, reply, budget)
      tokens += budget
    wall = time.perf_counter() - start
    latencies = [future.done_at - start for future, _ in futures]
    return {"tokens_s": tokens / wall, "p50": float(np.percentile(latencies, 50)),
            "p99": float(np.percentile(latencies, 99)), "wall": wall, "peak": _peak_bytes(),
            "tokens": tokens}
  finally:
    engine.close()


def compare(model, tok, requests, slots: int, capacity: int, decode_steps: int) -> dict:
  """{"static batcher": row, "continuous": row} for one policy on one load (each row:
  tokens_s, p50, p99, wall, peak, tokens)."""
  buckets = [1]
  while buckets[-1] < slots:
    buckets.append(min(2 * buckets[-1], slots))
  rows = {}
  for way in ("static batcher", "continuous"):
    engine = Engine(model, tok, stop_ids=(), batch_buckets=buckets)
    if way == "static batcher":
      make = lambda e=engine: _Static(Batcher(e, window_s=0.01))
    else:
      make = lambda e=engine: Scheduler(e, slots=slots, capacity=capacity, steps=decode_steps,
                                        max_queue=len(requests))
    rows[way] = measure(way, make, requests)
  return rows


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
  parser.add_argument("--policies", default="tiny,small", help="comma-separated: tiny, small")
  parser.add_argument("--requests", type=int, default=64, help="clients, one request each")
  parser.add_argument("--min_prompt", type=int, default=64)
  parser.add_argument("--max_prompt", type=int, default=2048)
  parser.add_argument("--min_reply", type=int, default=8)
  parser.add_argument("--max_reply", type=int, default=512)
  parser.add_argument("--slots", type=int, default=8, help="rows decoded at once, both ways")
  parser.add_argument("--decode_steps", type=int, default=8, help="the scheduler's steps "
                      "per program call")
  args = parser.parse_args(argv)
  tok = tiny.tokenizer()
  requests = load(args)
  print(f"{args.requests} requests at once: prompts {args.min_prompt}-{args.max_prompt} "
        f"tokens (log-uniform), replies {args.min_reply}-{args.max_reply} (uniform, no stop); "
        f"{args.slots} rows; {jax.devices()[0].platform}", flush=True)
  print("| policy | engine | tokens/s | p50 latency (s) | p99 latency (s) | wall (s) | "
        "peak memory (MB) |")
  print("|---|---|---|---|---|---|---|")
  for name in args.policies.split(","):
    rows = compare(policy(name, tok), tok, requests, args.slots,
                   args.max_prompt + args.max_reply, args.decode_steps)
    for way, row in rows.items():
      peak = f"{row['peak'] / 2**20:.0f}" if row["peak"] else "n/a"
      print(f"| {name} | {way} | {row['tokens_s']:.0f} | {row['p50']:.2f} | "
            f"{row['p99']:.2f} | {row['wall']:.1f} | {peak} |", flush=True)
    ratio = rows["continuous"]["tokens_s"] / rows["static batcher"]["tokens_s"]
    print(f"| {name} | continuous / static | {ratio:.2f}x | | | | |", flush=True)


class _Static:
  """The static batcher with the scheduler's submit signature."""

  def __init__(self, batcher):
    self.batcher = batcher

  def submit(self, prompt, max_tokens):
    return self.batcher.submit(prompt, max_tokens, Sampling())

  def close(self):
    self.batcher.close()


if __name__ == "__main__":
  main()
