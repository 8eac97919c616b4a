"""A host-driven rollout in the style of agent frameworks: a jitted decode step per token,
stop strings and regex parsing on the host (`agent.host_fields`), environments stepped from
Python one episode at a time, rewards from string rules (`agent.host_text_reward`). The
episode rules are the compiled loop's (`rules`), on Python values.

It is the slow reference the compiled rollout is tested against (same cache layout, same
keys, so the same episodes) and the baseline of `benchmarks/rollout_bench.py`. Parse-only
decoding (the model is free; malformed turns end the episode).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxspatial.models.sampler import DecodeState, append, prefill
from jaxspatial.rollout import rules, vision
from jaxspatial.rollout.token_table import token_bytes
from jaxspatial.rollout.episode import (RolloutConfig, capacity, check_turn_budget, force,
                                        sample_token)
from jaxspatial.rollout.observation import ObservationTemplate, observation_tokens_host
from jaxspatial.rollout.parse import ParsedTurn


# Each program is `jax.jit` over the model as the pytree it is: `nnx.jit` would walk the
# module graph on every token (benchmarks/call_overhead_bench.py).
@functools.partial(jax.jit, static_argnames=("size", "dtype"))
def _prefill(model, ids, mask, images, size, dtype):
  pixels, grids, sequence_grids = vision.prompt_inputs(model, images)
  return prefill(model, ids, mask, size, jnp.dtype(dtype), pixels, grids, sequence_grids)


# The cache crosses the jit boundary on every token here: donated, it is updated in place
# (the compiled rollout carries it inside one program and needs no donation).
@functools.partial(jax.jit, static_argnames=("config",), donate_argnames=("dstate",))
def _decode_step(model, dstate, logits, key, turn, k, writing, forced, config):
  text = model.language_model
  token, logp = sample_token(logits, rules.token_key(key, turn, k), config)
  token, logp = force(logits, token, logp, forced, config)
  token = jnp.where(writing, token, config.pad_token)
  slot = dstate.next_slot
  valid = jax.lax.dynamic_update_slice(dstate.valid, writing[:, None], (0, slot))
  batch = token.shape[0]
  position = jnp.broadcast_to(dstate.next_position[None, :, None], (3, batch, 1))
  hidden, cache = text.extend(text.embed_tokens(token[:, None]), position, valid, dstate.cache,
                              slot)
  dstate = DecodeState(cache=cache, valid=valid, next_slot=slot + 1,
                       next_position=dstate.next_position + writing.astype(jnp.int32),
                       last_hidden=hidden[:, -1].astype(jnp.float32), last_token=token)
  return token, jnp.where(writing, logp, 0.0), dstate, text.logits(hidden[:, -1]).astype(
      jnp.float32)


@functools.partial(jax.jit, donate_argnames=("dstate",))
def _append(model, dstate, ids, mask, images):
  pixels, grids, sequence_grids = vision.view_inputs(model, images)
  return append(model, dstate, ids, mask, pixels, grids, sequence_grids)


def host_rollout(model, agent, tokenizer, template: ObservationTemplate, tasks, prompt_ids,
                 prompt_mask, key, config: RolloutConfig, forced=None) -> dict:
  """Runs the episodes from Python. Returns numpy arrays named as `Trajectory`'s fields
  (tokens, attention_mask, loss_mask, logprobs, turn_length, turn_answer, action_values,
  action_present, reward, ...) and `turn_text` (each episode's turns as bytes)."""
  if config.constrained:
    raise ValueError("host_rollout: the host loop decodes parse-only (constrained=False)")
  if config.repetition_penalty != 1.0:
    raise ValueError("host_rollout: the host loop has no repetition penalty "
                     f"(RolloutConfig.repetition_penalty {config.repetition_penalty})")
  check_turn_budget(agent, config)
  pieces, _ = token_bytes(tokenizer)
  grammar = agent.grammar
  stops = tuple(grammar.stops)
  eos = set(config.eos_tokens)
  batch, prompt_length = prompt_ids.shape
  size = capacity(prompt_length, template, config)
  step_env = jax.jit(agent.step)
  prompt_images, numbers, env_state = jax.jit(jax.vmap(agent.reset))(
      rules.reset_keys(key, batch), tasks)
  prompt_images = vision.prompt_views(prompt_images)
  images = prompt_images[:, 0]
  dstate, logits = _prefill(model, jnp.asarray(prompt_ids), jnp.asarray(prompt_mask),
                            prompt_images, size, config.cache_dtype)
  tokens = np.full((batch, size), config.pad_token, np.int32)
  tokens[:, :prompt_length] = prompt_ids
  attention = np.zeros((batch, size), bool)
  attention[:, :prompt_length] = prompt_mask
  loss = np.zeros((batch, size), bool)
  logprobs = np.zeros((batch, size), np.float32)
  turns = config.max_turns
  fields = len(grammar.fields)
  out = dict(turn_length=np.zeros((batch, turns), np.int32),
             turn_active=np.zeros((batch, turns), bool),
             turn_valid=np.zeros((batch, turns), bool), turn_answer=np.zeros((batch, turns), bool),
             action_values=np.zeros((batch, turns, fields), np.float32),
             action_present=np.zeros((batch, turns, fields), bool))
  states = [jax.tree.map(lambda x, i=i: x[i], env_state) for i in range(batch)]
  running = np.ones(batch, bool)
  malformed = np.zeros(batch, bool)
  final_turn = [b""] * batch
  turn_text = [[] for _ in range(batch)]
  for turn in range(turns):
    if not running.any():
      break
    ended = ~running
    text = [b""] * batch
    count = np.zeros(batch, np.int32)
    for k in range(config.max_turn_tokens):
      if ended.all():
        break
      writing = ~ended
      slot = int(dstate.next_slot)
      forced_k = (np.full(batch, -1, np.int32) if forced is None
                  else np.asarray(forced)[:, turn, k].astype(np.int32))
      token, logp, dstate, logits = _decode_step(model, dstate, logits, key, turn, k,
                                                 jnp.asarray(writing), jnp.asarray(forced_k),
                                                 config)
      token, logp = np.asarray(token), np.asarray(logp)
      tokens[:, slot] = token
      attention[:, slot] = writing
      loss[:, slot] = writing
      logprobs[:, slot] = logp
      for b in np.nonzero(writing)[0]:
        # ids past the tokenizer's (the model's padded vocabulary) have no text, as the
        # automaton's tables say
        text[b] += pieces[token[b]] if token[b] < len(pieces) else b""
        count[b] += 1
        closed = token[b] in eos or any(s in text[b] for s in stops)
        if closed or k + 1 == config.max_turn_tokens:
          ended[b] = True
    next_numbers, next_images, variants = [], [], []
    continuing = np.zeros(batch, bool)
    for b in range(batch):
      if not running[b]:
        next_numbers.append(np.zeros(template.num_numbers, np.float32))
        next_images.append(np.asarray(images[b]))
        variants.append(0)
        continue
      turn_text[b].append(text[b])
      parsed = agent.host_fields(text[b])
      values, present, answer = parsed or (np.zeros(len(grammar.fields), np.float32),
                                           np.zeros(len(grammar.fields), bool), False)
      last = bool(rules.last_turn(turn, turns))
      kind = rules.host_turn(parsed is not None, answer, last,
                             rules.stopped_at_call(text[b], grammar),
                             agent.continue_on_format_error)
      out["turn_length"][b, turn] = count[b]
      out["turn_active"][b, turn] = True
      out["turn_valid"][b, turn] = parsed is not None
      out["turn_answer"][b, turn] = kind.answered
      out["action_values"][b, turn] = values
      out["action_present"][b, turn] = present
      invalid = done = False
      if rules.stepped(kind):
        step = ParsedTurn(valid=jnp.asarray(True), values=jnp.asarray(values),
                          present=jnp.asarray(present))
        image, nums, states[b], invalid, done = step_env(
            rules.step_keys(key, turn, batch)[b], states[b], step, jnp.asarray(kind.answered))
        next_images.append(np.asarray(image))
        next_numbers.append(np.asarray(nums))
      else:
        next_images.append(np.asarray(images[b]))
        next_numbers.append(np.zeros(template.num_numbers, np.float32))
      outcome = rules.host_outcome(kind, invalid, done, last)
      malformed[b] |= outcome.ended_badly
      if outcome.finishing:
        final_turn[b] = text[b]
      continuing[b] = outcome.continuing
      variants.append(int(rules.observation_variant(
          agent, jnp.asarray(outcome.rejected), jnp.asarray(outcome.retry),
          jnp.asarray(rules.next_is_final(turn, turns)), states[b])))
    images = jnp.asarray(np.stack(next_images))
    if continuing.any():
      ids, mask = zip(*(observation_tokens_host(template, n, v)
                        for n, v in zip(next_numbers, variants)))
      ids, mask = np.stack(ids), np.stack(mask) & continuing[:, None]
      slot = int(dstate.next_slot)
      dstate, logits = _append(model, dstate, jnp.asarray(ids), jnp.asarray(mask), images)
      tokens[:, slot:slot + template.length] = ids
      attention[:, slot:slot + template.length] = mask
    running = continuing
  rewards = np.zeros(batch, np.float32)
  for b in range(batch):
    task = jax.tree.map(lambda x, b=b: np.asarray(x[b]), tasks)
    answered = bool(out["turn_answer"][b].any())
    state = jax.tree.map(np.asarray, states[b])
    rewards[b] = agent.host_text_reward(final_turn[b].decode("utf-8", "replace"), answered,
                                        task, state)
  out.update(tokens=tokens, attention_mask=attention, loss_mask=loss, logprobs=logprobs,
             reward=rewards, malformed=malformed, turn_text=turn_text)
  return out
