"""Test defaults: float32 everywhere, CPU, no 64-bit mode; one persistent XLA compilation
cache per pytest run, shared by the xdist workers and every subprocess they start."""

import os
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Many tests compile the same programs: a killed run and its resumption, the subprocess
# recipe checks, the tiny policies' forwards. The cache is made by the first process to load
# this file (the xdist controller) and inherited through the environment; a cache entry is
# keyed by the program, the compile options and the devices, so results are unchanged.
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxspatial-xla-cache-")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")


def pytest_sessionfinish(session, exitstatus):  # pylint: disable=unused-argument
  if _OWN_CACHE and not hasattr(session.config, "workerinput"):
    shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
