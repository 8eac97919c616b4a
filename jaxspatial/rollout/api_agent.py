"""Episodes driven by an OpenAI-compatible chat endpoint: an API model (GPT-4.1, Gemini, a
vLLM / SGLang server of a SpatialClaw-size backbone) acting in the same environments, with
the same prompts and the same rules as the compiled rollout, from a host loop.

  api_rollout(endpoint, agent, tasks, key) -> [one record per episode]

`endpoint` is a `perception.ChatEndpoint` (or anything with its `complete` /
`complete_many`): concurrency, retries with backoff, a request budget, the key from an
environment variable (never a file). Per turn every running episode sends one request,
all of them at once (`complete_many`).

Prompts. The first prompt is the agent's own (`agent.first_prompts`, run with a character
"tokenizer" so its text comes back exactly, each view's image placeholder group kept as one
marker; Think3D's padding views are masked there and so absent), cut at Qwen's chat markers
into OpenAI messages: the system message, then the user turn as text parts and image parts
(PNG data URLs of the views `agent.reset` returns), in the prompt's order. The reply opening
(`<|im_start|>assistant\n` and the agent's `prefill`) is the server's template's business
and is dropped. An observation message is the agent's template variant
(`agent.observation`, `observation_variant` as the device picks it) with its numbers
formatted as the device formats them (`{}` two decimals, `{:d}` integers:
`observation.format_number_host`), the new view as an image part where the variant shows one.

Parsing. A reply is cut after its first closing tag (the compiled rollout's stop strings)
and walked through the agent's grammar DFA on the host (`parse_reply`: the same byte DFA,
the same field values as the device's `parse_turn`, no tokenizer; the host regexes agree with
it, tests/rollout/test_api_agent.py checks it), so any agent's action reaches its `step` as a
`ParsedTurn`. The grammar is the agent's without its prefill: the endpoint returns whole
replies, so a reply must open with `<think>` itself (a reasoning model whose server returns
the reasoning apart, in `reasoning_content`, writes none in its content: give it a prompt or
a server setting that keeps the tags in the content).

Episode rules (`rules`, as `episode.rollout` plays them): an answer ends the episode; a malformed turn ends it as
malformed, unless the agent's `continue_on_format_error` and the turn stopped at the call's
closing tag before the last turn (then the format-error message follows and the environment
is not stepped); a tool call in the last turn, or one the environment refuses for good, ends
it as malformed; the environment's `done` ends it. Keys: reset `fold_in(key, 2**20)` split
over the batch, step t `fold_in(fold_in(key, 2**21), t)` split, as on device, so an API
episode and a compiled episode with the same texts are the same episode.

Reward: the agent's device reward (`agent.reward`, jitted) on the recorded answer bytes (the
final turn's first <answer>...</answer> after its thinking, ANSWER_BYTES, as on device), the
final environment state and the task; a host judge `judge(question [B, Lq], answer [B, A],
references [B, R, La]) -> bool [B]` (e.g. `perception.LLMJudge`) replaces the rule judge as
in `compile_rollout(judge=)`, asked only about the rows the agent's `judge_asks` names (PERIA:
its gate, `PeriaAgent.rule_and_gate`). `host_reward` is the agent's `text_reward` (PERIA's:
R_rep from the replies' text, R_format and R_correct from the whole response with the
observation messages, `papers.peria_reward_text`, as its recipe trains on; None for the
others).

Failures: `on_error="raise"` (default) raises the endpoint's error (a failed request after its
retries, the budget spent); `"end"` ends that episode with `error` set (no answer; its reward
is the device's for an episode without one) and the others go on.
"""

from __future__ import annotations

import base64
import concurrent.futures
import functools
import io
import re
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxspatial.rollout.automaton import START, Grammar
from jaxspatial.rollout.regex_ast import Enum, Text
from jaxspatial.rollout import rules, vision
from jaxspatial.rollout.episode import ANSWER_BYTES
from jaxspatial.rollout.observation import _FIELD, IMAGE_PLACEHOLDER, format_number_host
from jaxspatial.rollout.parse import TEXT_BYTES, ParsedTurn

IMAGE_GROUP = "<|vision_start|>" + IMAGE_PLACEHOLDER + "<|vision_end|>"
_TURN = re.compile(r"<\|im_start\|>(system|user|assistant)\n(.*?)<\|im_end\|>", re.DOTALL)
_OPENING = re.compile(r"<\|im_start\|>assistant\n", re.DOTALL)
ROLES = ("system", "user", "assistant")


# --- prompts -------------------------------------------------------------------------------

