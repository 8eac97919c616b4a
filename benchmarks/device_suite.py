"""The prepared device benchmark: what a few minutes on one GPU should measure, unattended.

    python -m benchmarks.device_suite [--out outputs/device_suite] [--budget-s 330]
    python -m benchmarks.device_suite --smoke      # every part at tiny sizes, on the CPU
    python -m benchmarks.device_suite --parts rollout --budget-s 250 --deadline-s 270  # a 2nd call
    make device-bench

Cost: at most 6 minutes on one H200 (a watchdog writes the report and ends the run at
`--deadline-s` 345; rollout sizes past the first and the host loop start only when their
estimate fits in `--budget-s` 330, skips are recorded); --smoke 50-58 s on a 2-core
CPU (its XLA compiles at LLVM -O0: it tests the path, its numbers mean nothing). Each
part is caught on its own (the error text goes into the report, the run goes on);
DIR/report.json is rewritten after every part and grid row; one Markdown table per part
is printed at the end.
  versions  jax / jaxlib / flax, CUDA and cuDNN where discoverable, the devices, the host
  pitfalls  known XLA regressions, measured: the f32 scatter-add of an embedding gradient
            (8 x 4096 ids into [151936, 2048]) under index contention against int32 (jax
            #38806 / openxla/xla #46225: a CAS loop on NVIDIA GPUs with jaxlib 0.10.2 to
            0.11.0). The suite runs as launch.train does (jaxspatial/xla_workarounds.py
            sets the workaround flag on an affected install); a subprocess then measures
            the other side: without the flag when it is set, with it when the raw
            scatter bites;
            `jax.ops.segment_sum` layouts (jax #39959)
  renderer  the jit renderer at 1M and 1.5M points, 512x512 and 1024x768, radius 0 / 1,
            1 / 8 / 64 views a call: ms per view, points per second; Open3D (radius 0) and
            Think3D's numpy method (radius 1, one call per resolution, 1M points) on the
            host as ratios; scatter-min throughput (uniform, clustered pixels), the bound
  rollout   compiled Act3D episodes (`episode.rollout`, the program `compile_rollout`
            jits, compiled ahead of time) of a Qwen2.5-VL-3B-shaped random policy in bf16,
            640x480 views, 4 turns x 256 forced tokens, batch 8, 64, 128: compile s, tokens
            and episodes per second; vision / render / decode shares from separately jitted
            components; a profiler trace (DIR/trace); the host loop at batch 8
  train     one GRPO step on the batch-8 trajectories (f32 master weights, bf16 compute,
            remat, 2 micro-batches): tokens per second, MFU from the compiled step's cost
            analysis, peak device memory; then the old log-probabilities recomputed
  decode    Act3D's policy family at long context: 32 greedy decode steps after a cache of
            4k, 16k and 24k tokens, batch 1, bf16 weights (zeros: the work does not depend
            on them) and cache, Qwen3.5-9B's hybrid decoder against Qwen2.5-VL-7B's KV
            decoder (benchmarks/sampler_bench.py's rows at the papers' shapes): tokens per
            second and cache bytes per episode. Last, and only rows that fit the budget
  serving   benchmarks/serving_bench.py on the device: 32 requests at once (prompts 64-1,024
            tokens, replies 8-256) on its small policy, the continuous scheduler against
            the static batcher: tokens per second, p50 / p99 latency, peak memory; only
            with `serving_s` of budget left
            (each a compile of about a minute): `--parts decode --budget-s 250` as a second
            call measures them all
On an accelerator the rollout's set-up and every compile run on a worker thread beside
the measurements (`--compiles serial` for undisturbed timings, at the cost of minutes).
Order: versions, pitfalls, renderer, rollout batch 8, train, rollout batch 64, host loop,
rollout batch 128, decode.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import pathlib
import platform
import queue
import subprocess
import sys
import threading
import time
import traceback

import flax
import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
from flax import nnx

from benchmarks.render_bench import (cameras_in_room, jaxspatial_view_ms, numpy_draw,
                                     open3d_cloud, open3d_draw)
from benchmarks.timing import timed, timed_first
from data_pipelines.synthetic import make_room
from jaxspatial import xla_workarounds
from jaxspatial.envs import act3d
from jaxspatial.models import memory
from jaxspatial.models.precision import Precision
from jaxspatial.models.qwen2_5_vl.config import Qwen25VLConfig, TextConfig, VisionConfig
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.models.qwen2_5_vl.preprocess import batch_vision_inputs
from jaxspatial.train import (AdvantageConfig, OptimizerConfig, StepConfig, TrainBatch,
                              batch_logprobs, grpo, make_optimizer, train_step)
# jaxspatial.rollout (and data_pipelines.synthetic.episodes, through it) is imported where
# it is used: importing it starts the XLA backend (module-level jnp constants in
# rollout/episode.py), and main() sets the platform and the backend's flags first.

REPO = pathlib.Path(__file__).resolve().parents[1]
PARTS = ("versions", "pitfalls", "renderer", "rollout", "train", "decode", "serving")
QWEN_3B_VOCAB = 151936

# Workaround of the f32 scatter-add CAS loop (jax-ml/jax#38806, root-cause comment of
# 2026-07-18; used by bartz-org/bartz#176): the hidden LLVM NVPTX option restores the native
# `atom.add.f32` (which flushes f32 denormals in the atomic sum). Fixed in jax 0.11.1.
FTZ_ATOMICS_OPTION = xla_workarounds.FTZ_ATOMICS  # launch.train sets it where affected
WORKAROUND = {
    "issues": ["https://github.com/jax-ml/jax/issues/38806",
               "https://github.com/openxla/xla/issues/46225"],
    "affected": "jaxlib 0.10.2 to 0.11.0 on NVIDIA GPUs (LLVM commit 8ae895af32cc, "
                "llvm/llvm-project#200732: atomicrmw fadd lowers to a CAS loop unless the "
                "function flushes denormals)",
    "flag": f"XLA_FLAGS=--xla_backend_extra_options={FTZ_ATOMICS_OPTION}",
    "flag_note": "set before the backend starts (XLA reads XLA_FLAGS once); merge with an "
                 "existing --xla_backend_extra_options by a comma",
    "pin": "jax/jaxlib >= 0.11.1 (the fix, reported in cusp-ai-oss/kUPS#248), or <= 0.10.1",
    "sources": ["https://github.com/jax-ml/jax/issues/38806",
                "https://github.com/bartz-org/bartz/pull/176",
                "https://github.com/llvm/llvm-project/pull/206154"],
}

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
        serving_replies=(4, 16), serving_slots=2, serving_s=5.0)


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


def _jsonable(x):
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
          text = json.dumps(self.data, indent=1, default=_jsonable)
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


# ---------------------------------------------------------------------------------------
# versions


def versions_part(entry: dict) -> None:
  devices = jax.devices()
  entry.update(jax=jax.__version__, jaxlib=jaxlib.__version__, flax=flax.__version__,
               numpy=np.__version__, python=platform.python_version(),
               platform=devices[0].platform, device_kind=devices[0].device_kind,
               device_count=len(devices), process_count=jax.process_count(),
               host_cpus=os.cpu_count(), host_machine=platform.machine(),
               xla_flags=os.environ.get("XLA_FLAGS", ""))
  try:
    import open3d  # pylint: disable=import-outside-toplevel
    entry["open3d"] = open3d.__version__
  except Exception as exc:  # pylint: disable=broad-except
    entry["open3d"] = f"unavailable: {type(exc).__name__}: {exc}"[:300]
  try:
    from jax.extend import backend  # pylint: disable=import-outside-toplevel
    entry["backend_platform_version"] = backend.get_backend().platform_version
  except Exception as exc:  # pylint: disable=broad-except
    entry["backend_platform_version"] = f"unavailable: {exc}"[:300]
  # jax._src.lib.cuda_versions is private and absent without the CUDA plugin.
  cuda = {}
  try:
    from jax._src.lib import cuda_versions  # pylint: disable=import-outside-toplevel
    names = dir(cuda_versions) if cuda_versions is not None else []
    for name in names:
      if name.endswith("version") and callable(getattr(cuda_versions, name)):
        try:
          cuda[name] = getattr(cuda_versions, name)()
        except Exception as exc:  # pylint: disable=broad-except
          cuda[name] = f"unavailable: {exc}"[:200]
  except Exception as exc:  # pylint: disable=broad-except
    cuda["error"] = f"{type(exc).__name__}: {exc}"[:300]
  entry["cuda_versions"] = cuda
  try:
    entry["environment_info"] = jax.print_environment_info(return_string=True)
  except Exception as exc:  # pylint: disable=broad-except
    entry["environment_info"] = f"unavailable: {exc}"[:300]
  entry["scatter_regression_affected"] = xla_workarounds.scatter_add_affected(
      jaxlib.__version__, devices[0].platform == "gpu")


# ---------------------------------------------------------------------------------------
# pitfalls


def scatter_add_rows(sizes: Sizes) -> list[dict]:
  """The embedding gradient's scatter-add ([tokens] ids into a [vocab, hidden] table's
  gradient) in f32 and int32, uniform and contended ids; ms per call."""
  vocab, hidden, tokens = sizes.embed_vocab, sizes.embed_hidden, sizes.embed_tokens
  uniform_ids = jax.random.randint(jax.random.PRNGKey(0), (tokens,), 0, vocab)
  # Contended: a handful of rows (padding, frequent tokens) take every update.
  distinct = sizes.embed_distinct_ids
  contended_ids = (jax.random.randint(jax.random.PRNGKey(1), (tokens,), 0, distinct)
                   * (vocab // distinct))
  add = jax.jit(lambda table, ids, updates: table.at[ids].add(updates))
  rows = []
  for case, ids in (("uniform", uniform_ids), ("contended", contended_ids)):
    row = {"case": case, "ids": tokens, "table": [vocab, hidden]}
    for dtype in (jnp.float32, jnp.int32):
      table = jnp.zeros((vocab, hidden), dtype)
      updates = jnp.ones((tokens, hidden), dtype)
      row[f"{jnp.dtype(dtype).name}_ms"] = 1e3 * timed(lambda: add(table, ids, updates),
                                                       sizes.pitfall_repeats)
    row["f32_over_int32"] = row["float32_ms"] / row["int32_ms"]
    rows.append(row)
  # What a training step runs: the gradient of an embedding lookup.
  table = jnp.zeros((vocab, hidden), jnp.float32)
  cotangent = jnp.ones((tokens, hidden), jnp.float32)
  grad = jax.jit(jax.grad(lambda t, ids: jnp.sum(jnp.take(t, ids, axis=0) * cotangent)))
  rows.append({"case": "contended, jax.grad of an embedding lookup", "ids": tokens,
               "table": [vocab, hidden],
               "float32_ms": 1e3 * timed(lambda: grad(table, contended_ids),
                                         sizes.pitfall_repeats)})
  return rows


def segment_sum_rows(sizes: Sizes) -> list[dict]:
  """`segment_sum` of [rows, columns] into [count] segments: plain, and vmapped over the
  columns with out_axes 0 (the layout jax #39959 found strided since 0.9.2) and 1."""
  rows_n, columns, count = sizes.segment_rows, sizes.segment_columns, sizes.segment_count
  ids = jnp.sort(jax.random.randint(jax.random.PRNGKey(2), (rows_n,), 0, count))
  out = []
  for dtype in (jnp.float32, jnp.int32):
    data = jnp.ones((rows_n, columns), dtype)
    variants = {
        "plain [S, C]": jax.jit(lambda d: jax.ops.segment_sum(d, ids, count)),
        "vmap out_axes=0 [C, S]": jax.jit(jax.vmap(
            lambda col: jax.ops.segment_sum(col, ids, count), in_axes=1, out_axes=0)),
        "vmap out_axes=1 [S, C]": jax.jit(jax.vmap(
            lambda col: jax.ops.segment_sum(col, ids, count), in_axes=1, out_axes=1)),
    }
    for name, fn in variants.items():
      out.append({"case": name, "dtype": jnp.dtype(dtype).name, "rows": rows_n,
                  "columns": columns, "segments": count,
                  "ms": 1e3 * timed(lambda: fn(data), sizes.pitfall_repeats)})
  return out


def without_backend_option(xla_flags: str, option: str) -> str:
  prefix = "--xla_backend_extra_options="
  parts = []
  for part in xla_flags.split():
    if part.startswith(prefix):
      kept = [o for o in part[len(prefix):].split(",") if o and o != option]
      part = prefix + ",".join(kept) if kept else ""
    if part:
      parts.append(part)
  return " ".join(parts)


def remeasure_with_flag(sizes: Sizes, timeout_s: float, with_flag: bool = True) -> dict:
  """The scatter-add rows again in a fresh process whose XLA_FLAGS carry the workaround
  (or, `with_flag` False, lack it: the raw regression) — a flag cannot change once the
  backend has started."""
  env = dict(os.environ, JAXSPATIAL_SKIP_XLA_WORKAROUNDS="1")
  flags = env.get("XLA_FLAGS", "")
  env["XLA_FLAGS"] = (xla_workarounds.with_backend_option(flags, FTZ_ATOMICS_OPTION) if with_flag
                      else without_backend_option(flags, FTZ_ATOMICS_OPTION))
  env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # this process holds most of the memory
  command = [sys.executable, "-m", "benchmarks.device_suite", "--pitfall-child",
             json.dumps(dataclasses.asdict(sizes))]
  result = {"xla_flags": env["XLA_FLAGS"]}
  start = time.perf_counter()
  done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=timeout_s, check=False)
  result["elapsed_s"] = time.perf_counter() - start
  result["returncode"] = done.returncode
  lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
  if done.returncode or not lines:
    result["error"] = (done.stdout + done.stderr)[-3000:]
    return result
  result["rows"] = json.loads(lines[-1])["rows"]
  contended = next(r for r in result["rows"] if r["case"] == "contended")
  result["fixed"] = contended["f32_over_int32"] <= 10
  return result


