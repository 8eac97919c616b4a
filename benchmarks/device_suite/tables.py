"""The Markdown tables printed at the end, one per part."""

from __future__ import annotations

import json
import math

from benchmarks.device_suite.core import PARTS, jsonable
from benchmarks.device_suite.pitfalls import WORKAROUND


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
                  _rollout_table, _train_table, _decode_table, _serving_table,
                  _recipes_table):
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
          f"{json.dumps(p.get('remeasure', {}), default=jsonable)[:400]}")
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


def _recipes_table(report: dict) -> None:
  rows = report.get("recipes", {}).get("rows")
  if not rows:
    return
  print("\n### recipes: one RL step on the papers' policy families (episodes / s: the "
        "rollout, a group's prompt prefilled once / per row)\n")
  for row in rows:
    row["layers_of"] = (f"{row['layers']} of {row['published_layers']}"
                        if row.get("published_layers") else row.get("layers"))
    row["peak_gib"] = row["peak_memory_bytes"] / 2 ** 30 if row.get("peak_memory_bytes") else None
    row["estimate_gib"] = row["estimate_bytes"] / 2 ** 30 if row.get("estimate_bytes") else None
    row["error_line"] = (row.get("error") or "").split("\n")[0][:80] or None
  print(markdown_table([
      ("recipe", "recipe", ""), ("policy", "policy", ""), ("layers", "layers_of", ""),
      ("episodes", "episodes", ""), ("eps/s shared", "episodes_per_s_shared", ".2f"),
      ("eps/s per row", "episodes_per_s_per_row", ".2f"),
      ("sharing", "sharing_speedup", ".2f"), ("step s", "step_s", ".2f"),
      ("update tok/s", "update_tokens_per_s", ".0f"), ("MFU", "mfu", ".3f"),
      ("peak GiB", "peak_gib", ".1f"), ("estimate GiB", "estimate_gib", ".1f"),
      ("error", "error_line", "")], rows))
