"""The KL term's reference policy: a frozen copy keeps the policy it copied while the
policy trains; "lora_disabled" is the base model under the adapters; and a saved copy
restores exactly."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspatial.models import apply_lora
from jaxspatial.models.qwen2_5_vl import Qwen25VL
from jaxspatial.rl.objectives import PolicyLossConfig
from jaxspatial.train import (Checkpointer, OptimizerConfig, ReferencePolicy, StepConfig,
                              make_optimizer, token_logprobs, train_step)
from tests.train.sharded_worker import CONFIG, batch


def _logprobs(model, data):
  return np.asarray(token_logprobs(model, data.tokens, data.attention_mask, data.images))


@pytest.mark.slow
def test_frozen_reference_is_the_policy_when_copied(tmp_path):
  model = Qwen25VL(CONFIG, rngs=nnx.Rngs(0))
  optimizer = make_optimizer(model, OptimizerConfig(learning_rate=1e-2, total_steps=10))
  data = batch(0)
  before = _logprobs(model, data)
  reference = ReferencePolicy.create("frozen", model)
  np.testing.assert_allclose(np.asarray(reference.logprobs(model, data)), before, atol=2e-5)
  loss = PolicyLossConfig(beta=0.04, aggregation="sequence-mean-token-mean")
  config = StepConfig(objective="grpo", loss=loss)
  first = train_step(model, optimizer, data.replace(
      old_logprobs=jnp.asarray(before), ref_logprobs=reference.logprobs(model, data)), config)
  assert float(first["kl"]) == pytest.approx(0.0, abs=1e-7)  # policy == reference
  train_step(model, optimizer, data.replace(old_logprobs=jnp.asarray(before)), config)
  after = _logprobs(model, data)
  assert np.abs(after - before).max() > 1e-3  # the policy moved ...
  ref = reference.logprobs(model, data)
  np.testing.assert_allclose(np.asarray(ref), before, atol=2e-5)  # ... the reference did not
  second = train_step(model, optimizer, data.replace(old_logprobs=jnp.asarray(after),
                                                     ref_logprobs=ref), config)
  assert float(second["kl"]) > 1e-6
  # Saved once beside the checkpoints, it restores exactly.
  checkpointer = Checkpointer(tmp_path)
  checkpointer.save_reference(reference.params)
  restored = checkpointer.restore_reference(reference.params)
  np.testing.assert_array_equal(
      np.asarray(restored["language_model"]["norm"]["weight"]),
      np.asarray(reference.params["language_model"]["norm"]["weight"]))
  assert Checkpointer(tmp_path / "elsewhere").restore_reference(reference.params) is None


@pytest.mark.slow
def test_lora_disabled_reference_is_the_base_model():
  model = Qwen25VL(CONFIG, rngs=nnx.Rngs(0))
  data = batch(0)
  base = _logprobs(model, data)
  with pytest.raises(ValueError, match="has no LoRA adapters"):
    ReferencePolicy.create("lora_disabled", model)
  apply_lora(model, ("q_proj", "v_proj"), rank=4, alpha=8.0, rngs=nnx.Rngs(1))
  for path, value in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)):
    if path[-1] == "lora_b":  # trained adapters: B no longer zero
      value.set_value(jnp.full(value[...].shape, 0.05, value[...].dtype))
  adapted = _logprobs(model, data)
  assert np.abs(adapted - base).max() > 1e-3
  reference = ReferencePolicy.create("lora_disabled", model)
  np.testing.assert_allclose(np.asarray(reference.logprobs(model, data)), base, atol=1e-5)
  np.testing.assert_allclose(_logprobs(model, data), adapted)  # the policy is untouched
  with pytest.raises(ValueError, match="kind must be one of"):
    ReferencePolicy.create("ema", model)
