"""Multi-host start-up: `jax.distributed.initialize` from the environment.

Explicit:  JAX_COORDINATOR_ADDRESS=host:port JAX_NUM_PROCESSES=n JAX_PROCESS_ID=i
SLURM:     srun with more than one task (jax reads SLURM's variables)
TPU pods:  detected by jax on Cloud TPU VMs (TPU_WORKER_HOSTNAMES / the metadata server)
Otherwise a single process. Returns (process index, process count).

Data: every process loads only its rows of a global batch (`process_rows`), and
`global_batch` assembles the processes' rows into global arrays sharded over
('data', 'fsdp'), without any process holding the whole batch.
"""

from __future__ import annotations

import os

import jax

from jaxspatial.models.sharding import global_batch  # noqa: F401 (re-exported)


def initialize_from_env(environ=None) -> tuple[int, int]:
  """Call it before anything touches the XLA backend (importing jaxspatial.rollout does);
  a second call is a no-op."""
  env = os.environ if environ is None else environ
  if jax.distributed.is_initialized():
    pass
  elif env.get("JAX_COORDINATOR_ADDRESS"):
    for name in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
      if name not in env:
        raise ValueError(f"initialize_from_env: JAX_COORDINATOR_ADDRESS is set but {name} "
                         "is not")
    jax.distributed.initialize(env["JAX_COORDINATOR_ADDRESS"], int(env["JAX_NUM_PROCESSES"]),
                               int(env["JAX_PROCESS_ID"]))
  elif int(env.get("SLURM_NTASKS", "1")) > 1 or "TPU_WORKER_HOSTNAMES" in env:
    jax.distributed.initialize()
  return jax.process_index(), jax.process_count()


def process_rows(global_rows: int, process: int | None = None,
                 count: int | None = None) -> slice:
  """This process's contiguous share of a global batch of `global_rows` rows."""
  process = jax.process_index() if process is None else process
  count = jax.process_count() if count is None else count
  if global_rows % count:
    raise ValueError(f"process_rows: a global batch of {global_rows} rows does not split "
                     f"over {count} processes")
  share = global_rows // count
  return slice(process * share, (process + 1) * share)

__all__ = ["global_batch", "initialize_from_env", "process_rows"]