class _CharTokenizer:
  """Each character its code point: an agent's `first_prompts` through it returns its text."""
  pad_token_id = 0

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    del add_special_tokens
    return [ord(c) for c in text]


def first_prompt_texts(agent, tasks) -> list[str]:
  """The agent's first prompt of each task as text, each shown view one IMAGE_GROUP."""
  ids, mask = agent.first_prompts(_CharTokenizer(), tasks, 1)
  return ["".join(map(chr, np.asarray(row)[np.asarray(m, bool)])) for row, m in zip(ids, mask)]


def chat_messages(text: str, first_view: int = 0, prefill: str = "") -> tuple[list[dict], int]:
  """(messages, views used) of a chat-layout text (a first prompt or an observation
  message): each complete `<|im_start|>role\\n...<|im_end|>` turn one message, its image
  groups image parts {"type": "image", "view": k} numbered from `first_view`. A closing
  `<|im_end|>` in front (an observation closes the reply) and the reply opening behind
  (`<|im_start|>assistant\\n` + `prefill`) are dropped; any other text outside turns is a
  ValueError (a template this converter does not know)."""
  messages, view, at = [], first_view, 0
  rest = text
  if rest.startswith("<|im_end|>"):
    rest = rest[len("<|im_end|>"):].lstrip("\n")
  for match in _TURN.finditer(rest):
    if rest[at:match.start()].strip("\n"):
      raise ValueError(f"chat_messages: text outside the chat turns: {rest[at:match.start()]!r}")
    at = match.end()
    role, content = match.group(1), match.group(2)
    pieces = content.split(IMAGE_GROUP)
    if len(pieces) == 1:
      messages.append({"role": role, "content": content})
      continue
    parts = []
    for k, piece in enumerate(pieces):
      if k:
        parts.append({"type": "image", "view": view})
        view += 1
      if piece:
        parts.append({"type": "text", "text": piece})
    messages.append({"role": role, "content": parts})
  tail = rest[at:].lstrip("\n")
  opening = _OPENING.match(tail)
  if opening:
    tail = tail[opening.end():]
    if tail.startswith(prefill):
      tail = tail[len(prefill):]
  if tail.strip():
    raise ValueError(f"chat_messages: text outside the chat turns: {tail!r}")
  return messages, view


def observation_text(template: str, numbers, text: str = "") -> str:
  """A template variant with its numbers formatted as the device does (`{}` two decimals,
  `{:d}` an integer) and `{text}` filled."""
  numbers = np.asarray(numbers, np.float32).reshape(-1)
  out, k = [], 0
  parts = _FIELD.split(template)
  for i, part in enumerate(parts):
    if i % 2 == 0:
      out.append(part)
    elif part == "text":
      out.append(text)
    else:
      out.append(format_number_host(numbers[k], part == ":d"))
      k += 1
  return "".join(out)


def png_bytes(image) -> bytes:
  """An image [H, W, 3] uint8 as PNG file bytes."""
  from PIL import Image  # pylint: disable=import-outside-toplevel
  buffer = io.BytesIO()
  Image.fromarray(np.asarray(image, np.uint8)).save(buffer, format="PNG")
  return buffer.getvalue()


def png_data_url(image) -> str:
  """An image [H, W, 3] uint8 (or its PNG bytes) as a PNG data URL."""
  data = image if isinstance(image, bytes) else png_bytes(image)
  return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def openai_messages(messages: Sequence[dict], views, urls: dict | None = None) -> list[dict]:
  """Messages with image parts {"type": "image", "view": k} as OpenAI image_url parts
  (PNG data URLs of `views[k]`; `urls` caches them by k)."""
  urls = {} if urls is None else urls
  out = []
  for message in messages:
    content = message["content"]
    if isinstance(content, str):
      out.append(dict(message))
      continue
    parts = []
    for part in content:
      if part["type"] == "image":
        k = part["view"]
        if k not in urls:
          urls[k] = png_data_url(views[k])
        parts.append({"type": "image_url", "image_url": {"url": urls[k]}})
      else:
        parts.append(dict(part))
    out.append({**message, "content": parts})
  return out


# --- parsing -------------------------------------------------------------------------------

def cut_turn(reply: bytes, stops: Sequence[bytes]) -> bytes:
  """The reply up to and including its first closing tag (the whole reply if none)."""
  ends = [reply.find(s) + len(s) for s in stops if s in reply]
  return reply[:min(ends)] if ends else reply


