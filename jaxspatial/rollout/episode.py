"""The compiled episode loop: prompt to reward as one XLA program for a batch of episodes.

  prefill(prompt with the first view)
  repeat up to max_turns (lax.while_loop):
    decode every running episode until its turn closes (first closing tag, an EOS token,
      or max_turn_tokens), tracking the grammar automaton per token; in constrained mode
      the automaton masks the logits so every turn closes as a valid call or answer
    parse the turn's action from the automaton (on device)
    step the environments (vmap); an answer ends the episode, a malformed turn ends it
      with the format flag, a tool call in the last turn ends it as malformed
    preprocess the new views, run the vision encoder, append each running episode's
      observation message to the KV cache (loss mask 0)
  score the answers (on device; an optional host judge through io_callback)

Turns are synchronous: all episodes decode in the same cache slots, an episode that has
closed its turn writes masked padding. Randomness: the token at step k of turn t is
sampled with fold_in(fold_in(key, t), k), so a host loop can reproduce the episode.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxspatial.models.reading_jit import reading_jit
from jaxspatial.models.sampler import (DecodeState, append, append_hidden, filter_logits,
                                      mark_seen, prefill, repeat_rows, repetition_penalty)
from jaxspatial.models.sampler import sample_token as sampler_choose
from jaxspatial.rl.advantages import image_hash
from jaxspatial.rl.rewards import device_text
from jaxspatial.rollout.automaton import START
from jaxspatial.rollout.token_table import TokenAutomaton, allowed_tokens, token_bytes
from jaxspatial.rollout.observation import ObservationTemplate, observation_tokens
from jaxspatial.rollout.parse import parse_turn
from jaxspatial.rollout import rules, vision
from jaxspatial.rollout.contract import on_device
from jaxspatial.rollout.trajectory import Trajectory

Array = jax.Array
ANSWER_BYTES = 128
MIN_TEMPERATURE = 1e-3


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  max_turns: int = 4
  max_turn_tokens: int = 64
  constrained: bool = False    # mask logits to the grammar (else parse only)
  temperature: float = 1.0     # 0: greedy
  top_k: int = 0
  top_p: float = 1.0
  eos_tokens: tuple[int, ...] = ()
  pad_token: int = 0
  cache_dtype: str = "float32"
  # Hugging Face's repetition penalty over every token in context (1.0: off); logprobs are
  # then those of the penalised distribution sampled from.
  repetition_penalty: float = 1.0

  def __post_init__(self):
    """Field checks that need no agent (`check_turn_budget` checks the rest against the
    agent and its automaton): each names the field, the expected and the got."""
    def integer(name, low):
      value = getattr(self, name)
      if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low:
        raise ValueError(f"RolloutConfig.{name}: expected an int >= {low}, got {value!r}")

    def real(name, ok, expected):
      value = getattr(self, name)
      if (not isinstance(value, numbers.Real) or isinstance(value, bool)
          or not math.isfinite(value) or not ok(value)):
        raise ValueError(f"RolloutConfig.{name}: expected {expected}, got {value!r}")

    integer("max_turns", 1)
    integer("max_turn_tokens", 1)
    integer("top_k", 0)
    integer("pad_token", 0)
    if not isinstance(self.constrained, (bool, np.bool_)):
      raise ValueError(f"RolloutConfig.constrained: expected a bool, got {self.constrained!r}")
    # Below MIN_TEMPERATURE the scaled logits overflow float32 (log-probabilities NaN).
    real("temperature", lambda t: t == 0 or t >= MIN_TEMPERATURE,
         f"0 (greedy) or a finite temperature >= {MIN_TEMPERATURE}")
    real("top_p", lambda p: 0 < p <= 1, "a nucleus mass in (0, 1]")
    real("repetition_penalty", lambda r: r > 0, "a finite penalty > 0 (1: off)")
    eos = self.eos_tokens
    if isinstance(eos, (str, bytes)) or not isinstance(eos, (tuple, list)) or any(
        not isinstance(t, numbers.Integral) or isinstance(t, bool) or t < 0 for t in eos):
      raise ValueError(f"RolloutConfig.eos_tokens: expected a tuple of token ids >= 0, got "
                       f"{eos!r}")
    object.__setattr__(self, "eos_tokens", tuple(int(t) for t in eos))  # hashable
    try:
      dtype = jnp.dtype(self.cache_dtype) if isinstance(self.cache_dtype, str) else None
    except (TypeError, ValueError):
      dtype = None
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
      raise ValueError(f"RolloutConfig.cache_dtype: expected a float dtype name "
                       f"('float32', 'bfloat16', ...), got {self.cache_dtype!r}")


def reshaped_by(config: RolloutConfig) -> tuple[str, ...]:
  """The settings that make the recorded log-probabilities differ from the policy's own
  at the rollout's temperature (what the trainer recomputes): () when they are its own."""
  reasons = (("repetition_penalty", config.repetition_penalty != 1.0),
             ("top_k", config.top_k > 0), ("top_p", config.top_p < 1.0),
             ("constrained", config.constrained), ("temperature 0", config.temperature == 0))
  return tuple(f"{name} {getattr(config, name.split()[0])!r}" for name, on in reasons if on)


