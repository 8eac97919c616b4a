"""Two processes with `jax.distributed` on CPU complete a GRPO step together, with the loss
of the same step on one device; and (`make train-checks`: too slow for `make test`) a
recipe rollout whose tasks each process loaded itself gives, row for row, the one-process
rollout of all the tasks."""

import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest
from flax import nnx

from jaxspatial.models.qwen2_5_vl import Qwen25VL
from jaxspatial.train import OptimizerConfig, make_optimizer, train_step
from tests.train.distributed_worker import GRPO
from tests.train.sharded_worker import CONFIG, batch
from tests.conftest import xla_flags

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _two_processes(tmp_path, *args) -> list[str]:
  port = _free_port()
  procs = []
  for i in range(2):
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
               JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(i),
               XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=1"))
    # Output to files: a full pipe would block one process inside a collective.
    log = open(tmp_path / f"process{i}.log", "w", encoding="utf-8")  # pylint: disable=consider-using-with
    procs.append(subprocess.Popen([sys.executable, "-m", "tests.train.distributed_worker",
                                   str(tmp_path), *args],
                                  cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
  outputs = []
  for i, p in enumerate(procs):
    p.wait(timeout=600)
    out = (tmp_path / f"process{i}.log").read_text()
    outputs.append(out)
    assert p.returncode == 0, out[-4000:]
  return outputs


@pytest.mark.slow
def test_two_process_grpo_step(tmp_path):
  outputs = _two_processes(tmp_path)
  losses = [float(o.split("loss ")[-1].split()[0]) for o in outputs]
  model = Qwen25VL(CONFIG, rngs=nnx.Rngs(0))
  optimizer = make_optimizer(model, OptimizerConfig(learning_rate=1e-2, total_steps=10))
  expected = float(train_step(model, optimizer, batch(0), GRPO)["loss"])
  np.testing.assert_allclose(losses, [expected, expected], rtol=1e-5)


@pytest.mark.recipe_checks
def test_two_process_recipe_rollout_rows_equal_the_one_process_rollout(tmp_path):
  _two_processes(tmp_path, "rollout")
  import jax
  from tests.train.distributed_worker import recipe_job, recipe_tasks
  job = recipe_job(None)
  whole = job.run(job.model, recipe_tasks(), jax.random.PRNGKey(0))
  for process in range(2):
    part = np.load(tmp_path / f"rollout_{process}.npz")
    rows = slice(2 * process, 2 * process + 2)
    np.testing.assert_array_equal(part["tokens"], np.asarray(whole.tokens)[rows])
    np.testing.assert_allclose(part["reward"], np.asarray(whole.reward)[rows])
