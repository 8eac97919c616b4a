"""Grammar automata against the host regexes, on thousands of random and adversarial turns
tokenised with a real byte-level BPE."""

import random

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspatial.rollout import automaton as am
from jaxspatial.rollout import grammars, host_parse, parse
from tests.rollout import turn_strings

COUNT = 1500  # turns per grammar


@pytest.fixture(scope="module")
def automata(tokenizer):
  return {name: am.compile_token_automaton(make(), tokenizer)
          for name, make in grammars.GRAMMARS.items()}


def _parse_batch(automaton, ids_list):
  length = max(len(i) for i in ids_list)
  tokens = np.zeros((len(ids_list), length), np.int32)
  for row, ids in enumerate(ids_list):
    tokens[row, :len(ids)] = ids
  counts = np.asarray([len(i) for i in ids_list], np.int32)

  @jax.jit
  def run(tokens, counts):
    def one(t, n):
      before, final = parse.walk_states(automaton, t, n)
      return parse.parse_turn(automaton, t, before, n, final)
    return jax.vmap(one)(tokens, counts)
  return jax.device_get(run(tokens, counts))


def _expected(grammar, host):
  """The host parse as the device's (values, present) per field name."""
  name = grammar.name
  out = {}
  if "answer" in host:
    out["kind"] = float(grammar.option("kind", b"<answer>"))
    return out
  out["kind"] = float(1 - grammar.option("kind", b"<answer>"))
  if name == "act3d":
    out["action"] = float(host["action"])
    if host["distance"] is not None:
      out["distance"] = np.float32(host["distance"])
  elif name == "think3d":
    out.update(camera=float(host["camera"]), azimuth=np.float32(host["azimuth"]),
               elevation=np.float32(host["elevation"]), camera_view=float(host["ego"]))
  elif name == "peria":
    out.update(tool=float(host["tool"]), image=float(host["image"]),
               **{f"bbox{i}": float(v) for i, v in enumerate(host["bbox"])})
  return out


@pytest.mark.parametrize("name", sorted(grammars.GRAMMARS))
def test_automaton_accepts_exactly_what_the_host_regex_accepts(name, tokenizer, automata):
  automaton = automata[name]
  texts = turn_strings.turns(name, COUNT, seed=hash(name) % 1000)
  ids_list = [tokenizer.encode(t, add_special_tokens=False) or [0] for t in texts]
  result = _parse_batch(automaton, ids_list)
  fields = [f.name for f in automaton.grammar.fields]
  accepted = 0
  for row, (text, ids) in enumerate(zip(texts, ids_list)):
    host = host_parse.PARSERS[name](text.encode())
    assert bool(result.valid[row]) == (host is not None), (name, text, ids)
    if host is None:
      assert not result.present[row].any()
      continue
    accepted += 1
    expected = _expected(automaton.grammar, host)
    for index, field in enumerate(fields):
      if field in expected:
        assert result.present[row, index], (text, field)
        assert result.values[row, index] == expected[field], (text, field)
      else:
        assert not result.present[row, index], (text, field)
  # Both outcomes are well represented.
  assert 0.2 * COUNT < accepted < 0.8 * COUNT, accepted


def test_token_bytes_concatenate_to_the_text(tokenizer):
  pieces, special = am.token_bytes(tokenizer)
  for text in turn_strings.turns("think3d", 200, seed=5) + turn_strings.turns("thinker3d", 50):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert b"".join(pieces[i] for i in ids) == text.encode()
  assert special[tokenizer.convert_tokens_to_ids("<|im_end|>")]


@pytest.mark.parametrize("name", sorted(grammars.GRAMMARS))
def test_byte_automaton_matches_regex_on_raw_bytes(name):
  """Raw byte strings, invalid UTF-8 included, straight through the byte-level DFA."""
  grammar = grammars.GRAMMARS[name]()
  rng = random.Random(1)
  for text in turn_strings.turns(name, 800, seed=7):
    data = bytearray(text.encode())
    for _ in range(rng.choice((0, 1, 2))):
      data.insert(rng.randint(0, len(data)), rng.randrange(256))
    state = grammar.dfa.walk(bytes(data))
    assert bool(grammar.dfa.accepting[state]) == (
        host_parse.PARSERS[name](bytes(data)) is not None), bytes(data)


@pytest.mark.parametrize("name", sorted(grammars.GRAMMARS))
def test_constrained_decoding_with_random_logits_always_closes_a_valid_turn(
    name, tokenizer, automata):
  automaton = automata[name]
  budget, batch = 48, 64
  key = jax.random.PRNGKey(0)

  @jax.jit
  def sample(key):
    def step(carry, k):
      state, t, key = carry
      key, sub = jax.random.split(key)
      logits = jax.random.normal(sub, (batch, automaton.vocab_size)) * 3.0
      ok = am.allowed_tokens(automaton, state, jnp.full((batch,), budget - k))
      done = automaton.accepting[state]
      token = jnp.argmax(jnp.where(ok, logits, -jnp.inf), -1)
      token = jnp.where(done, 0, token)
      new_state = jnp.where(done, state, automaton.token_next[state, token].astype(jnp.int32))
      return (new_state, t + ~done, key), jnp.where(done, -1, token)
    (state, count, _), tokens = jax.lax.scan(
        step, (jnp.ones(batch, jnp.int32), jnp.zeros(batch, jnp.int32), key), jnp.arange(budget))
    return state, count, tokens.T
  state, count, tokens = jax.device_get(sample(key))
  assert automaton.accepting[state].all()
  chex.assert_trees_all_equal(count <= budget, np.ones(batch, bool))
  pieces, _ = am.token_bytes(tokenizer)
  for row in range(batch):
    text = b"".join(pieces[t] for t in tokens[row] if t >= 0)
    assert host_parse.PARSERS[name](text) is not None, text


def test_grammar_errors_name_the_problem():
  with pytest.raises(ValueError, match="prefixes of one another"):
    am.Grammar("bad", am.Enum("x", (b"up", b"upward")), (b"!",)).dfa
  with pytest.raises(ValueError, match="appears twice"):
    am.Grammar("bad", am.seq(am.Number("n", 0, 3), am.Number("n", 0, 3)), (b"!",)).fields
  with pytest.raises(ValueError, match="ambiguous"):
    am.Grammar("bad", am.alt(am.Number("a", 0, 9), am.Number("b", 0, 9)), (b"!",)).dfa
