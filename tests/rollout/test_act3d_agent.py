"""Act3D's reward on device (eqs. 8-9) from an episode's answer bytes, against the paper's
formula written out here in numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from data_pipelines.synthetic import episodes
from jaxspatial.envs import act3d
from jaxspatial.rl.rewards.papers import Act3DRewardConfig
from jaxspatial.rollout import agents

ANSWER_BYTES = 64


def paper_reward(judge, em, malformed, interactions, grounded):
  """R = 0.3 R_judge + 0.2 R_EM + 0.05 R_judge c - 0.2 R_fmt, c = 12 when grounded else
  min(n_int, 12) (Act3D eqs. 8-9, section 4.1's coefficients)."""
  credit = 12 if grounded else min(interactions, 12)
  return 0.3 * judge + 0.2 * em + 0.05 * judge * credit - 0.2 * malformed


def _bytes(text, length=ANSWER_BYTES):
  out = np.full(length, -1, np.int32)
  data = list(text.encode())
  out[:len(data)] = data
  return jnp.asarray(out)


@pytest.fixture(scope="module")
def task_and_state():
  tasks, _ = episodes.act3d_tasks(1, seed=2, points=4000)
  task = jax.tree.map(lambda x: jnp.asarray(x[0]), tasks)
  refs = np.full((3, 32), -1, np.int32)
  for row, text in enumerate(["sofa", "the brown couch"]):  # two annotated answers
    refs[row, :len(text)] = list(text.encode())
  task = task.replace(answer_ids=jnp.asarray(refs))
  _, state = act3d.reset(jax.random.PRNGKey(0), task, agents.Act3DAgent().params)
  return task, state.replace(num_interactions=jnp.asarray(3, jnp.int32),
                             objects_seen=jnp.zeros_like(state.objects_seen))


@pytest.mark.parametrize("answer, answered, expected", [
    # R_EM counts a match with any annotated answer (the second here, normalised).
    ("Brown couch", True, dict(judge=1, em=1, malformed=0)),
    ("sofa", True, dict(judge=1, em=1, malformed=0)),
    ("a red lamp", True, dict(judge=0, em=0, malformed=0)),
    # A missing or empty answer is the paper's malformed output.
    ("", True, dict(judge=0, em=0, malformed=1)),
    ("  \n ", True, dict(judge=0, em=0, malformed=1)),
    # A non-empty answer in a turn that slipped from our grammar is still an answer.
    ("sofa", False, dict(judge=1, em=1, malformed=0)),
])
@pytest.mark.slow
def test_reward_against_the_papers_formula(task_and_state, answer, answered, expected):
  task, state = task_and_state
  agent = agents.Act3DAgent()
  reward, parts = agent.reward(state, task, _bytes(answer), jnp.asarray(answered),
                               jnp.asarray(not answered))
  assert float(parts["judge"]) == expected["judge"]
  assert float(parts["exact_match"]) == expected["em"]
  assert float(parts["malformed"]) == expected["malformed"]
  assert float(reward) == pytest.approx(paper_reward(**expected, interactions=3,
                                                     grounded=False))


def test_grammar_rule_counts_only_well_formed_answers(task_and_state):
  task, state = task_and_state
  agent = agents.Act3DAgent(reward_config=Act3DRewardConfig(format_rule="grammar"))
  reward, parts = agent.reward(state, task, _bytes("sofa"), jnp.asarray(False),
                               jnp.asarray(True))
  assert float(parts["malformed"]) == 1 and float(parts["judge"]) == 0
  assert float(reward) == pytest.approx(-0.2)


def test_a_host_verdict_needs_an_answer(task_and_state):
  """A judge that says yes earns nothing for an episode without an answer."""
  task, state = task_and_state
  agent = agents.Act3DAgent()
  reward, parts = agent.reward(state, task, _bytes(""), jnp.asarray(False), jnp.asarray(True),
                               jnp.asarray(True))
  assert float(parts["judge"]) == 0 and float(reward) == pytest.approx(-0.2)
  reward, parts = agent.reward(state, task, _bytes("some answer"), jnp.asarray(True),
                               jnp.asarray(False), jnp.asarray(True))
  assert float(parts["judge"]) == 1
  assert float(reward) == pytest.approx(paper_reward(1, 0, 0, 3, False))


def test_grounding_all_or_any_answer_object(task_and_state):
  task, state = task_and_state
  task = task.replace(answer_objects=jnp.asarray([0, 1, -1, -1], jnp.int32))
  seen = jnp.zeros_like(state.objects_seen).at[0].set(True)  # one of the two objects seen
  state = state.replace(objects_seen=seen)
  for rule, grounded in (("all", False), ("any", True)):
    agent = agents.Act3DAgent(reward_config=Act3DRewardConfig(grounding=rule))
    reward, parts = agent.reward(state, task, _bytes("sofa"), jnp.asarray(True),
                                 jnp.asarray(False))
    assert float(parts["grounded"]) == grounded
    assert float(reward) == pytest.approx(paper_reward(1, 1, 0, 3, grounded))
