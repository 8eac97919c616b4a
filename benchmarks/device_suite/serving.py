"""The serving part: benchmarks/serving_bench.py on the device, the continuous scheduler
against the static batcher."""

from __future__ import annotations

from benchmarks.device_suite.core import Clock, Report, Sizes, log


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
