"""Training: SFT and GRPO steps, optimizer, checkpoints, metrics, multi-host start-up."""

from jaxspatial.train import grpo
from jaxspatial.train.checkpoint import Checkpointer, PreemptionGuard, key_from_json, key_to_json
from jaxspatial.train.distributed import global_batch, initialize_from_env, process_rows
from jaxspatial.train.logprobs import token_logprobs
from jaxspatial.train.metrics import MetricWriter, read_jsonl
from jaxspatial.train.optim import OptimizerConfig, make_optimizer, trainable
from jaxspatial.train.grpo import AdvantageConfig
from jaxspatial.train.reference import ReferencePolicy
from jaxspatial.train.steps import StepConfig, TrainBatch, batch_logprobs, shard_batch, train_step

__all__ = ["AdvantageConfig", "Checkpointer", "MetricWriter", "OptimizerConfig", "PreemptionGuard",
           "ReferencePolicy", "StepConfig",
           "TrainBatch", "batch_logprobs", "grpo", "global_batch", "initialize_from_env", "key_from_json",
           "key_to_json", "make_optimizer", "process_rows", "read_jsonl", "shard_batch", "token_logprobs",
           "train_step", "trainable"]
