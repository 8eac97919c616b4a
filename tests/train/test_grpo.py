"""Advantages after a rollout: GRPO and RLOO per episode; OR-GIGPO per turn, each generated
token taking its turn's advantage, against a numpy implementation of the paper's equations;
the estimator registry."""

import types

import jax.numpy as jnp
import numpy as np
import pytest

from jaxspatial.train import AdvantageConfig, grpo


def _normalise(x, ddof=1, eps=1e-6):
  x = np.asarray(x, np.float64)
  if len(x) < 2:
    return np.zeros_like(x)
  return (x - x.mean()) / (x.std(ddof=ddof) + eps)


def _trajectory():
  # 2 prompts x 3 episodes, 2 turns of 3 decode slots; slots: 2 prompt, turn 0 at 2..4,
  # an observation at 5..6, turn 1 at 7..9.
  b, s = 6, 10
  loss = np.zeros((b, s), bool)
  loss[:, 2:5] = True
  active = np.asarray([[1, 1], [1, 0], [1, 1], [1, 1], [1, 1], [1, 0]], bool)
  loss[active[:, 1], 7:10] = True
  loss[0, 9] = False  # turn 1 of episode 0 stopped after 2 tokens
  hashes = np.asarray([[0, 5, 7], [0, 5, 0], [0, 6, 8], [0, 1, 2], [0, 1, 3], [0, 4, 0]],
                      np.uint32)
  return types.SimpleNamespace(tokens=jnp.zeros((b, s), jnp.int32), loss_mask=jnp.asarray(loss),
                               turn_start=jnp.asarray([2, 7]), turn_end=jnp.asarray([5, 10]),
                               turn_active=jnp.asarray(active),
                               observation_hashes=jnp.asarray(hashes))


def test_token_turns_marks_generated_slots_with_their_turn():
  turns = np.asarray(grpo.token_turns(_trajectory()))
  np.testing.assert_array_equal(turns[0], [-1, -1, 0, 0, 0, -1, -1, 1, 1, -1])
  np.testing.assert_array_equal(turns[1], [-1, -1, 0, 0, 0, -1, -1, -1, -1, -1])


def test_grpo_and_or_gigpo_advantages_against_numpy():
  traj = _trajectory()
  rewards = np.asarray([1.0, 0.0, 2.0, 0.5, 1.5, 0.0], np.float32)
  got = np.asarray(grpo.advantages(traj, jnp.asarray(rewards), AdvantageConfig(group_size=3)))
  np.testing.assert_allclose(got, np.concatenate([_normalise(rewards[:3]),
                                                  _normalise(rewards[3:])]), rtol=1e-5)
  config = AdvantageConfig(estimator="or_gigpo", group_size=3, gamma=0.9, omega=0.5)
  got = np.asarray(grpo.advantages(traj, jnp.asarray(rewards), config))
  active = np.asarray(traj.turn_active)
  hashes = np.asarray(traj.observation_hashes)[:, 1:]
  expected_step = np.zeros((6, 2))
  for p in range(2):
    rows = range(3 * p, 3 * p + 3)
    episode = _normalise(rewards[3 * p:3 * p + 3])
    # outcome reward on the last turn, discounted back: R_t = gamma^(last - t) R
    returns = {(i, t): 0.9 ** (active[i].sum() - 1 - t) * rewards[i]
               for i in rows for t in range(2) if active[i, t]}
    for (i, t), value in returns.items():
      group = [returns[j, u] for (j, u) in returns if hashes[j, u] == hashes[i, t]]
      step = _normalise(group)[group.index(value)] if len(group) > 1 else 0.0
      expected_step[i, t] = episode[i - 3 * p] + 0.5 * step
  turns = np.asarray(grpo.token_turns(traj))
  expected = np.where(turns >= 0, np.take_along_axis(expected_step, np.maximum(turns, 0), 1), 0)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
  # Episodes 3 and 4 share their first observation (hash 1): a step group of two.
  assert got[3, 2] != pytest.approx(_normalise(rewards[3:])[0])
  with pytest.raises(ValueError, match="not a multiple of group_size"):
    grpo.advantages(traj, jnp.asarray(rewards[:5]), config)