def _tuples(x):
  return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


def pitfall_child(sizes_json: str) -> None:
  """The subprocess of `remeasure_with_flag`: prints the scatter-add rows as one JSON line."""
  sizes = Sizes(**{k: _tuples(v) for k, v in json.loads(sizes_json).items()})
  rows = scatter_add_rows(sizes)[:2]
  print(json.dumps({"rows": rows, "xla_flags": os.environ.get("XLA_FLAGS", "")}), flush=True)


def pitfalls_part(entry: dict, sizes: Sizes, clock: Clock, report: Report,
                  applied: bool = False) -> None:
  """`applied`: this process runs with the workaround flag (as launch.train does on an
  affected install); the raw regression is then measured in a child without it."""
  entry["workaround"] = {**WORKAROUND, "applied_in_this_process": applied}
  scatter = scatter_add_rows(sizes)
  contended = next(r for r in scatter if r["case"] == "contended")
  bites = contended["f32_over_int32"] > 10
  entry["scatter_add"] = {"rows": scatter, "bites": bites, "with_workaround": applied,
                          "bites_rule": "contended f32 more than 10x slower than int32"}
  report.save()
  segments = segment_sum_rows(sizes)
  by = {(r["case"], r["dtype"]): r["ms"] for r in segments}
  layout = by[("vmap out_axes=0 [C, S]", "float32")] / by[("vmap out_axes=1 [S, C]", "float32")]
  f32_int32 = by[("plain [S, C]", "float32")] / by[("plain [S, C]", "int32")]
  entry["segment_sum"] = {
      "rows": segments, "out_axes0_over_out_axes1": layout, "f32_over_int32": f32_int32,
      "bites": layout > 3 or f32_int32 > 10,
      "bites_rule": "vmap out_axes=0 more than 3x slower than out_axes=1, or f32 more than "
                    "10x slower than int32",
      "issue": "https://github.com/jax-ml/jax/issues/39959"}
  report.save()
  if applied:  # the rows above have the flag: the child shows what it saves
    raw = (remeasure_with_flag(sizes, timeout_s=min(180.0, clock.left() - 30), with_flag=False)
           if clock.left() >= 60 else {"skipped": f"budget: {clock.left():.0f} s left"})
    entry["raw_without_workaround"] = raw
    if raw.get("rows"):
      raw_contended = next(r for r in raw["rows"] if r["case"] == "contended")
      entry["scatter_add"]["bites_without_workaround"] = raw_contended["f32_over_int32"] > 10
    entry["remeasure"] = {"skipped": "this process has the workaround already"}
  elif not bites:
    entry["remeasure"] = {"skipped": "the f32 scatter-add did not bite"}
  elif clock.left() < 60:
    entry["remeasure"] = {"skipped": f"budget: {clock.left():.0f} s left"}
  else:
    entry["remeasure"] = remeasure_with_flag(sizes, timeout_s=min(180.0, clock.left() - 30))


