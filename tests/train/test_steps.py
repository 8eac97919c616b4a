"""Training steps on one device: losses against their definitions, micro-batches, the
non-finite guard, the schedule, checkpoints, metrics."""

import json
import os
import signal

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxspatial.models.qwen2_5_vl import Qwen25VL
from jaxspatial.rl.objectives import PolicyLossConfig
from jaxspatial.train import (Checkpointer, MetricWriter, OptimizerConfig, PreemptionGuard,
                              StepConfig, make_optimizer, read_jsonl, token_logprobs, train_step)
from jaxspatial.train.optim import schedule
from tests.train.sharded_worker import CONFIG, batch, params


def _model(seed=0):
  model = Qwen25VL(CONFIG, rngs=nnx.Rngs(seed))
  return model, make_optimizer(model, OptimizerConfig(learning_rate=1e-2, total_steps=10))


def test_sft_loss_is_the_mean_negative_log_likelihood_of_generated_tokens():
  model, optimizer = _model()
  data = batch(0)
  pixels_logits = token_logprobs(model, data.tokens, data.attention_mask, data.images)
  # Independent: log-softmax of the full logits, picked by hand with numpy.
  from jaxspatial.models.qwen2_5_vl.preprocess import batch_vision_inputs
  pixels, grids, sequence_grids = batch_vision_inputs(model.config.vision, data.images)
  logits = np.asarray(model(data.tokens, data.attention_mask, pixels, grids, sequence_grids),
                      np.float64)
  logits -= logits.max(-1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  tokens, mask = np.asarray(data.tokens), np.asarray(data.loss_mask)
  nll = [-logp[b, j - 1, tokens[b, j]] for b in range(8) for j in range(1, 24) if mask[b, j]]
  np.testing.assert_allclose(np.asarray(pixels_logits)[mask], -np.asarray(nll), rtol=1e-4)
  metrics = train_step(model, optimizer, data, StepConfig(objective="sft"))
  np.testing.assert_allclose(float(metrics["loss"]), np.mean(nll), rtol=1e-4)
  assert bool(metrics["finite"])


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["sft", "grpo"])
def test_micro_batches_accumulate_to_the_full_batch_step(objective):
  loss = PolicyLossConfig(beta=0.02, aggregation="sequence-mean-token-mean")
  results = []
  for micro in (1, 4):
    # SGD with momentum: the update is linear in the gradient, so it shows gradient
    # differences as they are (Adam's m / sqrt(v) turns rounding of ~0 gradients into +-lr).
    model = Qwen25VL(CONFIG, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(0.5, momentum=0.9), wrt=nnx.Param)
    metrics = train_step(model, optimizer, batch(1),
                         StepConfig(objective=objective, loss=loss, micro_batches=micro))
    results.append((float(metrics["loss"]), params(model)))
  np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               results[0][1], results[1][1])


@pytest.mark.slow
def test_a_non_finite_loss_is_not_applied():
  model, optimizer = _model()
  before = params(model)
  opt_before = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(optimizer)))
  bad = batch(2).replace(advantages=jnp.full((8,), jnp.nan))
  metrics = train_step(model, optimizer, bad, StepConfig(objective="grpo"))
  assert not bool(metrics["finite"]) and not np.isfinite(float(metrics["loss"]))
  chex.assert_trees_all_equal(params(model), before)
  chex.assert_trees_all_equal(jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(optimizer))),
                              opt_before)


def test_schedule_warms_up_then_decays_by_cosine():
  config = OptimizerConfig(learning_rate=1e-3, warmup_steps=10, total_steps=110,
                           final_fraction=0.1)
  lr = schedule(config)
  np.testing.assert_allclose(float(lr(5)), 5e-4, rtol=1e-6)
  np.testing.assert_allclose(float(lr(10)), 1e-3, rtol=1e-6)
  t = 50 / 100
  np.testing.assert_allclose(float(lr(60)), 1e-4 + (1e-3 - 1e-4) * 0.5 * (1 + np.cos(np.pi * t)),
                             rtol=1e-5)
  np.testing.assert_allclose(float(lr(110)), 1e-4, rtol=1e-5)


@pytest.mark.slow
def test_checkpoint_round_trip_keeps_params_optimizer_and_extra(tmp_path):
  model, optimizer = _model()
  train_step(model, optimizer, batch(3), StepConfig(objective="sft"))
  saver = Checkpointer(tmp_path, keep=2, best_metric="reward")
  for step, reward in ((1, 0.5), (2, 0.9), (3, 0.1)):
    saver.save(step, model, optimizer, {"phase": "grpo", "step": step}, {"reward": reward})
  saver.close()
  assert sorted(p.name for p in (tmp_path / "latest").iterdir() if p.name.isdigit()) == ["2", "3"]
  fresh, fresh_opt = _model(seed=9)
  loader = Checkpointer(tmp_path, keep=2, best_metric="reward")
  step, extra = loader.restore(fresh, fresh_opt)
  assert step == 3 and extra == {"phase": "grpo", "step": 3}
  chex.assert_trees_all_equal(params(fresh), params(model))
  best_step, _ = loader.restore(fresh, fresh_opt, best=True)
  assert best_step == 2
  a = train_step(fresh, fresh_opt, batch(4), StepConfig(objective="sft"))
  b = train_step(model, optimizer, batch(4), StepConfig(objective="sft"))
  np.testing.assert_allclose(float(a["loss"]), float(b["loss"]), rtol=1e-6)
  assert Checkpointer(tmp_path / "empty").restore(fresh, fresh_opt) is None


def test_preemption_guard_turns_sigterm_into_a_flag():
  with PreemptionGuard() as guard:
    os.kill(os.getpid(), signal.SIGTERM)
    assert guard.requested
  assert signal.getsignal(signal.SIGTERM) is not guard._handle


def test_metrics_go_to_jsonl_and_tensorboard(tmp_path):
  writer = MetricWriter(tmp_path)
  writer.write(1, {"loss": 2.0, "reward": jnp.float32(0.5)})
  writer.write(2, {"loss": 1.5})
  writer.close()
  rows = read_jsonl(tmp_path / "metrics.jsonl")
  assert [r["step"] for r in rows] == [1, 2] and rows[0]["reward"] == 0.5
  events = list(tmp_path.glob("events.out.tfevents.*"))
  assert events and events[0].stat().st_size > 0
  json.dumps(rows)


@pytest.mark.parametrize("keep", [0, -1, 1.5, None])
def test_checkpoint_retention_below_one_step_is_refused(tmp_path, keep):
  with pytest.raises(ValueError, match="checkpoint.keep must be an integer >= 1"):
    Checkpointer(tmp_path, keep=keep)
