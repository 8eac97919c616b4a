"""Workarounds for known XLA regressions, applied before the backend starts.

The f32 scatter-add CAS loop (jax-ml/jax#38806, openxla/xla#46225): jaxlib 0.10.2 to 0.11.0
on NVIDIA GPUs lower a float32 scatter-add to a compare-and-swap retry loop (LLVM's NVPTX
backend since llvm/llvm-project#200732), hundreds of times slower under index contention.
Every training step's embedding gradient is such a scatter (a batch's token ids into the
[vocab, hidden] table). The hidden LLVM option `-nvptx-allow-ftz-atomics` restores the
native `atom.add.f32`, whose only cost is that f32 denormals are flushed inside the atomic
sum, as jaxlib 0.10.1 did (the root-cause comment of #38806; bartz-org/bartz#176 applies it
the same way). `benchmarks/device_suite/` measures whether it bites, and with the flag.

The launch entry points call `apply()` before importing anything that starts the backend;
`JAXSPATIAL_SKIP_XLA_WORKAROUNDS=1` turns it off.

**Platform notes (accelerators).** jaxlib 0.10.2 to 0.11.0 (we pin 0.10.2) lower a float32
scatter-add to a compare-and-swap loop on NVIDIA GPUs (jax #38806, openxla/xla #46225), hundreds
of times slower under index contention; every training step's embedding gradient is such a
scatter. `jaxspatial/xla_workarounds.py` adds the LLVM option `-nvptx-allow-ftz-atomics` to
XLA_FLAGS on those installs (native `atom.add.f32`; f32 denormals flush inside the atomic sum,
as 0.10.1 did) in launch.train and launch.eval; `JAXSPATIAL_SKIP_XLA_WORKAROUNDS=1` turns it
off; jax >= 0.11.1 is reported fixed. The renderer's z-buffer is an int32 scatter-min,
unaffected. `segment_sum`'s strided-layout regression (jax #39959) does not touch our code paths
(no segment_sum in a hot path); the device suite measures both. Not yet measured on a GPU: the
first session lent one runs `make device-bench` and records the table here.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os

FTZ_ATOMICS = "-nvptx-allow-ftz-atomics"
AFFECTED = ((0, 10, 2), (0, 11, 0))  # jaxlib, inclusive


def _version(text: str) -> tuple[int, ...]:
  parts = []
  for piece in text.split(".")[:3]:
    digits = "".join(ch for ch in piece if ch.isdigit())
    parts.append(int(digits or 0))
  return tuple(parts)


def scatter_add_affected(jaxlib_version: str, has_cuda: bool) -> bool:
  low, high = AFFECTED
  return has_cuda and low <= _version(jaxlib_version) <= high


def with_backend_option(xla_flags: str, option: str) -> str:
  """XLA_FLAGS with `option` in --xla_backend_extra_options (merged, by a comma, into an
  existing one; unchanged when present)."""
  flags = xla_flags.split()
  for i, flag in enumerate(flags):
    if flag.startswith("--xla_backend_extra_options="):
      options = flag.split("=", 1)[1].split(",")
      if option not in options:
        flags[i] = flag + ("," if flag.split("=", 1)[1] else "") + option
      return " ".join(flags)
  return " ".join(flags + [f"--xla_backend_extra_options={option}"])


def _has_cuda_plugin() -> bool:
  for name in ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_plugins.xla_cuda12",
               "jax_plugins.xla_cuda13"):
    try:
      if importlib.util.find_spec(name) is not None:
        return True
    except (ImportError, ValueError):  # a missing parent package
      continue
  return False


def apply(environ=None) -> list[str]:
  """Sets the workarounds this installation needs in `environ` (os.environ); returns their
  names. Call before the XLA backend starts: XLA reads XLA_FLAGS once."""
  environ = os.environ if environ is None else environ
  if environ.get("JAXSPATIAL_SKIP_XLA_WORKAROUNDS") == "1":
    return []
  try:
    jaxlib_version = importlib.metadata.version("jaxlib")
  except importlib.metadata.PackageNotFoundError:
    return []
  if not scatter_add_affected(jaxlib_version, _has_cuda_plugin()):
    return []
  environ["XLA_FLAGS"] = with_backend_option(environ.get("XLA_FLAGS", ""), FTZ_ATOMICS)
  return ["f32 scatter-add: " + FTZ_ATOMICS]