# ---------------------------------------------------------------------------------------
# renderer


def scatter_min_rows(num_updates: int, width: int, height: int, clustered_pixels: int,
                     repeats: int) -> list[dict]:
  """int32 `.at[].min` of `num_updates` into an image-sized buffer: the z-buffer's pass."""
  size = width * height
  buffer = jnp.full((size + 1,), jnp.iinfo(jnp.int32).max, jnp.int32)
  values = jax.random.randint(jax.random.PRNGKey(3), (num_updates,), 0, 2 ** 30)
  patterns = {
      "uniform": jax.random.randint(jax.random.PRNGKey(4), (num_updates,), 0, size),
      f"clustered ({clustered_pixels} pixels)": jax.random.randint(
          jax.random.PRNGKey(5), (num_updates,), 0, clustered_pixels) * 97 % size}
  scatter_min = jax.jit(lambda b, i, v: b.at[i].min(v))
  rows = []
  for name, index in patterns.items():
    seconds = timed(lambda: scatter_min(buffer, index, values), repeats)
    rows.append({"pattern": name, "updates": num_updates, "width": width, "height": height,
                 "ms": 1e3 * seconds, "updates_per_s": num_updates / seconds})
  return rows


def renderer_part(entry: dict, sizes: Sizes, clock: Clock, report: Report) -> None:
  rows, scatter, skipped = [], [], []
  entry.update(rows=rows, scatter_min=scatter, skipped=skipped,
               note="jaxspatial rows draw colour and depth (what the baselines compute); "
                    "first_call_s includes the jit compile; host baselines run after the "
                    "device rows (Open3D's TBB workers spin and steal cores)")
  start = time.perf_counter()
  rooms = {}
  for points in sizes.render_points:
    room = make_room(0, points, num_objects=8)
    rooms[points] = room
    cloud = jax.device_put(room.cloud)
    for width, height in sizes.render_resolutions:
      cameras = cameras_in_room(room, max(sizes.render_views), width, height)
      for radius in sizes.render_radii:
        for views in sizes.render_views:
          row = {"renderer": "jaxspatial", "points": points, "width": width,
                 "height": height, "radius": radius, "views": views}
          if time.perf_counter() - start > sizes.render_budget_s or clock.left() < 30:
            skipped.append({**row, "reason": "renderer budget"})
            continue
          try:
            first, ms = jaxspatial_view_ms(cloud, cameras, height, width, radius, views,
                                           sizes.render_repeats)
            row.update(ms_per_view=ms, points_per_s=points / (ms / 1e3), first_call_s=first)
          except Exception as exc:  # pylint: disable=broad-except
            row["error"] = f"{type(exc).__name__}: {exc}"[:1000]
          rows.append(row)
          report.save()
    for width, height in sizes.render_resolutions:
      scatter.extend(scatter_min_rows(points, width, height, sizes.scatter_clustered_pixels,
                                      sizes.render_repeats))
    del cloud
    report.save()
  entry["host_baselines"] = baselines = []
  for points, room in rooms.items():
    xyz_np, rgb_np = np.asarray(room.cloud.xyz), np.asarray(room.cloud.rgb)
    try:  # open3d's import fails without Debian's libusb (make system-deps)
      o3d_cloud = open3d_cloud(xyz_np, rgb_np)
    except Exception as exc:  # pylint: disable=broad-except
      o3d_cloud = None
      entry["open3d"] = f"skipped: {type(exc).__name__}: {exc}"[:300]
    for width, height in sizes.render_resolutions:
      cameras = cameras_in_room(room, sizes.open3d_views, width, height)
      base = {"points": points, "width": width, "height": height, "views": 1}
      if o3d_cloud is not None:
        views = sizes.open3d_views
        row = {"renderer": "open3d project_to_rgbd_image", **base, "radius": 0}
        try:
          ms = 1e3 * timed(open3d_draw(o3d_cloud, cameras, width, height, views), 2) / views
          row.update(ms_per_view=ms, points_per_s=points / (ms / 1e3))
        except Exception as exc:  # pylint: disable=broad-except
          row["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        baselines.append(row)
      if points == sizes.numpy_points:
        row = {"renderer": "numpy, Think3D method", **base, "radius": 1}
        try:
          draw = numpy_draw(xyz_np, rgb_np, cameras, height, width, 1)
          begin = time.perf_counter()  # one call: it is slow and has nothing to compile
          draw()
          ms = 1e3 * (time.perf_counter() - begin)
          row.update(ms_per_view=ms, points_per_s=points / (ms / 1e3))
        except Exception as exc:  # pylint: disable=broad-except
          row["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        baselines.append(row)
      report.save()
  for row in rows:
    for base in baselines:
      same = (base["points"], base["width"], base["height"], base["radius"]) == (
          row["points"], row["width"], row["height"], row["radius"])
      if same and "ms_per_view" in row and "ms_per_view" in base:
        row["speedup"] = base["ms_per_view"] / row["ms_per_view"]
        row["speedup_vs"] = base["renderer"]


# ---------------------------------------------------------------------------------------
# background compiles


class Job:
  """One background compile (or set-up); `result()` waits for it, or runs it in the caller
  when compiles are serial."""

  def __init__(self, name: str, fn, serial: bool):
    self.name, self.fn, self.serial = name, fn, serial
    self.done = threading.Event()
    self.value = self.error = None
    self.seconds = None
    self.lock = threading.Lock()

  def run(self) -> None:
    with self.lock:
      if self.done.is_set():
        return
      start = time.perf_counter()
      try:
        self.value = self.fn()
      except BaseException as exc:  # pylint: disable=broad-except
        self.error = exc
      self.seconds = time.perf_counter() - start
      self.done.set()

  def result(self, timeout: float | None = None):
    if self.serial:
      self.run()
    if not self.done.wait(timeout):
      raise TimeoutError(f"{self.name}: not compiled within {timeout:.0f} s")
    if self.error is not None:
      raise self.error
    return self.value


class Worker:
  """Runs jobs on one daemon thread in submission order, so that XLA compiles (minutes for
  a 36-layer program on a GPU host) overlap the main thread's device-bound measurements.
  One thread: two XLA compiles at once were slower than one after the other (measured on
  the CPU backend). A job may wait on jobs submitted before it, never after.
  serial=True: nothing runs until asked for (undisturbed timings, longer runs)."""

  def __init__(self, serial: bool):
    self.serial = serial
    self.jobs = []
    self.queue = queue.Queue()
    if not serial:
      threading.Thread(target=self._loop, daemon=True, name="compiles").start()

  def _loop(self):
    while True:
      self.queue.get().run()

  def submit(self, name: str, fn) -> Job:
    job = Job(name, fn, self.serial)
    self.jobs.append(job)
    if not self.serial:
      self.queue.put(job)
    return job

  def busy(self) -> bool:
    return not self.serial and any(not job.done.is_set() for job in self.jobs)

  def wait_idle(self, timeout: float) -> bool:
    end = time.perf_counter() + timeout
    for job in self.jobs if not self.serial else []:
      if not job.done.wait(max(end - time.perf_counter(), 0.0)):
        return False
    return True


def abstract(tree):
  """ShapeDtypeStructs of a pytree of arrays: lowering from them never touches buffers
  that the main thread may have donated meanwhile."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                     sharding=getattr(x, "sharding", None)),
                      tree)


# ---------------------------------------------------------------------------------------
# decode at long context


def zeros_policy(cls, config):
  """A bf16 policy of `config` with every parameter zero, made on the device without a
  random initialisation (a decode step's work does not depend on the values)."""
  shapes = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0), dtype=jnp.bfloat16,
                                      param_dtype=jnp.bfloat16, attention="auto"))
  graphdef, state = nnx.split(shapes)
  return nnx.merge(graphdef, jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), state))