def parse_reply(grammar: Grammar, turn: bytes) -> ParsedTurn:
  """The host twin of `parse.parse_turn` on a turn's bytes: walk the grammar's byte DFA
  (stopping at its first accepting state), label each byte with its field, read the fields
  as the device does. numpy arrays."""
  dfa = grammar.dfa
  state, data, labels, options = START, [], [], []
  for byte in turn:
    if dfa.accepting[state]:
      break
    data.append(byte)
    labels.append(int(dfa.field[state, byte]))
    options.append(int(dfa.option[state, byte]))
    state = int(dfa.next[state, byte])
  valid = bool(dfa.accepting[state])
  data, labels, options = (np.asarray(data, np.int64), np.asarray(labels, np.int64),
                           np.asarray(options, np.int64))
  values, present, texts = [], [], []
  for index, spec in enumerate(grammar.fields):
    mine = labels == index + 1 if len(labels) else np.zeros(0, bool)
    present.append(bool(mine.any()))
    if isinstance(spec, Enum):
      values.append(float(np.max(np.where(mine, options, -1))) if len(mine) else -1.0)
      continue
    if isinstance(spec, Text):
      values.append(float(mine.sum()))
      row = np.full(TEXT_BYTES, -1, np.int32)
      chosen = data[mine][:TEXT_BYTES]
      row[:len(chosen)] = chosen
      texts.append(row)
      continue
    digits = bytes(b for b, m in zip(data.tolist(), mine.tolist()) if m and 48 <= b <= 57)
    dot = np.cumsum(mine & (data == ord("."))) > 0 if len(mine) else np.zeros(0, bool)
    places = int(np.sum(mine & (data >= 48) & (data <= 57) & dot)) if len(mine) else 0
    mantissa = int(digits) if digits else 0
    magnitude = np.float32(mantissa) / np.float32(10.0 ** min(places, 9))
    negative = bool(np.any(mine & (data == ord("-")))) if len(mine) else False
    values.append(float(-magnitude if negative else magnitude))
  values = np.asarray(values, np.float32) if values else np.zeros(0, np.float32)
  present = np.asarray(present, bool) if present else np.zeros(0, bool)
  texts = np.stack(texts) if texts else np.full((0, TEXT_BYTES), -1, np.int32)
  return ParsedTurn(valid=np.asarray(valid), values=np.where(valid, values, 0.0).astype(np.float32),
                    present=present & valid, texts=np.where(valid, texts, -1).astype(np.int32))


def answer_bytes(turn: bytes) -> np.ndarray:
  """The host twin of the device's answer bytes: the content of the turn's first
  <answer>...</answer> after its first </think> ([ANSWER_BYTES] int32, -1 padded)."""
  out = np.full(ANSWER_BYTES, -1, np.int32)
  think = turn.find(b"</think>")
  data = turn[think + len(b"</think>"):] if think >= 0 else turn
  opened = data.find(b"<answer>")
  if opened < 0:
    return out
  start = opened + len(b"<answer>")
  closed = data.find(b"</answer>", start)
  if closed < 0:
    return out
  content = np.frombuffer(data[start:closed][:ANSWER_BYTES], np.uint8)
  out[:len(content)] = content
  return out


def _fields(grammar: Grammar, parsed: ParsedTurn) -> dict:
  """The written fields by name: enums as their option text, numbers as floats, texts as
  strings."""
  out = {}
  for index, spec in enumerate(grammar.fields):
    if not parsed.present[index]:
      continue
    value = float(parsed.values[index])
    if isinstance(spec, Enum):
      out[spec.name] = spec.options[int(value)].decode("utf-8", "replace")
    elif isinstance(spec, Text):
      row = parsed.texts[grammar.text_index(spec.name)]
      out[spec.name] = bytes(row[row >= 0].astype(np.uint8)).decode("utf-8", "replace")
    else:
      out[spec.name] = value
  return out


# --- the loop ------------------------------------------------------------------------------

def _row(tree, b):
  return jax.tree.map(lambda x: x[b], tree)


# One compiled program per agent (static: agents are frozen dataclasses), kept across calls.
@functools.partial(jax.jit, static_argnums=0)
def _reset(agent, keys, tasks):
  return jax.vmap(agent.reset)(keys, tasks)


@functools.partial(jax.jit, static_argnums=0)
def _step(agent, key, state, parsed, answered):
  return agent.step(key, state, parsed, answered)


_variant = jax.jit(rules.observation_variant, static_argnums=0)
_rewards = jax.jit(rules.rewards, static_argnums=0)
_judge_asks = jax.jit(rules.judge_asks, static_argnums=0)


