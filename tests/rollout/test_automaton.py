"""Grammar automata against the host regexes, on thousands of random and adversarial turns
tokenised with a real byte-level BPE; answer bodies against the answer rule's reference
checker (`turn_strings.legal_answer`), constrained samples included."""

import collections
import random
import time
import zlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.models.sampler import prefill
from jaxspatial.rollout import automaton as am, regex_ast as ra, token_table as tt
from jaxspatial.rollout import episode, grammars, host_parse, parse, tiny
from tests.rollout import turn_strings

COUNT = 1500  # turns per grammar


@pytest.fixture(scope="module")
def automata(tokenizer):
  return {name: tt.compile_token_automaton(make(), tokenizer)
          for name, make in grammars.GRAMMARS.items()}


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
    out.update(tool=float(host["tool"]), image_index=float(host["image_index"]))
    if host["argument"] is not None:  # none: a perception tool's image_index alone
      out["argument"] = float(host["argument"])
    for k, (x, y) in enumerate(host["points"]):
      out[f"x{k}"], out[f"y{k}"] = float(x), float(y)
    if host["text"] is not None:  # a text field's value is its length in bytes
      out[grammars.PERIA_TEXT] = float(len(host["text"]))
  return out


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(grammars.GRAMMARS))
def test_automaton_accepts_exactly_what_the_host_regex_accepts(name, tokenizer, automata):
  automaton = automata[name]
  texts = turn_strings.turns(name, COUNT, seed=zlib.crc32(name.encode()) % 1000)
  ids_list = [tokenizer.encode(t, add_special_tokens=False) or [0] for t in texts]
  result = turn_strings.parse_batch(automaton, ids_list)
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
  assert 0.15 * COUNT < accepted < 0.8 * COUNT, accepted


@pytest.mark.slow
@pytest.mark.parametrize("name", ["act3d", "think3d", "peria"])
def test_a_grammar_after_a_prefill_parses_what_follows_it_as_the_whole_turn(name, tokenizer):
  """A thinking template's prompt opens each reply with "<think>\n": the automaton of
  `grammar.after(prefill)` over the model's tokens accepts, and parses, exactly what the
  host regex accepts of the prefill followed by those tokens' text."""
  prefill = "<think>\n"
  automaton = tt.compile_token_automaton(grammars.GRAMMARS[name]().after(prefill), tokenizer)
  texts = [t.split("<think>", 1)[-1] for t in turn_strings.turns(name, 600, seed=11)]
  texts = [t for t in texts if t]
  ids_list = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
  result = turn_strings.parse_batch(automaton, ids_list)
  fields = [f.name for f in automaton.grammar.fields]
  accepted = 0
  for row, text in enumerate(texts):
    host = host_parse.PARSERS[name]((prefill + text).encode())
    assert bool(result.valid[row]) == (host is not None), (name, text)
    if host is None:
      continue
    accepted += 1
    expected = _expected(automaton.grammar, host)
    for index, field in enumerate(fields):
      assert bool(result.present[row, index]) == (field in expected), (text, field)
      if field in expected:
        assert result.values[row, index] == expected[field], (text, field)
  assert 0.15 * len(texts) < accepted < 0.8 * len(texts), accepted
  with pytest.raises(ValueError, match="cannot begin with the prefix"):
    grammars.GRAMMARS[name]().after("<answer>").dfa


PERIA_TEXT_TOOLS = ("text_ocr", "text_segment", "grounding_dino")


