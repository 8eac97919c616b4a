"""profile_compiled: what XLA made of a program, its output the program's, quiet on request."""

import jax.numpy as jnp
import numpy as np

from jaxspatial.rollout.profile import profile_compiled


def test_the_report_and_the_output_and_a_quiet_run(capsys, tmp_path):
  x = np.arange(6, dtype=np.float32)
  report, out = profile_compiled(lambda v: jnp.cumsum(v) * 2, (jnp.asarray(x),), repeats=2,
                                 verbose=False)
  np.testing.assert_array_equal(np.asarray(out), np.cumsum(x) * 2)
  assert {"lower_s", "compile_s", "run_s"} <= set(report) and report["run_s"] > 0
  assert capsys.readouterr().out == ""
  profile_compiled(lambda v: v + 1, (jnp.asarray(x),), repeats=1, trace_dir=str(tmp_path))
  printed = capsys.readouterr().out
  assert "compiling" in printed and f"xprof server --logdir {tmp_path}" in printed
  assert list(tmp_path.rglob("*.xplane.pb"))