def peria_response_text(messages: Sequence[dict]) -> str:
  """An episode's response as PERIA's reward manager decodes it, rebuilt from the
  conversation: from the first reply on, each reply's text, and each observation message's
  text as its chat turn decodes with special tokens skipped ("\\nuser\\n" + its text parts +
  "\\nassistant\\n"; images and chat markers are special tokens)."""
  first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
  parts = []
  for message in messages[first:]:
    content = message["content"]
    if not isinstance(content, str):
      content = "".join(p.get("text", "") for p in content if p.get("type") == "text")
    parts.append(content if message["role"] == "assistant" else
                 f"\n{message['role']}\n{content}\nassistant\n")
  return "".join(parts)


def _send(endpoint, requests: list[dict], on_error: str) -> list[tuple[str | None, str | None]]:
  """(reply, error) per request, all at once."""
  if not requests:
    return []
  if on_error == "raise":
    return [(reply, None) for reply in endpoint.complete_many(requests)]
  workers = max(1, min(int(getattr(endpoint, "concurrency", 8)), len(requests)))
  with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="api-agent") as pool:
    futures = [pool.submit(endpoint.complete, **r) for r in requests]
  out = []
  for future in futures:
    error = future.exception()
    out.append((None, f"{type(error).__name__}: {error}") if error else (future.result(), None))
  return out


