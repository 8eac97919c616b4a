"""One process of a 2-process `jax.distributed` CPU run (tests/train/test_distributed.py):
both processes take one GRPO step on a ('data',) mesh spanning them, each loading only its
own half of the batch (`process_rows`, `global_batch`), and print the loss."""

import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")

import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

from jaxspatial.models.qwen2_5_vl import Qwen25VL  # noqa: E402
from jaxspatial.models.sharding import make_mesh  # noqa: E402
from jaxspatial.rl.objectives import PolicyLossConfig  # noqa: E402
from jaxspatial.train import (OptimizerConfig, StepConfig, global_batch,  # noqa: E402
                              initialize_from_env, make_optimizer, process_rows, train_step)
from tests.train.sharded_worker import CONFIG, batch  # noqa: E402

GRPO = StepConfig(objective="grpo", loss=PolicyLossConfig(beta=0.01))


def global_array(mesh, value, spec):
  value = np.asarray(value)
  sharding = NamedSharding(mesh, spec)
  return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def main():
  process, count = initialize_from_env()
  assert count == 2 and jax.device_count() == 2, (count, jax.devices())
  model = Qwen25VL(CONFIG, rngs=nnx.Rngs(0))  # the same on both processes (same seed)
  mesh = make_mesh(data=2)
  state = nnx.state(model, nnx.Param)
  values = jax.tree.map(lambda x: global_array(mesh, x, PartitionSpec()),
                        nnx.to_pure_dict(state))
  nnx.replace_by_pure_dict(state, values)
  nnx.update(model, state)
  rows = process_rows(batch(0).batch_size)
  assert rows == (slice(0, 4) if process == 0 else slice(4, 8)), rows
  local = jax.tree.map(lambda x: np.asarray(x)[rows], batch(0))  # this process's rows only
  data = global_batch(local, mesh)
  assert data.tokens.shape == (8, 24) and not data.tokens.is_fully_addressable
  with jax.set_mesh(mesh):
    optimizer = make_optimizer(model, OptimizerConfig(learning_rate=1e-2, total_steps=10))
    metrics = train_step(model, optimizer, data, GRPO)
    loss = float(jax.device_get(metrics["loss"]))
  print(f"process {process}: GRPO step done, loss {loss:.7f}", flush=True)
  jax.distributed.shutdown()
  return 0


if __name__ == "__main__":
  sys.exit(main())
