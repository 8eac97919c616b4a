"""A grammar's DFA walked through a tokenizer's vocabulary into device tables.

`compile_token_automaton` walks every vocabulary token's bytes from every state (tokens
longest first, so the work is states x the vocabulary's total bytes), giving the tables a
rollout uses on device:

  token_next [S, V]   state after a token (DEAD when the grammar cannot continue; a walk
                      stops at the first accepting state, later bytes of the token ignored)
  distance   [S]      fewest tokens from a state to acceptance (constrained decoding forces
                      a call to close within the turn's token budget)
  min_turn_tokens     (static, host) fewest tokens of any valid turn: a turn budget below it
                      would leave constrained decoding no token to sample
  byte_next, byte_field, byte_option [S, 256]   the byte-level DFA and its labels, from
                      which the parsed action is read on device
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxspatial.rollout.automaton import DEAD, DFA, START, Grammar

Array = jax.Array


def _byte_decoder() -> dict[str, int]:
  """GPT-2's byte <-> printable unicode map, inverted (byte-level BPE vocabularies)."""
  printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
               + list(range(ord("®"), ord("ÿ") + 1)))
  codes = printable[:]
  extra = 0
  for b in range(256):
    if b not in printable:
      printable.append(b)
      codes.append(256 + extra)
      extra += 1
  return {chr(c): b for b, c in zip(printable, codes)}


def token_bytes(tokenizer) -> tuple[list[bytes], np.ndarray]:
  """Each token id's bytes (special tokens: their text), and which ids are special."""
  decoder = _byte_decoder()
  size = len(tokenizer)
  special_ids = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}
  out, special = [], np.zeros(size, bool)
  pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
  for i, piece in enumerate(pieces):
    if i in special_ids:
      out.append(special_ids[i].encode())
      special[i] = True
      continue
    if piece is None or any(ch not in decoder for ch in piece):
      raise ValueError(f"token_bytes: token {i} ({piece!r}) is not a byte-level BPE piece; "
                       "only byte-level BPE tokenizers (GPT-2 / Qwen style) are supported")
    out.append(bytes(decoder[ch] for ch in piece))
  return out, special


def byte_table(pieces: list[bytes], vocab_size: int,
               keep=None) -> tuple[np.ndarray, np.ndarray]:
  """(bytes [V, K] int32, -1 padded; lengths [V] int32) of `pieces` padded to `vocab_size`
  ids; tokens outside `keep` (bool per piece) and ids past the pieces have length 0."""
  table = np.full((vocab_size, max(1, max(map(len, pieces), default=1))), -1, np.int32)
  lengths = np.zeros(vocab_size, np.int32)
  for i, piece in enumerate(pieces):
    if keep is None or keep[i]:
      table[i, :len(piece)] = np.frombuffer(piece, np.uint8)
      lengths[i] = len(piece)
  return table, lengths


def single_byte_tokens(pieces: list[bytes], special) -> list[int]:
  """[256] the first non-special token spelling each byte value alone (-1 if none)."""
  out = [-1] * 256
  for i, (piece, is_special) in enumerate(zip(pieces, special)):
    if len(piece) == 1 and not is_special and out[piece[0]] < 0:
      out[piece[0]] = i
  return out


def _walk_tokens(dfa: DFA, pieces_VxL: np.ndarray, lengths_V: np.ndarray) -> np.ndarray:
  """[S, V] state after each token from each state, stopping at the first accepting state."""
  size = dfa.num_states
  # Accepting states absorb (the turn ended there); with tokens longest first, byte j moves
  # only the prefix of tokens that have a byte j: work is S x (total bytes), not S x V x L.
  absorbing = dfa.next.copy()
  absorbing[dfa.accepting] = np.flatnonzero(dfa.accepting)[:, None]
  order = np.argsort(-lengths_V, kind="stable")
  longer = np.searchsorted(-lengths_V[order], -np.arange(pieces_VxL.shape[1]), side="left")
  states = np.broadcast_to(np.arange(size, dtype=np.int32)[:, None], (size, len(order))).copy()
  for j, count in enumerate(longer):  # `count` tokens have more than j bytes
    columns = pieces_VxL[order[:count], j]
    states[:, :count] = absorbing[states[:, :count], columns[None]]
  out = np.empty_like(states)
  out[:, order] = states
  # A token that starts in an accepting state continues past the turn's end: dead.
  out[dfa.accepting] = DEAD
  return out


def _distances(token_next: np.ndarray, accepting: np.ndarray, allowed_V: np.ndarray) -> np.ndarray:
  """[S] fewest allowed tokens to an accepting state: breadth first, backwards, over the
  [S, S] graph of where some allowed token leads (large when acceptance is unreachable)."""
  big = np.iinfo(np.int32).max // 2
  size = len(accepting)
  leads_SxS = np.zeros((size, size), bool)
  leads_SxS[np.arange(size)[:, None], token_next[:, allowed_V]] = True
  leads_SxS[:, DEAD] = False
  dist = np.where(accepting, 0, big).astype(np.int32)
  frontier, reached = accepting.copy(), accepting.copy()
  steps = 0
  while frontier.any():
    steps += 1
    frontier = leads_SxS[:, frontier].any(axis=1) & ~reached
    dist[frontier] = steps
    reached |= frontier
  return dist


