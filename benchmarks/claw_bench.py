"""The SpatialClaw kernel: start time and cells per second, inside bubblewrap against the
same kernel unsandboxed.

    python -m benchmarks.claw_bench
    python -m benchmarks.claw_bench --starts 3 --cells 100   # quicker

Cost on a 2-core CPU: about half a minute. Both sides run the same kernel program
(jaxspatial/agents/kernel_program) over the same episode (`--frames` frames of 480x640);
the baseline is `Kernel(..., sandbox=False)`: no bubblewrap, uid switch, rlimits or seccomp
(its static check and audit hooks stay). Rows:
  start            Kernel(...) until the kernel answers: the episode folder written,
                   bwrap's namespaces and binds, Python with numpy / scipy / PIL imported,
                   frames mapped (median of `--starts`)
  reset            kill + start again (what a timeout costs on top of the cell)
  trivial cell     `x = 1`: the pipe round trip, the static check, exec, summaries
  tool round trip  a cell calling a host tool with one 480x640x3 uint8 frame that returns
                   it: both transfers through the pipes as raw bytes
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from jaxspatial.agents import Kernel, Limits


def echo(image):
  return image


def measure(sandbox: bool, frames, starts: int, cells: int) -> dict:
  limits = Limits(cell_timeout_s=60.0)
  out = {}
  times = []
  for _ in range(starts):
    start = time.perf_counter()
    kernel = Kernel(frames, {"fps": 1.0}, {"echo": echo}, limits, sandbox=sandbox)
    times.append(time.perf_counter() - start)
    kernel.close()
  out["start"] = statistics.median(times)
  with Kernel(frames, {"fps": 1.0}, {"echo": echo}, limits, sandbox=sandbox) as kernel:
    times = []
    for _ in range(starts):
      start = time.perf_counter()
      kernel.reset()
      times.append(time.perf_counter() - start)
    out["reset"] = statistics.median(times)
    for name, code in (("trivial", "x = 1"),
                       ("tool", "_ = tools.echo(InputImages[0])")):
      result = kernel.run_cell(code)  # warm-up
      assert result.status == "ok", result.error
      start = time.perf_counter()
      for _ in range(cells):
        kernel.run_cell(code)
      out[name] = cells / (time.perf_counter() - start)
  return out


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--frames", type=int, default=32)
  parser.add_argument("--starts", type=int, default=5)
  parser.add_argument("--cells", type=int, default=300)
  args = parser.parse_args(argv)
  rng = np.random.default_rng(0)
  frames = [rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for _ in range(args.frames)]
  print(f"{args.frames} frames of 480x640; {args.starts} starts; {args.cells} cells per row")
  boxed = measure(True, frames, args.starts, args.cells)
  plain = measure(False, frames, args.starts, args.cells)
  print("| part | sandboxed | unsandboxed | sandbox overhead |")
  print("|---|---|---|---|")
  for key, name in (("start", "start"), ("reset", "reset")):
    print(f"| {name} | {boxed[key] * 1e3:.0f} ms | {plain[key] * 1e3:.0f} ms | "
          f"+{(boxed[key] - plain[key]) * 1e3:.0f} ms |")
  for key, name in (("trivial", "trivial cell"), ("tool", "tool round trip 480x640x3")):
    overhead = 1e3 / boxed[key] - 1e3 / plain[key]
    print(f"| {name} | {boxed[key]:.0f} cells/s | {plain[key]:.0f} cells/s | "
          f"{overhead:+.2f} ms per cell |", flush=True)


if __name__ == "__main__":
  main()