def capacity(prompt_length: int, template: ObservationTemplate, config: RolloutConfig) -> int:
  return (prompt_length + config.max_turns * config.max_turn_tokens
          + (config.max_turns - 1) * template.length)


def sample_token(logits_BxV: Array, key: Array, config: RolloutConfig):
  """(token, log-probability under the distribution sampled from)."""
  return sampler_choose(logits_BxV, key, config.temperature, config.top_k, config.top_p)


def force(logits_BxV: Array, token: Array, logp: Array, forced_B: Array, config: RolloutConfig):
  """Where `forced` >= 0 its token replaces the sample; the log-probability is the policy's
  (under the distribution it would have sampled from)."""
  scaled = logits_BxV if config.temperature <= 0 else filter_logits(
      logits_BxV / config.temperature, config.top_k, config.top_p)
  forced_logp = jnp.take_along_axis(jax.nn.log_softmax(scaled, -1),
                                    jnp.maximum(forced_B, 0)[:, None], -1)[:, 0]
  # A grammar that allows no token (a forced turn it rejected) masks every logit: the forced
  # token's probability is 0, not log_softmax's NaN.
  forced_logp = jnp.where(jnp.isfinite(scaled).any(-1), forced_logp, -jnp.inf)
  use = forced_B >= 0
  return jnp.where(use, forced_B, token), jnp.where(use, forced_logp, logp)


def turn_logits(automaton: TokenAutomaton, logits_BxV: Array, grammar_state: Array,
                remaining: Array, config: RolloutConfig) -> Array:
  """The logits a token is sampled from: masked to the grammar when constrained."""
  if not config.constrained:
    return logits_BxV
  ok = allowed_tokens(automaton, grammar_state, remaining)
  return jnp.where(ok, logits_BxV, -jnp.inf)


def advance(automaton: TokenAutomaton, grammar_state, stop_state, token, config: RolloutConfig):
  """Automaton states after `token`, and whether the turn closed with it."""
  grammar_next = jnp.where(automaton.accepting[grammar_state], grammar_state,
                           automaton.token_next[grammar_state, token].astype(jnp.int32))
  stop_next = jnp.where(automaton.stop_accepting[stop_state], stop_state,
                        automaton.stop_next[stop_state, token].astype(jnp.int32))
  eos = jnp.asarray(config.eos_tokens or (-1,), jnp.int32)
  closed = automaton.stop_accepting[stop_next] | jnp.any(token[:, None] == eos[None], -1)
  if config.constrained:
    closed |= automaton.accepting[grammar_next]
  return grammar_next, stop_next, closed


def _write(buffer, slot, column):
  return jax.lax.dynamic_update_slice(buffer, column[:, None].astype(buffer.dtype), (0, slot))


