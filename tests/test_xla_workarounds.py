"""The XLA workarounds: which installations need them, and the XLA_FLAGS they write."""

from jaxspatial import xla_workarounds as xw


def test_only_affected_jaxlibs_with_cuda_get_the_ftz_atomics_option():
  assert xw.scatter_add_affected("0.10.2", True) and xw.scatter_add_affected("0.11.0", True)
  assert not xw.scatter_add_affected("0.10.1", True)
  assert not xw.scatter_add_affected("0.11.1", True)
  assert not xw.scatter_add_affected("0.10.2", False)  # CPU / TPU installs
  assert xw.scatter_add_affected("0.10.2.dev20260701", True)


def test_the_option_merges_into_existing_xla_flags():
  option = xw.FTZ_ATOMICS
  assert xw.with_backend_option("", option) == f"--xla_backend_extra_options={option}"
  flags = "--xla_gpu_autotune_level=0 --xla_backend_extra_options=-foo"
  assert xw.with_backend_option(flags, option) == (
      f"--xla_gpu_autotune_level=0 --xla_backend_extra_options=-foo,{option}")
  once = xw.with_backend_option(flags, option)
  assert xw.with_backend_option(once, option) == once


def test_apply_leaves_this_cpu_install_alone_and_can_be_skipped(monkeypatch):
  environ = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"}
  monkeypatch.setattr(xw, "_has_cuda_plugin", lambda: False)
  assert xw.apply(environ) == [] and environ["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false"
  monkeypatch.setattr(xw, "_has_cuda_plugin", lambda: True)
  monkeypatch.setattr(xw.importlib.metadata, "version", lambda name: "0.10.2")
  assert xw.apply({"JAXSPATIAL_SKIP_XLA_WORKAROUNDS": "1"}) == []
  assert xw.apply(environ) and xw.FTZ_ATOMICS in environ["XLA_FLAGS"]
