"""What the episode loop needs to know about one paper's agent: its grammar, its observation
message, how a parsed turn becomes an environment action, and its reward. Every agent
subclasses `contract.Agent`, which declares the members the loops read (and the optional
ones' defaults).

An agent is a frozen dataclass (static under jit). Its functions act on one episode; the
loop vmaps them.

`answer` is the content of the final turn's first <answer>...</answer> as bytes (-1
padded); `answered` says the episode ended with a well-formed answer turn, `malformed`
that it ended with a malformed turn or a tool call after its last turn. `judge` is a
host judge's verdict when one is configured.

`numbers` are the values the observation template formats (Act3D: the camera position and
the look-at point, to 0.01 m; PERIA: the new image's index).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxspatial.envs import act3d, think3d
from jaxspatial.rl.rewards import device_text
from jaxspatial.rl.rewards.papers import (Act3DRewardConfig, Think3DRewardConfig, act3d_reward,
                                          act3d_reward_text, think3d_reward_text)
from jaxspatial.envs.task import decode_text
from jaxspatial.rollout import grammars, host_parse, prompts, turns
from jaxspatial.rollout.contract import Agent, render_options
from jaxspatial.rollout.automaton import Grammar
from jaxspatial.rollout.peria_agent import PERIA_OBSERVATION, PeriaAgent  # noqa: F401 (re-exported)

Array = jax.Array

def _host_values(grammar, fields: dict[str, float] | None, answered: bool):
  """(values, present, answered) in the grammar's field order from a host parse's fields by
  name ("kind" set from `answered`), or None for a malformed turn."""
  if fields is None:
    return None
  names = [f.name for f in grammar.fields]
  values, present = np.zeros(len(names), np.float32), np.zeros(len(names), bool)
  answer_option = grammar.option("kind", b"<answer>")
  for name, value in [("kind", answer_option if answered else 1 - answer_option),
                      *fields.items()]:
    values[names.index(name)] = value
    present[names.index(name)] = True
  return values, present, answered


TOOL_RESPONSE = ("<|im_end|>\n<|im_start|>user\n<tool_response>\n<|vision_start|><|image_pad|>"
                 "<|vision_end|>\n{body}\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


@dataclasses.dataclass(frozen=True)
class Act3DAgent(Agent, turns.AnswerTurns):
  """Act3D: relative camera moves, then a short-phrase answer judged against the reference."""
  params: act3d.Act3DParams = act3d.Act3DParams()
  reward_config: Act3DRewardConfig = Act3DRewardConfig()
  max_distance: int = 360
  system_prompt: str = prompts.ACT3D_SYSTEM
  prefill: str = ""   # the chat template's reply opening (turns.AnswerTurns)

  name: ClassVar[str] = "act3d"
  accuracy_key: ClassVar[str] = "judge"   # the reward component that is "correct"
  input_views: ClassVar[bool] = False     # the first prompt holds one render, not the views

  @classmethod
  def from_config(cls, agent, max_turns: int, reward_weights=None) -> "Act3DAgent":
    """From a config's `agent` block (width, height, hfov_deg, splats: `render_options`)
    and the turn budget."""
    return cls(act3d.Act3DParams(width=agent.width, height=agent.height,
                                 hfov_deg=agent.hfov_deg, max_interactions=max_turns - 1,
                                 **render_options(agent)),
               Act3DRewardConfig(**(reward_weights or {})))

  def first_prompts(self, tokenizer, tasks, image_tokens: int, length: int | None = None):
    """(ids, mask) of the tasks' first turns: appendix C.1's user text after the render."""
    texts = [prompts.chat_prompt(self.system_prompt, prompts.act3d_user_text(
        decode_text(tasks.question_ids[row]), tasks.scene_min[row], tasks.scene_max[row]),
        image_tokens, prefill=self.prefill) for row in range(len(tasks.question_ids))]
    return prompts.left_padded(tokenizer, texts, length)

  def host_fields(self, turn: bytes):
    parsed = host_parse.parse_act3d(self.prefill.encode() + turn, self.max_distance)
    if parsed is None or "answer" in parsed:
      return _host_values(self.grammar, None if parsed is None else {}, parsed is not None)
    fields = {"action": parsed["action"]}
    if parsed["distance"] is not None:
      fields["distance"] = parsed["distance"]
    return _host_values(self.grammar, fields, False)

  def host_text_reward(self, final_turn: str, answered: bool, task, env_state) -> float:
    """Eqs. 8-9 from the text (`papers.act3d_reward_text`): the rule judge over every
    reference."""
    references = [bytes(r[r >= 0].astype(np.uint8)).decode() for r in task.answer_ids
                  if r[0] >= 0]
    objects, seen = task.answer_objects >= 0, np.asarray(env_state.objects_seen)
    grounded = bool(objects.any() and (np.all(seen | ~objects)
                                       if self.reward_config.grounding == "all"
                                       else np.any(seen & objects)))
    return act3d_reward_text(final_turn, references, int(env_state.num_interactions),
                             grounded, self.reward_config, well_formed=answered)

  def call_turn(self, thought: str, action: str, distance=None) -> str:
    """A camera move in this agent's syntax: `action` one of `act3d.PRIMITIVES`, `distance`
    (metres or degrees, at most `max_distance`; None: the primitive's default)."""
    if action not in act3d.PRIMITIVES:
      raise ValueError(f"Act3D action: expected one of {act3d.PRIMITIVES}, got {action!r}")
    arguments = {"action": action}
    if distance is not None:
      arguments["distance"] = turns.number(distance)
      if not 0 <= arguments["distance"] <= self.max_distance:
        raise ValueError(f"Act3D distance: expected 0..{self.max_distance}, got {distance!r}")
    return turns.call("<tool_call>", "</tool_call>", thought, grammars.ACT3D_TOOL, arguments)

  @functools.cached_property
  def grammar(self) -> Grammar:
    return self.turn_grammar(grammars.act3d(self.max_distance))

  @property
  def image_size(self) -> tuple[int, int]:
    return self.params.height, self.params.width

  @property
  def max_calls(self) -> int:
    return self.params.max_interactions

  @property
  def observation(self) -> str:
    return self.opened(TOOL_RESPONSE.format(
        body="Camera at ({}, {}, {}), looking at ({}, {}, {})."))

  def reset(self, key, task):
    obs, state = act3d.reset(key, task, self.params)
    return obs.image, jnp.concatenate([obs.position, obs.look_at]), state

  def step(self, key, state, parsed, answered):
    action_id, _ = parsed.field(self.grammar, "action")
    distance, has_distance = parsed.field(self.grammar, "distance")
    primitive = jnp.where(answered, act3d.STOP, action_id.astype(jnp.int32))
    action = act3d.Act3DAction(primitive=primitive, distance=distance,
                               has_distance=has_distance, position=jnp.zeros(3),
                               look_at=jnp.zeros(3))
    obs, state, _, done, info = act3d.step(key, state, action, self.params)
    return (obs.image, jnp.concatenate([obs.position, obs.look_at]), state, info["invalid"],
            done)

  def reward(self, state, task, answer_bytes, answered, malformed, judge=None):
    """Eqs. 8-9. The prediction is the final turn's answer; `reward_config.format_rule`
    "paper": R_fmt = 1 for a missing or empty answer (the paper's "malformed output"), and
    any non-empty answer is judged; "grammar": only an answer in a well-formed final turn
    counts, and every other ending is malformed. R_EM and the rule judge take any of the
    task's reference answers; a host judge's verdict counts only with a prediction."""
    config = self.reward_config
    space = jnp.zeros(answer_bytes.shape, bool)
    for byte in device_text.WHITESPACE:
      space |= answer_bytes == byte
    nonempty = jnp.any((answer_bytes >= 0) & ~space)
    if config.format_rule == "paper":
      has_prediction = nonempty
      bad = ~nonempty
    elif config.format_rule == "grammar":
      has_prediction = answered & nonempty
      bad = malformed | ~has_prediction
    else:
      raise ValueError(f"Act3DRewardConfig.format_rule: expected 'paper' or 'grammar', got "
                       f"{config.format_rule!r}")
    prediction = jnp.where(has_prediction, answer_bytes, -1)
    references = task.answer_ids  # [R, La]
    real = references[:, 0] >= 0
    exact = jnp.any(real & jax.vmap(lambda r: device_text.exact_match(prediction, r))(
        references))
    if judge is None:
      verdict = jnp.any(real & jax.vmap(lambda r: device_text.rule_judge(prediction, r))(
          references))
    else:
      verdict = judge & has_prediction
    objects = task.answer_objects >= 0
    if config.grounding == "all":
      grounded = jnp.any(objects) & jnp.all(state.objects_seen | ~objects)
    elif config.grounding == "any":
      grounded = jnp.any(state.objects_seen & objects)
    else:
      raise ValueError(f"Act3DRewardConfig.grounding: expected 'all' or 'any', got "
                       f"{config.grounding!r}")
    reward = act3d_reward(verdict, exact, bad, state.num_interactions, grounded, config)
    return reward, {"judge": verdict.astype(jnp.float32), "exact_match": exact.astype(jnp.float32),
                    "malformed": bad.astype(jnp.float32), "grounded": grounded.astype(jnp.float32),
                    "interactions": state.num_interactions.astype(jnp.float32)}


THINK3D_VIEW = "View of camera {:d} at azimuth {}, elevation {}."
# Stage-aware messages after a view (the paper's continual prompts for intermediate and
# final rounds): views left and "call again or answer", or "answer now, no tools"; and a
# rejected request (no such camera, an angle out of range: the view does not change).
THINK3D_OBSERVATIONS = (
    TOOL_RESPONSE.format(body=THINK3D_VIEW + " Views left: {:d}. Call pi3_tool for another "
                         "view, or answer."),
    TOOL_RESPONSE.format(body=THINK3D_VIEW + " This is the final turn: do not call pi3_tool; "
                         "reason in <think></think>, then give only the option letter in "
                         "<answer></answer>."),
    TOOL_RESPONSE.format(body="The request for camera {:d} at azimuth {}, elevation {} was "
                         "rejected (no such camera, or an angle out of range); the view is "
                         "unchanged. Views left: {:d}."),
)
THINK3D_INTERMEDIATE, THINK3D_FINAL, THINK3D_REJECTED = range(3)


@dataclasses.dataclass(frozen=True)
class Think3DAgent(Agent, turns.AnswerTurns):
  """Think3D: the task's input views in the first prompt, then views of the reconstruction
  (anchor camera, azimuth, elevation, ego or global), then a multiple-choice answer.
  `views`: "free" angles, or the paper-era RL prompt's three "preset" views.
  `reconstruction`: a `perception.reconstruction_tool` (None: the dataset's cloud and
  cameras): at reset the scene is reconstructed from the task's input images inside the
  compiled rollout, one host call per batch (`think3d.with_reconstruction`)."""
  params: think3d.Think3DParams = think3d.Think3DParams()
  reward_config: Think3DRewardConfig = Think3DRewardConfig()
  max_cameras: int = 8
  views: str = "free"
  system_prompt: str = prompts.THINK3D_SYSTEM
  prefill: str = ""   # the chat template's reply opening (turns.AnswerTurns)
  reconstruction: Any = None

  name: ClassVar[str] = "think3d"
  accuracy_key: ClassVar[str] = "correct"
  input_views: ClassVar[bool] = True

  @classmethod
  def from_config(cls, agent, max_turns: int, reward_weights=None) -> "Think3DAgent":
    """From a config's `agent` block (width, height, input_views, views, splats:
    `render_options`)."""
    return cls(think3d.Think3DParams(width=agent.width, height=agent.height,
                                     max_rounds=max_turns - 1,
                                     num_prompt_images=agent.input_views,
                                     **render_options(agent)),
               Think3DRewardConfig(**(reward_weights or {})), views=agent.views)

  def with_reconstruction(self, tool) -> "Think3DAgent":
    """This agent reconstructing each task's scene from its input images with `tool`."""
    return dataclasses.replace(self, reconstruction=tool)

  def first_prompts(self, tokenizer, tasks, image_tokens: int, length: int | None = None):
    """(ids, mask): the task's first `num_prompt_images` input views (padding views
    masked), then the question."""
    views = self.params.num_prompt_images
    users = [decode_text(q) for q in tasks.question_ids]
    return prompts.left_padded_views(tokenizer, self.system_prompt, users, image_tokens,
                                     views, np.minimum(tasks.num_input_cameras, views),
                                     length, prefill=self.prefill)

  def host_fields(self, turn: bytes):
    parsed = host_parse.parse_think3d(self.prefill.encode() + turn, self.max_cameras,
                                      self.views)
    if parsed is None or "answer" in parsed:
      return _host_values(self.grammar, None if parsed is None else {}, parsed is not None)
    fields = {"camera": parsed["camera"]}
    if self.views == "preset":
      fields["view"] = grammars.THINK3D_PRESET_VIEWS.index((parsed["azimuth"],
                                                            parsed["elevation"]))
    else:
      fields.update(azimuth=parsed["azimuth"], elevation=parsed["elevation"])
    fields["camera_view"] = self.grammar.option("camera_view",
                                                b"true" if parsed["ego"] else b"false")
    return _host_values(self.grammar, fields, False)

  def host_text_reward(self, final_turn: str, answered: bool, task, env_state) -> float:
    """Accuracy and format from the text (`papers.think3d_reward_text`)."""
    del env_state
    letter = "ABCDE"[task.answer_choice] if task.answer_choice >= 0 else "?"
    return think3d_reward_text(final_turn if answered else "", letter, self.reward_config)

  def call_turn(self, thought: str, camera: int, azimuth, elevation, ego: bool = False) -> str:
    """A view request in this agent's syntax: `camera` 1-based (the paper's
    rotation_reference_camera), angles in degrees (with `views="preset"`, one of
    `grammars.THINK3D_PRESET_VIEWS`), `ego` the camera's own view instead of the global one."""
    if not 1 <= int(camera) <= self.max_cameras:
      raise ValueError(f"Think3D camera: expected 1..{self.max_cameras}, got {camera!r}")
    azimuth, elevation = turns.number(azimuth), turns.number(elevation)
    if self.views == "preset":
      if (azimuth, elevation) not in grammars.THINK3D_PRESET_VIEWS:
        raise ValueError(f"Think3D preset views: expected (azimuth, elevation) in "
                         f"{grammars.THINK3D_PRESET_VIEWS}, got {(azimuth, elevation)}")
      azimuth, elevation = int(azimuth), int(elevation)
    elif not (-180 <= azimuth <= 180 and -90 <= elevation <= 90):
      raise ValueError(f"Think3D angles: expected azimuth in [-180, 180] and elevation in "
                       f"[-90, 90], got {(azimuth, elevation)}")
    arguments = {"rotation_reference_camera": int(camera), "azimuth_angle": azimuth,
                 "elevation_angle": elevation, "camera_view": bool(ego)}
    return turns.call("<tool_call>", "</tool_call>", thought, grammars.THINK3D_TOOL, arguments)

  @functools.cached_property
  def grammar(self) -> Grammar:
    return self.turn_grammar(grammars.think3d(self.max_cameras, self.views))

  @property
  def image_size(self) -> tuple[int, int]:
    return self.params.height, self.params.width

  @property
  def max_calls(self) -> int:
    return self.params.max_rounds

  @property
  def observation(self) -> tuple[str, ...]:
    return tuple(map(self.opened, THINK3D_OBSERVATIONS))

  def observation_variant(self, invalid, format_error, next_is_final, env_state=None):
    del format_error, env_state  # a malformed turn ends a Think3D episode
    return jnp.where(next_is_final, THINK3D_FINAL,
                     jnp.where(invalid, THINK3D_REJECTED, THINK3D_INTERMEDIATE))

  def _numbers(self, obs):
    action = obs.action
    return jnp.stack([action.camera_index.astype(jnp.float32) + 1, action.azimuth_deg,
                      action.elevation_deg,
                      (self.params.max_rounds - obs.round).astype(jnp.float32)])

  def reset(self, key, task):
    """The prompt's input views [N, H, W, 3] (`Think3DParams.num_prompt_images`; the prompt
    masks those past `task.num_input_cameras`)."""
    if self.reconstruction is not None:
      task = think3d.with_reconstruction(self.reconstruction, task)
    obs, state = think3d.reset(key, task, self.params)
    return obs.input_images, self._numbers(obs), state

  def _angles(self, parsed):
    if self.views == "preset":
      view, _ = parsed.field(self.grammar, "view")
      table = jnp.asarray(grammars.THINK3D_PRESET_VIEWS, jnp.float32)
      chosen = table[jnp.clip(view.astype(jnp.int32), 0, len(grammars.THINK3D_PRESET_VIEWS) - 1)]
      return chosen[0], chosen[1]
    azimuth, _ = parsed.field(self.grammar, "azimuth")
    elevation, _ = parsed.field(self.grammar, "elevation")
    return azimuth, elevation

  def step(self, key, state, parsed, answered):
    camera, _ = parsed.field(self.grammar, "camera")
    azimuth, elevation = self._angles(parsed)
    ego, _ = parsed.field(self.grammar, "camera_view")  # option 1 is "true"
    action = think3d.Think3DAction.create(
        jnp.where(answered, think3d.STOP, think3d.VIEW), camera.astype(jnp.int32) - 1, azimuth,
        elevation, jnp.where(ego > 0, think3d.EGO, think3d.GLOBAL))
    obs, state, _, done, info = think3d.step(key, state, action, self.params)
    return obs.image, self._numbers(obs), state, info["invalid"], done

  def reward(self, state, task, answer_bytes, answered, malformed, judge=None):
    del state, judge
    letter = device_text.option_letter(answer_bytes, 0, answer_bytes.shape[-1])
    correct = answered & (letter >= 0) & (letter == task.answer_choice)
    config = self.reward_config
    reward = config.accuracy_weight * correct + config.format_weight * answered
    return reward, {"correct": correct.astype(jnp.float32),
                    "malformed": (malformed | ~answered).astype(jnp.float32)}