def _decode_turn(model, automaton, config, turn, key, dstate, logits, running, buffers,
                 forced_BxN, seen_BxV):
  """Decodes one turn for the running episodes. Returns the cache, the last logits, the
  turn's tokens, grammar states and counts, the updated trajectory buffers and the tokens
  in context (`seen`, for the repetition penalty; None when it is off)."""
  text = model.language_model
  batch = running.shape[0]
  limit = config.max_turn_tokens

  def cond(carry):
    k, _, _, _, _, ended, *_ = carry
    return (k < limit) & ~jnp.all(ended)

  def body(carry):
    (k, dstate, logits, grammar_state, stop_state, ended, count, tokens_T, states_T, buffers,
     seen) = carry
    writing = ~ended
    if seen is not None:
      logits = repetition_penalty(logits, seen, config.repetition_penalty)
    step_logits = turn_logits(automaton, logits, grammar_state, jnp.full(batch, limit - k),
                              config)
    token, logp = sample_token(step_logits, rules.token_key(key, turn, k), config)
    if forced_BxN is not None:
      token, logp = force(step_logits, token, logp, forced_BxN[:, k], config)
    token = jnp.where(writing, token, config.pad_token)
    if seen is not None:
      seen = mark_seen(seen, token[:, None], writing[:, None])
    grammar_next, stop_next, closed = advance(automaton, grammar_state, stop_state, token, config)
    tokens_T = tokens_T.at[:, k].set(token)
    states_T = states_T.at[:, k].set(grammar_state)
    slot = dstate.next_slot
    ids, attention, loss, logprobs = buffers
    buffers = (_write(ids, slot, token), _write(attention, slot, writing),
               _write(loss, slot, writing), _write(logprobs, slot, jnp.where(writing, logp, 0.0)))
    valid = _write(dstate.valid, slot, writing)
    position = jnp.broadcast_to(dstate.next_position[None, :, None], (3, batch, 1))
    embeds = text.embed_tokens(token[:, None])
    hidden, cache = text.extend(embeds, position, valid, dstate.cache, slot)
    dstate = DecodeState(cache=cache, valid=valid, next_slot=slot + 1,
                         next_position=dstate.next_position + writing.astype(jnp.int32),
                         last_hidden=hidden[:, -1].astype(jnp.float32), last_token=token)
    logits = text.logits(hidden[:, -1]).astype(jnp.float32)
    grammar_state = jnp.where(writing, grammar_next, grammar_state)
    stop_state = jnp.where(writing, stop_next, stop_state)
    ended = ended | (writing & (closed | (k + 1 >= limit)))
    return (k + 1, dstate, logits, grammar_state, stop_state, ended,
            count + writing.astype(jnp.int32), tokens_T, states_T, buffers, seen)

  start = jnp.full(batch, START, jnp.int32)
  carry = (jnp.asarray(0), dstate, logits, start, start, ~running, jnp.zeros(batch, jnp.int32),
           jnp.full((batch, limit), config.pad_token, jnp.int32),
           jnp.full((batch, limit), START, jnp.int32), buffers, seen_BxV)
  _, dstate, logits, grammar_state, _, _, count, tokens_T, states_T, buffers, seen_BxV = (
      jax.lax.while_loop(cond, body, carry))
  return dstate, logits, tokens_T, states_T, count, grammar_state, buffers, seen_BxV


def _replay_turn(model, automaton, config, dstate, logits, running, buffers, forced_BxN,
                 seen_BxV):
  """`_decode_turn` for a turn forced whole (teacher replay): the forced tokens up to the
  turn's close (or its first -1) written as one segment, one forward over the turn in place
  of one per token. Tokens, grammar states, counts, slots and masks equal `_decode_turn`'s
  forcing the same turn; each log-probability comes from the previous position's logits
  (the carried ones for the first token), processed as the decode loop processes them."""
  text = model.language_model
  batch, limit = forced_BxN.shape

  def close(carry, column):
    grammar_state, stop_state, ended = carry
    k, forced = column
    writing = ~ended & (forced >= 0)
    token = jnp.where(writing, forced, config.pad_token)
    grammar_next, stop_next, closed = advance(automaton, grammar_state, stop_state, token, config)
    ended = ended | (forced < 0) | (writing & (closed | (k + 1 >= limit)))
    carry = (jnp.where(writing, grammar_next, grammar_state),
             jnp.where(writing, stop_next, stop_state), ended)
    return carry, (token, grammar_state, writing)

  start = jnp.full(batch, START, jnp.int32)
  (final_state, _, _), (tokens_NxB, states_NxB, writing_NxB) = jax.lax.scan(
      close, (start, start, ~running), (jnp.arange(limit), forced_BxN.T))
  tokens_T, writing = tokens_NxB.T, writing_NxB.T
  count = jnp.sum(writing, -1, dtype=jnp.int32)
  states_T = jnp.where(jnp.arange(limit) < jnp.max(count), states_NxB.T, START)
  slot = dstate.next_slot
  # As many slots as the decode loop's steps: the longest turn's tokens.
  dstate, hidden_BxNxC = append_hidden(model, dstate, tokens_T, writing,
                                       real_length=jnp.max(count))

  def score(seen, column):
    k, before_C, token, grammar_state, write = column
    position_logits = jnp.where(k == 0, logits, text.logits(before_C).astype(jnp.float32))
    if seen is not None:
      position_logits = repetition_penalty(position_logits, seen, config.repetition_penalty)
      seen = mark_seen(seen, token[:, None], write[:, None])
    step_logits = turn_logits(automaton, position_logits, grammar_state,
                              jnp.full(batch, limit - k), config)
    _, logp = force(step_logits, token, jnp.zeros(batch), token, config)
    return seen, jnp.where(write, logp, 0.0)

  before = jnp.concatenate([hidden_BxNxC[:, :1], hidden_BxNxC[:, :-1]], 1)
  seen_BxV, logp_NxB = jax.lax.scan(
      score, seen_BxV, (jnp.arange(limit), jnp.swapaxes(before, 0, 1), tokens_NxB, states_NxB,
                        writing_NxB))
  ids, attention, loss, logprobs = buffers
  put = lambda buffer, block: jax.lax.dynamic_update_slice(buffer, block.astype(buffer.dtype),
                                                           (0, slot))
  buffers = (put(ids, tokens_T), put(attention, writing), put(loss, writing),
             put(logprobs, logp_NxB.T))
  logits = text.logits(dstate.last_hidden.astype(hidden_BxNxC.dtype)).astype(jnp.float32)
  return dstate, logits, tokens_T, states_T, count, final_state, buffers, seen_BxV


