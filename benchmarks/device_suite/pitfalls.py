"""The pitfalls part: known XLA regressions, measured (the f32 scatter-add of an embedding
gradient under index contention, jax #38806; `segment_sum` layouts, jax #39959), and the
workaround flag's other side in a child process (`--pitfall-child`)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp

from benchmarks.device_suite.core import REPO, Clock, Report, Sizes
from benchmarks.timing import timed
from jaxspatial import xla_workarounds


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


def tuples_of(x):
  return tuple(tuples_of(v) for v in x) if isinstance(x, list) else x


def pitfall_child(sizes_json: str) -> None:
  """The subprocess of `remeasure_with_flag`: prints the scatter-add rows as one JSON line."""
  sizes = Sizes(**{k: tuples_of(v) for k, v in json.loads(sizes_json).items()})
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
