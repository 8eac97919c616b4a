"""Training: the trainer and the experiment protocol, SFT / GRPO / registered losses, the
optimizer, checkpoints, metrics, multi-host start-up.

Modules:
- steps.py (TrainBatch from a Trajectory, the registered loss of `StepConfig.objective`,
  micro-batch accumulation, gradients of the optimizer's `wrt` only, the non-finite guard, batch
  sharding), logprobs.py (one forward pass over a trajectory's slots), optim.py (AdamW, warm-up
  + cosine or linear decay, clipping, weight-decay masks (transformers' rule: not biases and
  norms); `trainable` filters: frozen towers, LoRA only), reference.py (the KL term's reference:
  frozen copy or LoRA disabled), thinker3d.py (stage-1 loss and batch layout),
- grpo.py (after a rollout: advantages from the estimator registry
  (register_advantage_estimator, ESTIMATORS: "grpo" and "rloo" per episode, "or_gigpo" per turn
  -> per token; AdvantageConfig.estimator names one); old / reference log-probs; epochs x
  mini-batch updates),
- checkpoint.py (orbax: async, latest K + best, restore onto any mesh, parameters alone, the
  frozen reference; SIGTERM guard; each step records its arrays' fingerprints (fingerprint.py:
  exact uint32 sums on device, sharding-independent) and each process's data-iterator state; a
  latest restore takes the newest step that verifies, moving damaged ones to
  latest/corrupt.<step>.<n> and best/ steps past it to best/superseded.* (the newest
  `checkpoint.keep_aside` of each kept; a latest/ left with none refuses to restart from 0
  without `checkpoint.restart_from_zero`);
  requested steps and restore_params raise instead; a failed write is one CheckpointError naming
  step and cause at check / save / wait),
- metrics.py (JSONL + TensorBoard via tensorboardX; one row per step: resume_step drops the rows
  a resumed run redoes; a gs:// logdir is staged locally and uploaded whole on flush, which the
  trainer calls before each checkpoint), every file under a workdir goes through etils.epath,
  distributed.py (jax.distributed from the environment; each process's rows of a global batch:
  process_rows, global_batch), plots.py (`training_curves`: curve.png / curve.svg of a whole
  run from metrics.jsonl, a panel per metric, phase starts marked; matplotlib, imported
  when drawing),
- losses.py (the loss registry: objective name -> (sum, (denominator, metrics)); "sft", "grpo",
  and "thinker3d_stage1" from train/thinker3d.py),
- registry.py (`registrar`: the one decorator factory of the loss and the advantage-estimator
  registries),
- experiment.py (the Experiment protocol a recipe implements; Phase; RolloutBatch;
  `ExportedPolicy`, `for_export` / `build_for_export` / `exported_policy`: what a recipe
  exports, built without its data),
- trainer.py (Trainer: the one training loop; rl_step, the one RL step GRPO, OR-GIGPO and
  3DThinker stage 2 take; `Trainer.restore`: the one restore path of launch.eval and
  launch.export, the folder and step checked first, the steps there named),
- workdir_lock.py (`hold_workdir`: one run per work directory: an OS lock (flock) on
  <workdir>/.lock, freed by the kernel when its holder dies, taken over with a line naming
  it; on an object store a lease (lease.json, heartbeat every 30 s, stale after 120 s);
  process 0 only; re-entrant; `WorkdirInUseError` names the holder's host, pid, start and
  command)

One loop: `jaxspatial.train.Trainer(config, experiment).run()` (`launch.train` calls it through
`recipes.train`). The trainer owns the mesh (`config.mesh`), builds the policy under it
(`experiment.build(mesh)`), runs the experiment's phases by a global step, makes each phase's
optimizer (`Phase.optimizer`, its `total_steps` the phase's updates) and KL reference, restores
across phases, refuses non-finite updates, handles SIGTERM, writes metrics (process 0; a
supervised step's metrics are read while the next step runs), a progress bar per phase and, at
the end, the run's charts, and calls the experiment's evaluation and report. A recipe supplies
an `Experiment` (train/experiment.py): `build`, `phases` (each a `Phase`: name, steps,
objective through `StepConfig`, optimizer, trainable filter, reference, and for RL the
`AdvantageConfig`, epochs and mini-batches),
`train_batch(phase, k)` or `rollout(phase, k, key)`, `evaluate(module, when)`, `report`, its
`data_iterator` and a memory estimate. Every step's data and keys derive from (seed, step in
phase, the data iterator's state), so a run restored at step k continues exactly as if it had
never stopped (SIGKILL and resume give the same metrics, tested for every recipe by `make
train-checks`). An RL step (`rl_step`): the experiment's episodes and rewards, advantages, old
log-probabilities recomputed under the current parameters (`batch_logprobs`, the rollout's
temperature) and the reference's, then `epochs x mini_batches` optimizer steps on the model
and optimizer split once (`split_train_step`, `jax.jit` over held state: no graph walk per
call; `train_step` is the one-call form) (micro-batches accumulate (sum, denominator) pairs, so the loss equals the full-batch loss; a
non-finite loss or gradient is not applied and the run stops naming the step, before any save).
One mesh ('data', 'fsdp', 'tensor') serves rollouts and updates; batches are sharded over
('data', 'fsdp').

Checkpoints (one Orbax step each: parameters, optimizer, step, phase, results, the flat config,
fingerprints and each process's data-iterator state) go to `latest/` (last K, `checkpoint.keep`
>= 1) and `best/` (by RL reward), asynchronously and atomically; a restore verifies the
fingerprints and falls back to the newest intact step, moving the damaged one aside
(train/checkpoint.py). A resume whose config differs in anything that changes the run is refused
with the differences (`resume_overrides` lists keys allowed to change, or "*"; the workdir,
logging, the checkpoint cadence, evaluation and fault injection are always allowed; the data
folder, the model folder and the mesh are not); a work directory holding a run is refused
without `resume`; a failed save stops the run with one line naming the step and the cause;
`metrics.jsonl` holds exactly one row per step (a resume drops the rows it redoes). SIGTERM
saves the step and raises `Preempted`, a SystemExit with status 143, which launch/slurm_gpu.sh
requeues on. `faults` (kill_after_step, sigterm_after_step, nan_at_step) inject the failures the
tests use.

The KL term (beta > 0) takes the reference's log-probabilities from `ReferencePolicy`: "frozen"
copies the parameters when GRPO starts (the SFT policy) and is saved once beside the checkpoints
(`checkpoints/reference`), so a resumed run uses the same copy; "lora_disabled" evaluates the
policy with every adapter's update zeroed (3DThinker's reference), holding no copy. What trains
is the optimizer's `wrt` filter (`optim.trainable`: frozen path names such as "visual", or
adapters only); `train_step` differentiates with respect to that filter only.

**dtypes.** Geometry and rendering in float32 and int32 (no 64-bit mode anywhere). The model's
dtypes are the config's `model.dtype` (computation), `model.param_dtype` (parameters) and
`model.cache_dtype` (the rollout's KV cache), read by `models.precision.Precision`: the recipes'
reference variants compute in bfloat16 over float32 master weights with a bf16 cache, `:cpu`
variants and the demo keep float32; bf16 parameters are for rollout-only or evaluation jobs
(training refuses them). Logits, log-probabilities, losses, rewards and advantages are float32
under any policy (the LM head accumulates and returns float32). The GRPO ratio's old
log-probabilities are recomputed by the training forward pass, so the ratio is exactly 1 at the
first update; the sampler's own log-probabilities agree with them to 1e-5 nats in float32 and
1e-2 in bf16 (tests/models/test_precision.py).

**Memory on accelerators.** `model.attention` ("auto") takes cuDNN flash attention on GPU in
bf16; `model.remat` recomputes each decoder layer and vision block in the backward pass;
`train_step` donates the parameters and optimizer state (updated in place; remat is
`jax.checkpoint` over the layer, writing back only RNG state, so a remat model also runs inside
rollouts' while loops, where `nnx.remat` raises TraceContextError); the host loop's per-token
step donates its KV cache (the compiled rollout carries its cache inside one program). Every
training launch prints `models.memory.estimate` before compiling.
"""