image_tokens = vision.image_tokens


def _turn_bytes(automaton: TokenAutomaton, tokens_T: Array, count: Array) -> Array:
  """The turn's text as byte ids, compacted to the front (-1 after)."""
  used = jnp.arange(tokens_T.shape[0]) < count
  data = jnp.where(used[:, None], automaton.token_bytes[tokens_T], -1).reshape(-1)
  return device_text.span(data, 0, data.shape[0])


def _answer_bytes(automaton: TokenAutomaton, tokens_T: Array, count: Array) -> Array:
  """The content of the turn's first <answer>...</answer> after its thinking (ANSWER_BYTES,
  -1 padded)."""
  data = _turn_bytes(automaton, tokens_T, count)
  # The answer follows the thinking: an "<answer>" written inside <think> is not it.
  think_end = device_text.find(data, device_text.encode("</think>"))
  data = device_text.span(data, jnp.where(think_end >= 0, think_end + len("</think>"), 0),
                          data.shape[0])
  found, start, end = device_text.answer_span(data)
  window = jax.lax.dynamic_slice(jnp.concatenate([data, jnp.full(ANSWER_BYTES, -1, data.dtype)]),
                                 (jnp.maximum(start, 0),), (ANSWER_BYTES,))
  inside = jnp.arange(ANSWER_BYTES) < end - start
  return jnp.where(found & inside, window, -1)


# Step keys of turns that produced no image (OR-GIGPO pools steps by the observation each
# produced: an answer, a malformed turn and a rejected call each get their own key rather
# than the hash of whatever image the environment returned).
ANSWER_KEY, MALFORMED_KEY, REJECTED_KEY = (jnp.uint32(0x9E3779B1), jnp.uint32(0x85EBCA77),
                                           jnp.uint32(0xC2B2AE3D))
# A text result's key (its text decides the match: `Trajectory.observation_text`).
TEXT_KEY = jnp.uint32(0x27D4EB2F)


def check_turn_budget(agent, config: RolloutConfig, automaton: TokenAutomaton | None = None
                      ) -> None:
  """The loop's turns and the environment's tool budget must agree: `max_calls` tool calls,
  then one turn to answer. With fewer turns the loop would silently cut the paper's budget;
  with more, turns past the budget could only be rejected calls.

  With the automaton: token ids must lie in its vocabulary, and under constrained decoding
  `max_turn_tokens` must hold the grammar's shortest valid turn (`min_turn_tokens`), else
  every token is masked and the sampler draws token 0 with log-probability NaN. Reads
  only static values, so it works under jit."""
  if not isinstance(config, RolloutConfig):
    raise TypeError(f"expected a RolloutConfig, got {type(config).__name__}")
  name = type(agent).__name__
  if config.max_turns != rules.max_turns(agent):
    raise ValueError(
        f"RolloutConfig.max_turns is {config.max_turns}, but {name} allows "
        f"{agent.max_calls} tool calls and then the answer: max_turns must be "
        f"{rules.max_turns(agent)} (or set the environment's budget to max_turns - 1)")
  if automaton is None:
    return
  vocab = automaton.vocab_size
  for field, ids in (("pad_token", (config.pad_token,)), ("eos_tokens", config.eos_tokens)):
    outside = [t for t in ids if not 0 <= t < vocab]
    if outside:
      raise ValueError(f"RolloutConfig.{field}: expected token ids in [0, {vocab}) (the "
                       f"automaton's vocabulary), got {outside[0]}")
  if config.top_k > vocab:
    raise ValueError(f"RolloutConfig.top_k: expected at most the vocabulary size {vocab} "
                     f"(0: off), got {config.top_k}")
  if config.constrained:
    shortest = automaton.min_turn_tokens
    grammar = automaton.grammar.name
    if shortest < 0:
      raise ValueError(f"RolloutConfig.constrained: {name}'s grammar {grammar!r} has no "
                       "valid turn in this vocabulary (the allowed tokens never reach "
                       "acceptance); constrained decoding could only sample masked tokens")
    if config.max_turn_tokens < shortest:
      raise ValueError(
          f"RolloutConfig.max_turn_tokens is {config.max_turn_tokens}, but the shortest valid "
          f"turn of {name}'s grammar {grammar!r} is {shortest} tokens: constrained decoding "
          f"would mask every token (sampling token 0 with log-probability NaN); "
          f"max_turn_tokens must be at least {shortest}")


