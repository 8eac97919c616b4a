"""The trainer is written against the policy interface: a Qwen3-VL and a Qwen3.5 policy
each take a full SFT step (its loss the numpy NLL of the model's own logits) and a LoRA GRPO
step (only the adapters move) through the same `train_step` as Qwen2.5-VL."""

import jax
import numpy as np
import pytest
from flax import nnx

from jaxspatial.models import apply_lora, linear_names
from jaxspatial.models.qwen3_5 import Qwen35, Qwen35Config
from jaxspatial.models.qwen3_vl import Qwen3VL, Qwen3VLConfig
from jaxspatial.rl.objectives import PolicyLossConfig
from jaxspatial.train import OptimizerConfig, StepConfig, make_optimizer, trainable, train_step
from jaxspatial.train.logprobs import token_logprobs
from tests.train.sharded_worker import batch, params


FAMILIES = {"qwen3_vl": (Qwen3VL, Qwen3VLConfig), "qwen3_5": (Qwen35, Qwen35Config)}


@pytest.fixture(scope="module", params=[pytest.param("qwen3_vl", marks=pytest.mark.slow),
                                        "qwen3_5"])
def family(request):
  # Vocabulary 256: image token 250, as the shared batch places it (one 56 x 56 view: a
  # 4 x 4 patch grid, 4 merged tokens).
  cls, config_class = FAMILIES[request.param]
  config = config_class.tiny(256)
  assert config.image_token_id == 250
  return cls, config


def test_a_full_sft_step_is_the_mean_nll_of_the_models_logits(family):
  cls, config = family
  model = cls(config, rngs=nnx.Rngs(0))
  data = batch(0)
  assert model.image_tokens(data.images.shape[2:4]) == 4
  pixels, grids, sequence_grids = model.vision_inputs(data.images)
  forward = nnx.jit(lambda m, t, a, p, s: m(t, a, p, grids, s))
  logits = np.asarray(forward(model, data.tokens, data.attention_mask, pixels, sequence_grids),
                      np.float64)
  logits -= logits.max(-1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  tokens, mask = np.asarray(data.tokens), np.asarray(data.loss_mask)
  nll = [-logp[b, j - 1, tokens[b, j]] for b in range(8) for j in range(1, 24) if mask[b, j]]
  ours = np.asarray(nnx.jit(token_logprobs)(model, data.tokens, data.attention_mask,
                                            data.images))
  np.testing.assert_allclose(ours[mask], -np.asarray(nll), rtol=1e-4)
  optimizer = make_optimizer(model, OptimizerConfig(learning_rate=1e-2, total_steps=10))
  before = params(model)
  metrics = train_step(model, optimizer, data, StepConfig(objective="sft"))
  np.testing.assert_allclose(float(metrics["loss"]), np.mean(nll), rtol=1e-4)
  assert bool(metrics["finite"])
  after = params(model)
  moved = jax.tree.map(lambda a, b: bool(np.any(a != b)), before, after)
  # Every part trains: the learned vision positions, Qwen3-VL's DeepStack mergers, Qwen3.5's
  # gated attention and every Gated DeltaNet parameter (convolution, gates, gated norm).
  assert moved["visual"]["pos_embed"]["embedding"]
  layers = moved["language_model"]["layers"]
  if cls is Qwen3VL:
    assert moved["visual"]["deepstack_merger_list"][0]["linear_fc1"]["kernel"]
    assert layers[0]["self_attn"]["q_norm"]["weight"]
  else:
    assert all(jax.tree.leaves(layers[0]["linear_attn"])), layers[0]["linear_attn"]
    assert all(jax.tree.leaves(layers[3]["self_attn"])), layers[3]["self_attn"]


def test_a_lora_grpo_step_moves_only_the_adapters(family):
  cls, config = family
  model = cls(config, rngs=nnx.Rngs(1))
  targets = linear_names(model.language_model)
  assert {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
          "down_proj"} <= set(targets)
  if cls is Qwen35:  # the linear-attention projections are LoRA targets too
    assert {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"} <= set(targets)
  apply_lora(model.language_model, targets, 4, 8.0, rngs=nnx.Rngs(2))
  base = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Not(nnx.LoRAParam))))
  adapters = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.LoRAParam)))
  wrt = trainable(adapters_only=True)
  optimizer = make_optimizer(model, OptimizerConfig(learning_rate=1e-2, total_steps=10), wrt)
  step = StepConfig(objective="grpo", loss=PolicyLossConfig(beta=0.0, aggregation="token-mean"))
  metrics = train_step(model, optimizer, batch(1), step)
  assert bool(metrics["finite"]) and np.isfinite(float(metrics["loss"]))
  jax.tree.map(np.testing.assert_array_equal, base,
               jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Not(nnx.LoRAParam)))))
  after = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.LoRAParam)))
  changed = jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.any(a != b)), adapters, after))
  assert changed and any(changed)
