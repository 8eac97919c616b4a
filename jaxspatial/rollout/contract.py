"""The agent and judge contracts: every member the episode loops (the compiled `episode`,
the host `host_loop`, the API `api_agent`) read, declared once with the optional ones'
defaults, in the manner of gymnax's `Environment`. The loops never probe an agent with
`getattr` nor test its name: a member they need is here, and an agent overrides it.

An agent is a frozen dataclass (static under jit) subclassing `Agent`; its functions act on
one episode and the compiled loop vmaps them.

  required                              (an agent must define)
  name, accuracy_key, input_views       class constants: the registry key, the reward
                                        component that is "correct", whether the first
                                        prompt holds the task's input views
  grammar                               the turn grammar (after the prefill)
  image_size                            (H, W) of every view
  max_calls                             the tool-call budget: max_turns = max_calls + 1
  observation                           the message template after a call (a string, or a
                                        tuple of variants picked by `observation_variant`)
  prefill                               the chat template's reply opening
  first_prompts(tokenizer, tasks, image_tokens, length) -> (ids, mask)
  reset(key, task)                      -> (images [N, H, W, 3] or image, numbers, env_state)
  step(key, env_state, parsed, answered) -> (image, numbers, env_state, invalid, done)
  reward(env_state, task, answer, answered, malformed, judge) -> (reward, components)

  optional                              (defaults here)
  continue_on_format_error    False     a malformed turn that stopped at the call's closing
                                        tag gets a format-error message and the episode goes
                                        on (the environment is not stepped)
  observation_variant(...)    0         the message variant an episode shows after a turn
  text_tokens                 0         width of the observation's `{text}` slot (a host
                                        tool's tokenised result: PERIA's perception tools)
  observation_text(env_state)           that slot's (ids [text_tokens], mask)
  judge_asks(task, answer, answered)    whether a host judge is asked (default: answered)
  host_rewards(rows, tokenizer, tasks)  None  rewards that need the model's text (trainer)
  text_reward(replies, response, task, components)  None  an API episode's host reward
  host_fields(turn)                     the host regex parse of a turn (host loop only)
  host_text_reward(final_turn, answered, task, env_state)  the string-rule reward (host
                                        loop only)
"""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

import jax.numpy as jnp
import numpy as np


class Agent:
  """Base of every agent: the loops' contract, with the optional members' defaults."""

  name: ClassVar[str]
  accuracy_key: ClassVar[str]
  input_views: ClassVar[bool]
  prefill: str   # the chat template's reply opening (a dataclass field of each agent)
  # Optional members (an agent dataclass may redeclare them as fields or properties).
  continue_on_format_error = False
  text_tokens = 0

  # --- required ------------------------------------------------------------------------

  @property
  def grammar(self):
    raise NotImplementedError(f"{type(self).__name__}.grammar")

  @property
  def image_size(self) -> tuple[int, int]:
    raise NotImplementedError(f"{type(self).__name__}.image_size")

  @property
  def max_calls(self) -> int:
    raise NotImplementedError(f"{type(self).__name__}.max_calls")

  @property
  def observation(self) -> str | tuple[str, ...]:
    raise NotImplementedError(f"{type(self).__name__}.observation")

  def first_prompts(self, tokenizer, tasks, image_tokens: int, length: int | None = None):
    raise NotImplementedError(f"{type(self).__name__}.first_prompts")

  def reset(self, key, task):
    raise NotImplementedError(f"{type(self).__name__}.reset")

  def step(self, key, state, parsed, answered):
    raise NotImplementedError(f"{type(self).__name__}.step")

  def reward(self, state, task, answer_bytes, answered, malformed, judge=None):
    raise NotImplementedError(f"{type(self).__name__}.reward")

  # --- optional ------------------------------------------------------------------------

  def observation_variant(self, invalid, format_error, next_is_final, env_state=None):
    """The template variant shown after this turn (one episode): the only one by default."""
    del invalid, format_error, next_is_final, env_state
    return jnp.zeros((), jnp.int32)

  def observation_text(self, env_state):
    """(ids [text_tokens], mask) of the observation's `{text}` slot after a step."""
    del env_state
    return jnp.zeros(self.text_tokens, jnp.int32), jnp.zeros(self.text_tokens, bool)

  def judge_asks(self, task, answer_bytes, answered):
    """Whether a host judge is asked about this episode's answer (the others reach it
    blank, which it answers without a request): every answer by default."""
    del task, answer_bytes
    return answered

  def host_rewards(self, rows, tokenizer, tasks=None):
    """Rewards that need the model's text ([B] numpy) from trajectory rows, or None: the
    device's reward is the reward."""
    del rows, tokenizer, tasks
    return None

  def text_reward(self, replies: Sequence[str], response: str, task, components: dict
                  ) -> float | None:
    """An API episode's host reward from its text (`replies`: each turn as parsed;
    `response`: the whole response as a reward manager decodes it; `task`: the episode's
    task as numpy; `components`: its device reward components), or None: none."""
    del replies, response, task, components
    return None

  def host_fields(self, turn: bytes) -> tuple[np.ndarray, np.ndarray, bool] | None:
    """The host loop's regex parse of a turn's text (prefill not included): the grammar's
    (values, present) and whether it answers, or None for a malformed turn."""
    del turn
    raise NotImplementedError(f"host_rollout: {type(self).__name__} has no host parse")

  def host_text_reward(self, final_turn: str, answered: bool, task, env_state) -> float:
    """The host loop's reward from string rules: the episode's final turn (an answer or
    the turn that ended it badly), the task and the final state as numpy."""
    del final_turn, answered, task, env_state
    raise NotImplementedError(f"host_rollout: {type(self).__name__} has no string reward")


class Judge:
  """Base of the rollout's judges: `judge(question [B, Lq], answer [B, A], references
  [B, R, La]) -> bool [B]` on -1-padded byte ids, called on the host (`io_callback`).
  Any such callable is a host judge; a class subclasses this to declare what it is."""

  on_device: ClassVar[bool] = False

  def __call__(self, question_BxLq, answer_BxA, references_BxRxLa) -> np.ndarray:
    raise NotImplementedError(f"{type(self).__name__}.__call__")


class DeviceJudge(Judge):
  """A judge that runs inside the compiled rollout: `state()` is the program's argument
  (a model, its tables), `verdicts(state, question, answer, references, key) -> bool [B]`
  traced in it; no host callback."""

  on_device: ClassVar[bool] = True

  def state(self) -> Any:
    raise NotImplementedError(f"{type(self).__name__}.state")

  def verdicts(self, state, question_BxLq, answer_BxA, references_BxRxLa, key):
    raise NotImplementedError(f"{type(self).__name__}.verdicts")


def on_device(judge) -> bool:
  """Whether `judge` runs inside the compiled rollout (a plain callable is a host judge)."""
  return isinstance(judge, Judge) and judge.on_device


def render_options(agent_config) -> dict:
  """An environment's splats from a config's `agent` block: {splat_radius, point_radius}
  (point_radius 0, or absent: fixed splats, the environments' default). Older configs
  without the keys get the environments' defaults."""
  splat = agent_config.get("splat_radius", 1)
  radius = float(agent_config.get("point_radius", 0.0) or 0.0)
  if radius < 0:
    raise ValueError(f"agent.point_radius: expected >= 0 (0: fixed splats), got {radius}")
  return dict(splat_radius=int(splat), point_radius=radius or None)