def paper_decode_policies() -> dict:
  """Builders of Qwen3.5-9B's and Qwen2.5-VL-7B's text decoders (a one-block vision tower:
  decode never runs it)."""
  from jaxspatial.models.qwen3_5 import Qwen35, Qwen35Config  # pylint: disable=import-outside-toplevel
  from jaxspatial.models.qwen3_vl.config import VisionConfig as Qwen3VisionConfig  # pylint: disable=import-outside-toplevel
  hybrid = Qwen35Config(vision=Qwen3VisionConfig(depth=1, hidden_size=32, intermediate_size=64,
                                                 num_heads=2, out_hidden_size=4096,
                                                 deepstack_visual_indexes=()))
  kv = Qwen25VLConfig(text=TextConfig(vocab_size=152064, hidden_size=3584,
                                      intermediate_size=18944, num_hidden_layers=28,
                                      num_attention_heads=28, num_key_value_heads=4,
                                      tie_word_embeddings=False),
                      vision=VisionConfig(depth=1, hidden_size=32, intermediate_size=64,
                                          num_heads=2, out_hidden_size=3584,
                                          fullatt_block_indexes=(0,)))
  return {"qwen2_5_vl 7B (28 KV)": lambda: zeros_policy(Qwen25VL, kv),
          "qwen3_5 9B (24 DeltaNet+8)": lambda: zeros_policy(Qwen35, hybrid)}


def decode_part(entry: dict, sizes: Sizes, clock: Clock, report: Report) -> None:
  from benchmarks import sampler_bench  # pylint: disable=import-outside-toplevel
  if sizes.decode_policy == "tiny":
    builders = {name: (lambda m=m: m)
                for name, m in sampler_bench.tiny_long_context_models().items()}
  else:
    builders = paper_decode_policies()
  rows = entry.setdefault("rows", [])
  for name, build in builders.items():
    if clock.left() < sizes.decode_row_s:
      entry.setdefault("skipped", []).append(f"{name}: out of budget")
      continue
    model = build()
    for context in sizes.decode_contexts:
      if clock.left() < sizes.decode_row_s:
        entry.setdefault("skipped", []).append(f"{name} at {context}: out of budget")
        continue
      seconds = sampler_bench.decode_at_context(model, context, repeats=sizes.decode_repeats)
      rows.append(dict(model=name, context=context, decode_tok_s=32 / seconds,
                       cache_bytes=memory.cache_bytes(model, 1, context + 32, jnp.bfloat16)))
      log(clock, f"decode: {name} at {context}: {32 / seconds:.0f} tok/s")
      report.save()
    del model


def serving_part(entry: dict, sizes: Sizes, clock: Clock, report: Report) -> None:
  # pylint: disable=import-outside-toplevel
  import types
  from benchmarks import serving_bench
  from jaxspatial.rollout import tiny
  if clock.left() < sizes.serving_s:
    entry.setdefault("skipped", []).append("serving: out of budget")
    return
  tok = tiny.tokenizer()
  load = types.SimpleNamespace(requests=sizes.serving_requests,
                               min_prompt=sizes.serving_prompts[0],
                               max_prompt=sizes.serving_prompts[1],
                               min_reply=sizes.serving_replies[0],
                               max_reply=sizes.serving_replies[1])
  rows = serving_bench.compare(serving_bench.policy(sizes.serving_policy, tok), tok,
                               serving_bench.load(load), sizes.serving_slots,
                               sizes.serving_prompts[1] + sizes.serving_replies[1], 8)
  entry["rows"] = [dict(engine=way, policy=sizes.serving_policy, **row)
                   for way, row in rows.items()]
  ratio = rows["continuous"]["tokens_s"] / rows["static batcher"]["tokens_s"]
  entry["continuous_over_static"] = ratio
  log(clock, f"serving: continuous {ratio:.2f}x the static batcher's tokens/s")
  report.save()


# ---------------------------------------------------------------------------------------
# rollout and train


FILLER = " the chair is left of the table"


def padded_turns(tok, scripts, turn_tokens: int) -> list[list[str]]:
  """The scripted turns with their thinking padded to nearly `turn_tokens` tokens, so every
  turn decodes its whole budget (the policy still runs on every forced token)."""
  length = lambda text: len(tok.encode(text, add_special_tokens=False))
  word = length(FILLER)
  cache = {}

  def pad(turn: str) -> str:
    if turn not in cache:
      head, tail = turn.split("</think>", 1)
      make = lambda n: head + FILLER * n + "</think>" + tail
      count = max(0, (turn_tokens - 2 - length(turn)) // word)
      while count and length(make(count)) > turn_tokens - 2:
        count -= 1
      cache[turn] = make(count)
    return cache[turn]
  return [[pad(turn) for turn in episode_turns] for episode_turns in scripts]


def policy_config(tok, name: str):
  """The tiny policy, or Qwen2.5-VL-3B's text and vision shapes (vocabulary 151936), with
  the tiny tokenizer's special token ids (all below 151936)."""
  from jaxspatial.rollout import tiny  # pylint: disable=import-outside-toplevel
  config = tiny.model_config(tok)
  if name == "tiny":
    return config
  return dataclasses.replace(config, text=TextConfig(vocab_size=QWEN_3B_VOCAB),
                             vision=VisionConfig())


def build_policy(config, param_dtype, remat: bool, shapes_only: bool = False):
  """bf16 compute over `param_dtype` weights, attention "auto" (cuDNN on a GPU)."""
  build = lambda: Qwen25VL(config, rngs=nnx.Rngs(0), dtype=jnp.bfloat16,
                           param_dtype=param_dtype, attention="auto", remat=remat)
  return nnx.eval_shape(build) if shapes_only else build()


def rollout_copy(model):
  """The trainer's weights cast to bf16: what a rollout worker holds, half the bytes a
  decode step reads (remat is off: nothing is differentiated in a rollout)."""
  graphdef, _ = nnx.split(build_policy(model.config, jnp.bfloat16, remat=False,
                                       shapes_only=True))
  cast = jax.jit(lambda state: jax.tree.map(
      lambda x: x.astype(jnp.bfloat16) if jnp.issubdtype(x.dtype, jnp.floating) else x, state))
  return nnx.merge(graphdef, cast(nnx.state(model)))


def parameter_count(model) -> int:
  return int(sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))))


