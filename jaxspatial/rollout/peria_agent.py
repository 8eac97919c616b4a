"""PERIA's agent for the episode loop: interaction tools on the episode's image list, then an
answer (`contract.Agent` is the agent interface).

Observation messages are the public environment's texts (PEDIA's tool server), in Qwen's
chat layout as a user turn:
  a new image         "Tool executed successfully.\\nObservation {k}:\\n" + the image
  an invalid call     the tool's error: "Error: Invalid image index.", draw_path's "Error:
                      Need at least 2 points ...", or "Error executing {tool}: ..." (the
                      server appends Python's exception text; ours says "invalid arguments.")
  an unparseable turn "Error: Could not parse action. Expected format: <action>{...}</action>",
                      and the episode goes on (`continue_on_format_error`, the server's way)
`observation` is the tuple of these variants; `observation_variant` picks one per episode.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import jax.numpy as jnp
import numpy as np

from jaxspatial.envs import peria
from jaxspatial.rl.rewards import device_text
from jaxspatial.rl.rewards.papers import peria_reward, peria_reward_text
from jaxspatial.envs.task import decode_text
from jaxspatial.rollout import grammars, prompts, turns
from jaxspatial.rollout.automaton import Grammar
from jaxspatial.rollout.contract import Agent, render_options


def _user_turn(text: str) -> str:
  return f"<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


PERIA_OBSERVATION = _user_turn("Tool executed successfully.\nObservation {:d}:\n"
                               "<|vision_start|><|image_pad|><|vision_end|>")
PERIA_INVALID_INDEX = _user_turn("Error: Invalid image index.")
PERIA_PATH_POINTS = _user_turn("Error: Need at least 2 points (4 coordinate values) and an "
                               "even number of values.")
PERIA_INVALID_ARGUMENTS = tuple(_user_turn(f"Error executing {tool}: invalid arguments.")
                                for tool in peria.TOOLS)
PERIA_INVALID_CALL = _user_turn("Error executing the tool: invalid arguments.")  # tool unknown
PERIA_FORMAT_ERROR = _user_turn('Error: Could not parse action. Expected format: '
                                '<action>{"name": "tool_name", "arguments": {...}}</action>')
PERIA_OBSERVATIONS = (PERIA_OBSERVATION, PERIA_INVALID_INDEX, PERIA_PATH_POINTS,
                      *PERIA_INVALID_ARGUMENTS, PERIA_INVALID_CALL, PERIA_FORMAT_ERROR)
# A perception tool's result: its host tool writes the whole text ("Tool executed
# successfully.\nResult: {...}", or its error), tokenised into the slot.
PERIA_TEXT_RESULT = _user_turn("{text}")
SUCCESS_VARIANT, INDEX_VARIANT, PATH_POINTS_VARIANT, ARGUMENTS_VARIANT = 0, 1, 2, 3
INVALID_CALL_VARIANT = ARGUMENTS_VARIANT + len(peria.TOOLS)
FORMAT_ERROR_VARIANT = INVALID_CALL_VARIANT + 1
TEXT_VARIANT = FORMAT_ERROR_VARIANT + 1  # only with perception tools


@dataclasses.dataclass(frozen=True)
class PeriaAgent(Agent, turns.AnswerTurns):
  """PERIA: the public server's six interaction tools on the episode's image list, then an
  answer checked by the public reward manager's rule (`device_text.peria_correct`) against
  the references: a multiple-choice task's reference is its option letter, an open one's
  its answer texts. R_format + R_correct on device; R_rep is the host's (it needs the
  text), and the host recomputes R_format and R_correct from the text (`text_rewards`).

  continue_on_format_error: an unparseable turn gets PERIA_FORMAT_ERROR and the episode
  goes on, as in the public environment (False: it ends the episode as malformed).
  coordinate_format: how calls write coordinates, "list" ([420, 310, 680, 590], the paper's
  example) or "boxed" (the public declarations' strings "\\\\boxed{420,310,680,590}",
  "(x,y)"); see `grammars.peria`.
  perception: host perception tools (`jaxspatial.perception.TextTool`, e.g. "text_ocr"),
  called with `image_index` and either an optional `bounding_box` or a text argument
  ("text_prompt" / "question", passed to the tool as that keyword); their text results
  are the observation (`with_perception`)."""
  params: peria.PeriaParams = peria.PeriaParams()
  continue_on_format_error: bool = True
  coordinate_format: str = "list"
  system_prompt: str = prompts.PERIA_SYSTEM
  prefill: str = ""   # the chat template's reply opening (turns.AnswerTurns)
  perception: tuple = ()

  name: ClassVar[str] = "peria"
  accuracy_key: ClassVar[str] = "correct"
  input_views: ClassVar[bool] = False
  # On a benchmark the tasks carry their stored views and image 0 is the task's own image
  # (`peria.initial_image`: ChartQA's chart), so the recipe loads them; else a render.
  benchmark_images: ClassVar[bool] = True

  @classmethod
  def from_config(cls, agent, max_turns: int, reward_weights=None) -> "PeriaAgent":
    """From a config's `agent` block (width, height, hfov_deg, max_images, splats:
    `render_options`)."""
    del reward_weights  # PERIA's reward has no weights
    return cls(peria.PeriaParams(width=agent.width, height=agent.height,
                                 hfov_deg=agent.hfov_deg, max_images=agent.max_images,
                                 max_turns=max_turns, **render_options(agent)))

  def first_prompts(self, tokenizer, tasks, image_tokens: int, length: int | None = None):
    """(ids, mask): "Observation 0:" before the image, then the question (the public
    pipeline's first user message)."""
    system = self.system_prompt + prompts.peria_perception_text(self.perception)
    texts = [prompts.peria_prompt(system, decode_text(q), image_tokens, self.prefill)
             for q in tasks.question_ids]
    return prompts.left_padded(tokenizer, texts, length)

  def host_rewards(self, rows, tokenizer, tasks=None):
    """PERIA's training reward from the text, the public reward manager's (`text_rewards`):
    R_rep on the model text, R_format and R_correct on the whole response. `rows`: this
    process's trajectory rows as numpy; `tasks`: their tasks (numpy, the same rows), for
    R_correct's references; without them R_correct is the device's."""
    references = None if tasks is None else reference_texts(tasks.answer_ids,
                                                            tasks.answer_choice)
    return text_rewards(rows.tokens, rows.loss_mask, rows.turn_active.sum(-1),
                        rows.reward_components["correct"], tokenizer,
                        attention_mask_BxS=rows.attention_mask, references=references,
                        judged_B=rows.reward_components.get("judged"))

  def text_reward(self, replies, response, task, components) -> float:
    """An API episode's training reward from its text (`papers.peria_reward_text`): R_rep
    on the replies, R_format and R_correct on the whole response, the device judge's
    overturn counting."""
    references = reference_texts(np.asarray(task.answer_ids)[None],
                                 np.asarray(task.answer_choice)[None])[0]
    return float(peria_reward_text("".join(replies), max(len(replies), 1), references,
                                   response_text=response, judge=components["judged"] > 0))

  def call_turn(self, thought: str, tool: str, image_index: int, points=(),
                label: str | None = None, text: str | None = None,
                text_key: str | None = None) -> str:
    """A tool call in this agent's syntax: `tool` one of `grammars.PERIA_TOOLS` on image
    `image_index`, `points` [(x, y), ...] on the 0..scale grid written to the tool's argument
    (image_label: `label` and its position). Coordinates as `coordinate_format` says. Which
    point counts a tool takes is the environment's to check. A perception tool takes no
    points or a box's two, or `text` written to `text_key` (default: the tool's own text
    argument, "text_prompt" or "question"; another key is written as asked, which the
    tool then refuses)."""
    names = grammars.PERIA_TOOLS + self.params.text_tools
    if tool not in names:
      raise ValueError(f"PERIA tool: expected one of {names}, got {tool!r}")
    if not 0 <= int(image_index) < self.params.max_images:
      raise ValueError(f"PERIA image_index: expected 0..{self.params.max_images - 1}, got "
                       f"{image_index!r}")
    flat = [int(v) for xy in points for v in xy]
    scale = int(self.params.scale)
    if tool in self.params.text_tools:
      arguments = {"image_index": int(image_index)}
      if text is not None or text_key is not None:
        if flat:
          raise ValueError(f"PERIA {tool}: a call writes a box or a text argument, not both; "
                           f"got points {points!r} and text {text!r}")
        arguments[self._text_key(tool, text_key)] = _checked_text(tool, text)
      elif flat:
        if len(flat) != 4 or not all(0 <= v <= scale for v in flat):
          raise ValueError(f"PERIA {tool}: expected no points or a box's two in 0..{scale}, "
                           f"got {points!r}")
        arguments["bounding_box"] = flat if self.coordinate_format == "list" else (
            "\\boxed{" + ",".join(map(str, flat)) + "}")
      return turns.call("<action>", "</action>", thought, tool, arguments)
    if text is not None or text_key is not None:
      raise ValueError(f"PERIA {tool}: interaction tools take no text argument (image_label's "
                       f"text is `label`), got text {text!r}")
    if (not flat or len(flat) % 2 or len(flat) > 2 * self.params.max_path_points
        or not all(0 <= v <= scale for v in flat)):
      raise ValueError(f"PERIA points: expected 1..{self.params.max_path_points} (x, y) pairs "
                       f"in 0..{scale}, got {points!r}")
    values = flat if self.coordinate_format == "list" else (
        "\\boxed{" + ",".join(map(str, flat)) + "}")
    argument = grammars.PERIA_ARGUMENTS[peria.TOOL_ARGUMENT[grammars.PERIA_TOOLS.index(tool)]]
    arguments = {"image_index": int(image_index)}
    if argument == "text":
      if label is None or '"' in label or "\\" in label:
        raise ValueError(f"PERIA image_label: expected a label without '\"' or '\\\\', "
                         f"got {label!r}")
      arguments.update(text=label, position=values)
    else:
      arguments[argument] = values
    return turns.call("<action>", "</action>", thought, tool, arguments)

  def _text_key(self, tool: str, text_key: str | None) -> str:
    """The key a text argument of `tool` is written to: `text_key`, else the tool's own."""
    keys = grammars.PERIA_TEXT_ARGUMENTS
    if text_key is not None:
      if text_key not in keys:
        raise ValueError(f"PERIA {tool}: text_key must be one of {keys}, got {text_key!r}")
      return text_key
    arguments = getattr(self.perception[self.params.text_tools.index(tool)], "arguments", ())
    own = [a for a in arguments if a in keys]
    if not own:
      raise ValueError(f"PERIA {tool}: the tool takes no text argument (its arguments: "
                       f"{tuple(arguments)}); pass text_key to write one anyway")
    return own[0]

  def __post_init__(self):
    if self.coordinate_format not in grammars.PERIA_COORDINATES:
      raise ValueError(f"PeriaAgent.coordinate_format: expected one of "
                       f"{grammars.PERIA_COORDINATES}, got {self.coordinate_format!r}")
    names = tuple(t.name for t in self.perception)
    if names != self.params.text_tools or any(
        t.max_tokens != self.params.text_tokens for t in self.perception):
      raise ValueError(f"PeriaAgent.perception {names} must match PeriaParams.text_tools "
                       f"{self.params.text_tools} and their width text_tokens "
                       f"{self.params.text_tokens}: build it with with_perception")
    for tool in self.perception:  # the parsed key's index is passed to the tool as is
      keys = tuple(getattr(tool, "text_keys", ()))
      if keys != grammars.PERIA_TEXT_ARGUMENTS:
        raise ValueError(f"PeriaAgent.perception: tool {tool.name!r} reads text keys {keys}, "
                         f"the grammar writes {grammars.PERIA_TEXT_ARGUMENTS}")

  def with_perception(self, tools) -> "PeriaAgent":
    """This agent with host perception tools (TextTools of one `max_tokens`)."""
    tools = tuple(tools)
    widths = {t.max_tokens for t in tools}
    if len(widths) > 1:
      raise ValueError(f"PeriaAgent.with_perception: the tools' max_tokens differ: {widths}")
    params = self.params.replace(text_tools=tuple(t.name for t in tools),
                                 text_tokens=widths.pop() if widths else 0)
    return dataclasses.replace(self, params=params, perception=tools)

  @property
  def text_tokens(self) -> int:
    return self.params.text_tokens

  def observation_text(self, state):
    return state.text_ids, state.text_mask

  @functools.cached_property
  def grammar(self) -> Grammar:
    return self.turn_grammar(grammars.peria(self.params.max_images, int(self.params.scale),
                                            self.params.max_path_points,
                                            self.coordinate_format, self.params.text_tools))

  @property
  def image_size(self) -> tuple[int, int]:
    return self.params.height, self.params.width

  @property
  def max_calls(self) -> int:
    return self.params.max_turns - 1  # the last turn answers

  @property
  def observation(self) -> tuple[str, ...]:
    texts = PERIA_OBSERVATIONS + ((PERIA_TEXT_RESULT,) if self.perception else ())
    return tuple(map(self.opened, texts))

  def observation_variant(self, invalid, format_error, next_is_final, env_state=None):
    """The message after a turn: the format error, the error of the call the environment
    rejected (`env_state.error`, `env_state.tool`; without `env_state`, or for a perception
    tool's arguments, the generic one), or the new image (a perception tool's text).
    PERIA's server has no final-turn message: `next_is_final` is unused."""
    del next_is_final
    if env_state is None:
      rejected = jnp.asarray(INVALID_CALL_VARIANT)
    else:
      tool = jnp.clip(env_state.tool, 0, len(peria.TOOLS) - 1)
      by_error = jnp.asarray([INVALID_CALL_VARIANT, INVALID_CALL_VARIANT, ARGUMENTS_VARIANT,
                              INDEX_VARIANT, PATH_POINTS_VARIANT])
      rejected = by_error[env_state.error] + jnp.where(
          env_state.error == peria.ERROR_ARGUMENTS, tool, 0)
      # A perception tool's refused arguments have no per-tool message: the generic one.
      rejected = jnp.where((env_state.error == peria.ERROR_ARGUMENTS)
                           & (env_state.tool >= len(peria.TOOLS)), INVALID_CALL_VARIANT,
                           rejected)
    success = SUCCESS_VARIANT
    if self.perception and env_state is not None:
      success = jnp.where(env_state.text_call, TEXT_VARIANT, SUCCESS_VARIANT)
    return jnp.where(format_error, FORMAT_ERROR_VARIANT,
                     jnp.where(invalid, rejected, success)).astype(jnp.int32)

  def reset(self, key, task):
    obs, state = peria.reset(key, task, self.params)
    return obs.image, obs.index[None].astype(jnp.float32), state

  def step(self, key, state, parsed, answered):
    value = lambda name: parsed.field(self.grammar, name)[0]
    slots = range(self.params.max_path_points)
    points = jnp.stack([jnp.stack([value(f"x{k}") for k in slots]),
                        jnp.stack([value(f"y{k}") for k in slots])], -1)
    written = jnp.stack([parsed.field(self.grammar, f"x{k}")[1] for k in slots])
    action = peria.PeriaAction(
        kind=jnp.where(answered, peria.STOP, peria.TOOL).astype(jnp.int32),
        tool=value("tool").astype(jnp.int32), image=value("image_index").astype(jnp.int32),
        argument=jnp.where(parsed.field(self.grammar, "argument")[1], value("argument"),
                           -1).astype(jnp.int32), points=points,
        num_points=jnp.sum(written.astype(jnp.int32)))
    source = state.images[jnp.clip(action.image, 0, self.params.max_images - 1)]
    obs, state, _, done, info = peria.step(key, state, action, self.params)
    if self.perception:
      state = self._perceive(state, action, source, parsed)
    return obs.image, obs.index[None].astype(jnp.float32), state, info["invalid"], done

  def _perceive(self, state, action, source, parsed):
    """The called perception tool's text for a valid text call (one host call per tool
    and batch under vmap; rows that did not call it are skipped on the host), given its
    box or its text argument (the bytes and the key's index in PERIA_TEXT_ARGUMENTS)."""
    box = action.points[:2].reshape(4)
    has_box = action.num_points == 2
    text, written = parsed.text(self.grammar, grammars.PERIA_TEXT)
    first = len(grammars.PERIA_POINT_ARGUMENTS)
    text_key = jnp.where(written & (action.argument >= first), action.argument - first, -1)
    ids, mask = state.text_ids, state.text_mask
    for j, tool in enumerate(self.perception):
      called = state.text_call & (action.tool == len(peria.TOOLS) + j)
      tool_ids, tool_mask = tool(source, box, has_box, called, text, text_key)
      ids = jnp.where(called, tool_ids, ids)
      mask = jnp.where(called, tool_mask, mask)
    return state.replace(text_ids=ids, text_mask=mask)

  def rule_and_gate(self, task, answer_bytes, answered):
    """(the public rule's verdict, whether a host judge's verdict counts) of one episode's
    answer against its references (`reference_ids`): the judge counts only where the public
    manager asks it: the rule failed, the prediction is non-empty, and not both the
    prediction and the one reference a single word (`device_text.peria_correct`).

    The prediction is the answer the rollout recorded: the final turn's first
    <answer>...</answer> after its first </think>, its first ANSWER_BYTES (128) bytes. The
    public manager reads the whole response: its first <answer>...</answer> in any case
    (one written inside a turn's thinking would be it), else the text after the first
    </think> (a cut-off episode's calls and observations, which no rule matches, though
    its judge may be asked). Here an episode without an answer scores 0, unjudged. The host
    text reward (`text_rewards`) reads the response as the public manager does."""
    prediction = jnp.where(answered, answer_bytes, -1)
    rule, gate = device_text.peria_correct(prediction, reference_ids(task))
    return rule & answered, gate & answered

  def reward(self, state, task, answer_bytes, answered, malformed, judge=None):
    """R_format (the grammar's) + R_correct: the public rule on the answer, or the judge's
    YES where its gate lets it (`rule_and_gate`; a verdict outside the gate is ignored, so
    a judge asked about every row scores as one asked about the gated rows only).
    Components: correct, format, judged (the judge overturned the rule), interactions."""
    del malformed  # a truncated episode (calls, no answer) scores 0, a broken one -1
    rule, gate = self.rule_and_gate(task, answer_bytes, answered)
    judged = jnp.zeros_like(gate) if judge is None else gate & judge
    correct = rule | judged
    reward = peria_reward(answered, state.calls, correct)
    return reward, {"correct": correct.astype(jnp.float32),
                    "format": reward - correct,
                    "judged": judged.astype(jnp.float32),
                    "interactions": state.calls.astype(jnp.float32)}


  def judge_asks(self, task, answer_bytes, answered):
    """The public manager's gate (`rule_and_gate`): the judge is asked only where its
    verdict can count."""
    return self.rule_and_gate(task, answer_bytes, answered)[1]


def reference_ids(task):
  """[R, La] the references PERIA's rule compares an answer with: a multiple-choice task's
  option letter ("A" + answer_choice, what the public data's ground truth holds and the
  options in the question are labelled with; its option text does not count), else the
  task's answer texts."""
  letter = jnp.full_like(task.answer_ids, -1).at[0, 0].set(ord("A") + task.answer_choice)
  return jnp.where(task.answer_choice >= 0, letter, task.answer_ids)


def reference_texts(answer_ids_BxRxLa, answer_choice_B) -> list[list[str]]:
  """`reference_ids` on the host for a batch: per task its reference strings."""
  out = []
  for ids, choice in zip(np.asarray(answer_ids_BxRxLa), np.asarray(answer_choice_B)):
    out.append([chr(ord("A") + int(choice))] if choice >= 0 else
               [decode_text(row) for row in ids if row.size and row[0] >= 0])
  return out


def _checked_text(tool: str, text) -> str:
  """A text argument the grammar holds as written: a JSON string needing no escape (no
  '"', backslash or control character) with a non-space character."""
  if (not isinstance(text, str) or not text.strip(" \t\n\r\x0b\x0c")
      or any(c in '"\\' or ord(c) < 0x20 for c in text)):
    raise ValueError(f"PERIA {tool}: expected a text argument with a non-space character and "
                     f"no '\"', '\\' or control character, got {text!r}")
  return text


def response_text(tokens_S, loss_mask_S, attention_mask_S, tokenizer) -> str:
  """The response as the public reward manager decodes it: every attended token from the
  first generated one on (the model's turns and the observation messages between them),
  special tokens skipped."""
  generated = np.flatnonzero(np.asarray(loss_mask_S, bool))
  if not len(generated):
    return ""
  keep = np.asarray(attention_mask_S, bool).copy()
  keep[:generated[0]] = False
  return tokenizer.decode(np.asarray(tokens_S)[keep], skip_special_tokens=True)


def text_rewards(tokens_BxS, loss_mask_BxS, turns_B, correct_B, tokenizer, *,
                 attention_mask_BxS=None, references=None, judged_B=None) -> np.ndarray:
  """PERIA's reward from each episode's text, as the public reward manager computes it
  (`papers.peria_reward_text`): R_rep on the model text (its generated tokens, user turns
  left out); R_format (a `</think>` before the first action, complete tags, any case) and
  R_correct's prediction on the whole response (`response_text`; without
  `attention_mask_BxS`, the model text). R_correct: the public rule against `references`
  (per row its strings, `reference_texts`), 1 also where the device's judge overturned the
  rule (`judged_B`) and the host's gate agrees; without references the device's `correct_B`.
  The device's R_format reads the grammar and agrees unless a malformed turn was retried
  (`continue_on_format_error`): only the text tells whether it lacked `</think>`, and the
  format-error message itself holds a complete `<action>...</action>`, which the public
  rule counts (a cut-off episode after it scores 0, not -1)."""
  tokens, loss = np.asarray(tokens_BxS), np.asarray(loss_mask_BxS, bool)
  out = []
  for b in range(tokens.shape[0]):
    model_text = tokenizer.decode(tokens[b][loss[b]])
    response = model_text if attention_mask_BxS is None else response_text(
        tokens[b], loss[b], np.asarray(attention_mask_BxS)[b], tokenizer)
    judged = judged_B is not None and bool(np.asarray(judged_B)[b] > 0)
    out.append(peria_reward_text(
        model_text, max(int(turns_B[b]), 1), None if references is None else references[b],
        response_text=response, judge=judged, correct=float(correct_B[b])))
  return np.asarray(out, np.float32)