def api_rollout(endpoint, agent, tasks, key=None, *, max_tokens: int = 1024,
                temperature: float = 0.0, top_p: float = 1.0, judge: Callable | None = None,
                on_error: str = "raise", max_turns: int | None = None) -> list[dict]:
  """Runs one episode per task of the batch `tasks` (a `Task` pytree with a leading axis)
  with `endpoint` as the policy. `max_tokens`, `temperature`, `top_p`: each request's.
  `max_turns` (default and only allowed value: the agent's `max_calls` + 1).

  Returns per episode a dict: messages (the conversation, image parts
  {"type": "image", "view": k}; `openai_messages(messages, views)` rebuilds the requests),
  views (uint8 [V, H, W, 3]: the prompt's shown views, then each observation's), replies
  (raw), turns (each reply cut after its closing tag: what was parsed and what the
  conversation holds), actions (per turn: kind "call" / "answer" / "malformed", fields,
  invalid, done, variant), answer (str, the recorded answer), answer_bytes, answered,
  malformed, error, reward, reward_components, host_reward (PERIA), requests (the
  completions this episode asked for), turns_used."""
  if on_error not in ("raise", "end"):
    raise ValueError(f"api_rollout: on_error must be 'raise' or 'end', got {on_error!r}")
  if agent.text_tokens:
    raise ValueError("api_rollout: agents with host perception tools (a {text} observation "
                     "slot) are not supported: their results are tokenised for a policy")
  turns = rules.max_turns(agent)
  if max_turns is not None and max_turns != turns:
    raise ValueError(f"api_rollout: max_turns is {max_turns}, but {type(agent).__name__} "
                     f"allows {agent.max_calls} tool calls and then the answer: {turns}")
  key = jax.random.PRNGKey(0) if key is None else key
  grammar = agent.grammar.after(b"")
  stops = tuple(grammar.stops)
  templates = agent.observation
  templates = (templates,) if isinstance(templates, str) else tuple(templates)
  prefill = agent.prefill

  batch = int(jax.tree.leaves(tasks)[0].shape[0])
  images, _, env_state = jax.device_get(_reset(agent, rules.reset_keys(key, batch), tasks))
  images = vision.prompt_views(np.asarray(images))

  records, states, urls = [], [], []
  for b, text in enumerate(first_prompt_texts(agent, tasks)):
    messages, shown = chat_messages(text, 0, prefill)
    if shown > images.shape[1]:
      raise ValueError(f"api_rollout: the first prompt shows {shown} views, the environment "
                       f"returned {images.shape[1]}")
    records.append(dict(messages=messages, views=[images[b, k] for k in range(shown)],
                        replies=[], turns=[], actions=[], answer="",
                        answer_bytes=np.full(ANSWER_BYTES, -1, np.int32), answered=False,
                        malformed=False, error=None, requests=0, turns_used=0))
    states.append(_row(env_state, b))
    urls.append({})
  running = np.ones(batch, bool)

  for turn in range(turns):
    active = np.flatnonzero(running)
    if not len(active):
      break
    requests = [dict(messages=openai_messages(records[b]["messages"], records[b]["views"],
                                              urls[b]),
                     temperature=temperature, max_tokens=max_tokens, top_p=top_p)
                for b in active]
    replies = _send(endpoint, requests, on_error)
    step_keys = rules.step_keys(key, turn, batch)
    last = bool(rules.last_turn(turn, turns))
    for b, (reply, error) in zip(active, replies):
      record = records[b]
      record["requests"] += 1
      if error is not None:
        record["error"] = error
        running[b] = False
        continue
      record["turns_used"] += 1
      record["replies"].append(reply)
      text = cut_turn(reply.encode("utf-8"), stops)
      record["turns"].append(text.decode("utf-8", "replace"))
      parsed = parse_reply(grammar, text)
      kind = rules.host_turn(bool(parsed.valid), bool(rules.answer_kind(parsed.values, grammar)),
                             last, rules.stopped_at_call(text, grammar),
                             agent.continue_on_format_error)
      answered, call = kind.answered, kind.call
      invalid = done = False
      image = numbers_now = None
      if rules.stepped(kind):
        out = _step(agent, step_keys[b], states[b], jax.tree.map(jnp.asarray, parsed),
                    jnp.asarray(answered))
        image, numbers_now, new_state, invalid, done = jax.device_get(out)
        states[b] = new_state
      outcome = rules.host_outcome(kind, invalid, done, last)
      invalid, done, retry = outcome.rejected, outcome.done, outcome.retry
      ended_badly, continuing = outcome.ended_badly, outcome.continuing
      if outcome.finishing:
        record["answer_bytes"] = answer_bytes(text)
        record["answer"] = bytes(record["answer_bytes"][record["answer_bytes"] >= 0]
                                 .astype(np.uint8)).decode("utf-8", "replace")
      record["answered"] |= answered
      record["malformed"] |= ended_badly
      variant = int(_variant(agent, jnp.asarray(invalid), jnp.asarray(retry),
                             jnp.asarray(rules.next_is_final(turn, turns)), states[b]))
      record["actions"].append(dict(
          turn=turn, kind="answer" if answered else "call" if call else "malformed",
          fields=_fields(grammar, parsed), invalid=invalid, done=done, retried=retry,
          variant=variant if continuing else None))
      record["messages"].append({"role": "assistant", "content": text.decode("utf-8",
                                                                             "replace")})
      if continuing:
        shown_numbers = (np.zeros(64, np.float32) if numbers_now is None
                         else np.asarray(numbers_now))
        message = observation_text(templates[variant], shown_numbers)
        new, used = chat_messages(message, len(record["views"]), prefill)
        if used > len(record["views"]):
          if image is None:
            raise ValueError(f"api_rollout: observation variant {variant} shows an image, but "
                             "the environment was not stepped")
          record["views"].append(np.asarray(image))
        record["messages"].extend(new)
      running[b] = continuing

  answers = np.stack([r["answer_bytes"] for r in records])
  answered = np.asarray([r["answered"] for r in records])
  malformed = np.asarray([r["malformed"] for r in records])
  verdict = None
  if judge is not None:
    # Only the rows the agent asks about (`judge_asks`; PERIA: its gate) go to the judge.
    asked = np.flatnonzero(np.asarray(_judge_asks(agent, tasks, jnp.asarray(answers),
                                                  jnp.asarray(answered))))
    verdict = np.zeros(batch, bool)
    if len(asked):
      verdict[asked] = np.asarray(judge(np.asarray(tasks.question_ids)[asked], answers[asked],
                                        np.asarray(tasks.answer_ids)[asked]),
                                  bool).reshape(len(asked))
  final = jax.tree.map(lambda *x: np.stack(x), *states)
  rewards, components = jax.device_get(_rewards(
      agent, final, tasks, jnp.asarray(answers), jnp.asarray(answered), jnp.asarray(malformed),
      None if verdict is None else jnp.asarray(verdict)))
  for b, record in enumerate(records):
    record["views"] = np.stack(record["views"]).astype(np.uint8)
    record["reward"] = float(rewards[b])
    record["reward_components"] = {k: float(v[b]) for k, v in components.items()}
    record["host_reward"] = agent.text_reward(
        record["turns"], peria_response_text(record["messages"]),
        jax.tree.map(lambda x, b=b: np.asarray(x)[b], tasks), record["reward_components"])
  return records


def write_views(records: Sequence[dict], folder) -> None:
  """Each episode's views as PNG files `folder/episode{b}_view{k}.png`; records gain
  `view_paths`."""
  from PIL import Image  # pylint: disable=import-outside-toplevel
  import pathlib  # pylint: disable=import-outside-toplevel
  folder = pathlib.Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  for b, record in enumerate(records):
    paths = []
    for k, view in enumerate(record["views"]):
      path = folder / f"episode{b}_view{k}.png"
      Image.fromarray(np.asarray(view, np.uint8)).save(path)
      paths.append(str(path))
    record["view_paths"] = paths