def shortest_turn(token_next: np.ndarray, accepting: np.ndarray, allowed_V: np.ndarray) -> int:
  """Fewest allowed tokens from the start state to an accepting one (the grammar's shortest
  valid turn in this vocabulary), breadth first forward over the token transition table on
  the host; -1 when no sequence of allowed tokens reaches acceptance."""
  token_next = np.asarray(token_next)
  accepting = np.asarray(accepting, bool)
  if accepting[START]:
    return 0
  leads = token_next[:, np.asarray(allowed_V, bool)]  # [S, V'] where allowed tokens lead
  seen = np.zeros(len(accepting), bool)
  seen[[DEAD, START]] = True
  frontier = np.asarray([START])
  steps = 0
  while frontier.size:
    steps += 1
    reached = np.unique(leads[frontier])
    reached = reached[~seen[reached]]
    if accepting[reached].any():
      return steps
    seen[reached] = True
    frontier = reached
  return -1


@struct.dataclass
class TokenAutomaton:
  """Device tables for one grammar and one tokenizer (see the module docstring)."""
  token_next: Array      # [S, V] int32
  distance: Array        # [S] int32 fewest tokens to acceptance (large when impossible)
  accepting: Array       # [S] bool
  byte_next: Array       # [S, 256] int32
  byte_field: Array      # [S, 256] int32
  byte_option: Array     # [S, 256] int32
  stop_next: Array       # [Sc, V] int32 the stop automaton (first closing tag)
  stop_accepting: Array  # [Sc] bool
  token_bytes: Array     # [V, Lmax] int32 byte values, -1 padded
  token_length: Array    # [V] int32
  banned: Array          # [V] bool: special tokens the grammar never spells (masked when
                         # constrained)
  grammar: Grammar = struct.field(pytree_node=False)
  # Fewest allowed tokens of a valid turn (`shortest_turn`; -1: none), static so that
  # configuration checks can read it under jit, where the tables are tracers.
  min_turn_tokens: int = struct.field(pytree_node=False, default=-1)

  @property
  def vocab_size(self) -> int:
    return self.token_next.shape[1]


def compile_token_automaton(grammar: Grammar, tokenizer, vocab_size: int | None = None
                            ) -> TokenAutomaton:
  """Tables for `grammar` over `tokenizer`'s vocabulary, padded to the model's `vocab_size`
  (ids past the tokenizer's are dead and banned)."""
  pieces, special = token_bytes(tokenizer)
  size = vocab_size or len(pieces)
  if size < len(pieces):
    raise ValueError(f"compile_token_automaton: vocab_size {size} is smaller than the "
                     f"tokenizer's {len(pieces)} tokens")
  table, lengths = byte_table(pieces, size)
  literals = grammar.literals
  banned = np.ones(size, bool)
  banned[:len(pieces)] = special & np.asarray([p not in literals for p in pieces])
  dfa, stop = grammar.dfa, grammar.stop_dfa
  token_next = _walk_tokens(dfa, table, lengths)
  token_next[:, lengths == 0] = DEAD
  stop_next = _walk_tokens(stop, table, lengths)
  stop_next[:, lengths == 0] = DEAD
  distance = _distances(token_next, dfa.accepting, ~banned)
  index_dtype = np.int16 if dfa.num_states < 2 ** 15 else np.int32
  return TokenAutomaton(
      token_next=jnp.asarray(token_next.astype(index_dtype)), distance=jnp.asarray(distance),
      accepting=jnp.asarray(dfa.accepting), byte_next=jnp.asarray(dfa.next),
      byte_field=jnp.asarray(dfa.field), byte_option=jnp.asarray(dfa.option),
      stop_next=jnp.asarray(stop_next.astype(index_dtype)),
      stop_accepting=jnp.asarray(stop.accepting), token_bytes=jnp.asarray(table),
      token_length=jnp.asarray(lengths), banned=jnp.asarray(banned), grammar=grammar,
      min_turn_tokens=shortest_turn(token_next, dfa.accepting, ~banned))


def allowed_tokens(automaton: TokenAutomaton, state_B: Array, remaining_B: Array) -> Array:
  """[B, V] tokens that keep the grammar alive and can still close within `remaining`
  tokens (this one included): the mask of constrained decoding."""
  nxt = automaton.token_next[state_B].astype(jnp.int32)
  return ((nxt != DEAD) & ~automaton.banned[None]
          & (automaton.distance[nxt] <= remaining_B[:, None] - 1))


def min_turn_tokens(automaton: TokenAutomaton) -> int:
  """The grammar's shortest valid turn in tokens of this vocabulary (special tokens the
  grammar never spells excluded); -1 when no turn can be written."""
  return automaton.min_turn_tokens