def test_peria_text_arguments_parse_as_the_host_regex_reads_them(tokenizer):
  """PERIA with perception tools (a small grammar: 2 points): the byte DFA and
  the token automaton accept what the host regex accepts, over generated and mutated
  turns; the fields agree, and the text field's bytes are the regex's capture (its first
  TEXT_BYTES; the value is the whole length)."""
  grammar = grammars.peria(max_points=2, text_tools=PERIA_TEXT_TOOLS)
  automaton = tt.compile_token_automaton(grammar, tokenizer)
  rng = random.Random(4)
  texts = []
  for _ in range(500):
    text = turn_strings.peria_turn(rng, text_tools=PERIA_TEXT_TOOLS)
    for _ in range(rng.choice((0, 0, 0, 1, 2))):
      text = turn_strings.mutate(text, rng)
    texts.append(text)
  result = turn_strings.parse_batch(
      automaton, [tokenizer.encode(t, add_special_tokens=False) or [0] for t in texts])
  fields = [f.name for f in grammar.fields]
  row = grammar.text_index(grammars.PERIA_TEXT)
  seen = collections.Counter()
  for r, text in enumerate(texts):
    host = host_parse.parse_peria(text.encode(), max_points=2, text_tools=PERIA_TEXT_TOOLS)
    assert bool(result.valid[r]) == (host is not None), text
    assert bool(grammar.dfa.accepting[grammar.dfa.walk(text.encode())]) == (host is not None)
    expected = {} if host is None else _expected(grammar, host)
    for index, field in enumerate(fields):
      assert bool(result.present[r, index]) == (field in expected), (text, field)
      if field in expected:
        assert result.values[r, index] == expected[field], (text, field)
    data = (host or {}).get("text") or b""
    want = np.full(parse.TEXT_BYTES, -1, np.int32)
    want[:min(len(data), parse.TEXT_BYTES)] = list(data[:parse.TEXT_BYTES])
    np.testing.assert_array_equal(result.texts[r, row], want, err_msg=text)
    if host is not None and "answer" not in host:
      seen["text" if data else "argument" if host["argument"] is not None else "bare"] += 1
      seen["cut"] += len(data) > parse.TEXT_BYTES
  print("accepted PERIA calls:", dict(seen))
  assert seen["text"] > 40 and seen["bare"] > 10 and seen["argument"] > 20 and seen["cut"] > 0
  assert 0.15 * len(texts) < sum(result.valid) < 0.8 * len(texts)


def test_token_bytes_concatenate_to_the_text(tokenizer):
  pieces, special = tt.token_bytes(tokenizer)
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
      ok = tt.allowed_tokens(automaton, state, jnp.full((batch,), budget - k))
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
  pieces, _ = tt.token_bytes(tokenizer)
  for row in range(batch):
    text = b"".join(pieces[t] for t in tokens[row] if t >= 0)
    assert host_parse.PARSERS[name](text) is not None, text
    body = _answer_body_of(text)
    assert body is None or turn_strings.legal_answer(body), text


def test_grammar_errors_name_the_problem():
  with pytest.raises(ValueError, match="prefixes of one another"):
    am.Grammar("bad", ra.Enum("x", (b"up", b"upward")), (b"!",)).dfa
  with pytest.raises(ValueError, match="appears twice"):
    am.Grammar("bad", ra.seq(ra.Number("n", 0, 3), ra.Number("n", 0, 3)), (b"!",)).fields
  with pytest.raises(ValueError, match="ambiguous"):
    am.Grammar("bad", ra.alt(ra.Number("a", 0, 9), ra.Number("b", 0, 9)), (b"!",)).dfa

  with pytest.raises(ValueError, match=r"TextWithout.patterns: expected non-empty bytes"):
    ra.TextWithout((b"</think>", b""))
  with pytest.raises(ValueError, match=r"TextWithout.patterns: expected non-empty bytes"):
    ra.TextWithout(("</think>",))
  with pytest.raises(ValueError, match=r"TextWithout.min_nonspace: expected >= 0, got -1"):
    ra.TextWithout(b"x", min_nonspace=-1)
  with pytest.raises(ValueError, match=r"TextWithout.space: expected byte values"):
    ra.TextWithout(b"x", space=" ")
  with pytest.raises(ValueError, match=r"Text 't'.min_nonspace: expected >= 1"):
    ra.Text("t", min_nonspace=0)
  with pytest.raises(ValueError, match=r"TextWithout.patterns: expected non-empty bytes"):
    ra.Text("t", patterns=(b"",))
  # Options share a continuation, or end in another option's: its field is one field.
  value = ra.seq(":", ra.Number("n", 0, 9))
  shared = am.Grammar("shared", ra.seq(ra.Enum("k", (b"a", b"b", b"c"), (
      value, value, ra.seq("!", value))), ";"), (b";",))
  assert [f.name for f in shared.fields] == ["k", "n"]
  for text, accepted in ((b"a:5;", True), (b"c!:7;", True), (b"c:7;", False), (b"b!:1;", False)):
    assert bool(shared.dfa.accepting[shared.dfa.walk(text)]) == accepted, text
  with pytest.raises(ValueError, match="appears twice"):
    am.Grammar("bad", ra.Enum("k", (b"a", b"b"), (ra.Number("n", 0, 9), ra.Number("n", 0, 5))),
               (b"!",)).fields