def _turn_contains(automaton: TokenAutomaton, tokens_T: Array, count: Array,
                   pattern: bytes) -> Array:
  """Whether the turn's text holds `pattern` (e.g. the call's closing tag)."""
  return device_text.find(_turn_bytes(automaton, tokens_T, count), tuple(pattern)) >= 0


def rollout(model, agent, automaton: TokenAutomaton, template: ObservationTemplate, tasks,
            prompt_ids_BxL: Array, prompt_mask_BxL: Array, key: Array, config: RolloutConfig,
            judge: Callable | None = None, forced_BxTxN: Array | None = None,
            judge_state=None, replay: bool = False, group: int = 1) -> Trajectory:
  """Runs B episodes. `tasks` is a batch of `Task`s; the prompt holds the image tokens of
  the N views `agent.reset` returns (N x `image_tokens(model, agent.image_size)`, in order;
  views the prompt masks still take their slots). Jit it with `agent`,
  `template`, `config`, `judge` static (see `compile_rollout`).

  An episode ends with an answer, a malformed turn (unless the agent's
  `continue_on_format_error`: then a format-error observation follows), a tool call in its
  last turn, or when the environment says it is done. `config.max_turns` must be the
  agent's `max_calls` + 1 (`check_turn_budget`).

  `forced_BxTxN` (optional, [B, max_turns, max_turn_tokens]): token ids that replace the
  samples where >= 0 (scripted policies, replaying a trajectory, teacher forcing); their
  log-probabilities are still the policy's. `replay` (static; teacher replay): every turn
  is forced whole and written as one segment (`_replay_turn`), a turn with no forced
  tokens as an empty (malformed) turn; without it forced tokens are fed one decode step at
  a time and -1 samples. `judge(question [B, Lq], answer [B, A],
  references [B, R, La]) -> bool [B]` runs on the host at the end (an LLM judge) and
  replaces the rule judge; its verdict counts only for episodes that answered. A judge
  with `on_device` (`perception.PolicyJudge`: a jaxspatial policy) runs inside this
  program instead: `judge.verdicts(judge_state, question, answer, references, key)`.

  `key`: [2], one for the batch, or [B, 2], one per row (`rules.row_keys`: a row's draws
  then do not depend on the rows beside it, in a batch or a group).

  `group` (static; GRPO's group size, or several samples per question): each `group`
  consecutive rows hold one task and one prompt; the reset, the vision encoder and the
  prefill run on the group's first row and the state and cache are repeated to its rows
  (a reset ignores its key: every agent's does). The rows then sample apart."""
  check_turn_budget(agent, config, automaton)
  if replay and forced_BxTxN is None:
    raise ValueError("rollout: replay=True needs forced_BxTxN (the turns to replay)")
  batch, prompt_length = prompt_ids_BxL.shape
  if group < 1 or batch % group:
    raise ValueError(f"rollout: {batch} rows are not whole groups of {group}")
  turns = config.max_turns
  firsts = lambda x: x[::group]
  prompt_images_P, numbers, env_state = jax.vmap(agent.reset)(
      firsts(rules.reset_keys(key, batch)), jax.tree.map(firsts, tasks))
  prompt_images_P = vision.prompt_views(prompt_images_P)
  pixels, grids, sequence_grids = vision.prompt_inputs(model, prompt_images_P)
  size = capacity(prompt_length, template, config)
  dstate, logits = prefill(model, firsts(prompt_ids_BxL), firsts(prompt_mask_BxL), size,
                           jnp.dtype(config.cache_dtype), pixels, grids, sequence_grids)
  dstate = repeat_rows(dstate, group)
  prompt_images, numbers, env_state, logits = jax.tree.map(
      lambda x: jnp.repeat(x, group, axis=0), (prompt_images_P, numbers, env_state, logits))
  views = prompt_images.shape[1]
  pad = jnp.full((batch, size - prompt_length), config.pad_token, jnp.int32)
  buffers = (jnp.concatenate([prompt_ids_BxL.astype(jnp.int32), pad], 1),
             dstate.valid, jnp.zeros((batch, size), bool), jnp.zeros((batch, size), jnp.float32))
  seen = None
  if config.repetition_penalty != 1.0:
    seen = mark_seen(jnp.zeros((batch, logits.shape[-1]), bool), prompt_ids_BxL,
                     prompt_mask_BxL.astype(bool))
  num_fields = len(automaton.grammar.fields)
  height, width = agent.image_size
  shows_image = jnp.asarray([v.has_image for v in template.variants])
  shows_text = jnp.asarray([v.text_gap >= 0 for v in template.variants])
  record = dict(
      images=jnp.zeros((batch, views + turns, height, width, 3), jnp.uint8).at[:, :views].set(
          prompt_images),
      image_given=jnp.zeros((batch, views + turns), bool).at[:, :views].set(True),
      turn_start=jnp.zeros(turns, jnp.int32),
      turn_end=jnp.zeros(turns, jnp.int32),
      turn_length=jnp.zeros((batch, turns), jnp.int32),
      turn_active=jnp.zeros((batch, turns), bool),
      turn_valid=jnp.zeros((batch, turns), bool),
      turn_answer=jnp.zeros((batch, turns), bool),
      env_invalid=jnp.zeros((batch, turns), bool),
      action_values=jnp.zeros((batch, turns, num_fields), jnp.float32),
      action_present=jnp.zeros((batch, turns, num_fields), bool),
      observation_numbers=jnp.zeros((batch, turns + 1, template.num_numbers),
                                    jnp.float32).at[:, 0].set(numbers),
      observation_variant=jnp.zeros((batch, turns), jnp.int32),
      observation_hashes=jnp.zeros((batch, turns + 1), jnp.uint32).at[:, 0].set(
          jax.vmap(image_hash)(prompt_images[:, 0])),
      answer=jnp.full((batch, ANSWER_BYTES), -1, jnp.int32),
      malformed=jnp.zeros(batch, bool),
      observation_text=jnp.zeros((batch, turns, template.text_tokens), jnp.int32),
      observation_text_length=jnp.zeros((batch, turns), jnp.int32))

  def cond(carry):
    turn, running = carry[0], carry[1]
    return (turn < turns) & jnp.any(running)

  def body(carry):
    turn, running, dstate, logits, env_state, buffers, record, seen = carry
    turn_slot = dstate.next_slot
    forced = None if forced_BxTxN is None else jax.lax.dynamic_index_in_dim(
        forced_BxTxN, turn, axis=1, keepdims=False)
    if replay:
      dstate, logits, tokens_T, states_T, count, final_state, buffers, seen = _replay_turn(
          model, automaton, config, dstate, logits, running, buffers, forced, seen)
    else:
      dstate, logits, tokens_T, states_T, count, final_state, buffers, seen = _decode_turn(
          model, automaton, config, turn, key, dstate, logits, running, buffers, forced, seen)
    turn_end = dstate.next_slot
    parsed = jax.vmap(lambda t, s, n, f: parse_turn(automaton, t, s, n, f))(
        tokens_T, states_T, count, final_state)
    last_turn = rules.last_turn(turn, turns)
    # As an agent server sees it: only a turn that stopped at the call's closing tag is a
    # (malformed) action to retry; one ending at EOS, the token limit or `</answer>` ends
    # the episode.
    closed_call = jax.vmap(lambda t, n: _turn_contains(
        automaton, t, n, rules.call_stop(automaton.grammar)))(tokens_T, count)
    kind = rules.classify_turn(running, parsed.valid,
                               rules.answer_kind(parsed.values, automaton.grammar), last_turn,
                               closed_call, agent.continue_on_format_error)
    answered = kind.answered
    image, numbers, new_env, env_invalid, env_done = jax.vmap(
        lambda k, s, p, a: agent.step(k, s, p, a))(rules.step_keys(key, turn, batch), env_state,
                                                   parsed, answered)
    acted = rules.stepped(kind)
    env_state = jax.tree.map(
        lambda new, old: jnp.where(acted.reshape((-1,) + (1,) * (new.ndim - 1)), new, old),
        new_env, env_state)
    outcome = rules.turn_outcome(kind, env_invalid, env_done, last_turn)
    format_error, rejected = outcome.format_error, outcome.rejected
    ended_badly, continuing = outcome.ended_badly, outcome.continuing
    answer_now = jax.vmap(lambda t, n: _answer_bytes(automaton, t, n))(tokens_T, count)
    variant = rules.observation_variants(agent, rejected, outcome.retry,
                                         rules.next_is_final(turn, turns), env_state)
    step_key = jnp.where(answered, ANSWER_KEY, jnp.where(
        format_error, MALFORMED_KEY, jnp.where(rejected, REJECTED_KEY, jnp.where(
            shows_text[variant], TEXT_KEY, jax.vmap(image_hash)(image)))))
    if template.text_tokens:  # a host tool's tokenised result (PERIA's perception tools)
      text = jax.vmap(agent.observation_text)(env_state)
      text_used = shows_text[variant] & running
      record = dict(
          record,
          observation_text=record["observation_text"].at[:, turn].set(
              jnp.where(text_used[:, None], text[0], 0)),
          observation_text_length=record["observation_text_length"].at[:, turn].set(
              jnp.where(text_used, jnp.sum(text[1], -1), 0)))

    at = lambda array, value: array.at[:, turn].set(value)
    record = dict(
        record,
        images=record["images"].at[:, views + turn].set(image),
        image_given=record["image_given"].at[:, views + turn].set(
            continuing & shows_image[variant]),
        turn_start=record["turn_start"].at[turn].set(turn_slot),
        turn_end=record["turn_end"].at[turn].set(turn_end),
        turn_length=at(record["turn_length"], jnp.where(running, count, 0)),
        turn_active=at(record["turn_active"], running),
        turn_valid=at(record["turn_valid"], running & parsed.valid),
        turn_answer=at(record["turn_answer"], answered),
        env_invalid=at(record["env_invalid"], rejected),
        action_values=at(record["action_values"], parsed.values),
        action_present=at(record["action_present"], parsed.present),
        observation_numbers=record["observation_numbers"].at[:, turn + 1].set(numbers),
        observation_variant=at(record["observation_variant"], variant),
        observation_hashes=record["observation_hashes"].at[:, turn + 1].set(
            jnp.where(running, step_key, 0)),
        answer=jnp.where(outcome.finishing[:, None], answer_now, record["answer"]),
        malformed=record["malformed"] | ended_badly)

    if template.text_tokens:
      ids, mask = jax.vmap(lambda n, v, t: observation_tokens(template, n, v, t))(
          numbers, variant, text)
    else:
      ids, mask = jax.vmap(lambda n, v: observation_tokens(template, n, v))(numbers, variant)
    mask = mask & continuing[:, None]

    def observe(args):
      dstate, logits, buffers = args
      pixels, grids, sequence_grids = vision.view_inputs(model, image)
      slot = dstate.next_slot
      dstate, segment_logits = append(model, dstate, ids, mask, pixels, grids, sequence_grids)
      tokens, attention, loss, logprobs = buffers
      buffers = (jax.lax.dynamic_update_slice(tokens, ids, (0, slot)),
                 jax.lax.dynamic_update_slice(attention, mask, (0, slot)), loss, logprobs)
      return dstate, segment_logits, buffers

    def skip(args):
      # Nobody continues: no compute, but the message's tokens are still laid out (masked)
      # so that every trajectory holds the same image groups (static shapes for training).
      dstate, logits, buffers = args
      slot = dstate.next_slot
      tokens, attention, loss, logprobs = buffers
      written = jax.lax.dynamic_update_slice(tokens, ids, (0, slot))
      tokens = jnp.where(turn < turns - 1, written, tokens)
      empty = DecodeState(cache=dstate.cache, valid=dstate.valid,
                          next_slot=dstate.next_slot + template.length,
                          next_position=dstate.next_position, last_hidden=dstate.last_hidden,
                          last_token=dstate.last_token)
      return empty, logits, (tokens, attention, loss, logprobs)

    dstate, logits, buffers = jax.lax.cond(jnp.any(continuing), observe, skip,
                                           (dstate, logits, buffers))
    if seen is not None:
      seen = mark_seen(seen, ids, mask)
    return turn + 1, continuing, dstate, logits, env_state, buffers, record, seen

  carry = (jnp.asarray(0, jnp.int32), jnp.ones(batch, bool), dstate, logits, env_state, buffers,
           record, seen)
  _, _, dstate, _, env_state, buffers, record, _ = jax.lax.while_loop(cond, body, carry)
  tokens, attention, loss, logprobs = buffers

  answered = jnp.any(record["turn_answer"], -1)
  verdict = None
  if on_device(judge):
    if judge_state is None:
      raise ValueError(f"rollout: the on-device judge {judge!r} needs judge_state "
                       "(judge.state())")
    if rules.per_row(key):
      raise ValueError("rollout: an on-device judge samples the batch with one key; row "
                       "keys ([B, 2]) would make its verdicts depend on the batch")
    verdict = judge.verdicts(judge_state, tasks.question_ids, record["answer"],
                             tasks.answer_ids, jax.random.fold_in(key, rules.JUDGE_FOLD))
  elif judge is not None:
    # Rows the agent does not ask about (PERIA: the rule already decided) go blank: the
    # judge answers them False without a request.
    asks = rules.judge_asks(agent, tasks, record["answer"], answered)
    verdict = jax.experimental.io_callback(
        judge, jax.ShapeDtypeStruct((batch,), jnp.bool_), tasks.question_ids,
        jnp.where(asks[:, None], record["answer"], -1), tasks.answer_ids, ordered=False)
  reward, components = rules.rewards(agent, env_state, tasks, record["answer"], answered,
                                     record["malformed"], verdict)
  return Trajectory(
      tokens=tokens, attention_mask=attention, loss_mask=loss, logprobs=logprobs,
      images=record["images"], image_given=record["image_given"],
      turn_start=record["turn_start"], turn_end=record["turn_end"],
      turn_length=record["turn_length"],
      turn_active=record["turn_active"], turn_valid=record["turn_valid"],
      turn_answer=record["turn_answer"], env_invalid=record["env_invalid"],
      action_values=record["action_values"], action_present=record["action_present"],
      observation_numbers=record["observation_numbers"],
      observation_variant=record["observation_variant"],
      observation_hashes=record["observation_hashes"], answer=record["answer"], reward=reward,
      reward_components=components, observation_text=record["observation_text"],
      observation_text_length=record["observation_text_length"])