class RolloutBench:
  """The rollout and the GRPO step: pieces built and programs compiled on the worker, then
  measured by the main thread one size at a time."""

  def __init__(self, sizes: Sizes, out: pathlib.Path, clock: Clock, report: Report,
               worker: Worker):
    self.sizes, self.out, self.clock, self.report, self.worker = sizes, out, clock, report, worker
    self.entry = report.part("rollout")
    self.rows = self.entry.setdefault("rows", [])
    self.skipped = self.entry.setdefault("skipped", [])
    self.trajectories = {}
    self.compiled = {}
    self.setup = worker.submit("rollout set-up", self._setup)
    first = sizes.rollout_batches[0]
    self.compiled[first] = worker.submit(f"rollout batch {first}",
                                         lambda: self._compile_rollout(first))
    self.train_compiled = worker.submit("train step", self._compile_train)
    self.logprobs_compiled = worker.submit("log-probabilities", self._compile_logprobs)
    for batch in sizes.rollout_batches[1:2]:
      self.compiled[batch] = worker.submit(f"rollout batch {batch}",
                                           lambda b=batch: self._compile_rollout(b))

  # -- set-up and compiles (worker thread) ------------------------------------------------

  def _setup(self) -> dict:
    from data_pipelines.synthetic import episodes  # pylint: disable=import-outside-toplevel
    # pylint: disable-next=import-outside-toplevel
    from jaxspatial.rollout import agents, token_table as am, episode, observation, tiny
    sizes = self.sizes
    begin = time.perf_counter()
    self.tok = tiny.tokenizer()
    config = policy_config(self.tok, sizes.rollout_policy)
    model = build_policy(config, jnp.float32, remat=True)   # the trainer's master weights
    self.policy = rollout_copy(model)
    self.text_parameters = parameter_count(model.language_model)
    parameters = parameter_count(model)
    optimizer = make_optimizer(model, OptimizerConfig(learning_rate=1e-6, total_steps=10))
    self.train_graphdef, self.train_state = nnx.split((model, optimizer))
    self.train_state_shapes = abstract(self.train_state)
    del model, optimizer  # the state's buffers are donated to the step
    self.policy_graphdef, self.policy_state = nnx.split(self.policy)
    self.agent = agents.Act3DAgent(act3d.Act3DParams(
        width=sizes.rollout_width, height=sizes.rollout_height, grounding_min_pixels=5,
        max_interactions=sizes.rollout_turns - 1))
    self.automaton = am.compile_token_automaton(self.agent.grammar, self.tok,
                                                config.text.vocab_size)
    self.n_image = episode.image_tokens(self.policy, self.agent.image_size)
    self.template = observation.compile_template(self.tok, self.agent.observation,
                                                 self.n_image)
    self.eos = self.tok.convert_tokens_to_ids("<|im_end|>")
    self.config = episode.RolloutConfig(
        max_turns=sizes.rollout_turns, max_turn_tokens=sizes.rollout_turn_tokens,
        temperature=1.0, eos_tokens=(self.eos,), pad_token=self.tok.pad_token_id or 0,
        cache_dtype="bfloat16")
    largest = max(sizes.rollout_batches + (sizes.rollout_host_batch,))
    self.tasks, questions = episodes.act3d_tasks(largest, seed=1, points=sizes.rollout_points)
    self.ids, self.mask = episodes.act3d_prompts(self.tok, questions, self.n_image)
    self.short_scripts = tiny.scripted_act3d_turns(largest, sizes.rollout_turns)
    self.scripts = padded_turns(self.tok, self.short_scripts, sizes.rollout_turn_tokens)
    self.forced = episode.forced_tokens(self.tok, self.scripts, self.config)
    self.key = jax.random.PRNGKey(0)
    agent, template, config = self.agent, self.template, self.config
    graphdef = self.policy_graphdef

    # The program compile_rollout jits (episode.rollout), as a pure function of the
    # weights so that it compiles ahead of time (as launch/profile_rollout does).
    def program(state, automaton, tasks, ids, mask, key, forced):
      return episode.rollout(nnx.merge(graphdef, state), agent, automaton, template, tasks,
                             ids, mask, key, config, None, forced)
    self.program = jax.jit(program)
    return dict(policy=sizes.rollout_policy, parameters=parameters,
                text_parameters=self.text_parameters,
                weights="float32 master weights (trainer); the rollout holds a bf16 cast",
                compute_dtype="bfloat16", cache_dtype="bfloat16", attention="auto",
                view=[sizes.rollout_width, sizes.rollout_height],
                vision_tokens_per_view=self.n_image, turns=sizes.rollout_turns,
                turn_tokens=sizes.rollout_turn_tokens, prompt_length=int(self.ids.shape[1]),
                forced_turn_tokens=[len(self.tok.encode(t, add_special_tokens=False))
                                    for t in self.scripts[0]],
                points=sizes.rollout_points, setup_s=time.perf_counter() - begin)

  def _inputs(self, batch: int):
    """(tasks, prompt ids, prompt mask, forced tokens) of the first `batch` episodes."""
    return (jax.tree.map(lambda x: x[:batch], self.tasks), self.ids[:batch],
            self.mask[:batch], self.forced[:batch])

  def _device_inputs(self, batch: int):
    tasks, ids, mask, forced = self._inputs(batch)
    return jax.device_put((tasks, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(forced)))

  def _rollout_args(self, batch: int):
    tasks, ids, mask, forced = self._device_inputs(batch)
    return self.policy_state, self.automaton, tasks, ids, mask, self.key, forced

  def _compile_rollout(self, batch: int):
    """(the executable, the Trajectory's shapes)."""
    self.setup.result()
    lowered = self.program.lower(*self._rollout_args(batch))
    return lowered.compile(), lowered.out_info

  def _train_batch(self, trajectory):
    batch = trajectory.tokens.shape[0]
    advantages = grpo.advantages(trajectory, trajectory.reward,
                                 AdvantageConfig(group_size=batch))
    # The rollout's log-probabilities stand for the old policy's in the timed step (the
    # step costs the same); batch_logprobs recomputes them after it, as grpo.update does.
    return TrainBatch.from_trajectory(trajectory, advantages=advantages,
                                      old_logprobs=trajectory.logprobs.astype(jnp.float32))

  def _compile_train(self):
    _, trajectory_shapes = self.compiled[self.sizes.rollout_batches[0]].result()
    batch_shapes = jax.eval_shape(self._train_batch, trajectory_shapes)
    graphdef = self.train_graphdef
    config = StepConfig(objective="grpo", temperature=1.0,
                        micro_batches=self.sizes.train_micro_batches)

    # A pure function of the (model, optimizer) state: its cost analysis is the step that runs.
    def step(state, batch):
      model, optimizer = nnx.merge(graphdef, state)
      metrics = train_step(model, optimizer, batch, config)
      return nnx.state((model, optimizer)), metrics
    compiled = jax.jit(step, donate_argnums=0).lower(self.train_state_shapes,
                                                     batch_shapes).compile()
    return compiled, batch_shapes

  def _compile_logprobs(self):
    _, batch_shapes = self.train_compiled.result()
    graphdef = self.train_graphdef
    logprobs = lambda state, batch: batch_logprobs(nnx.merge(graphdef, state)[0], batch, 1.0)
    return jax.jit(logprobs).lower(self.train_state_shapes, batch_shapes).compile()

  # -- measurements (main thread) ---------------------------------------------------------

  def wait(self, job: Job, reserve_s: float | None = None):
    """(the job's result, seconds waited), waiting at most until `reserve_s` before the
    budget ends (None: as long as it takes; the watchdog ends the run at the deadline)."""
    begin = time.perf_counter()
    timeout = (None if self.worker.serial or reserve_s is None
               else max(self.clock.left() - reserve_s, 1.0))
    return job.result(timeout=timeout), time.perf_counter() - begin

  def first_size(self, entry: dict) -> None:
    """The first batch size: throughput, a profiler trace, the component shares."""
    entry.update(self.setup.result())
    self.report.save()
    self.measure(self.sizes.rollout_batches[0], trace=True, components=True)

  def measure(self, batch: int, trace: bool, components: bool,
              reserve_s: float | None = None) -> dict:
    row = {"batch": batch}
    self.rows.append(row)
    job = self.compiled[batch]
    (compiled, _), waited = self.wait(job, reserve_s)
    row.update(compile_s=job.seconds, waited_for_compile_s=waited,
               compiled_in_background=not self.worker.serial)
    args = self._device_inputs(batch)
    last = {}

    def call():
      last["trajectory"] = compiled(self.policy_state, self.automaton, args[0], args[1],
                                    args[2], self.key, args[3])
      return last["trajectory"]
    first, run_s = timed_first(call, self.sizes.rollout_repeats)
    traj = last["trajectory"]
    tokens = float(np.asarray(traj.loss_mask).sum())
    row.update(first_call_s=first, run_s=run_s, generated_tokens=tokens,
               generated_tokens_per_s=tokens / run_s, episodes_per_s=batch / run_s,
               sequence_slots=int(traj.tokens.shape[1]),
               all_turns_played=bool(np.asarray(traj.turn_active).all()),
               peak_memory_bytes=peak_memory_bytes())
    row["cost_analysis_flops_loop_bodies_once"] = first_cost(compiled).get("flops")
    row["memory_analysis_bytes"] = memory_bytes(compiled)
    self.trajectories[batch] = traj
    self._host_ratio()
    self.report.save()
    if trace:  # the profiler needs CUPTI on a GPU: a failure costs this row's trace only
      trace_dir = self.out / "trace"
      begin = time.perf_counter()
      try:
        with jax.profiler.trace(str(trace_dir)):
          jax.block_until_ready(call())
        row.update(trace_dir=str(trace_dir), traced_run_s=time.perf_counter() - begin)
      except Exception as exc:  # pylint: disable=broad-except
        row["trace_error"] = error_text(exc, 1500)
      self.report.save()
    if components:
      row.update(self.component_shares(traj, args[0], run_s))
      self.report.save()
    return row

  def component_shares(self, traj, tasks, run_s: float) -> dict:
    """The vision encoder on the B x T views the tokens hold and the B x (N + T) renders
    (through `agent.reset`: a render and the grounding count each), separately jitted."""
    vision_config = self.policy.config.vision
    shown_BxTxHxWx3 = traj.images[:, :-1]

    @nnx.jit
    def encode(visual, images):
      pixels, grids, _ = batch_vision_inputs(vision_config, images)
      return visual(pixels, grids)

    batch = shown_BxTxHxWx3.shape[0]
    vision_first, vision_s = timed_first(lambda: encode(self.policy.visual, shown_BxTxHxWx3),
                                         self.sizes.rollout_repeats)
    keys = jax.random.split(self.key, batch)
    reset = jax.jit(jax.vmap(lambda key, task: self.agent.reset(key, task)[0]))
    render_first, render_one_s = timed_first(lambda: reset(keys, tasks),
                                             self.sizes.rollout_repeats)
    renders = traj.images.shape[1]
    render_s = renders * render_one_s
    rest = max(run_s - vision_s - render_s, 0.0)
    return {"share_method": "separately jitted components on the same shapes (the vision "
                            "encoder on B x T views; B x (N + T) renders via agent.reset); "
                            "decode = the rest (prefill, decode steps, observation appends, "
                            "parsing); the profiler trace is written, not parsed",
            "vision_s": vision_s, "vision_views": int(batch * shown_BxTxHxWx3.shape[1]),
            "vision_compile_s": max(vision_first - vision_s, 0.0),
            "render_s": render_s, "renders": int(batch * renders),
            "render_compile_s": max(render_first - render_one_s, 0.0),
            "vision_share": vision_s / run_s, "render_share": render_s / run_s,
            "decode_share": rest / run_s}

  def host_baseline(self, batch: int) -> None:
    """`host_loop.host_rollout` on the same episodes. Its warm-up (the compiles) plays one
    short scripted call, then an EOS ends each episode; the timed run plays them whole."""
    from jaxspatial.rollout import episode, host_loop  # pylint: disable=import-outside-toplevel
    tasks, ids, mask, forced = self._inputs(batch)
    warmup = episode.forced_tokens(self.tok, [t[:1] for t in self.short_scripts[:batch]],
                                   self.config)
    if self.sizes.rollout_turns > 1:
      warmup[:, 1, 0] = self.eos
    play = lambda f: host_loop.host_rollout(self.policy, self.agent, self.tok, self.template,
                                            tasks, ids, mask, self.key, self.config,
                                            jnp.asarray(f))["reward"]
    begin = time.perf_counter()
    play(warmup)
    warmup_s = time.perf_counter() - begin
    begin = time.perf_counter()
    play(forced)
    host_s = time.perf_counter() - begin
    self.entry["host_loop"] = {"batch": batch, "warmup_s": warmup_s, "run_s": host_s,
                               "episodes_per_s": batch / host_s}
    self._host_ratio()

  def _host_ratio(self) -> None:
    host = self.entry.get("host_loop")
    row = host and next((r for r in self.rows if r["batch"] == host["batch"] and "run_s" in r),
                        None)
    if row:
      host["generated_tokens_per_s"] = row["generated_tokens"] / host["run_s"]
      host["compiled_speedup"] = host["run_s"] / row["run_s"]

  def train(self, entry: dict) -> None:
    """One GRPO step on the first size's trajectories (f32 master weights, bf16 compute,
    remat, micro-batches), then the old log-probabilities recomputed."""
    if not self.trajectories:
      raise RuntimeError("train needs the rollout's trajectories, which it did not make")
    batch_size = min(self.trajectories)
    traj = self.trajectories[batch_size]
    batch = jax.jit(self._train_batch)(traj)
    tokens = int(np.prod(batch.tokens.shape))
    loss_tokens = float(np.asarray(batch.loss_mask).sum())
    entry.update(batch=batch_size, sequence_slots=int(batch.tokens.shape[1]),
                 micro_batches=self.sizes.train_micro_batches, remat=True,
                 params_dtype="float32", compute_dtype="bfloat16", attention="auto",
                 tokens=tokens, loss_tokens=loss_tokens,
                 old_logprobs="the rollout's in the timed step (same cost); batch_logprobs "
                              "recomputes them after it")
    (compiled, _), waited = self.wait(self.train_compiled)
    entry.update(compile_s=self.train_compiled.seconds, waited_for_compile_s=waited,
                 compiled_in_background=not self.worker.serial)
    flops = first_cost(compiled).get("flops")
    entry["flops"] = flops
    entry["memory_analysis_bytes"] = memory_bytes(compiled)
    entry["flops_note"] = ("XLA's cost analysis of the compiled step: forward, backward with "
                           "the rematerialised forward, optimizer")
    state, times, metrics = self.train_state, [], None
    self.train_state = None  # donated
    for _ in range(self.sizes.train_repeats + 1):  # the first call pays allocations
      begin = time.perf_counter()
      state, metrics = compiled(state, batch)
      jax.block_until_ready(metrics)
      times.append(time.perf_counter() - begin)
    step_s = float(np.median(times[1:]))
    kind = jax.devices()[0].device_kind
    peak = peak_flops(kind)
    entry.update(first_step_s=times[0], step_s=step_s, tokens_per_s=tokens / step_s,
                 loss_tokens_per_s=loss_tokens / step_s, device_kind=kind,
                 peak_bf16_flops=peak,
                 mfu=(flops / step_s / peak) if (peak and flops and flops > 0) else None,
                 loss=float(metrics["loss"]), finite=bool(metrics["finite"]),
                 peak_memory_bytes=peak_memory_bytes(),
                 flops_6nd_text=6.0 * self.text_parameters * tokens,
                 flops_6nd_note="6 x text-decoder parameters x B x S: a cross-check "
                                "without attention")
    entry["memory_estimate"] = self._memory_estimate(batch_size, int(batch.tokens.shape[1]))
    self.report.save()
    logprobs, waited = self.wait(self.logprobs_compiled)
    first, logprobs_s = timed_first(lambda: logprobs(state, batch), 1)
    recomputed = np.asarray(logprobs(state, batch))
    generated = np.asarray(batch.loss_mask, bool)
    # one update at lr 1e-6 after sampling: the bf16 sampler against the trainer's pass
    difference = np.abs(recomputed - np.asarray(traj.logprobs))[generated]
    entry["logprobs"] = {
        "compile_s": self.logprobs_compiled.seconds, "waited_for_compile_s": waited,
        "first_call_s": first, "run_s": logprobs_s, "tokens_per_s": tokens / logprobs_s,
        "grpo_update_s": step_s + logprobs_s,
        "max_abs_diff_vs_rollout": float(difference.max())}

  def _memory_estimate(self, batch: int, length: int) -> dict:
    """`models.memory.estimate` (what a training launch prints) beside the measured peak."""
    try:
      model, _ = nnx.merge(self.train_graphdef, self.train_state_shapes)
      estimate = memory.estimate(
          model, Precision("bfloat16", "float32", "bfloat16"), rollout_batch=batch,
          cache_length=length, train_batch=batch, train_length=length,
          micro_batches=self.sizes.train_micro_batches, remat=True,
          fused_attention=jax.default_backend() == "gpu")
    except Exception as exc:  # pylint: disable=broad-except
      return {"error": f"{type(exc).__name__}: {exc}"[:500]}
    fields = ("parameters", "gradients", "optimizer", "kv_cache", "activations")
    return {**{f: getattr(estimate, f) for f in fields}, "total": estimate.total}

  def later_sizes(self, entry: dict) -> None:
    """The second batch size, the host loop (full runs: once the worker is idle, so that no
    compile shares its cores), then the third size, each while the budget allows."""
    del entry
    base = next((r for r in self.rows if "run_s" in r), None)
    if base is None:
      raise RuntimeError("the first rollout size did not run")
    runs = self.sizes.rollout_repeats + 2
    cost = lambda batch: runs * base["run_s"] * batch / base["batch"] + 10
    plan = [("compiled", b) for b in self.sizes.rollout_batches[1:2]]
    plan.append(("host", self.sizes.rollout_host_batch))
    plan += [("compiled", b) for b in self.sizes.rollout_batches[2:]]
    for kind, batch in plan:
      if kind == "compiled" and batch not in self.compiled:
        self.compiled[batch] = self.worker.submit(f"rollout batch {batch}",
                                                  lambda b=batch: self._compile_rollout(b))
      # host: its compiles (~ the compiled program's) and ~30 ms a token, pessimistic;
      # serial compiles add the program's compile to a size's cost
      estimate = (base["compile_s"] + 0.03 * self.sizes.rollout_turns
                  * self.sizes.rollout_turn_tokens + 20 if kind == "host" else
                  cost(batch) + (base["compile_s"] if self.worker.serial else 0.0))
      if estimate > self.clock.left():
        self._skip(kind, batch, f"budget: estimated {estimate:.0f} s, "
                                f"{self.clock.left():.0f} s left")
        continue
      log(self.clock, f"rollout: {kind} batch {batch}")
      try:
        if kind == "host":
          if not self.worker.wait_idle(self.clock.left() - estimate):
            self._skip(kind, batch, "budget: the compile worker stayed busy")
            continue
          self.host_baseline(batch)
        else:
          self.measure(batch, trace=False, components=False, reserve_s=cost(batch))
      except TimeoutError as exc:
        self.rows[:] = [r for r in self.rows if r.get("batch") != batch or "run_s" in r]
        self._skip(kind, batch, f"budget: {exc}")
      except Exception as exc:  # pylint: disable=broad-except
        self.entry.setdefault("row_errors", []).append(
            {"kind": kind, "batch": batch, "error": error_text(exc)})
      self.report.save()

  def _skip(self, kind: str, batch: int, reason: str) -> None:
    self.skipped.append({"kind": kind, "batch": batch, "reason": reason})
    self.report.save()
    log(self.clock, f"rollout: skipped {kind} batch {batch} ({reason})")


