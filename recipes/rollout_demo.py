"""The rollout tools' set-up (launch/show_rollouts.py, launch/profile_rollout.py) from
configs/rollout_demo.py: policy, tokenizer, the agent's rollout (automaton, observation
template, settings), synthetic Act3D tasks and prompts, forced scripts."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from flax import nnx

from data_pipelines.synthetic import episodes
from jaxspatial.envs import act3d
from jaxspatial.models import Precision, model_options
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.rollout import AgentRollout, agents, automaton as am, episode, observation, tiny


@dataclasses.dataclass
class RolloutSetup:
  tokenizer: object
  model: Qwen25VL
  agent: object
  automaton: am.TokenAutomaton
  template: observation.ObservationTemplate
  config: episode.RolloutConfig
  tasks: object
  prompt_ids: jnp.ndarray
  prompt_mask: jnp.ndarray
  forced: jnp.ndarray | None


def build(c) -> RolloutSetup:
  if c.agent != "act3d":
    raise ValueError(f"rollout_setup: agent {c.agent!r} has no synthetic task source yet; "
                     "expected 'act3d'")
  if c.checkpoint:
    from jaxspatial.models.qwen2_5_vl.tokenizer import load_processor  # pylint: disable=import-outside-toplevel
    processor = load_processor(c.checkpoint)
    tok = getattr(processor, "tokenizer", processor)
    model = Qwen25VL.from_pretrained(c.checkpoint, **model_options(c.model))
  else:
    tok = tiny.tokenizer()
    model = Qwen25VL(tiny.model_config(tok), rngs=nnx.Rngs(c.seed), **model_options(c.model))
  agent = agents.Act3DAgent(act3d.Act3DParams(width=c.width, height=c.height,
                                              grounding_min_pixels=5,
                                              max_interactions=c.max_turns - 1))
  run = AgentRollout.create(agent, tok, model,
                            cache_dtype=Precision.from_config(c.model).cache_dtype,
                            max_turns=c.max_turns, max_turn_tokens=c.max_turn_tokens,
                            temperature=c.temperature, constrained=c.constrained)
  tasks, questions = episodes.act3d_tasks(c.batch, seed=c.seed, points=c.points,
                                          scenes=c.scenes)
  ids, mask = episodes.act3d_prompts(tok, questions, run.image_tokens)
  forced = None
  if c.scripted:  # scripted moves; the policy answers
    turns = [t[:-1] + [None] for t in tiny.scripted_act3d_turns(c.batch, c.max_turns)]
    forced = jnp.asarray(run.forced(turns))
  return RolloutSetup(tok, model, agent, run.automaton, run.template, run.config, tasks,
                      jnp.asarray(ids), jnp.asarray(mask), forced)
