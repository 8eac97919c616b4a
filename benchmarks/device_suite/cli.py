"""The prepared device benchmark: what a few minutes on one GPU should measure, unattended.

`python -m benchmarks.device_suite` (the package's `__main__`) runs `main`; the parts,
in order, are described in the package's docstring."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import pathlib
import sys
import threading

import jax

from benchmarks.device_suite.core import (DEFAULT_PARTS, PARTS, Clock, Report, Sizes, log,
                                          run_part)
from benchmarks.device_suite.decode import decode_part
from benchmarks.device_suite.pitfalls import pitfall_child, pitfalls_part
from benchmarks.device_suite.recipes import PAPER_POLICIES, recipe_child, recipes_part
from benchmarks.device_suite.renderer import renderer_part
from benchmarks.device_suite.rollout import RolloutBench
from benchmarks.device_suite.serving import serving_part
from benchmarks.device_suite.tables import print_tables
from benchmarks.device_suite.versions import versions_part
from benchmarks.device_suite.worker import Worker
from jaxspatial import xla_workarounds


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
  parser = argparse.ArgumentParser(prog="python -m benchmarks.device_suite",
                                   description=__doc__.splitlines()[0])
  parser.add_argument("--smoke", action="store_true", help="tiny sizes, on the CPU")
  parser.add_argument("--out", default="outputs/device_suite")
  parser.add_argument("--budget-s", type=float, default=None,
                      help="later rollout sizes start only within it (default 330, smoke 240)")
  parser.add_argument("--deadline-s", type=float, default=None,
                      help="the watchdog stops the run here (default 345, smoke 300)")
  parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(DEFAULT_PARTS),
                      help="default: all but recipes, which is a call of its own")
  parser.add_argument("--recipes", nargs="+", default=None, choices=tuple(PAPER_POLICIES),
                      help="the recipes part's recipes (default: Sizes.recipes)")
  parser.add_argument("--train-micro-batches", type=int, default=None)
  parser.add_argument("--compiles", choices=("auto", "background", "serial"), default="auto",
                      help="background: on a worker thread beside the measurements; serial: "
                           "each when needed; auto: background on an accelerator, serial on "
                           "the CPU (where the worker slowed everything 2-3x, measured)")
  parser.add_argument("--pitfall-child", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--recipe-child", default=None, help=argparse.SUPPRESS)
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
    if "recipes" in args.parts and not args.recipe_child:
      # the recipes run in child processes: this one must not hold the device's memory
      os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  # As launch.train: the rollout and the update run as a training job would.
  workarounds = xla_workarounds.apply()
  if args.recipe_child:
    recipe_child(args.recipe_child, args.out, args.smoke)
    return
  sizes = Sizes.smoke() if args.smoke else Sizes.full()
  if args.train_micro_batches:
    sizes = dataclasses.replace(sizes, train_micro_batches=args.train_micro_batches)
  if args.recipes:
    sizes = dataclasses.replace(sizes, recipes=tuple(args.recipes))
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
  if "recipes" in args.parts:
    run_part("recipes", lambda e: recipes_part(e, sizes, clock, report, args.smoke, out),
             report, clock)
  report.data["meta"]["elapsed_s"] = clock.elapsed()
  report.save()
  print_tables(report.data)
  log(clock, f"done: {report.path}")
  if worker.busy():  # a compile past the budget: do not wait for it at exit
    sys.stdout.flush()
    os._exit(0)  # pylint: disable=protected-access
