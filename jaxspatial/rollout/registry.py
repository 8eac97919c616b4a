"""The agents by name: each entry is everything one paper's agent is (grammar, observation
template, environment, system prompt and first prompts, reward on device, any host reward,
accuracy key, construction from a config). Adding an agent is one module and one line here.
"""

from __future__ import annotations

from jaxspatial.rollout.agents import Act3DAgent, Think3DAgent
from jaxspatial.rollout.peria_agent import PeriaAgent

AGENTS = {agent.name: agent for agent in (Think3DAgent, Act3DAgent, PeriaAgent)}


def make_agent(agent_config, max_turns: int, reward_weights=None):
  """The agent `agent_config.name` names, built from the config's `agent` block."""
  name = agent_config.name
  if name not in AGENTS:
    raise ValueError(f"config agent.name: expected one of {sorted(AGENTS)}, got {name!r}")
  return AGENTS[name].from_config(agent_config, max_turns, reward_weights)