@functools.lru_cache(maxsize=16)
def compile_rollout(agent, template: ObservationTemplate, config: RolloutConfig,
                    judge: Callable | None = None, replay: bool = False, group: int = 1):
  """`rollout` jitted: f(model, automaton, tasks, prompt_ids, prompt_mask, key,
  forced=None, judge_state=None); an on-device judge's `state()` goes in `judge_state`;
  `replay`: forced turns are whole, each written as one segment; `group`: consecutive rows
  share a prompt, prefilled once."""

  def run(model, automaton, tasks, prompt_ids, prompt_mask, key, forced=None,
          judge_state=None):
    return rollout(model, agent, automaton, template, tasks, prompt_ids, prompt_mask, key,
                   config, judge, forced, judge_state, replay, group)
  return reading_jit(run)


def forced_tokens(tokenizer, scripts, config: RolloutConfig) -> np.ndarray:
  """[B, max_turns, max_turn_tokens] int32 for `rollout(forced=...)` from per-episode lists of
  turn strings (None: that turn is sampled); -1 where the policy samples."""
  out = np.full((len(scripts), config.max_turns, config.max_turn_tokens), -1, np.int32)
  for b, turns in enumerate(scripts):
    if len(turns) > config.max_turns:
      raise ValueError(f"forced_tokens: episode {b} has {len(turns)} turns, more than "
                       f"max_turns {config.max_turns}")
    for t, turn in enumerate(turns):
      if turn is None:
        continue
      ids = tokenizer.encode(turn, add_special_tokens=False)
      if len(ids) > config.max_turn_tokens:
        raise ValueError(f"forced_tokens: episode {b} turn {t} is {len(ids)} tokens, more than "
                         f"max_turn_tokens {config.max_turn_tokens}")
      out[b, t, :len(ids)] = ids
  return out


