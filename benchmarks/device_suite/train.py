"""The train part: one GRPO step on the rollout's batch-8 trajectories (f32 master weights,
bf16 compute, remat, micro-batches): tokens per second, MFU, peak memory."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks.device_suite.core import first_cost, memory_bytes, peak_flops, peak_memory_bytes
from benchmarks.timing import timed_first
from jaxspatial.models import memory
from jaxspatial.models.precision import Precision
from jaxspatial.train import (AdvantageConfig, StepConfig, TrainBatch, batch_logprobs, grpo,
                              train_step)


class TrainPart:
  """The train part, as `RolloutBench`'s methods (it holds the trajectories and the
  compiled step): one GRPO step on the batch-8 trajectories, then the old
  log-probabilities recomputed."""

  def _train_batch(self, trajectory):
    batch = trajectory.tokens.shape[0]
    advantages = grpo.advantages(trajectory, trajectory.reward,
                                 AdvantageConfig(group_size=batch))
    # The rollout's log-probabilities stand for the old policy's in the timed step (the
    # step costs the same); batch_logprobs recomputes them after it, as grpo.update does.
    return TrainBatch.from_trajectory(trajectory, advantages=advantages,
                                      old_logprobs=trajectory.logprobs.astype(jnp.float32))

  def _compile_train(self):
    _, trajectory_shapes = self.compiled[self.sizes.rollout_batches[0]].result()
    batch_shapes = jax.eval_shape(self._train_batch, trajectory_shapes)
    graphdef = self.train_graphdef
    config = StepConfig(objective="grpo", temperature=1.0,
                        micro_batches=self.sizes.train_micro_batches)

    # A pure function of the (model, optimizer) state: its cost analysis is the step that runs.
    def step(state, batch):
      model, optimizer = nnx.merge(graphdef, state)
      metrics = train_step(model, optimizer, batch, config)
      return nnx.state((model, optimizer)), metrics
    compiled = jax.jit(step, donate_argnums=0).lower(self.train_state_shapes,
                                                     batch_shapes).compile()
    return compiled, batch_shapes

  def _compile_logprobs(self):
    _, batch_shapes = self.train_compiled.result()
    graphdef = self.train_graphdef
    logprobs = lambda state, batch: batch_logprobs(nnx.merge(graphdef, state)[0], batch, 1.0)
    return jax.jit(logprobs).lower(self.train_state_shapes, batch_shapes).compile()


  def train(self, entry: dict) -> None:
    """One GRPO step on the first size's trajectories (f32 master weights, bf16 compute,
    remat, micro-batches), then the old log-probabilities recomputed."""
    if not self.trajectories:
      raise RuntimeError("train needs the rollout's trajectories, which it did not make")
    batch_size = min(self.trajectories)
    traj = self.trajectories[batch_size]
    batch = jax.jit(self._train_batch)(traj)
    tokens = int(np.prod(batch.tokens.shape))
    loss_tokens = float(np.asarray(batch.loss_mask).sum())
    entry.update(batch=batch_size, sequence_slots=int(batch.tokens.shape[1]),
                 micro_batches=self.sizes.train_micro_batches, remat=True,
                 params_dtype="float32", compute_dtype="bfloat16", attention="auto",
                 tokens=tokens, loss_tokens=loss_tokens,
                 old_logprobs="the rollout's in the timed step (same cost); batch_logprobs "
                              "recomputes them after it")
    (compiled, _), waited = self.wait(self.train_compiled)
    entry.update(compile_s=self.train_compiled.seconds, waited_for_compile_s=waited,
                 compiled_in_background=not self.worker.serial)
    flops = first_cost(compiled).get("flops")
    entry["flops"] = flops
    entry["memory_analysis_bytes"] = memory_bytes(compiled)
    entry["flops_note"] = ("XLA's cost analysis of the compiled step: forward, backward with "
                           "the rematerialised forward, optimizer")
    state, times, metrics = self.train_state, [], None
    self.train_state = None  # donated
    for _ in range(self.sizes.train_repeats + 1):  # the first call pays allocations
      begin = time.perf_counter()
      state, metrics = compiled(state, batch)
      jax.block_until_ready(metrics)
      times.append(time.perf_counter() - begin)
    step_s = float(np.median(times[1:]))
    kind = jax.devices()[0].device_kind
    peak = peak_flops(kind)
    entry.update(first_step_s=times[0], step_s=step_s, tokens_per_s=tokens / step_s,
                 loss_tokens_per_s=loss_tokens / step_s, device_kind=kind,
                 peak_bf16_flops=peak,
                 mfu=(flops / step_s / peak) if (peak and flops and flops > 0) else None,
                 loss=float(metrics["loss"]), finite=bool(metrics["finite"]),
                 peak_memory_bytes=peak_memory_bytes(),
                 flops_6nd_text=6.0 * self.text_parameters * tokens,
                 flops_6nd_note="6 x text-decoder parameters x B x S: a cross-check "
                                "without attention")
    entry["memory_estimate"] = self._memory_estimate(batch_size, int(batch.tokens.shape[1]))
    self.report.save()
    logprobs, waited = self.wait(self.logprobs_compiled)
    first, logprobs_s = timed_first(lambda: logprobs(state, batch), 1)
    recomputed = np.asarray(logprobs(state, batch))
    generated = np.asarray(batch.loss_mask, bool)
    # one update at lr 1e-6 after sampling: the bf16 sampler against the trainer's pass
    difference = np.abs(recomputed - np.asarray(traj.logprobs))[generated]
    entry["logprobs"] = {
        "compile_s": self.logprobs_compiled.seconds, "waited_for_compile_s": waited,
        "first_call_s": first, "run_s": logprobs_s, "tokens_per_s": tokens / logprobs_s,
        "grpo_update_s": step_s + logprobs_s,
        "max_abs_diff_vs_rollout": float(difference.max())}

  def _memory_estimate(self, batch: int, length: int) -> dict:
    """`models.memory.estimate` (what a training launch prints) beside the measured peak."""
    try:
      model, _ = nnx.merge(self.train_graphdef, self.train_state_shapes)
      estimate = memory.estimate(
          model, Precision("bfloat16", "float32", "bfloat16"), rollout_batch=batch,
          cache_length=length, train_batch=batch, train_length=length,
          micro_batches=self.sizes.train_micro_batches, remat=True,
          fused_attention=jax.default_backend() == "gpu")
    except Exception as exc:  # pylint: disable=broad-except
      return {"error": f"{type(exc).__name__}: {exc}"[:500]}
    fields = ("parameters", "gradients", "optimizer", "kv_cache", "activations")
    return {**{f: getattr(estimate, f) for f in fields}, "total": estimate.total}