def test_text_without_is_the_text_free_of_its_patterns_with_enough_non_space():
  """Every string over a small alphabet up to 7 bytes, against the definition; overlapping
  patterns exercise the Aho-Corasick failure links."""
  patterns = (b"abab", b"babb", b"b|a", b"||")
  alphabet = b"ab| "
  texts = [b""]
  for _ in range(7):
    texts += [t + bytes([c]) for t in texts if len(t) == len(texts[-1]) for c in alphabet]
  for need in (0, 1, 2):
    dfa = am.Grammar("text", ra.seq(ra.TextWithout(patterns, min_nonspace=need), "!"),
                     (b"!",)).dfa
    for text in texts:
      expected = (not any(p in text for p in patterns)
                  and sum(c != ord(" ") for c in text) >= need)
      assert bool(dfa.accepting[dfa.walk(text + b"!")]) == expected, (need, text)


def test_token_tables_walk_each_token_from_each_state(tokenizer, automata):
  """token_next and distance against a plain walk of every token's bytes from the states
  that valid turns pass through, and Bellman-Ford relaxation over all allowed tokens."""
  pieces, _ = tt.token_bytes(tokenizer)
  for name in ("act3d", "thinker3d"):
    automaton = automata[name]
    dfa = automaton.grammar.dfa
    token_next = np.asarray(automaton.token_next)
    visited = {am.START}
    for text in turn_strings.turns(name, 30, seed=2):
      state = am.START
      for byte in text.encode():
        state = int(dfa.next[state, byte])
        visited.add(state)
    for state in sorted(visited):
      for token, data in enumerate(pieces):
        expected = state
        for byte in data:
          if dfa.accepting[expected]:
            break
          expected = int(dfa.next[expected, byte])
        if dfa.accepting[state] or not data:
          expected = am.DEAD
        assert token_next[state, token] == expected, (name, state, token)
    big = np.iinfo(np.int32).max // 2
    successors = token_next[:, ~np.asarray(automaton.banned)].astype(np.int64)
    dist = np.where(dfa.accepting, 0, big)
    for _ in range(dfa.num_states):
      dist = np.where(dfa.accepting, 0, np.minimum(dist, 1 + dist[successors].min(axis=1)))
      dist[am.DEAD] = big
    np.testing.assert_array_equal(np.asarray(automaton.distance), np.minimum(dist, big))


LATENTS = "<|latent_start|>" + "<|latent_pad|>" * 12 + "<|latent_end|>"


def _answer_turn(name: str, body: bytes) -> bytes:
  head = LATENTS.encode() if name == "thinker3d" else b""
  return head + b"<think>t</think><answer>" + body + b"</answer>"


def _answer_body_of(turn: bytes) -> bytes | None:
  """The answer body by the turns' shape: after the first </think> and JSON whitespace
  comes <answer>, then the body up to the first </answer> (None: not an answer)."""
  if b"</think>" not in turn:
    return None
  rest = turn.split(b"</think>", 1)[1].lstrip(b" \t\n\r")
  if not rest.startswith(b"<answer>"):
    return None
  return rest[len(b"<answer>"):].split(b"</answer>", 1)[0]


def _probe_bodies() -> list[bytes]:
  bodies = [b.encode() for b in turn_strings.LEGAL_ANSWERS + turn_strings.BLANK_ANSWERS]
  bodies += [b"x" + t.encode() + b" y" for t in turn_strings.TAGS_IN_ANSWERS]
  bodies += list(turn_strings.NOT_IN_ANSWERS)
  rng = random.Random(3)
  pieces = (b"<", b"|", b"/", b">", b"think", b"answer", b"tool_call", b"action", b"thin",
            b" ", b"\t", b"\x0b", b"\x0c", b"\n", b"a", "\u00a0".encode(), "→".encode())
  bodies += [b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 8))) for _ in range(300)]
  return bodies


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(grammars.GRAMMARS))
def test_answer_bodies_are_never_blank_or_tagged(name, tokenizer, automata):
  """Blank and tag-holding answers are malformed in the byte DFA, the token tables with
  the device parse, and the host regex alike; the reference is `legal_answer`."""
  automaton = automata[name]
  dfa = automaton.grammar.dfa
  turns = [_answer_turn(name, body) for body in _probe_bodies()]
  expected = [turn_strings.legal_answer(_answer_body_of(t)) for t in turns]
  for turn, legal in zip(turns, expected):
    host = host_parse.PARSERS[name](turn)
    assert (host is not None) == legal, turn
    if legal:
      assert host["answer"] == _answer_body_of(turn), turn
    assert bool(dfa.accepting[dfa.walk(turn)]) == legal, turn
  ids_list = [tokenizer.encode(t.decode(), add_special_tokens=False) for t in turns]
  np.testing.assert_array_equal(turn_strings.parse_batch(automaton, ids_list).valid, expected)
  assert 50 < sum(expected) < len(expected) - 50


