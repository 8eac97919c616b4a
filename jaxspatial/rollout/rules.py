"""The episode rules, once: how a turn ends an episode, the call budget, the keys, the
answer kind, the observation variant and the reward. The compiled loop (`episode`), the
host loop (`host_loop`) and the API loop (`api_agent`) all call these, so the three play
the same episodes by construction.

The outcome functions are elementwise boolean algebra: under jit they take jnp bool
arrays ([B] per turn), on the host numpy bools (`host_turn` / `host_outcome` wrap them for
Python values). The rules:
  - a well-formed answer ends the episode (its answer recorded);
  - a malformed turn ends it as malformed, unless the agent's `continue_on_format_error`,
    the turn stopped at the call's closing tag and a turn is left: then it is retried
    (a format-error message follows; the environment is not stepped);
  - a tool call in the last turn ends it as malformed, as does a call the environment
    rejected for good (invalid and done); the environment's done ends it.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

RESET_FOLD = 2 ** 20   # reset keys: fold_in(key, RESET_FOLD), split over the batch
STEP_FOLD = 2 ** 21    # step keys of turn t: fold_in(fold_in(key, STEP_FOLD), t), split
JUDGE_FOLD = 2 ** 22   # an on-device judge's key


# --- budget and keys -------------------------------------------------------------------

def max_turns(agent) -> int:
  """The loop's turns: the agent's tool budget, then one turn to answer."""
  return agent.max_calls + 1


# A rollout's key is one for the batch ([2]: the rows' draws depend on the batch's shape)
# or one per row ([B, 2], `row_keys`: a row samples the same whatever rows share its batch,
# so an evaluation's question draws alike in any batch, group or resumed run).

def row_keys(seed: int, ids) -> jax.Array:
  """[len(ids), 2]: row r's key fold_in(PRNGKey(seed), ids[r]) (ids: stable per row, e.g.
  a question's hash)."""
  base = jax.random.PRNGKey(seed)
  return jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.asarray(ids, jnp.uint32))


def per_row(key) -> bool:
  return key.ndim == 2


def _fold(key, *data):
  fold = lambda k: _fold_all(k, data)
  return jax.vmap(fold)(key) if per_row(key) else fold(key)


def _fold_all(key, data):
  for value in data:
    key = jax.random.fold_in(key, value)
  return key


def reset_keys(key, batch: int):
  if per_row(key):
    return _fold(key, RESET_FOLD)
  return jax.random.split(jax.random.fold_in(key, RESET_FOLD), batch)


def step_keys(key, turn, batch: int):
  if per_row(key):
    return _fold(key, STEP_FOLD, turn)
  return jax.random.split(jax.random.fold_in(jax.random.fold_in(key, STEP_FOLD), turn), batch)


def token_key(key, turn, k):
  """The key of the token at step k of turn t (a host loop reproduces the compiled one);
  [B, 2] for row keys."""
  return _fold(key, turn, k)


def last_turn(turn, turns: int):
  return turn == turns - 1


def next_is_final(turn, turns: int):
  """Whether the turn after this one is the last (the answer-only turn)."""
  return turn + 1 == turns - 1


# --- a turn's outcome ------------------------------------------------------------------

def call_stop(grammar) -> bytes:
  """The call's closing tag: a malformed turn that stopped at it may be retried."""
  return grammar.stops[0]


def stopped_at_call(turn: bytes, grammar) -> bool:
  """Host: whether a turn's text holds the call's closing tag."""
  return call_stop(grammar) in turn


def answer_kind(values_xF, grammar):
  """Whether parsed field values ([..., F]) are an answer (the "kind" field's option)."""
  option = grammar.option("kind", b"<answer>")
  return values_xF[..., grammar.field_id("kind") - 1] == option


class Turn(NamedTuple):
  """What a turn was, before the environment step."""
  answered: object
  call: object
  format_error: object
  retry: object


