"""The rollout's log-probabilities as the update's old ones (`Phase.old_logprobs`
"rollout"): on an on-policy update they give the GRPO loss and gradient of the recompute
path (a forward over the batch before the update) within float32 rounding; where they are
not the policy's own, the phase refuses them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from data_pipelines.synthetic import episodes
from jaxspatial.envs import act3d
from jaxspatial.rl.objectives import PolicyLossConfig
from jaxspatial.rollout import agents, episode, observation, tiny
from jaxspatial.rollout import token_table as am
from jaxspatial.train import AdvantageConfig, OptimizerConfig, Phase, StepConfig, TrainBatch
from jaxspatial.train.steps import batch_logprobs, loss_parts

AGENT = agents.Act3DAgent(act3d.Act3DParams(width=56, height=56, grounding_min_pixels=5,
                                            max_interactions=1))


def test_rollout_logprobs_give_the_recomputed_loss_and_gradient():
  tok = tiny.tokenizer()
  model = tiny.model(tok, "qwen2_5_vl", seed=6)
  automaton = am.compile_token_automaton(AGENT.grammar, tok, model.config.text.vocab_size)
  n_image = episode.image_tokens(model, AGENT.image_size)
  template = observation.compile_template(tok, AGENT.observation, n_image)
  tasks, questions = episodes.act3d_tasks(4, seed=2)
  ids, mask = episodes.act3d_prompts(tok, questions, n_image)
  config = episode.RolloutConfig(max_turns=2, max_turn_tokens=24, temperature=0.8,
                                 pad_token=tok.pad_token_id,
                                 eos_tokens=(tok.convert_tokens_to_ids("<|im_end|>"),))
  assert not episode.reshaped_by(config)
  traj = episode.compile_rollout(AGENT, template, config)(
      model, automaton, tasks, jnp.asarray(ids), jnp.asarray(mask), jax.random.PRNGKey(4))
  batch = TrainBatch.from_trajectory(traj, advantages=jnp.asarray([1.0, -1.0, 0.5, -0.5]))
  assert int(batch.loss_mask.sum()) > 40
  step = StepConfig(objective="grpo", temperature=0.8,
                    loss=PolicyLossConfig(epsilon_low=0.2, epsilon_high=0.28,
                                          aggregation="token-mean"))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  @jax.jit
  def loss_and_grad(params, batch):
    def loss(params):
      total, (denominator, _) = loss_parts(nnx.merge(graphdef, params, rest), batch, step)
      return total / denominator
    return jax.value_and_grad(loss)(params)

  recomputed = batch.replace(old_logprobs=jax.jit(batch_logprobs, static_argnums=2)(
      model, batch, 0.8))
  want_loss, want_grad = loss_and_grad(params, recomputed)
  got_loss, got_grad = loss_and_grad(params, batch.replace(old_logprobs=traj.logprobs))
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5, atol=1e-6)
  for got, want in zip(jax.tree.leaves(got_grad), jax.tree.leaves(want_grad)):
    scale = float(jnp.max(jnp.abs(want))) + 1e-12
    np.testing.assert_allclose(got / scale, want / scale, atol=1e-4)
  assert any(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(want_grad))


def test_rollout_logprobs_need_an_on_policy_update():
  rl = dict(name="rl", steps=2, optimizer=OptimizerConfig(), step=StepConfig(objective="grpo"),
            advantage=AdvantageConfig(group_size=2), old_logprobs="rollout")
  with pytest.raises(ValueError, match="one epoch, one mini-batch.*1 epochs x 2 mini-batches"):
    Phase(**rl, mini_batches=2)
  with pytest.raises(ValueError, match="'recompute' or 'rollout', got 'cached'"):
    Phase(**{**rl, "old_logprobs": "cached"})
  assert episode.reshaped_by(episode.RolloutConfig(repetition_penalty=1.1, top_k=20)) == (
      "repetition_penalty 1.1", "top_k 20")
