"""Multi-host start-up: `jax.distributed.initialize` from the environment.

Explicit:  JAX_COORDINATOR_ADDRESS=host:port JAX_NUM_PROCESSES=n JAX_PROCESS_ID=i
SLURM:     srun with more than one task (jax reads SLURM's variables)
TPU pods:  detected by jax on Cloud TPU VMs (TPU_WORKER_HOSTNAMES / the metadata server)
Otherwise a single process. Returns (process index, process count).
"""

from __future__ import annotations

import os

import jax


def initialize_from_env(environ=None) -> tuple[int, int]:
  env = os.environ if environ is None else environ
  if env.get("JAX_COORDINATOR_ADDRESS"):
    for name in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
      if name not in env:
        raise ValueError(f"initialize_from_env: JAX_COORDINATOR_ADDRESS is set but {name} "
                         "is not")
    jax.distributed.initialize(env["JAX_COORDINATOR_ADDRESS"], int(env["JAX_NUM_PROCESSES"]),
                               int(env["JAX_PROCESS_ID"]))
  elif int(env.get("SLURM_NTASKS", "1")) > 1 or "TPU_WORKER_HOSTNAMES" in env:
    jax.distributed.initialize()
  return jax.process_index(), jax.process_count()
