"""Teacher replay by segment (`rollout(replay=True)`: each forced turn one forward) against
the same turns forced one decode step at a time: equal tokens, masks, turn records,
observations and rewards, log-probabilities within float32 rounding, for the three policy
families with image observations."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspatial.envs import act3d
from jaxspatial.rollout import agents, episode
from tests.rollout.tiny_act3d import act3d_policy

BATCH = 4
AGENT = agents.Act3DAgent(act3d.Act3DParams(width=56, height=56, grounding_min_pixels=5,
                                            max_interactions=2))


def _call(action, distance=None):
  args = f'"action": "{action}"' + ("" if distance is None else f', "distance": {distance}')
  return ('<think>move</think><tool_call>{"name": "render_view_tool", "arguments": {' + args
          + '}}</tool_call>')


SCRIPTS = [
    [_call("turn_left", 60), _call("forward", 1.5), "<think>done</think><answer>red chair</answer>"],
    [_call("up"), "<think>x</think><answer></answer>"],            # empty answer: malformed
    ["<think>a</think><tool_call>{\"name\": oops}</tool_call>"],     # malformed call
    [_call("turn_right", 30), _call("backward", 2), _call("left")],  # a call in the last turn
]


def assert_replays_equal(by_segment, by_token) -> None:
  """Every trajectory field equal; log-probabilities within float32 rounding (one forward
  over a turn against one per token)."""
  for field in dataclasses.fields(by_token):
    name = field.name
    got, want = getattr(by_segment, name), getattr(by_token, name)
    if name == "logprobs":
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5, err_msg=name)
    else:
      jax.tree.map(lambda g, w, name=name: np.testing.assert_array_equal(g, w, err_msg=name),
                   got, want)
  assert np.all(by_token.logprobs[by_token.loss_mask] <= 0)


# Two programs per family, 55-85 s on 2 cores: `make slow-tests`. `make test` runs the
# Qwen2.5-VL case (tests/rollout/test_episode.py).
@pytest.mark.slow
@pytest.mark.parametrize("family, settings", [
    ("qwen2_5_vl", dict(repetition_penalty=1.3, top_k=20)),
    ("qwen3_vl", dict(constrained=True)),
    ("qwen3_5", dict(temperature=0.7)),
])
def test_segment_replay_equals_token_replay(family, settings):
  p = act3d_policy(AGENT, family, 2, BATCH, 5)
  tok, model, automaton, template, tasks, ids, mask = (
      p.tok, p.model, p.automaton, p.template, p.tasks, p.ids, p.mask)
  config = episode.RolloutConfig(max_turns=3, max_turn_tokens=40, pad_token=tok.pad_token_id,
                                 eos_tokens=(tok.convert_tokens_to_ids("<|im_end|>"),),
                                 **settings)
  forced = jnp.asarray(episode.forced_tokens(tok, SCRIPTS, config))
  inputs = (model, automaton, tasks, jnp.asarray(ids), jnp.asarray(mask),
            jax.random.PRNGKey(3), forced)
  by_token = jax.device_get(episode.compile_rollout(AGENT, template, config)(*inputs))
  by_segment = jax.device_get(episode.compile_rollout(AGENT, template, config,
                                                      replay=True)(*inputs))
  assert by_token.turn_active.sum() == 9  # three, two, one and three turns played
  assert_replays_equal(by_segment, by_token)
