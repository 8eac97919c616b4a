"""What every part shares: the sizes, the clock, the report (rewritten after every part
and row), error text, and the device's peak FLOP/s and memory."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import threading
import time
import traceback

import jax
import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
PARTS = ("versions", "pitfalls", "renderer", "rollout", "train", "decode", "serving", "recipes")
# recipes: a second call of its own (`--parts recipes`, `make device-bench-recipes`)
DEFAULT_PARTS = PARTS[:-1]
QWEN_3B_VOCAB = 151936

# Peak dense bf16 FLOP/s by device kind (lower-case substrings, the first match wins).
PEAK_BF16_FLOPS = (("h200", 989e12), ("h100 pcie", None), ("h100", 989e12),
                   ("a100", 312e12), ("v5 lite", 197e12), ("v5e", 197e12), ("v5p", 459e12),
                   ("v6", 918e12), ("v4", 275e12))


@dataclasses.dataclass(frozen=True)
class Sizes:
  """Every size the suite measures at; `full()` for a GPU, `smoke()` for a CPU check."""
  render_points: tuple[int, ...]
  render_resolutions: tuple[tuple[int, int], ...]   # (width, height)
  render_radii: tuple[int, ...]
  render_views: tuple[int, ...]
  render_repeats: int
  render_budget_s: float           # the jaxspatial grid stops starting rows after this
  numpy_points: int                # the numpy baseline runs at this cloud size only
  open3d_views: int
  scatter_clustered_pixels: int
  rollout_policy: str              # "3b" or "tiny"
  rollout_batches: tuple[int, ...]
  rollout_host_batch: int
  rollout_turns: int
  rollout_turn_tokens: int
  rollout_width: int
  rollout_height: int
  rollout_points: int
  rollout_repeats: int
  train_micro_batches: int
  train_repeats: int
  embed_vocab: int
  embed_hidden: int
  embed_tokens: int
  embed_distinct_ids: int          # contended: every token id is one of these
  segment_rows: int
  segment_columns: int
  segment_count: int
  pitfall_repeats: int
  decode_policy: str = "paper"     # "paper" (Qwen3.5-9B vs Qwen2.5-VL-7B) or "tiny"
  decode_contexts: tuple[int, ...] = (4096, 16384, 24576)
  decode_repeats: int = 2
  decode_row_s: float = 60.0       # a row starts only with this much budget left
  serving_policy: str = "small"    # benchmarks/serving_bench.py's policies
  serving_requests: int = 32
  serving_prompts: tuple[int, int] = (64, 1024)
  serving_replies: tuple[int, int] = (8, 256)
  serving_slots: int = 8
  serving_s: float = 60.0          # the part starts only with this much budget left
  recipes: tuple[str, ...] = ("act3d_grpo", "think3d_rl", "peria_or_gigpo")
  recipe_policy: str = "paper"     # "paper" (recipes.PAPER_POLICIES) or "tiny" (cpu variants)
  recipe_prompts: int = 4          # x the recipe's group (8) episodes a step
  recipe_steps: int = 2            # timed steps after the first (which compiles)
  recipe_pairs: int = 3            # interleaved rollout pairs, shared / per row
  recipe_memory_fraction: float = 0.7  # of the device, for f32 weights, grads, AdamW
  recipe_micro_rows: int = 4       # rows per micro-batch of the update (0: the config's)
  recipe_row_s: float = 150.0      # a recipe starts only with this much budget left

  @classmethod
  def full(cls) -> "Sizes":
    return cls(
        render_points=(1_000_000, 1_500_000), render_resolutions=((512, 512), (1024, 768)),
        render_radii=(0, 1), render_views=(1, 8, 64), render_repeats=5, render_budget_s=100.0,
        numpy_points=1_000_000, open3d_views=8, scatter_clustered_pixels=256,
        rollout_policy="3b", rollout_batches=(8, 64, 128), rollout_host_batch=8,
        rollout_turns=4, rollout_turn_tokens=256, rollout_width=640, rollout_height=480,
        rollout_points=100_000, rollout_repeats=2, train_micro_batches=2, train_repeats=2,
        embed_vocab=QWEN_3B_VOCAB, embed_hidden=2048,
        embed_tokens=8 * 4096, embed_distinct_ids=32, segment_rows=65536,
        segment_columns=1024, segment_count=12123, pitfall_repeats=3)

  @classmethod
  def smoke(cls) -> "Sizes":
    # Turns of 40 tokens: the scripted Act3D call is up to 36 tiny-tokenizer tokens.
    return cls(
        render_points=(20_000,), render_resolutions=((64, 48),), render_radii=(0, 1),
        render_views=(1, 2), render_repeats=2, render_budget_s=30.0, numpy_points=20_000,
        open3d_views=2, scatter_clustered_pixels=16, rollout_policy="tiny",
        rollout_batches=(2,), rollout_host_batch=2, rollout_turns=2, rollout_turn_tokens=40,
        rollout_width=112, rollout_height=84, rollout_points=20_000, rollout_repeats=1,
        train_micro_batches=2, train_repeats=1, embed_vocab=4096,
        embed_hidden=64, embed_tokens=2048, embed_distinct_ids=8, segment_rows=2048,
        segment_columns=32, segment_count=100, pitfall_repeats=2, decode_policy="tiny",
        decode_contexts=(64, 256), decode_repeats=1, decode_row_s=5.0,
        serving_policy="tiny", serving_requests=4, serving_prompts=(64, 128),
        serving_replies=(4, 16), serving_slots=2, serving_s=5.0, recipe_policy="tiny",
        recipe_prompts=2, recipe_steps=1, recipe_pairs=1, recipe_micro_rows=0,
        recipe_row_s=20.0)


class Clock:
  """Seconds since the suite started, against its budget."""

  def __init__(self, budget_s: float):
    self.start = time.perf_counter()
    self.budget_s = budget_s

  def elapsed(self) -> float:
    return time.perf_counter() - self.start

  def left(self) -> float:
    return self.budget_s - self.elapsed()


def log(clock: Clock, message: str) -> None:
  print(f"[{clock.elapsed():7.1f} s] {message}", flush=True)


def error_text(exc: BaseException, limit: int = 2500) -> str:
  """The project's frames of the traceback, then its last lines (XLA's messages can run to
  pages, library frames to hundreds)."""
  ours = [f"{f.filename}:{f.lineno} {f.name}" for f in traceback.extract_tb(exc.__traceback__)
          if str(REPO) in f.filename and "site-packages" not in f.filename]
  text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
  return "project frames: " + " <- ".join(reversed(ours[-8:])) + "\n" + text[-limit:]


def jsonable(x):
  if isinstance(x, (np.integer, np.bool_)):
    return x.item()
  if isinstance(x, np.floating):
    return float(x)
  if isinstance(x, (np.ndarray, jax.Array)):
    return np.asarray(x).tolist()
  if isinstance(x, pathlib.Path):
    return str(x)
  return repr(x)


class Report:
  """The report dict, written atomically (a kill mid-write leaves the previous file)."""

  def __init__(self, path: pathlib.Path, meta: dict):
    self.path = path
    self.data = {"meta": meta}
    self.lock = threading.Lock()

  def part(self, name: str) -> dict:
    return self.data.setdefault(name, {"status": "pending", "error": None, "elapsed_s": 0.0})

  def save(self) -> None:
    with self.lock:
      for _ in range(3):  # the watchdog may write while the main thread adds a row
        try:
          text = json.dumps(self.data, indent=1, default=jsonable)
          break
        except RuntimeError:
          time.sleep(0.05)
      else:
        return
      self.path.parent.mkdir(parents=True, exist_ok=True)
      tmp = self.path.with_suffix(".json.tmp")
      tmp.write_text(text)
      os.replace(tmp, self.path)


def run_part(name: str, fn, report: Report, clock: Clock) -> None:
  """Runs one part (or a later phase of it), recording its error instead of raising."""
  entry = report.part(name)
  log(clock, f"{name}: start")
  entry["status"] = "running"
  report.data["meta"]["running"] = name
  report.save()
  start = time.perf_counter()
  try:
    fn(entry)
    entry["status"] = "ok" if entry["error"] is None else "error"
  except Exception as exc:  # pylint: disable=broad-except
    entry["status"] = "error"
    text = f"{type(exc).__name__}: {exc}"[:500] + "\n" + error_text(exc)
    entry["error"] = text if entry["error"] is None else entry["error"] + "\n" + text
  entry["elapsed_s"] = entry["elapsed_s"] + time.perf_counter() - start
  report.data["meta"]["running"] = None
  report.save()
  log(clock, f"{name}: {entry['status']} ({time.perf_counter() - start:.1f} s)")


def peak_flops(device_kind: str) -> float | None:
  kind = device_kind.lower()
  for name, flops in PEAK_BF16_FLOPS:
    if name in kind:
      return flops
  return None


def peak_memory_bytes() -> int | None:
  try:
    stats = jax.devices()[0].memory_stats()
  except Exception:  # pylint: disable=broad-except
    return None
  return None if not stats else stats.get("peak_bytes_in_use")


def first_cost(compiled) -> dict:
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  return dict(cost or {})


def memory_bytes(compiled) -> dict:
  """XLA's memory analysis of an executable: argument, output, temporary, aliased bytes."""
  try:
    analysis = compiled.memory_analysis()
  except Exception:  # pylint: disable=broad-except
    return {}
  names = ("argument_size", "output_size", "temp_size", "alias_size")
  return {n: getattr(analysis, n + "_in_bytes") for n in names
          if analysis is not None and hasattr(analysis, n + "_in_bytes")}
