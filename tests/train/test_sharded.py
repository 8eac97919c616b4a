"""8 fake CPU devices in their own process: sharded SFT and GRPO steps equal single-device
steps (loss and parameters within 1e-5); checkpoints restore onto a different mesh.

In `make train-checks` (3.5 minutes on 2 cores, beyond `make test`'s budget);
tests/models/test_sharding.py keeps the 8-device forward passes in `make test`."""

import os
import pathlib
import subprocess
import sys

import pytest
from tests.conftest import xla_flags


@pytest.mark.multidevice
@pytest.mark.recipe_checks
def test_sharded_steps_and_checkpoint_restore_on_another_mesh():
  env = dict(os.environ, XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=8"),
             JAX_PLATFORMS="cpu")
  root = pathlib.Path(__file__).resolve().parents[2]
  result = subprocess.run([sys.executable, "-m", "tests.train.sharded_worker"], env=env,
                          cwd=root, capture_output=True, text=True, timeout=900)
  out = result.stdout + result.stderr
  assert result.returncode == 0, out[-4000:]
  assert "sft: sharded step equals single-device step" in out
  assert "grpo: sharded step equals single-device step" in out
  assert "checkpoint restored onto another mesh continues identically" in out