# ---------------------------------------------------------------------------------------
# tables


def markdown_table(columns, rows) -> str:
  """columns: (header, key, format) triples; a missing value prints as '-'."""
  lines = ["| " + " | ".join(c[0] for c in columns) + " |",
           "|" + "|".join("---" for _ in columns) + "|"]
  for row in rows:
    cells = []
    for _, key, fmt in columns:
      value = row.get(key)
      if value is None or (isinstance(value, float) and not math.isfinite(value)):
        cells.append("-")
      elif fmt:
        cells.append(format(value, fmt))
      else:
        cells.append(str(value))
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def print_tables(report: dict) -> None:
  """One Markdown table per part; a table that fails to format is named, not raised."""
  for section in (_summary_table, _versions_table, _pitfalls_tables, _renderer_tables,
                  _rollout_table, _train_table, _decode_table, _serving_table):
    try:
      section(report)
    except Exception as exc:  # pylint: disable=broad-except
      print(f"\n({section.__name__} failed: {type(exc).__name__}: {exc})")


def _summary_table(report: dict) -> None:
  meta = report["meta"]
  print(f"\n## device suite ({'smoke' if meta['smoke'] else 'full'}), "
        f"{meta.get('elapsed_s', 0):.0f} s, report {meta['report']}\n")
  print(markdown_table([("part", "part", ""), ("status", "status", ""),
                        ("s", "elapsed_s", ".1f"), ("error", "error_line", "")],
                       [{"part": p, **report.get(p, {}),
                         "error_line": (report.get(p, {}).get("error") or "").split("\n")[0][:80]
                         or None} for p in PARTS]))


