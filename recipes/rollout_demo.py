"""The rollout tools (launch/show_rollouts.py, launch/profile_rollout.py) on
configs/rollout_demo.py: `build` makes the policy, tokenizer, the agent's rollout
(automaton, observation template, settings), synthetic Act3D tasks and prompts and forced
scripts; `show` writes an HTML page of a batch of rollouts; `profile` reports what XLA
made of the compiled rollout."""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
from etils import epath
from flax import nnx

from data_pipelines.synthetic import episodes
from jaxspatial.envs import act3d
from jaxspatial import models
from jaxspatial.models import Precision, model_options
from jaxspatial.rollout import AgentRollout, agents, token_table as am, episode, observation, tiny
from jaxspatial.rollout import viewer
from jaxspatial.rollout.profile import profile_compiled


@dataclasses.dataclass
class RolloutSetup:
  tokenizer: object
  model: object      # a policy family's model (jaxspatial.models.policy)
  agent: object
  automaton: am.TokenAutomaton
  template: observation.ObservationTemplate
  config: episode.RolloutConfig
  tasks: object
  prompt_ids: jnp.ndarray
  prompt_mask: jnp.ndarray
  forced: jnp.ndarray | None


def build(c) -> RolloutSetup:
  if c.agent.name != "act3d":
    raise ValueError(f"rollout_setup: agent {c.agent.name!r} has no synthetic task source yet; "
                     "expected 'act3d'")
  chat = models.ChatFormat()
  if c.model.checkpoint:
    processor, model = models.load_policy(c.model.checkpoint, **model_options(c.model))
    tok = getattr(processor, "tokenizer", processor)
    chat = models.ChatFormat.from_folder(c.model.checkpoint, tok)
  else:
    tok = tiny.tokenizer()
    model = tiny.model(tok, c.model.family, c.seed,
                       **model_options(c.model))
  agent = agents.Act3DAgent(act3d.Act3DParams(width=c.agent.width, height=c.agent.height,
                                              grounding_min_pixels=5,
                                              max_interactions=c.rollout.max_turns - 1))
  run = AgentRollout.create(agent, tok, model, chat=chat,
                            cache_dtype=Precision.from_config(c.model).cache_dtype,
                            max_turns=c.rollout.max_turns,
                            max_turn_tokens=c.rollout.max_turn_tokens,
                            temperature=c.rollout.temperature,
                            constrained=c.rollout.constrained)
  tasks, questions = episodes.act3d_tasks(c.batch, seed=c.seed, points=c.data.points,
                                          scenes=c.data.scenes)
  ids, mask = episodes.act3d_prompts(tok, questions, run.image_tokens, chat.prefill)
  forced = None
  if c.scripted:  # scripted moves; the policy answers
    turns = [t[:-1] + [None] for t in tiny.scripted_act3d_turns(c.batch, c.rollout.max_turns)]
    forced = jnp.asarray(run.forced(turns))
  return RolloutSetup(tok, model, run.agent, run.automaton, run.template, run.config, tasks,
                      jnp.asarray(ids), jnp.asarray(mask), forced)


def show(c) -> epath.Path:
  """Runs `c.batch` compiled rollouts and writes `c.out`: each turn's text beside the view
  the agent saw, the parsed actions, the rewards."""
  s = build(c)
  rollout = episode.compile_rollout(s.agent, s.template, s.config)
  print(f"compiling and running {c.batch} rollouts (about 30 s on a 2-core CPU) ...",
        flush=True)
  start = time.perf_counter()
  trajectory = jax.block_until_ready(rollout(
      s.model, s.automaton, s.tasks, s.prompt_ids, s.prompt_mask, jax.random.PRNGKey(c.seed),
      s.forced))
  print(f"{c.batch} episodes in {time.perf_counter() - start:.1f} s (compilation included)")
  for name, value in trajectory.metrics().items():
    print(f"  {name}: {float(value):.3f}")
  page = viewer.trajectory_html(jax.device_get(trajectory), s.tokenizer, s.automaton.grammar,
                                title=f"{c.agent.name} rollouts, seed {c.seed}",
                                tasks=s.tasks, forced=s.forced)
  out = epath.Path(c.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(page)
  print(f"rollout viewer: {out}")
  return out


def profile(c) -> dict:
  """`profile_compiled` on the config's rollout, with ms per episode and tokens per second."""
  s = build(c)
  graphdef, state = nnx.split(s.model)

  def program(state, automaton, tasks, ids, mask, key, forced):
    model = nnx.merge(graphdef, state)
    return episode.rollout(model, s.agent, automaton, s.template, tasks, ids, mask, key,
                           s.config, None, forced)

  print(f"rollout: batch {c.batch}, {c.rollout.max_turns} turns x {c.rollout.max_turn_tokens} "
        "tokens")
  report, trajectory = profile_compiled(
      program, (state, s.automaton, s.tasks, s.prompt_ids, s.prompt_mask,
                jax.random.PRNGKey(c.seed), s.forced), repeats=c.repeats,
      trace_dir=c.trace_dir or None)
  best = report["run_s"]
  tokens = float(trajectory.loss_mask.sum())
  report["ms_per_episode"] = 1e3 * best / c.batch
  print(f"run: {best:.3f} s for {c.batch} episodes = {report['ms_per_episode']:.1f} ms per "
        f"episode, {tokens / best:.0f} generated tokens/s")
  return report