@functools.lru_cache(maxsize=4)
def _token_pieces(tokenizer) -> list[bytes]:
  """Each token's bytes (walks the whole vocabulary: once per tokenizer, not per batch)."""
  return token_bytes(tokenizer)[0]


def check_replay(trajectory, forced_BxTxN, records, tokenizer) -> None:
  """Raises when a replayed episode (teacher SFT: every turn forced) did not play each of
  its forced turns whole: a turn the grammar rejects (the episode would end there and the
  rest of the trajectory be dropped), a turn never reached, one that closed before its
  last token (text after the closing tag), or a turn the episode played past the teacher's
  last (its tokens would not be the teacher's). `records[b]` names episode b's record."""
  pieces = _token_pieces(tokenizer)
  forced = np.asarray(forced_BxTxN)
  active, valid = np.asarray(trajectory.turn_active), np.asarray(trajectory.turn_valid)
  length = np.asarray(trajectory.turn_length)
  for b in range(forced.shape[0]):
    for t in range(forced.shape[1]):
      ids = forced[b, t][forced[b, t] >= 0]
      if not len(ids):
        if active[b, t]:
          raise ValueError(f"{records[b]}: the episode went on after the teacher's last turn "
                           f"{t - 1} (a tool call, not an answer): turn {t} has no teacher "
                           "tokens to replay")
        continue
      text = b"".join(pieces[i] for i in ids)
      if not active[b, t]:
        played = int(active[b].sum())
        raise ValueError(f"{records[b]}: turn {t} was never played: the episode ended after "
                         f"turn {played - 1} (an answer, a rejected call past the budget or "
                         f"the environment's end) with teacher turns left: {text[:200]!r}")
      if not valid[b, t]:
        raise ValueError(f"{records[b]}: turn {t} is not a well-formed call or answer in "
                         f"the agent's grammar: {text[:300]!r}")
      if length[b, t] != len(ids):
        kept = b"".join(pieces[i] for i in ids[:length[b, t]])
        raise ValueError(f"{records[b]}: turn {t} closes after {length[b, t]} of its "
                         f"{len(ids)} tokens; the text after it would be dropped: "
                         f"{text[len(kept):][:200]!r}")