def _versions_table(report: dict) -> None:
  v = report.get("versions", {})
  if "jax" in v:
    print("\n### versions\n")
    keys = ("jax", "jaxlib", "flax", "platform", "device_kind", "device_count", "host_cpus",
            "backend_platform_version", "scatter_regression_affected")
    print(markdown_table([("key", "key", ""), ("value", "value", "")],
                         [{"key": k, "value": v.get(k)} for k in keys]
                         + [{"key": k, "value": x} for k, x in v.get("cuda_versions", {}).items()]))


def _pitfalls_tables(report: dict) -> None:
  p = report.get("pitfalls", {})
  if "scatter_add" in p:
    print("\n### pitfalls: scatter-add (embedding gradient) and segment_sum\n")
    print(markdown_table([("case", "case", ""), ("f32 ms", "float32_ms", ".3f"),
                          ("int32 ms", "int32_ms", ".3f"),
                          ("f32 / int32", "f32_over_int32", ".1f")],
                         p["scatter_add"]["rows"]))
    print(f"\nscatter-add bites: {p['scatter_add']['bites']}; workaround "
          f"{WORKAROUND['flag']} or {WORKAROUND['pin']}; remeasure: "
          f"{json.dumps(p.get('remeasure', {}), default=_jsonable)[:400]}")
  if "segment_sum" in p:
    print()
    print(markdown_table([("case", "case", ""), ("dtype", "dtype", ""), ("ms", "ms", ".3f")],
                         p["segment_sum"]["rows"]))
    print(f"\nsegment_sum bites: {p['segment_sum']['bites']} (out_axes 0 / 1: "
          f"{p['segment_sum']['out_axes0_over_out_axes1']:.2f}, f32 / int32: "
          f"{p['segment_sum']['f32_over_int32']:.2f})")


def _renderer_tables(report: dict) -> None:
  r = report.get("renderer", {})
  if r.get("rows"):
    print("\n### renderer\n")
    print(markdown_table([("renderer", "renderer", ""), ("points", "points", ","),
                          ("W", "width", ""), ("H", "height", ""), ("r", "radius", ""),
                          ("views", "views", ""), ("ms/view", "ms_per_view", ".3f"),
                          ("Mpts/s", "mpts", ".1f"), ("first call s", "first_call_s", ".2f"),
                          ("speed-up", "speedup", ".1f"), ("vs", "speedup_vs", "")],
                         [{**x, "mpts": x.get("points_per_s", 0) / 1e6 or None}
                          for x in r.get("host_baselines", []) + r["rows"]]))
    print()
    print(markdown_table([("scatter-min", "pattern", ""), ("updates", "updates", ","),
                          ("W", "width", ""), ("H", "height", ""), ("ms", "ms", ".3f"),
                          ("Gupdates/s", "g", ".2f")],
                         [{**x, "g": x["updates_per_s"] / 1e9} for x in r.get("scatter_min", [])]))


