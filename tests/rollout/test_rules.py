"""The episode rules (rollout/rules.py) against the rules written out case by case, on
numpy, under jit and from Python values (the three loops' ways of calling them); the agent
and judge contracts the loops read."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspatial.rollout import agents, contract, registry, rules

FLAGS = ("running", "valid", "answer", "last", "stopped", "invalid", "done")


def _spec(running, valid, answer, last, stopped, invalid, done, retries):
  """(answered, ended_badly, continuing, finishing, stepped) as WORKSPACE's Rollouts spell
  the rules, one case at a time."""
  if not running:
    return False, False, False, False, False
  if not valid:   # malformed: retried (env not stepped) or the episode ends badly
    retry = retries and stopped and not last
    return False, not retry, retry, not retry, False
  if answer:      # a well-formed answer ends the episode
    return True, False, False, True, True
  # a call: in the last turn, or refused for good (invalid and done), it ends badly
  bad = last or (invalid and done)
  going = not last and not done
  return False, bad, going, bad, True


def _table():
  return np.asarray(list(itertools.product((False, True), repeat=len(FLAGS))), bool).T


@pytest.mark.parametrize("retries", [False, True])
def test_the_rules_are_the_spec_on_numpy_under_jit_and_from_python_values(retries):
  columns = _table()  # [7, 128]: every combination

  def outcome(running, valid, answer, last, stopped, invalid, done):
    turn = rules.classify_turn(running, valid, answer, last, stopped, retries)
    result = rules.turn_outcome(turn, invalid, done, last)
    return (result.answered, result.ended_badly, result.continuing, result.finishing,
            rules.stepped(turn))

  on_numpy = np.stack(outcome(*columns))
  on_device = np.stack(jax.jit(outcome)(*map(jnp.asarray, columns)))
  expected = np.asarray([_spec(*case, retries) for case in columns.T]).T
  np.testing.assert_array_equal(on_numpy, expected)
  np.testing.assert_array_equal(on_device, expected)
  for case, want in zip(columns.T, expected.T):
    running, valid, answer, last, stopped, invalid, done = map(bool, case)
    if not running:
      continue
    turn = rules.host_turn(valid, answer, last, stopped, retries)
    got = rules.host_outcome(turn, invalid, done, last)
    assert all(type(v) is bool for v in got)
    assert (got.answered, got.ended_badly, got.continuing, got.finishing,
            rules.stepped(turn)) == tuple(want), case


def test_budget_keys_and_answer_kind():
  agent = agents.Act3DAgent()
  assert rules.max_turns(agent) == agent.max_calls + 1
  key = jax.random.PRNGKey(4)
  np.testing.assert_array_equal(rules.reset_keys(key, 3),
                                jax.random.split(jax.random.fold_in(key, 2 ** 20), 3))
  np.testing.assert_array_equal(
      rules.step_keys(key, 2, 3),
      jax.random.split(jax.random.fold_in(jax.random.fold_in(key, 2 ** 21), 2), 3))
  np.testing.assert_array_equal(rules.token_key(key, 1, 5),
                                jax.random.fold_in(jax.random.fold_in(key, 1), 5))
  assert rules.next_is_final(1, 3) and not rules.next_is_final(0, 3)
  grammar = agent.grammar
  values = np.zeros((2, len(grammar.fields)), np.float32)
  values[0, grammar.field_id("kind") - 1] = grammar.option("kind", b"<answer>")
  values[1, grammar.field_id("kind") - 1] = 1 - grammar.option("kind", b"<answer>")
  assert rules.answer_kind(values, grammar).tolist() == [True, False]
  assert rules.stopped_at_call(b"<think>x</think><tool_call>{}</tool_call>", grammar)


def test_every_registered_agent_is_the_contract_with_its_defaults():
  for cls in registry.AGENTS.values():
    assert issubclass(cls, contract.Agent), cls
    agent = cls()
    assert isinstance(agent.continue_on_format_error, bool)
    assert isinstance(agent.text_tokens, int) and isinstance(agent.prefill, str)
    assert rules.max_turns(agent) >= 1 and agent.grammar.stops
    assert dataclasses.is_dataclass(agent) and hash(agent) == hash(cls())  # static under jit
  act3d = agents.Act3DAgent()
  assert not act3d.continue_on_format_error and act3d.text_tokens == 0
  assert int(rules.observation_variant(act3d, True, False, True, None)) == 0
  ids, mask = act3d.observation_text(None)
  assert ids.shape == mask.shape == (0,)
  assert act3d.text_reward(["t"], "r", None, {}) is None
  assert act3d.host_rewards(None, None) is None
  assert agents.PeriaAgent().continue_on_format_error
  with pytest.raises(NotImplementedError, match="no host parse"):
    agents.PeriaAgent().host_fields(b"<think>x</think><answer>A</answer>")


def test_a_judge_declares_where_it_runs():
  class Host(contract.Judge):
    def __call__(self, question, answer, references):
      return np.ones(len(answer), bool)

  class Device(contract.DeviceJudge):
    pass

  assert not contract.on_device(lambda q, a, r: a[:, 0] >= 0)  # any callable: a host judge
  assert not contract.on_device(Host()) and not contract.on_device(None)
  assert contract.on_device(Device())
  from jaxspatial.perception import LLMJudge, PolicyJudge
  assert issubclass(LLMJudge, contract.Judge) and not LLMJudge.on_device
  assert issubclass(PolicyJudge, contract.DeviceJudge) and PolicyJudge.on_device
