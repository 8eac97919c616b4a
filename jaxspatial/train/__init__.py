"""Training: the trainer and the experiment protocol, SFT / GRPO / registered losses, the
optimizer, checkpoints, metrics, multi-host start-up."""

from jaxspatial.train import grpo
from jaxspatial.train.checkpoint import (CheckpointCorruptError, CheckpointError, Checkpointer,
                                         CheckpointMismatchError, PreemptionGuard,
                                         key_from_json, key_to_json)
from jaxspatial.train.distributed import global_batch, initialize_from_env, process_rows
from jaxspatial.train.logprobs import token_logprobs
from jaxspatial.train.metrics import MetricWriter, read_jsonl
from jaxspatial.train.optim import OptimizerConfig, make_optimizer, trainable
from jaxspatial.train.grpo import ESTIMATORS, AdvantageConfig, register_advantage_estimator
from jaxspatial.train.losses import LOSSES, get_loss, register_loss
from jaxspatial.train import thinker3d as _thinker3d  # noqa: F401 (registers its loss)
from jaxspatial.train.experiment import Experiment, ExportedPolicy, Phase, RolloutBatch
from jaxspatial.train.trainer import (Preempted, Trainer, config_changes, flat_config,
                                      mesh_from_config, rl_step)
from jaxspatial.train.reference import ReferencePolicy
from jaxspatial.train.steps import StepConfig, TrainBatch, batch_logprobs, shard_batch, train_step

__all__ = ["AdvantageConfig", "ESTIMATORS", "register_advantage_estimator", "CheckpointCorruptError", "CheckpointError",
           "CheckpointMismatchError", "Checkpointer", "Experiment", "ExportedPolicy", "LOSSES", "Phase", "Preempted",
           "RolloutBatch", "Trainer", "config_changes", "flat_config", "get_loss", "mesh_from_config",
           "register_loss", "rl_step", "MetricWriter", "OptimizerConfig", "PreemptionGuard",
           "ReferencePolicy", "StepConfig",
           "TrainBatch", "batch_logprobs", "grpo", "global_batch", "initialize_from_env", "key_from_json",
           "key_to_json", "make_optimizer", "process_rows", "read_jsonl", "shard_batch", "token_logprobs",
           "train_step", "trainable"]