@pytest.mark.slow
def test_constrained_tiny_policy_never_answers_blank_or_with_tags(tokenizer):
  """The issue's measurement: constrained Act3D turns of the tiny random policy through
  the rollout's decode loop. Three quarters are forced up to `<answer>` so that the policy
  writes many answer bodies (a random policy rarely closes its thinking by itself)."""
  model = Qwen25VL(tiny.model_config(tokenizer), rngs=nnx.Rngs(0))
  automaton = tt.compile_token_automaton(grammars.act3d(), tokenizer,
                                         model.config.text.vocab_size)
  batch, limit = 64, 40
  config = episode.RolloutConfig(
      max_turns=1, max_turn_tokens=limit, constrained=True, temperature=1.0,
      eos_tokens=(tokenizer.convert_tokens_to_ids("<|im_end|>"),),
      pad_token=tokenizer.pad_token_id)
  prompt = jnp.asarray([tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)]
                       * batch, jnp.int32)
  head = tokenizer.encode("<think>ok</think><answer>", add_special_tokens=False)
  forced = np.full((batch, limit), -1, np.int32)
  forced[batch // 4:, :len(head)] = head

  @nnx.jit
  def sample(model, automaton, forced, key):
    size = prompt.shape[1] + limit
    dstate, logits = prefill(model, prompt, jnp.ones(prompt.shape, bool), size)
    buffers = (jnp.concatenate([prompt, jnp.zeros((batch, limit), jnp.int32)], 1),
               dstate.valid, jnp.zeros((batch, size), bool), jnp.zeros((batch, size)))
    out = episode._decode_turn(model, automaton, config, 0, key, dstate, logits,
                               jnp.ones(batch, bool), buffers, forced, None)
    return out[2], out[4], out[5]  # tokens, counts, grammar states after the turn
  tokens, count, final = jax.device_get(
      sample(model, automaton, jnp.asarray(forced), jax.random.PRNGKey(0)))
  assert automaton.accepting[final].all()
  pieces, _ = tt.token_bytes(tokenizer)
  answers = 0
  for row in range(batch):
    text = b"".join(pieces[t] for t in tokens[row, :count[row]])
    assert host_parse.parse_act3d(text) is not None, text
    body = _answer_body_of(text)
    answers += body is not None
    assert body is None or turn_strings.legal_answer(body), text
  assert answers >= batch - batch // 4


def test_host_parsers_stay_fast_on_hostile_text():
  """100 kB adversarial turns. The regexes are linear; backtracking that is quadratic in
  the length would take minutes here instead of milliseconds."""
  size = 100_000

  def answer(body):
    return b"<think></think><answer>" + body + b"</answer>", body
  cases = [(b"<think>" + b"</thin" * (size // 6), None), (b" " * size + b"<think>", None),
           answer(b" \t\x0b" * (size // 3)), answer(b" " * size + b"x"),
           answer(b"x" * size + b"<think>"), answer(b"<thin<answe<tool_cal</actio<" * (size // 26)),
           answer(b"a<|" * (size // 3)),
           (b"<think></think><answer>" + b"<" * size, None),
           (b"<think></think><answer>" + b"</answer" * (size // 8), None),
           (b"<think></think><tool_call>{" + b" \n" * (size // 2), None),
           (bytes(random.Random(0).randrange(256) for _ in range(size)), None)]
  for name, parse_turn in host_parse.PARSERS.items():
    head = LATENTS.encode() if name == "thinker3d" else b""
    start = time.perf_counter()
    for text, body in cases:
      result = parse_turn(head + text)
      legal = body is not None and turn_strings.legal_answer(body)
      assert (result is not None) == legal, (name, text[:60])
    assert time.perf_counter() - start < 5.0, name
