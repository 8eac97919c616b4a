#!/bin/bash
# Multi-node GPU training under SLURM: one process per node, all of its GPUs.
#
#   sbatch --nodes=4 --gpus-per-node=8 launch/slurm_gpu.sh configs/act3d_grpo.py \
#       --config.workdir=/shared/runs/act3d --config.model.checkpoint=/shared/ckpt/qwen \
#       --config.data.data_dir=/shared/data --config.sft.trajectories=/shared/act3d_sft.jsonl
#
# jax.distributed reads SLURM's variables (launch.train calls initialize_from_env), so every
# process joins one mesh ('data', 'fsdp', 'tensor') over all GPUs; each host loads its own
# data shard. Checkpoints go to --config.workdir, which must be on a shared file system.
# SLURM's SIGTERM before preemption or the time limit (--signal=TERM@120) makes the job save
# its step and exit with status 143; the script then requeues the job, which resumes from
# that step. Any other failure ends the job.
# Cost: the config file's header says what a run costs.
#SBATCH --job-name=jaxspatial
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --signal=TERM@120
#SBATCH --requeue
set -euo pipefail
CONFIG=${1:?usage: sbatch launch/slurm_gpu.sh CONFIG [--config.key=value ...]}
shift
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
# JAX's persistent compilation cache: a requeued job loads its compiled programs instead of
# compiling them again (process 0 writes it; it must be on the shared file system).
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$PWD/.cache/xla}
# launch.train adds -nvptx-allow-ftz-atomics to XLA_FLAGS on jaxlib 0.10.2-0.11.0 (the f32
# scatter-add CAS loop, jax #38806: jaxspatial/xla_workarounds.py)
status=0
srun --kill-on-bad-exit=1 .venv/bin/python -m launch.train --config "$CONFIG" "$@" || status=$?
if [ "$status" -eq 143 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
  echo "preempted: the step is saved; requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
