#!/bin/bash
# Training on a Cloud TPU pod slice: the same command on every worker.
#
#   launch/tpu_pod.sh my-tpu us-central2-b configs/think3d_rl.py --config.workdir=gs://bucket/run \
#       --config.model.checkpoint=/mnt/ckpt/qwen --config.data.data_dir=/mnt/data
#
# The checkpoint and data paths must be readable from every worker; each worker reads only
# its own shard of the task dataset.
# Copies this checkout to every worker, makes its .venv there (`make install`: the runtime
# set), adds jax[tpu], and starts launch.train on all workers at once; jax.distributed detects
# the pod (the trainer calls initialize_from_env), so the mesh spans every chip. Use a gs://
# or shared workdir for checkpoints. A maintenance event's SIGTERM makes the job save its
# step and exit with status 143; run the same command again and it resumes from there.
# Cost: the config file's header says what a run costs.
set -euo pipefail
TPU=${1:?usage: launch/tpu_pod.sh TPU_NAME ZONE CONFIG [--config.key=value ...]}
ZONE=${2:?zone}
CONFIG=${3:?config}
shift 3
ARGS="$*"
gcloud compute tpus tpu-vm scp --recurse --zone "$ZONE" --worker=all . "$TPU":~/jaxspatial
gcloud compute tpus tpu-vm ssh "$TPU" --zone "$ZONE" --worker=all --command \
  "cd ~/jaxspatial && make install >/dev/null && .venv/bin/pip install -q 'jax[tpu]' && \
   .venv/bin/python -m launch.train --config $CONFIG $ARGS"
