"""PERIA's agent for the episode loop: interaction tools on the episode's image list, then an
answer (see `jaxspatial.rollout.agents` for the agent interface)."""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp

from jaxspatial.envs import peria
from jaxspatial.rl.rewards import device_text
from jaxspatial.rl.rewards.papers import peria_reward
from jaxspatial.rollout import grammars
from jaxspatial.rollout.automaton import Grammar

PERIA_OBSERVATION = ("<|im_end|>\n<|im_start|>user\nTool executed successfully.\nObservation {:d}:\n"
                     "<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n<|im_start|>assistant\n")


@dataclasses.dataclass(frozen=True)
class PeriaAgent:
  """PERIA: interaction tools on the episode's image list (crop, line, box, highlight), then
  an answer: an option letter for multiple-choice tasks, else a phrase judged against the
  reference. R_format + R_correct on device; R_rep is the host's (it needs the text)."""
  params: peria.PeriaParams = peria.PeriaParams()

  @functools.cached_property
  def grammar(self) -> Grammar:
    return grammars.peria(self.params.max_images, int(self.params.scale))

  @property
  def image_size(self) -> tuple[int, int]:
    return self.params.height, self.params.width

  @property
  def observation(self) -> str:
    return PERIA_OBSERVATION

  def reset(self, key, task):
    obs, state = peria.reset(key, task, self.params)
    return obs.image, obs.index[None].astype(jnp.float32), state

  def step(self, key, state, parsed, answered):
    tool, _ = parsed.field(self.grammar, "tool")
    image, _ = parsed.field(self.grammar, "image")
    box = jnp.stack([parsed.field(self.grammar, f"bbox{i}")[0] for i in range(4)])
    action = peria.PeriaAction.create(jnp.where(answered, peria.STOP, peria.TOOL),
                                      tool.astype(jnp.int32), image.astype(jnp.int32), box)
    obs, state, _, done, info = peria.step(key, state, action, self.params)
    return obs.image, obs.index[None].astype(jnp.float32), state, info["invalid"], done

  def reward(self, state, task, answer_bytes, answered, malformed, judge=None):
    del malformed  # a truncated episode (calls, no answer) scores 0, a broken one -1
    prediction = jnp.where(answered, answer_bytes, -1)
    letter = device_text.option_letter(prediction, 0, prediction.shape[-1])
    verdict = (device_text.rule_judge(prediction, task.answer_ids) if judge is None
               else judge)
    correct = answered & jnp.where(task.answer_choice >= 0,
                                   (letter >= 0) & (letter == task.answer_choice), verdict)
    reward = peria_reward(answered, state.calls, correct)
    return reward, {"correct": correct.astype(jnp.float32),
                    "format": reward - correct,
                    "interactions": state.calls.astype(jnp.float32)}
