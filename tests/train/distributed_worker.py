"""One process of a 2-process `jax.distributed` CPU run (tests/train/test_distributed.py):
both processes take one GRPO step on a ('data',) mesh spanning them, each loading only its
own half of the batch (`process_rows`, `global_batch`), and print the loss. With a second
argument "rollout" they then run one compiled rollout of the agent recipe
(recipes/agents.py) over their own tasks and save their rows of it."""

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


def recipe_job(mesh):
  """A Think3D recipe's policy and rollout on the tiny policy (seed 0)."""
  from configs import think3d_rl
  from recipes.agents import AgentRecipe
  c = think3d_rl.get_config("cpu")
  c.agent.update(width=56, height=56)
  c.rollout.update(max_turns=2, max_turn_tokens=24, temperature=0.0)
  c.data.prompt_tokens = 400  # the system message and 8 input views
  job = AgentRecipe(c)
  job.build_policy(mesh)
  if mesh is not None:  # the same parameters, replicated over the processes' mesh
    state = nnx.state(job.model, nnx.Param)
    nnx.replace_by_pure_dict(state, jax.tree.map(
        lambda x: global_array(mesh, x, PartitionSpec()), nnx.to_pure_dict(state)))
    nnx.update(job.model, state)
  return job


def recipe_tasks():
  from data_pipelines.synthetic import episodes
  tasks, _ = episodes.act3d_tasks(4, seed=3, points=3000)
  return tasks.replace(question_ids=np.stack([np.pad(np.frombuffer(
      f"Which is left of box {i}? A. a B. b".encode(), np.uint8).astype(np.int32), (0, 40),
      constant_values=-1) for i in range(4)]))


def rollout_rows(process, mesh, out):
  from jaxspatial.models.sharding import local_rows
  job = recipe_job(mesh)
  rows = process_rows(4)
  mine = jax.tree.map(lambda x: np.asarray(x)[rows], recipe_tasks())
  traj = job.run(job.model, mine, jax.random.PRNGKey(0), mesh=mesh)
  assert traj.tokens.shape[0] == 4 and not traj.tokens.is_fully_addressable
  np.savez(f"{out}/rollout_{process}.npz", tokens=local_rows(traj.tokens),
           reward=local_rows(traj.reward))
  print(f"process {process}: rollout rows saved", flush=True)


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
  if sys.argv[2:] == ["rollout"]:
    rollout_rows(process, mesh, sys.argv[1])
  jax.distributed.shutdown()
  return 0


if __name__ == "__main__":
  sys.exit(main())
