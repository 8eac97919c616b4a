"""On-device multi-turn rollouts: grammar automata, the compiled episode loop, Trajectory."""

from jaxspatial.rollout import grammars, host_parse
from jaxspatial.rollout.agents import Act3DAgent, PeriaAgent, Think3DAgent
from jaxspatial.rollout.api_agent import api_rollout
from jaxspatial.rollout.automaton import Grammar
from jaxspatial.rollout.token_table import (TokenAutomaton, allowed_tokens, compile_token_automaton,
                                            token_bytes)
from jaxspatial.rollout.episode import (RolloutConfig, check_replay, check_turn_budget,
                                        compile_rollout, forced_tokens, image_tokens, rollout)
from jaxspatial.rollout.host_loop import host_rollout
from jaxspatial.rollout.observation import ObservationTemplate, compile_template
from jaxspatial.rollout.parse import ParsedTurn, parse_turn, walk_states
from jaxspatial.rollout.registry import AGENTS, make_agent
from jaxspatial.rollout.runner import AgentRollout
from jaxspatial.rollout.prompts import chat_prompt, left_padded, left_padded_views
from jaxspatial.rollout.trajectory import Trajectory
from jaxspatial.rollout.viewer import trajectory_html

__all__ = ["AGENTS", "Act3DAgent", "AgentRollout", "Grammar", "ObservationTemplate", "ParsedTurn", "PeriaAgent",
           "RolloutConfig", "Think3DAgent", "TokenAutomaton", "Trajectory", "allowed_tokens",
           "api_rollout", "chat_prompt", "check_replay", "check_turn_budget", "compile_rollout",
           "compile_template", "compile_token_automaton", "forced_tokens", "grammars",
           "host_parse", "host_rollout", "image_tokens", "left_padded", "left_padded_views", "make_agent",
           "parse_turn", "rollout", "token_bytes", "trajectory_html", "walk_states"]
