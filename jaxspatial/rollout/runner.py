"""An agent's compiled rollout with everything it needs: the token automaton of its grammar,
its observation template, the rollout settings and its first prompts.

    run = AgentRollout.create(agent, tokenizer, model, max_turns=4, max_turn_tokens=64)
    trajectory = run(model, tasks, key)                  # first prompts built from the tasks
    trajectory = run(model, tasks, key, forced=run.forced(scripts))   # scripted turns
    trajectory = run(model, tasks, key, forced=run.forced(scripts), replay=True)  # teacher
    trajectory = run(model, repeated_tasks, key, group=8)   # GRPO: each prompt prefilled once
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxspatial.models.chat import ChatFormat
from jaxspatial.rollout import token_table as am
from jaxspatial.rollout import episode, observation, rules
from jaxspatial.rollout.contract import on_device
from jaxspatial.models.sharding import global_batch


@dataclasses.dataclass
class AgentRollout:
  agent: Any
  tokenizer: Any
  automaton: am.TokenAutomaton
  template: observation.ObservationTemplate
  config: episode.RolloutConfig
  image_tokens: int
  prompt_tokens: int | None = None   # first prompts left-padded to this length
  # Judges (LLM judges through `jaxspatial.perception.judge` on the host, or a
  # `perception.PolicyJudge` on device; None: the agent's rule judge on device): of the
  # sampled rollouts, and of greedy evaluation (default: judge).
  judge: Any = None
  eval_judge: Any = None

  @classmethod
  def create(cls, agent, tokenizer, model, prompt_tokens: int | None = None,
             cache_dtype: str = "float32", chat: ChatFormat | None = None,
             judge=None, eval_judge=None, **settings) -> "AgentRollout":
    """`settings` are `RolloutConfig` fields (max_turns, temperature, ...); the pad token
    comes from the tokenizer. `chat` (default: Qwen's instruct layout) is the policy's chat
    format: its prefill opens every reply (the agent's `prefill`), its stop tokens end a
    turn."""
    chat = chat or ChatFormat()
    if agent.prefill != chat.prefill:
      agent = dataclasses.replace(agent, prefill=chat.prefill)
    config = episode.RolloutConfig(
        eos_tokens=chat.stop_ids(tokenizer), pad_token=tokenizer.pad_token_id
        if tokenizer.pad_token_id is not None else 0, cache_dtype=cache_dtype, **settings)
    image_tokens = episode.image_tokens(model, agent.image_size)
    automaton = am.compile_token_automaton(agent.grammar, tokenizer,
                                           model.config.text.vocab_size)
    # At setup, not at the first rollout: a budget below the grammar's shortest turn would
    # otherwise surface only once the trainer has compiled and sampled.
    episode.check_turn_budget(agent, config, automaton)
    template = observation.compile_template(tokenizer, agent.observation, image_tokens,
                                            text_tokens=agent.text_tokens)
    return cls(agent, tokenizer, automaton, template, config, image_tokens, prompt_tokens,
               judge, eval_judge)

  def prompts(self, tasks) -> tuple[np.ndarray, np.ndarray]:
    return self.agent.first_prompts(self.tokenizer, tasks, self.image_tokens,
                                    self.prompt_tokens)

  def capacity(self, prompt_length: int | None = None) -> int:
    """Slots of an episode (prompt, turns, observations)."""
    return episode.capacity(prompt_length or self.prompt_tokens, self.template, self.config)

  def forced(self, scripts) -> np.ndarray:
    """[B, turns, tokens] forced tokens from per-episode lists of turn strings (written
    whole, `<think>...`: the part the prompt's prefill already holds is dropped)."""
    chat = ChatFormat(prefill=self.agent.prefill)
    scripts = [[None if turn is None else chat.generated(turn) for turn in turns]
               for turns in scripts]
    return episode.forced_tokens(self.tokenizer, scripts, self.config)

  def __call__(self, model, tasks, key, forced=None, prompt_ids=None, prompt_mask=None,
               temperature: float | None = None, mesh=None, evaluation: bool = False,
               judged: bool = True, replay: bool = False, group: int = 1):
    """Compiled rollouts of `tasks` (this process's rows: with `mesh`, one global batch over
    ('data', 'fsdp')). Prompts are built from the tasks unless given. `evaluation`: judged
    by `eval_judge`; `judged=False`: by the agent's rule judge (no host judge requests:
    replays whose reward is unused). `replay`: every turn is forced whole (teacher SFT) and
    written as one segment per turn instead of one decode step per token. `group`: each
    `group` consecutive rows repeat one task (GRPO's groups), whose prompt is prefilled once.
    `key`: one for the batch, or [B, 2] one per row (`rules.row_keys`)."""
    if prompt_ids is None:
      prompt_ids, prompt_mask = self.prompts(tasks)
    config = self.config if temperature is None else dataclasses.replace(
        self.config, temperature=temperature)
    judge = None if not judged else (self.eval_judge or self.judge) if evaluation else self.judge
    run = episode.compile_rollout(self.agent, self.template, config, judge, replay, group)
    # An on-device judge (a jaxspatial policy) is an argument of the program, not a constant.
    judge_state = judge.state() if on_device(judge) else None
    rows = rules.per_row(jnp.asarray(key))  # one key a row: split with the rows
    inputs = (tasks, prompt_ids, prompt_mask, key if rows else None, forced)
    if mesh is not None:
      inputs = global_batch(inputs, mesh)
      with jax.set_mesh(mesh):
        return run(model, self.automaton, *inputs[:3], inputs[3] if rows else key, inputs[4],
                   judge_state)
    inputs = jax.tree.map(jnp.asarray, inputs)
    return run(model, self.automaton, *inputs[:3], inputs[3] if rows else key, inputs[4],
               judge_state)