def _rollout_table(report: dict) -> None:
  ro = report.get("rollout", {})
  if ro.get("rows"):
    print(f"\n### rollout ({ro.get('policy')}, {ro.get('parameters', 0) / 1e6:,.1f}M "
          f"parameters, {ro.get('turns')} turns x {ro.get('turn_tokens')} tokens)\n")
    host = ro.get("host_loop") or {}
    print(markdown_table([("batch", "batch", ""), ("compile s", "compile_s", ".1f"),
                          ("run s", "run_s", ".3f"), ("tok/s", "generated_tokens_per_s", ".0f"),
                          ("ep/s", "episodes_per_s", ".2f"), ("vision", "vision_share", ".1%"),
                          ("render", "render_share", ".1%"), ("decode", "decode_share", ".1%"),
                          ("host ep/s", "host_eps", ".2f"), ("speed-up", "speedup", ".1f")],
                         [{**x, **({"host_eps": host.get("episodes_per_s"),
                                     "speedup": host.get("compiled_speedup")}
                                    if host.get("batch") == x["batch"] else {})}
                          for x in ro["rows"]]))
    for s in ro.get("skipped", []):
      print(f"skipped: {s}")


def _train_table(report: dict) -> None:
  t = report.get("train", {})
  if "step_s" in t:
    print("\n### train (one GRPO step)\n")
    print(markdown_table([("batch", "batch", ""), ("slots", "sequence_slots", ""),
                          ("micro", "micro_batches", ""), ("compile s", "compile_s", ".1f"),
                          ("step s", "step_s", ".3f"), ("logprobs s", "logprobs_s", ".3f"),
                          ("tok/s", "tokens_per_s", ".0f"),
                          ("loss tok/s", "loss_tokens_per_s", ".0f"), ("TFLOP", "tflop", ".3g"),
                          ("MFU", "mfu", ".1%"), ("peak GiB", "gib", ".1f")],
                         [{**t, "tflop": (t.get("flops") or 0) / 1e12 or None,
                           "logprobs_s": (t.get("logprobs") or {}).get("run_s"),
                           "gib": (t.get("peak_memory_bytes") or 0) / 2 ** 30 or None}]))


def _decode_table(report: dict) -> None:
  rows = report.get("decode", {}).get("rows")
  if rows:
    print("\n### decode at long context (batch 1, 32 steps, bf16 cache)\n")
    print(markdown_table([("model", "model", ""), ("context", "context", ""),
                          ("decode tok/s", "decode_tok_s", ".0f"), ("cache MiB", "mib", ".1f")],
                         [{**r, "mib": r["cache_bytes"] / 2 ** 20} for r in rows]))


# ---------------------------------------------------------------------------------------


def _serving_table(report: dict) -> None:
  rows = report.get("serving", {}).get("rows")
  if rows:
    print("\n### serving: continuous batching against the static batcher\n")
    print(markdown_table([("engine", "engine", ""), ("policy", "policy", ""),
                          ("tokens/s", "tokens_s", ".0f"), ("p50 s", "p50", ".2f"),
                          ("p99 s", "p99", ".2f"), ("peak MiB", "mib", ".0f")],
                         [{**r, "mib": (r["peak"] or 0) / 2 ** 20} for r in rows]))


def start_watchdog(report: Report, clock: Clock, deadline_s: float) -> threading.Timer:
  """At the deadline: mark the running part, write the report, print the tables, exit."""
  def fire():
    name = report.data["meta"].get("running")
    if name:
      entry = report.part(name)
      entry["status"] = "deadline"
      entry["error"] = (entry.get("error") or "") + f"deadline {deadline_s:.0f} s reached"
    report.data["meta"].update(elapsed_s=clock.elapsed(), deadline_hit=True)
    report.save()
    try:
      print_tables(report.data)
    finally:
      print(f"DEADLINE {deadline_s:.0f} s: stopped; partial report {report.path}", flush=True)
      os._exit(0)  # pylint: disable=protected-access
  timer = threading.Timer(max(deadline_s - clock.elapsed(), 1.0), fire)
  timer.daemon = True
  timer.start()
  return timer


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--smoke", action="store_true", help="tiny sizes, on the CPU")
  parser.add_argument("--out", default="outputs/device_suite")
  parser.add_argument("--budget-s", type=float, default=None,
                      help="later rollout sizes start only within it (default 330, smoke 240)")
  parser.add_argument("--deadline-s", type=float, default=None,
                      help="the watchdog stops the run here (default 345, smoke 300)")
  parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
  parser.add_argument("--train-micro-batches", type=int, default=None)
  parser.add_argument("--compiles", choices=("auto", "background", "serial"), default="auto",
                      help="background: on a worker thread beside the measurements; serial: "
                           "each when needed; auto: background on an accelerator, serial on "
                           "the CPU (where the worker slowed everything 2-3x, measured)")
  parser.add_argument("--pitfall-child", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.pitfall_child:
    pitfall_child(args.pitfall_child)
    return
  if args.smoke:
    if "JAX_PLATFORMS" not in os.environ:
      jax.config.update("jax_platforms", "cpu")
    # Smoke numbers test the path, not the speed: LLVM -O0 compiles ~30% faster.
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_backend_optimization_level" not in flags:
      os.environ["XLA_FLAGS"] = (flags + " --xla_backend_optimization_level=0").strip()
  else:  # before the backend starts: the trainer's f32 state, Adam moments and the policy
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")
  # As launch.train: the rollout and the update run as a training job would.
  workarounds = xla_workarounds.apply()
  sizes = Sizes.smoke() if args.smoke else Sizes.full()
  if args.train_micro_batches:
    sizes = dataclasses.replace(sizes, train_micro_batches=args.train_micro_batches)
  # Smoke budgets leave room for a loaded machine: the test expects every row.
  clock = Clock(args.budget_s or (240.0 if args.smoke else 330.0))
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  report = Report(out / "report.json", {
      "smoke": args.smoke, "argv": sys.argv[1:] if argv is None else list(argv),
      "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "budget_s": clock.budget_s, "report": str(out / "report.json"), "running": None,
      "sizes": dataclasses.asdict(sizes)})
  for name in PARTS:
    report.part(name)["status"] = "pending" if name in args.parts else "not requested"
  report.save()
  start_watchdog(report, clock, args.deadline_s or (300.0 if args.smoke else 345.0))
  device = jax.devices()[0]
  log(clock, f"device suite ({'smoke' if args.smoke else 'full'}): {device.platform} "
             f"({device.device_kind}) x {len(jax.devices())}; report {report.path}")
  report.data["meta"]["device"] = f"{device.platform} ({device.device_kind})"
  report.data["meta"]["xla_workarounds"] = workarounds
  serial = args.compiles == "serial" or (args.compiles == "auto" and device.platform == "cpu")
  worker = Worker(serial=serial)
  report.data["meta"]["compiles"] = (
      "serial" if serial else "on a worker thread beside the measurements (XLA's GPU "
      "autotuning runs short kernels meanwhile; --compiles serial for undisturbed timings)")
  if "versions" in args.parts:
    run_part("versions", versions_part, report, clock)
  # The rollout's set-up and compiles start now on the worker (unless serial), beside the
  # next parts.
  bench = None
  if "rollout" in args.parts or "train" in args.parts:
    bench = RolloutBench(sizes, out, clock, report, worker)
  if "pitfalls" in args.parts:
    run_part("pitfalls", lambda e: pitfalls_part(e, sizes, clock, report,
                                                 applied=bool(workarounds)), report, clock)
  if "renderer" in args.parts:
    run_part("renderer", lambda e: renderer_part(e, sizes, clock, report), report, clock)
  if bench is not None:
    run_part("rollout", bench.first_size, report, clock)
  if "train" in args.parts:
    run_part("train", bench.train, report, clock)
  if "rollout" in args.parts:
    run_part("rollout", bench.later_sizes, report, clock)
  if "decode" in args.parts:
    run_part("decode", lambda e: decode_part(e, sizes, clock, report), report, clock)
  if "serving" in args.parts:
    run_part("serving", lambda e: serving_part(e, sizes, clock, report), report, clock)
  report.data["meta"]["elapsed_s"] = clock.elapsed()
  report.save()
  print_tables(report.data)
  log(clock, f"done: {report.path}")
  if worker.busy():  # a compile past the budget: do not wait for it at exit
    sys.stdout.flush()
    os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
  main()