def test_per_token_advantages_weight_each_token():
  """[B, S] advantages (OR-GIGPO) in the GRPO loss: a row's constant equals the [B] form,
  and zeroing one turn's tokens changes the gradient only through those tokens."""
  from flax import nnx

  from jaxspatial.models.qwen2_5_vl import Qwen25VL
  from jaxspatial.train import StepConfig
  from jaxspatial.train.steps import loss_parts
  from tests.train.sharded_worker import CONFIG, batch

  model = Qwen25VL(CONFIG, rngs=nnx.Rngs(0))
  data = batch(1)
  loss = nnx.jit(lambda m, d: loss_parts(m, d, StepConfig(objective="grpo"))[0])
  per_row = loss(model, data)
  spread = jnp.broadcast_to(data.advantages[:, None], data.tokens.shape)
  per_token = loss(model, data.replace(advantages=spread))
  np.testing.assert_allclose(float(per_row), float(per_token), rtol=1e-6)
  half = spread * (jnp.arange(data.tokens.shape[1]) < data.tokens.shape[1] // 2)
  partial = loss(model, data.replace(advantages=half))
  assert not np.isclose(float(partial), float(per_row))


@pytest.mark.slow
def test_update_runs_epochs_times_mini_batches_optimizer_steps():
  import optax
  from flax import nnx

  from jaxspatial.models.qwen2_5_vl import Qwen25VL
  from jaxspatial.models.sharding import make_mesh
  from jaxspatial.train import StepConfig
  from tests.train.sharded_worker import CONFIG, batch

  model = Qwen25VL(CONFIG, rngs=nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.sgd(1e-3), wrt=nnx.Param)
  metrics = grpo.update(model, optimizer, batch(1), StepConfig(objective="grpo"), make_mesh(),
                        mini_batches=2, epochs=3)
  assert int(optimizer.step[...]) == 6 and bool(metrics["finite"])
  with pytest.raises(ValueError, match="does not split into 3 mini-batches"):
    grpo.update(model, optimizer, batch(1), StepConfig(objective="grpo"), make_mesh(),
                mini_batches=3)


def test_rloo_from_a_config_and_the_estimator_registry():
  traj = _trajectory()
  rewards = np.asarray([1.0, 0.0, 2.0, 0.5, 1.5, 0.0], np.float32)
  config = AdvantageConfig(**dict(estimator="rloo", group_size=3))  # a config's advantage block
  got = np.asarray(grpo.advantages(traj, jnp.asarray(rewards), config))
  groups = rewards.reshape(2, 3).astype(np.float64)
  expected = np.stack([[g[i] - np.delete(g, i).mean() for i in range(3)] for g in groups])
  np.testing.assert_allclose(got, expected.reshape(-1), rtol=1e-6)
  with pytest.raises(ValueError, match=r"AdvantageConfig.estimator: expected one of "
                                       r"\['grpo', 'or_gigpo', 'rloo'.*got 'ppo'"):
    AdvantageConfig(estimator="ppo")
  # A recipe's own estimator: registered once, reachable by name, never overwritten.
  @grpo.register_advantage_estimator("test_best_of_group")
  def best(trajectory, rewards_PxG, config):  # pylint: disable=unused-argument
    return (rewards_PxG == rewards_PxG.max(-1, keepdims=True)).astype(jnp.float32).reshape(-1)
  try:
    got = grpo.advantages(traj, jnp.asarray(rewards),
                          AdvantageConfig(estimator="test_best_of_group", group_size=3))
    np.testing.assert_array_equal(np.asarray(got), [0, 0, 1, 0, 1, 0])
    with pytest.raises(ValueError, match="already registered"):
      grpo.register_advantage_estimator("rloo")(best)
  finally:
    del grpo.ESTIMATORS["test_best_of_group"]