def classify_turn(running, valid, answer, last, stopped_at_call_tag,
                  continue_on_format_error: bool) -> Turn:
  """running: the episode plays this turn; valid: the grammar accepted it; answer: it is
  an answer; last: the last turn; stopped_at_call_tag: its text holds the call's closing
  tag. A malformed turn is retried only with the agent's `continue_on_format_error`."""
  answered = running & valid & answer
  call = running & valid & ~answer
  format_error = running & ~valid
  retry = format_error & ~last & stopped_at_call_tag
  if not continue_on_format_error:
    retry = format_error & False
  return Turn(answered, call, format_error, retry)


class Outcome(NamedTuple):
  """A turn's consequences after the environment step."""
  answered: object
  call: object
  format_error: object
  retry: object
  rejected: object      # a call the environment refused (invalid)
  done: object          # the environment accepts no further action
  ended_badly: object   # the episode ends malformed
  continuing: object    # the episode plays another turn
  finishing: object     # the episode ends here and records this turn's answer


def turn_outcome(turn: Turn, env_invalid, env_done, last) -> Outcome:
  """The rules after the step (`env_invalid`, `env_done`: the step's flags; ignored where
  the environment was not stepped, i.e. neither a call nor an answer)."""
  acted = turn.call | turn.answered
  rejected = turn.call & env_invalid
  done = acted & env_done
  ended_badly = (turn.format_error & ~turn.retry) | (turn.call & (last | (rejected & done)))
  continuing = (turn.call & ~last & ~done) | turn.retry
  return Outcome(*turn, rejected, done, ended_badly, continuing, turn.answered | ended_badly)


def stepped(turn: Turn):
  """Whether the environment is stepped for this turn (a call or an answer)."""
  return turn.call | turn.answered


def host_turn(valid: bool, answer: bool, last: bool, stopped_at_call_tag: bool,
              continue_on_format_error: bool) -> Turn:
  """`classify_turn` of one running episode from Python values (the host and API loops)."""
  flag = lambda value: np.bool_(bool(value))
  turn = classify_turn(flag(True), flag(valid), flag(answer), flag(last),
                       flag(stopped_at_call_tag), continue_on_format_error)
  return Turn(*(bool(v) for v in turn))


def host_outcome(turn: Turn, env_invalid: bool, env_done: bool, last: bool) -> Outcome:
  """`turn_outcome` from Python values: Python bools."""
  flag = lambda value: np.bool_(bool(value))
  outcome = turn_outcome(Turn(*map(flag, turn)), flag(env_invalid), flag(env_done),
                         flag(last))
  return Outcome(*(bool(v) for v in outcome))


# --- observation and reward ------------------------------------------------------------

def observation_variant(agent, invalid, format_error, next_final, env_state):
  """The message variant one episode shows after a turn (int32)."""
  return jnp.asarray(agent.observation_variant(invalid, format_error, next_final, env_state),
                     jnp.int32)


def observation_variants(agent, invalid_B, format_error_B, next_final, env_state_B):
  """[B] `observation_variant` of a batch (one `next_final` for all)."""
  return jax.vmap(lambda i, f, s: observation_variant(agent, i, f, next_final, s))(
      invalid_B, format_error_B, env_state_B)


def judge_asks(agent, tasks, answers_BxA, answered_B):
  """[B] the rows a host judge is asked about (the others reach it blank)."""
  return jax.vmap(agent.judge_asks)(tasks, answers_BxA, answered_B)


def rewards(agent, env_states, tasks, answers_BxA, answered_B, malformed_B, verdict_B=None):
  """([B] reward, components) from the final states, the recorded answers and the flags;
  `verdict_B` a judge's (None: the agent's rule judge)."""
  return jax.vmap(agent.reward, in_axes=(0, 0, 0, 0, 0, None if verdict_B is None else 0))(
      env_states, tasks, answers_BxA, answered_B, malformed_B, verdict_B)