from jaxspatial.train import grpo
from jaxspatial.train.checkpoint import (CheckpointCorruptError, CheckpointError, Checkpointer,
                                         CheckpointMismatchError, PreemptionGuard,
                                         key_from_json, key_to_json)
from jaxspatial.train.distributed import global_batch, initialize_from_env, process_rows
from jaxspatial.train.logprobs import token_logprobs
from jaxspatial.train.metrics import MetricWriter, read_jsonl
from jaxspatial.train.optim import OptimizerConfig, make_optimizer, trainable
from jaxspatial.train.plots import training_curves
from jaxspatial.train.grpo import ESTIMATORS, AdvantageConfig, register_advantage_estimator
from jaxspatial.train.losses import LOSSES, get_loss, register_loss
from jaxspatial.train import thinker3d as _thinker3d  # noqa: F401 (registers its loss)
from jaxspatial.train.experiment import Experiment, ExportedPolicy, Phase, RolloutBatch
from jaxspatial.train.trainer import (Preempted, Trainer, config_changes, flat_config,
                                      mesh_from_config, rl_step)
from jaxspatial.train.reference import ReferencePolicy
from jaxspatial.train.workdir_lock import WorkdirLock, hold_workdir
from jaxspatial.train.steps import (StepConfig, TrainBatch, batch_logprobs, shard_batch,
                                    split_logprobs, split_train_step, train_step)

__all__ = ["AdvantageConfig", "ESTIMATORS", "register_advantage_estimator", "CheckpointCorruptError", "CheckpointError",
           "CheckpointMismatchError", "Checkpointer", "Experiment", "ExportedPolicy", "LOSSES", "Phase", "Preempted",
           "RolloutBatch", "Trainer", "config_changes", "flat_config", "get_loss", "mesh_from_config",
           "register_loss", "rl_step", "MetricWriter", "OptimizerConfig", "PreemptionGuard",
           "ReferencePolicy", "StepConfig",
           "TrainBatch", "batch_logprobs", "grpo", "global_batch", "initialize_from_env", "key_from_json",
           "key_to_json", "make_optimizer", "process_rows", "read_jsonl", "shard_batch", "split_logprobs",
           "split_train_step", "token_logprobs", "train_step", "trainable", "WorkdirLock",
           "hold_workdir", "training_curves"]
