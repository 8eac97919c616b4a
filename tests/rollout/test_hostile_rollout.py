"""Hostile rollout configuration and 3DThinker's format reward.

A constrained turn budget below the grammar's shortest valid turn masked every token (the
sampler then drew token 0 with log-probability NaN): it is refused, naming max_turn_tokens,
the minimum and the agent. RolloutConfig's other fields are fuzzed: a config either
works (the first constrained step has tokens to sample, with a finite log-probability) or
is refused naming the field. 3DThinker's format reward counts only a latent block of the
special token ids, not the same text spelled with ordinary tokens."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspatial.envs import act3d
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.rl.rewards import text as text_rules
from jaxspatial.rollout import agents, episode, grammars, host_parse
from jaxspatial.rollout import automaton as am, token_table as tt
from jaxspatial.rollout import thinker3d as rollout3d
from jaxspatial.rollout import tiny
from jaxspatial.rollout.runner import AgentRollout
from tests.rollout.conftest import LATENT_TOKENS

AGENT = agents.Act3DAgent(act3d.Act3DParams(width=32, height=24, max_interactions=2))


@pytest.fixture(scope="module")
def act3d_automaton(tokenizer):
  return tt.compile_token_automaton(AGENT.grammar, tokenizer)


@pytest.fixture(scope="module")
def thinker_automaton(tokenizer):
  return tt.compile_token_automaton(grammars.thinker3d(12), tokenizer)


_PROGRAMS = {}


def _first_step(automaton, temperature: float):
  """The first constrained step of a turn with `remaining` tokens: (any token allowed,
  sampled token, its log-probability). One program per automaton and temperature;
  `remaining` is traced."""
  key = (id(automaton), temperature)
  if key not in _PROGRAMS:
    _PROGRAMS[key] = (automaton, _compile_first_step(automaton, temperature))
  return _PROGRAMS[key][1]


def _compile_first_step(automaton, temperature: float):
  @jax.jit
  def run(remaining, key):
    logits = jax.random.normal(key, (4, automaton.vocab_size)) * 3.0
    config = episode.RolloutConfig(constrained=True, temperature=temperature)
    masked = episode.turn_logits(automaton, logits, jnp.full(4, am.START, jnp.int32),
                                 jnp.full(4, remaining), config)
    token, logp = episode.sample_token(masked, key, config)
    return jnp.any(jnp.isfinite(masked), -1), token, logp
  return run


def _shortest_by_walking(automaton, limit: int, tokenizer) -> bytes:
  """A valid turn of exactly `limit` tokens, built on the host by following the
  constrained mask's rule (a live, allowed token that can still close with `limit - k`
  left): the host parser must accept it."""
  pieces, _ = tt.token_bytes(tokenizer)
  token_next = np.asarray(automaton.token_next).astype(np.int64)
  distance, banned = np.asarray(automaton.distance), np.asarray(automaton.banned)
  state, out = am.START, b""
  for k in range(limit):
    nxt = token_next[state]
    allowed = (nxt != am.DEAD) & ~banned & (distance[nxt] <= limit - k - 1)
    token = int(np.flatnonzero(allowed)[0])
    out += pieces[token]
    state = int(nxt[token])
  assert bool(np.asarray(automaton.accepting)[state])
  return out


def test_the_shortest_turn_is_the_boundary_where_the_constrained_mask_empties(
    act3d_automaton, thinker_automaton, tokenizer):
  for automaton in (act3d_automaton, thinker_automaton):
    shortest = tt.min_turn_tokens(automaton)
    # Forward breadth first on the host == the device tables' backward distances.
    assert shortest == int(automaton.distance[am.START]) > 1
    assert shortest == tt.shortest_turn(automaton.token_next, automaton.accepting,
                                        ~np.asarray(automaton.banned))
    run = _first_step(automaton, 1.0)
    ok, _, logp = jax.device_get(run(shortest - 1, jax.random.PRNGKey(0)))
    assert not ok.any() and np.isnan(logp).all()  # the hazard: every token masked
    ok, _, logp = jax.device_get(run(shortest, jax.random.PRNGKey(0)))
    assert ok.all() and np.isfinite(logp).all()
  turn = _shortest_by_walking(act3d_automaton, tt.min_turn_tokens(act3d_automaton), tokenizer)
  assert host_parse.parse_act3d(turn) is not None, turn
  # A grammar the vocabulary can never close has no shortest turn.
  dead = np.zeros((3, 5), np.int32)
  assert tt.shortest_turn(dead, np.asarray([False, False, True]), np.ones(5, bool)) == -1


def test_a_constrained_budget_below_the_shortest_turn_is_refused(act3d_automaton):
  shortest = tt.min_turn_tokens(act3d_automaton)
  config = episode.RolloutConfig(max_turns=3, max_turn_tokens=shortest - 1, constrained=True)
  message = (rf"RolloutConfig.max_turn_tokens is {shortest - 1}, but the shortest valid turn of "
             rf"Act3DAgent's grammar 'act3d' is {shortest} tokens: .* max_turn_tokens must be "
             rf"at least {shortest}")
  with pytest.raises(ValueError, match=message):
    episode.check_turn_budget(AGENT, config, act3d_automaton)
  # The check reads static values only, so it refuses under jit too (rollout calls it
  # while tracing, with the automaton's tables as tracers).
  with pytest.raises(ValueError, match=message):
    jax.jit(lambda a: episode.check_turn_budget(AGENT, config, a) or 0)(act3d_automaton)
  episode.check_turn_budget(AGENT, dataclasses.replace(config, max_turn_tokens=shortest),
                            act3d_automaton)
  # Parse-only decoding samples unmasked logits: no NaN, and no refusal.
  episode.check_turn_budget(AGENT, dataclasses.replace(config, constrained=False),
                            act3d_automaton)


def test_agent_rollout_refuses_a_short_budget_at_setup(tokenizer, act3d_automaton):
  # The trainer builds its AgentRollout before compiling anything: the refusal must come
  # there, not at the first rollout after minutes of compilation.
  model = Qwen25VL(tiny.model_config(tokenizer), rngs=nnx.Rngs(0))
  shortest = tt.min_turn_tokens(act3d_automaton)
  with pytest.raises(ValueError, match=rf"max_turn_tokens must be at least {shortest}"):
    AgentRollout.create(AGENT, tokenizer, model, max_turns=3, max_turn_tokens=shortest - 1,
                        constrained=True)
  run = AgentRollout.create(AGENT, tokenizer, model, max_turns=3, max_turn_tokens=shortest,
                            constrained=True)
  assert run.config.max_turn_tokens == shortest


def _config_mutations(rng, shortest, vocab):
  """(fields, mutated field names): one to three fields of a good config changed, to
  values that work or must be refused."""
  pools = {
      "max_turns": [3, 3, 0, -1, 2, 4, 3.0, True, None, "3"],
      "max_turn_tokens": [shortest, shortest + 7, 10 ** 6, shortest - 1, 1, 0, -5, 64.0,
                          True, "64", None],
      "constrained": [True, False, 1, "yes", None],
      "temperature": [0.0, 1.0, 1.0, -1.0, np.nan, np.inf, 1e-30, -0.0, "hot", None, True],
      "top_k": [0, 0, -1, vocab + 1, 10 ** 9, 2.5, True, None],
      "top_p": [1.0, 1.0, 0.0, -0.1, 1.5, np.nan, np.inf, None, "0.9"],
      "eos_tokens": [(), (5,), [5, 6], (-1,), (vocab,), (10 ** 9,), (1.5,), (True,), 5, "5",
                     None],
      "pad_token": [0, 3, -1, vocab, 1.5, None, True],
      "cache_dtype": ["float32", "bfloat16", "float16", "int8", "bool", "nope", None, 3],
      "repetition_penalty": [1.0, 1.3, 0.0, -1.0, np.nan, np.inf, None, "1"],
  }
  fields = dict(max_turns=3, max_turn_tokens=shortest + 3, constrained=True, temperature=1.0,
                eos_tokens=(5,), pad_token=0)
  names = list(pools)
  mutated = [names[i] for i in rng.choice(len(names), rng.integers(1, 3), replace=False)]
  for name in mutated:
    pool = pools[name]
    fields[name] = pool[rng.integers(len(pool))]
  return fields, mutated


def test_fuzz_rollout_configs_work_or_are_refused_naming_the_field(act3d_automaton):
  rng = np.random.default_rng(0)
  shortest, vocab = tt.min_turn_tokens(act3d_automaton), act3d_automaton.vocab_size
  worked = refused = 0
  for case in range(300):
    fields, mutated = _config_mutations(rng, shortest, vocab)
    try:
      config = episode.RolloutConfig(**fields)
      episode.check_turn_budget(AGENT, config, act3d_automaton)
    except (ValueError, TypeError) as error:
      message = str(error)
      assert "RolloutConfig." in message and any(
          f"RolloutConfig.{name}" in message for name in mutated), (case, fields, message)
      refused += 1
      continue
    worked += 1
    # What it accepted is sound: hashable (compile_rollout caches on it), a budget the
    # grammar fits in, and a first constrained step with a finite log-probability.
    hash(config)
    assert config.max_turns == AGENT.max_calls + 1
    assert all(0 <= t < vocab for t in config.eos_tokens + (config.pad_token,))
    if config.constrained:
      assert config.max_turn_tokens >= shortest
      run = _first_step(act3d_automaton, 0.0 if config.temperature == 0 else 1.0)
      ok, token, logp = jax.device_get(run(config.max_turn_tokens, jax.random.PRNGKey(case)))
      assert ok.all() and np.isfinite(logp).all(), (case, fields)
  print(f"{worked} worked, {refused} refused")
  assert worked > 40 and refused > 150, (worked, refused)


# ----------------------------------------------------------------------------- 3DThinker


def _spelled(tokenizer, text: str) -> list[int]:
  """`text` in ordinary tokens only: each character encoded alone, so no special token
  (nor any merge across characters) can match."""
  ids = []
  for ch in text:
    ids += tokenizer.encode(ch, add_special_tokens=False)
  return ids


def _completions(tokenizer):
  """(name, completion ids, primed, a real block expected)."""
  start, pad, end = (tokenizer.convert_tokens_to_ids(t) for t in LATENT_TOKENS)
  encode = lambda s: tokenizer.encode(s, add_special_tokens=False)
  rest = encode("<think>the sofa is left</think><answer>B</answer>")
  real_block = [start] + [pad] * 12 + [end]
  text_block = "<|latent_start|>" + "<|latent_pad|>" * 12 + "<|latent_end|>"
  spelled_block = _spelled(tokenizer, text_block)
  space = encode(" \n")
  return [
      ("real", real_block + rest, False, True),
      ("spelled in text tokens", spelled_block + rest, False, False),
      ("real start, spelled pads", [start] + _spelled(
          tokenizer, "<|latent_pad|>" * 12 + "<|latent_end|>") + rest, False, False),
      ("spelled start, real pads", _spelled(tokenizer, "<|latent_start|>") + [pad] * 12
       + [end] + rest, False, False),
      ("spelled end", [start] + [pad] * 12 + _spelled(tokenizer, "<|latent_end|>") + rest,
       False, False),
      ("leading space, real", space + real_block + rest, False, True),
      ("11 pads", [start] + [pad] * 11 + [end] + rest, False, False),
      ("primed, real", [pad] * 12 + [end] + rest, True, True),
      ("primed, spelled", _spelled(tokenizer, "<|latent_pad|>" * 12 + "<|latent_end|>") + rest,
       True, False),
  ]


def _host_format(dfa, ids, primed, pieces, latent_ids):
  """The host rules: the grammar's byte DFA accepts the text (after the prompt's start
  token when primed) and the block is made of the latent ids (`text_rules`)."""
  data = b"".join(pieces[i] for i in ids)
  walked = dfa.accepting[dfa.walk((b"<|latent_start|>" if primed else b"") + data)]
  return bool(walked) and text_rules.thinker3d_latent_block_ids(ids, pieces, latent_ids, 12,
                                                                primed)


def test_thinker3d_format_reward_counts_only_a_block_of_latent_token_ids(
    tokenizer, thinker_automaton):
  latent_ids = tuple(tokenizer.convert_tokens_to_ids(t) for t in LATENT_TOKENS)
  config = rollout3d.Thinker3DRolloutConfig(latent_ids, (0,), num_latents=12)
  pieces, _ = tt.token_bytes(tokenizer)
  cases = _completions(tokenizer)
  rng = np.random.default_rng(0)
  # Random mixtures of the pieces, so the device and host rules meet odd sequences too.
  pieces_pool = [ids for _, ids, _, _ in cases]
  for _ in range(120):
    a, b = pieces_pool[rng.integers(len(pieces_pool))], pieces_pool[rng.integers(len(pieces_pool))]
    cut = rng.integers(len(a) + 1)
    cases.append(("mixed", a[:cut] + b[rng.integers(len(b) + 1):], bool(rng.integers(2)), None))
  size = max(len(ids) for _, ids, _, _ in cases) + 2
  tokens = np.zeros((len(cases), size), np.int32)
  for row, (_, ids, _, _) in enumerate(cases):
    tokens[row, :len(ids)] = ids
  lengths = np.asarray([len(ids) for _, ids, _, _ in cases], np.int32)
  primed = np.asarray([p for _, _, p, _ in cases])

  @jax.jit
  def rewards(tokens, lengths, primed):
    start = jnp.where(primed, thinker_automaton.token_next[am.START, latent_ids[0]].astype(
        jnp.int32), am.START)
    walks = jax.vmap(lambda t, n, s: rollout3d.completion_format(thinker_automaton, t, n, s))(
        tokens, lengths, start)
    return walks, rollout3d.format_reward(thinker_automaton, tokens, lengths, primed, config)

  walks, formats = jax.device_get(rewards(tokens, lengths, primed))
  dfa = thinker_automaton.grammar.dfa  # the byte automaton (built once, cached)
  by_name = {name: row for row, (name, *_ ) in enumerate(cases[:9])}
  # The issue: the grammar's byte walk alone accepts the block spelled in text tokens.
  assert walks[by_name["spelled in text tokens"]] and walks[by_name["primed, spelled"]]
  for row, (name, ids, is_primed, expected) in enumerate(cases):
    if expected is not None:
      assert bool(formats[row]) == expected, name
    assert bool(formats[row]) == _host_format(dfa, ids, is_primed, pieces, latent_ids), (
        name, ids)
  assert 0 < formats.sum() < len(cases)


def test_thinker3d_rollout_config_is_checked():
  with pytest.raises(ValueError, match=r"Thinker3DRolloutConfig.latent_tokens: expected 3 "
                                       r"distinct token ids"):
    rollout3d.Thinker3DRolloutConfig((1, 1, 2), (4,))
  with pytest.raises(ValueError, match=r"Thinker3DRolloutConfig.latent_tokens"):
    rollout3d.Thinker3DRolloutConfig((1, 2), (4,))
  with pytest.raises(ValueError, match=r"Thinker3DRolloutConfig.num_latents: expected an int "
                                       r">= 1, got 0"):
    rollout3d.Thinker3DRolloutConfig((1, 2, 3), (4,), num_latents=0)
  with pytest.raises(ValueError, match=r"Thinker3DRolloutConfig.stop_tokens"):
    rollout3d.Thinker3DRolloutConfig((1, 2, 3), 4)
