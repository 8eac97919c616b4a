"""Test defaults: float32 everywhere, CPU, no 64-bit mode, XLA's -O0 code generation; one
persistent XLA compilation cache per pytest run, shared by the xdist workers and every
subprocess they start."""

import os
import shutil
import tempfile

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

# The suite compiles hundreds of tiny programs and runs each a few times: LLVM's -O0 code
# generation cuts its time by about a quarter (tests/train + tests/serving 236 -> 172 s,
# the trainer golden test 49 -> 35 s); users' runs keep XLA's default. Tests marked
# `xla_default` compare two differently shaped programs' renders bit for bit (grouped vs
# single scatters, jit / vmap vs single calls, a compiled or API rollout vs the host loop or
# the environment stepped by hand), which holds under the default code generation only (at
# -O0 2-4% of pixels differ): `make test` and `make slow-tests` run them in a second pass
# with JAXSPATIAL_TESTS_XLA_DEFAULT=1. Subprocesses inherit the flags through `xla_flags`.
OPT_LEVEL = "--xla_backend_optimization_level=0"
XLA_DEFAULT = os.environ.get("JAXSPATIAL_TESTS_XLA_DEFAULT") == "1"
if not XLA_DEFAULT and OPT_LEVEL.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + OPT_LEVEL).strip()


def xla_flags(*flags: str) -> str:
  """XLA_FLAGS for a test's subprocess: the suite's flags and `flags`."""
  return " ".join((os.environ.get("XLA_FLAGS", ""),) + flags).strip()

# Many tests compile the same programs: a killed run and its resumption, the subprocess
# recipe checks, the tiny policies' forwards. The cache is made by the first process to load
# this file (the xdist controller) and inherited through the environment; a cache entry is
# keyed by the program, the compile options and the devices, so results are unchanged.
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxspatial-xla-cache-")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")


def pytest_collection_modifyitems(config, items):  # pylint: disable=unused-argument
  if OPT_LEVEL in os.environ.get("XLA_FLAGS", ""):
    skip = pytest.mark.skip(reason="compares programs bit for bit under XLA's default code "
                            "generation: make test's second pass (JAXSPATIAL_TESTS_XLA_DEFAULT=1)")
    for item in items:
      if "xla_default" in item.keywords:
        item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):  # pylint: disable=unused-argument
  if _OWN_CACHE and not hasattr(session.config, "workerinput"):
    shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
