"""Pieces the recipes share: the small Qwen2.5-VL-shaped policy of the CPU configs, the
rows of a global batch each process evaluates, and the GRPO phase of the agent recipes."""

from __future__ import annotations

import numpy as np
from flax import nnx

from jaxspatial.models.precision import Precision
from jaxspatial.models.qwen2_5_vl.config import Qwen25VLConfig, TextConfig, VisionConfig
from jaxspatial.rl.objectives import PolicyLossConfig
from jaxspatial.rollout import tiny
from jaxspatial.rollout.episode import RolloutConfig, reshaped_by
from jaxspatial.train import AdvantageConfig, OptimizerConfig, Phase, StepConfig


def grpo_phase(c, steps: int, trainable=nnx.Param) -> Phase:
  """The RL phase of an agent recipe (GRPO or OR-GIGPO over `c.rollout`'s rollouts) from
  the config. `rl.old_logprobs` "rollout" takes the rollout's log-probabilities as the
  old ones: refused where they are not the policy's own (a sampling filter, a cache in
  another precision than the computation)."""
  old = c.rl.get("old_logprobs", "recompute")
  if old == "rollout":
    precision = Precision.from_config(c.model)
    reasons = reshaped_by(RolloutConfig(**c.rollout)) + (
        (f"model.cache_dtype {precision.cache_dtype!r} (computing in {precision.dtype!r})",)
        if precision.cache_dtype != precision.dtype else ())
    if reasons:
      raise ValueError(f"rl.old_logprobs 'rollout': the rollout's log-probabilities are not "
                       f"the policy's own under {', '.join(reasons)}; use 'recompute'")
  return Phase("rl", steps, OptimizerConfig(**c.rl.optimizer),
               StepConfig(objective="grpo", temperature=c.rollout.temperature,
                          micro_batches=c.rl.micro_batches,
                          loss=PolicyLossConfig(**c.objective)),
               trainable, reference="frozen", advantage=AdvantageConfig(**c.advantage),
               mini_batches=c.rl.mini_batches, epochs=c.rl.epochs, old_logprobs=old)


def small_model_config(m, tokenizer) -> Qwen25VLConfig:
  """A small Qwen2.5-VL-shaped policy from a config's `model` block (hidden, intermediate,
  layers, heads, kv_heads, vision_depth, vision_hidden) with the tokenizer's vocabulary
  (rounded up to 64) and special ids."""
  vocab = (len(tokenizer) + 63) // 64 * 64
  text = TextConfig(vocab_size=vocab, hidden_size=m.hidden, intermediate_size=m.intermediate,
                    num_hidden_layers=m.layers, num_attention_heads=m.heads,
                    num_key_value_heads=m.kv_heads, mrope_section=(2, 3, 3) if
                    m.hidden // m.heads == 16 else (4, 6, 6), tie_word_embeddings=True)
  vision = VisionConfig(depth=m.vision_depth, hidden_size=m.vision_hidden,
                        intermediate_size=2 * m.vision_hidden, num_heads=2,
                        out_hidden_size=m.hidden, fullatt_block_indexes=(m.vision_depth - 1,))
  return tiny.model_config(tokenizer, Qwen25VLConfig(text=text, vision=vision))


def my_rows(count: int) -> np.ndarray:
  """The positions of this process's rows in a global batch of `count` rows."""
  from jaxspatial.train import process_rows  # pylint: disable=import-outside-toplevel
  return np.arange(count)[process_rows(count)]


def gather_rows(positions, values) -> np.ndarray:
  """Every process's `values` (one per global position), in position order, each position
  once; rows at a negative position (padding) are dropped."""
  import jax  # pylint: disable=import-outside-toplevel
  positions, values = np.asarray(positions), np.asarray(values, np.float64)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    positions = np.asarray(multihost_utils.process_allgather(positions)).reshape(-1)
    values = np.asarray(multihost_utils.process_allgather(values)).reshape(-1)
  keep = positions >= 0
  _, first = np.unique(positions[keep], return_index=True)
  return values[keep][first]
