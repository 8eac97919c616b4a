"""Two processes with `jax.distributed` on CPU complete a GRPO step together, with the loss
of the same step on one device; and a recipe rollout whose tasks each process loaded
itself gives, row for row, the one-process rollout of all the tasks."""

import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
from flax import nnx

from jaxspatial.models.qwen2_5_vl import Qwen25VL
from jaxspatial.train import OptimizerConfig, make_optimizer, train_step
from tests.train.distributed_worker import GRPO
from tests.train.sharded_worker import CONFIG, batch

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_two_process_grpo_step(tmp_path):
  port = _free_port()
  procs = []
  for i in range(2):
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
               JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(i),
               XLA_FLAGS="--xla_force_host_platform_device_count=1")
    procs.append(subprocess.Popen([sys.executable, "-m", "tests.train.distributed_worker",
                                   str(tmp_path)],
                                  cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True))
  outputs = []
  for p in procs:
    out, _ = p.communicate(timeout=600)
    outputs.append(out)
    assert p.returncode == 0, out[-4000:]
  losses = [float(o.split("loss ")[-1].split()[0]) for o in outputs]
  model = Qwen25VL(CONFIG, rngs=nnx.Rngs(0))
  optimizer = make_optimizer(model, OptimizerConfig(learning_rate=1e-2, total_steps=10))
  expected = float(train_step(model, optimizer, batch(0), GRPO)["loss"])
  np.testing.assert_allclose(losses, [expected, expected], rtol=1e-5)
  # The recipe's rollout: each process's rows equal the one-process rollout's.
  import jax
  from tests.train.distributed_worker import recipe_job, recipe_tasks
  job = recipe_job(None)
  whole = job.run(job.model, recipe_tasks(), jax.random.PRNGKey(0))
  for process in range(2):
    part = np.load(tmp_path / f"rollout_{process}.npz")
    rows = slice(2 * process, 2 * process + 2)
    np.testing.assert_array_equal(part["tokens"], np.asarray(whole.tokens)[rows])
    np.testing.assert_allclose(part["reward"], np.asarray(whole.reward)[rows])
