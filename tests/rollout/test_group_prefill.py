"""Group-shared prompts (`rollout(group=G)`: GRPO's G samples of a prompt prefilled once,
the cache repeated to the group's rows) against the same repeated batch prefilled row by
row: the same trajectories and rewards for the same key, log-probabilities within float32
rounding, for the three policy families with image prompts."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspatial.envs import act3d
from jaxspatial.rollout import agents, episode
from tests.rollout.tiny_act3d import act3d_policy

PROMPTS, GROUP = 2, 3
AGENT = agents.Act3DAgent(act3d.Act3DParams(width=56, height=56, grounding_min_pixels=5,
                                            max_interactions=1))


def _rollouts(family, **settings):
  """(per-row, group-shared) trajectories of PROMPTS prompts x GROUP samples, one key."""
  p = act3d_policy(AGENT, family, 4, PROMPTS, 8)
  tok, model, automaton, template, tasks, ids, mask = (
      p.tok, p.model, p.automaton, p.template, p.tasks, p.ids, p.mask)
  repeat = lambda x: np.repeat(np.asarray(x), GROUP, axis=0)
  config = episode.RolloutConfig(max_turns=2, max_turn_tokens=32, pad_token=tok.pad_token_id,
                                 eos_tokens=(tok.convert_tokens_to_ids("<|im_end|>"),),
                                 **settings)
  inputs = (model, automaton, jax.tree.map(repeat, tasks), jnp.asarray(repeat(ids)),
            jnp.asarray(repeat(mask)), jax.random.PRNGKey(11))
  per_row = episode.compile_rollout(AGENT, template, config)(*inputs)
  shared = episode.compile_rollout(AGENT, template, config, group=GROUP)(*inputs)
  return jax.device_get(per_row), jax.device_get(shared)


def assert_same_trajectories(shared, per_row, group: int) -> None:
  """Every field equal, log-probabilities within float32 rounding: XLA's matmuls over P
  rows and over P x G may sum in different orders (about 2e-6 apart), never enough to
  change a sample here."""
  for field in dataclasses.fields(per_row):
    got, want = getattr(shared, field.name), getattr(per_row, field.name)
    if field.name == "logprobs":
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=field.name)
    else:
      jax.tree.map(lambda g, w, name=field.name: np.testing.assert_array_equal(g, w, name),
                   got, want)
  # The samples of a group went apart (the test compares sampling, not one path).
  tokens = per_row.tokens.reshape(-1, group, per_row.tokens.shape[-1])
  assert any(not np.array_equal(t[0], t[k]) for t in tokens for k in range(1, group))


# Two programs per family, about a minute on 2 cores: `make slow-tests`. `make test` runs
# the Qwen2.5-VL case (tests/rollout/test_episode.py).
@pytest.mark.slow
@pytest.mark.parametrize("family, settings", [
    ("qwen3_vl", dict(temperature=1.0, repetition_penalty=1.1)),
    ("qwen3_5", dict(temperature=0.7, top_k=20)),
])
def test_a_group_prefilled_once_equals_every_row_prefilled_for_each_family(family, settings):
  per_row, shared = _rollouts(family, **settings)
  assert_same_trajectories(shared, per_row, GROUP)


def test_rows_that_are_not_whole_groups_are_refused():
  p = act3d_policy(AGENT, "qwen2_5_vl", 4, 4, 8)
  tok, model, automaton, template, tasks, ids, mask = (
      p.tok, p.model, p.automaton, p.template, p.tasks, p.ids, p.mask)
  config = episode.RolloutConfig(max_turns=2, max_turn_tokens=16, pad_token=tok.pad_token_id)
  with pytest.raises(ValueError, match="4 rows are not whole groups of 3"):
    episode.rollout(model, AGENT, automaton, template, tasks, jnp.asarray(ids),
                    jnp.asarray(mask), jax.random.PRNGKey(0), config, group=3)
