"""Grammars as byte automata, walked through a tokenizer's vocabulary into device tables.

A grammar is a small regular expression tree over bytes (`Lit`, `Bytes`, `Seq`, `Alt`,
`Repeat`, and `TextWithout`: free text holding none of a set of patterns, an Aho-Corasick
automaton, optionally with at least n non-space bytes) with labelled fields (`Enum`,
`Number`, and `Text`: a TextWithout whose bytes are the field's value). It compiles to a
minimal DFA over the 256 byte values whose transitions carry the field (and, on an enum
option's last byte, the option) they write. A field appears once in a grammar; an enum's
options may share a continuation (see `Enum`), which then holds its fields once.
`compile_token_automaton` then walks every vocabulary token's bytes from every state
(tokens longest first, so the work is states x the vocabulary's total bytes), giving the
tables a rollout uses on device:

  token_next [S, V]   state after a token (DEAD when the grammar cannot continue; a walk
                      stops at the first accepting state, later bytes of the token ignored)
  distance   [S]      fewest tokens from a state to acceptance (constrained decoding forces
                      a call to close within the turn's token budget)
  min_turn_tokens     (static, host) fewest tokens of any valid turn: a turn budget below it
                      would leave constrained decoding no token to sample
  byte_next, byte_field, byte_option [S, 256]   the byte-level DFA and its labels, from
                      which the parsed action is read on device

A turn ends at the first closing tag (`stops`, e.g. `</tool_call>`, `</answer>`), as a
serving engine's stop strings do. The DFA accepts exactly the turns that match the
grammar and contain no closing tag before their end: the grammar intersected with
"no stop string except as a suffix". State 0 is the dead state, state 1 the start.
"""

from __future__ import annotations

import collections
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

Array = jax.Array
DEAD, START = 0, 1
NO_FIELD, NO_OPTION = 0, -1


# ----------------------------------------------------------------------------- grammar tree

@dataclasses.dataclass(frozen=True)
class Bytes:
  """One byte from a set."""
  values: frozenset


@dataclasses.dataclass(frozen=True)
class Seq:
  items: tuple


@dataclasses.dataclass(frozen=True)
class Alt:
  items: tuple


@dataclasses.dataclass(frozen=True)
class Repeat:
  item: object
  min: int = 0
  max: int | None = None  # None: unbounded


ASCII_SPACE = frozenset(b" \t\n\r\x0b\x0c")  # bytes.isspace(); JSON's four and \v, \f


@dataclasses.dataclass(frozen=True)
class TextWithout:
  """Any bytes containing none of `patterns` (free text up to its closing tag), with at
  least `min_nonspace` bytes outside `space` (1: not blank). One bytes value is read as a
  single pattern."""
  patterns: tuple
  min_nonspace: int = 0
  space: frozenset = ASCII_SPACE

  def __post_init__(self):
    patterns = (self.patterns,) if isinstance(self.patterns, bytes) else tuple(self.patterns)
    for p in patterns:
      if not isinstance(p, bytes) or not p:
        raise ValueError(f"grammar: TextWithout.patterns: expected non-empty bytes, got {p!r}")
    if self.min_nonspace < 0:
      raise ValueError(f"grammar: TextWithout.min_nonspace: expected >= 0, got "
                       f"{self.min_nonspace}")
    space = frozenset(self.space)
    if not all(isinstance(b, int) and 0 <= b < 256 for b in space):
      raise ValueError(f"grammar: TextWithout.space: expected byte values (e.g. b' \\t'), "
                       f"got {self.space!r}")
    object.__setattr__(self, "patterns", patterns)
    object.__setattr__(self, "space", space)


@dataclasses.dataclass(frozen=True)
class Text:
  """A field of free text: bytes holding none of `patterns` (default: a JSON string's body
  without escapes, no '"' or backslash), at least `min_nonspace` (>= 1) of them outside
  `space`. Its bytes are the value (`parse.ParsedTurn.texts`); it is present when written,
  which the non-space byte makes visible."""
  name: str
  patterns: tuple = (b'"', b"\\")
  min_nonspace: int = 1
  space: frozenset = ASCII_SPACE

  def __post_init__(self):
    if self.min_nonspace < 1:
      raise ValueError(f"grammar: Text {self.name!r}.min_nonspace: expected >= 1 (an empty "
                       f"text could not be told from an absent one), got {self.min_nonspace}")
    body = self.body  # checks the patterns and the space as TextWithout does
    object.__setattr__(self, "patterns", body.patterns)
    object.__setattr__(self, "space", body.space)

  @property
  def body(self) -> TextWithout:
    return TextWithout(self.patterns, self.min_nonspace, self.space)


@dataclasses.dataclass(frozen=True)
class Enum:
  """A field whose value is one of `options` (literal byte strings, none a prefix of another).
  `continuations`, when given, is one grammar node per option that must follow it. Options
  share continuations (one automaton, its fields held once): equal continuations are one,
  and a `Seq` whose last item equals another option's continuation ends in that one
  (`_continuation_plan`)."""
  name: str
  options: tuple
  continuations: tuple | None = None


@dataclasses.dataclass(frozen=True)
class Number:
  """A field holding a decimal number in [lo, hi] (integer bounds), JSON syntax (no leading
  zeros, a '-' only when lo < 0), at most `decimals` digits after the point."""
  name: str
  lo: int
  hi: int
  decimals: int = 0


def lit(text: str | bytes) -> Seq:
  data = text.encode() if isinstance(text, str) else text
  return Seq(tuple(Bytes(frozenset([b])) for b in data))


def seq(*items) -> Seq:
  return Seq(tuple(lit(i) if isinstance(i, (str, bytes)) else i for i in items))


def alt(*items) -> Alt:
  return Alt(tuple(lit(i) if isinstance(i, (str, bytes)) else i for i in items))


def one_of(chars: str | bytes) -> Bytes:
  data = chars.encode() if isinstance(chars, str) else chars
  return Bytes(frozenset(data))


ANY = Bytes(frozenset(range(256)))
JSON_WS = Repeat(one_of(" \t\n\r"))


def optional(item) -> Repeat:
  return Repeat(item, 0, 1)


def _continuation_plan(continuations: tuple) -> dict:
  """{distinct continuation: (head or None, shared node)}, in order: equal continuations
  are one; one that is a Seq ending in another option's continuation is its head (the
  items before) and then that continuation, built once for every option reaching it."""
  whole = set(continuations)
  plan = {}
  for item in dict.fromkeys(continuations):
    tail = item.items[-1] if isinstance(item, Seq) and item.items else None
    plan[item] = (Seq(item.items[:-1]), tail) if tail is not None and tail in whole else (
        None, item)
  return plan


def _fields(node, out: list) -> list:
  if isinstance(node, (Enum, Number, Text)):
    if any(f.name == node.name for f in out):
      raise ValueError(f"grammar: field {node.name!r} appears twice")
    out.append(node)
  if isinstance(node, Enum) and node.continuations:
    shared = []
    for head, item in _continuation_plan(node.continuations).values():
      if head is not None:
        _fields(head, out)
      if item not in shared:
        shared.append(item)
        _fields(item, out)
  elif isinstance(node, (Seq, Alt)):
    for item in node.items:
      _fields(item, out)
  elif isinstance(node, Repeat):
    _fields(node.item, out)
  return out


def _literals(node, out: set) -> set:
  """Byte strings the grammar spells out (whole `lit`s and enum options)."""
  if isinstance(node, Seq) and node.items and all(
      isinstance(i, Bytes) and len(i.values) == 1 for i in node.items):
    out.add(bytes(next(iter(i.values)) for i in node.items))
  if isinstance(node, Enum):
    out.update(node.options)
    for item in node.continuations or ():
      _literals(item, out)
  if isinstance(node, (Seq, Alt)):
    for item in node.items:
      _literals(item, out)
  elif isinstance(node, Repeat):
    _literals(node.item, out)
  return out


def _number_strings(lo: int, hi: int, decimals: int) -> list[tuple[bytes, bool]]:
  """(integer part with sign, whether a fraction may follow) for the numbers in [lo, hi].
  A fraction after the bound itself may only be zeros, handled by the caller."""
  out = []
  for value in range(max(lo, 0), hi + 1):
    out.append((str(value).encode(), value < hi))
  if lo < 0:
    for magnitude in range(0, -lo + 1):
      out.append((b"-" + str(magnitude).encode(), magnitude < -lo))
  return out


def _aho_corasick(patterns: tuple[bytes, ...]) -> tuple[np.ndarray, np.ndarray]:
  """The complete goto table [N, 256] of the patterns' trie (failure links folded in) and
  [N] whether a state has seen a pattern end (there or at a suffix). State 0 is the root."""
  children: list[dict[int, int]] = [{}]
  ends = [False]
  for pattern in patterns:
    state = 0
    for byte in pattern:
      if byte not in children[state]:
        children[state][byte] = len(children)
        children.append({})
        ends.append(False)
      state = children[state][byte]
    ends[state] = True
  goto = np.zeros((len(children), 256), np.int32)
  fail = np.zeros(len(children), np.int32)
  matched = np.asarray(ends)
  for byte, child in children[0].items():
    goto[0, byte] = child
  queue = collections.deque(children[0].values())
  while queue:  # breadth first: a state's failure target is shallower, already complete
    state = queue.popleft()
    matched[state] |= matched[fail[state]]
    goto[state] = goto[fail[state]]
    for byte, child in children[state].items():
      fail[child] = goto[fail[state], byte]
      goto[state, byte] = child
      queue.append(child)
  return goto, matched


# ----------------------------------------------------------------------------- NFA

class _NFA:
  def __init__(self):
    self.eps: list[list[int]] = []
    self.edges: list[list[tuple[tuple[int, ...], int, tuple[int, int]]]] = []

  def state(self) -> int:
    self.eps.append([])
    self.edges.append([])
    return len(self.eps) - 1

  def build(self, node, label, field_ids) -> tuple[int, int]:
    if isinstance(node, Bytes):
      a, b = self.state(), self.state()
      self.edges[a].append((tuple(sorted(node.values)), b, label))
      return a, b
    if isinstance(node, Seq):
      a = self.state()
      end = a
      for item in node.items:
        s, e = self.build(item, label, field_ids)
        self.eps[end].append(s)
        end = e
      return a, end
    if isinstance(node, Alt):
      a, b = self.state(), self.state()
      for item in node.items:
        s, e = self.build(item, label, field_ids)
        self.eps[a].append(s)
        self.eps[e].append(b)
      return a, b
    if isinstance(node, Repeat):
      a = self.state()
      end = a
      for _ in range(node.min):
        s, e = self.build(node.item, label, field_ids)
        self.eps[end].append(s)
        end = e
      if node.max is None:
        s, e = self.build(node.item, label, field_ids)
        self.eps[end].append(s)
        self.eps[e].append(s)
        b = self.state()
        self.eps[end].append(b)
        self.eps[e].append(b)
        return a, b
      b = self.state()
      for _ in range(node.max - node.min):
        self.eps[end].append(b)
        s, e = self.build(node.item, label, field_ids)
        self.eps[end].append(s)
        end = e
      self.eps[end].append(b)
      return a, b
    if isinstance(node, TextWithout):
      return self._text_without(node, label)
    if isinstance(node, Text):
      return self._text_without(node.body, (field_ids[node.name], NO_OPTION))
    if isinstance(node, Enum):
      field = field_ids[node.name]
      for i, x in enumerate(node.options):
        for y in node.options[i + 1:]:
          if x.startswith(y) or y.startswith(x):
            raise ValueError(f"grammar: enum {node.name!r} options {x!r} and {y!r} are "
                             "prefixes of one another; the parsed option would be ambiguous")
      if node.continuations is not None and len(node.continuations) != len(node.options):
        raise ValueError(f"grammar: enum {node.name!r} has {len(node.options)} options and "
                         f"{len(node.continuations)} continuations")
      a, b = self.state(), self.state()
      plan = _continuation_plan(node.continuations) if node.continuations is not None else None
      starts: dict = {}  # each continuation's and shared node's start, built once
      for k, option in enumerate(node.options):
        if not option:
          raise ValueError(f"grammar: enum {node.name!r} has an empty option")
        end = a
        for j, byte in enumerate(option):
          nxt = self.state()
          self.edges[end].append(((byte,), nxt, (field, k if j == len(option) - 1 else -1)))
          end = nxt
        if plan is None:
          self.eps[end].append(b)
          continue
        self.eps[end].append(self._continuation(node.continuations[k], plan, starts, b,
                                                label, field_ids))
      return a, b
    if isinstance(node, Number):
      if node.lo > node.hi:
        raise ValueError(f"grammar: number {node.name!r} has lo {node.lo} > hi {node.hi}")
      field = (field_ids[node.name], NO_OPTION)
      digit = Bytes(frozenset(b"0123456789"))
      fraction = seq(".", Repeat(digit, 1, node.decimals)) if node.decimals else None
      zeros = seq(".", Repeat(lit("0"), 1, node.decimals)) if node.decimals else None
      options = []
      for text, open_fraction in _number_strings(node.lo, node.hi, node.decimals):
        tail = fraction if open_fraction else zeros
        options.append(seq(lit(text), optional(tail)) if tail else lit(text))
      return self.build(Alt(tuple(options)), field, field_ids)
    raise TypeError(f"grammar: unknown node {type(node).__name__}")

  def _continuation(self, item, plan: dict, starts: dict, b: int, label, field_ids) -> int:
    """The start of an enum continuation ending at `b`, built on first use: its head (if
    any), then its shared node, itself built once (`_continuation_plan`)."""
    if ("whole", item) not in starts:
      head, shared = plan[item]
      if ("node", shared) not in starts:
        s, e = self.build(shared, label, field_ids)
        self.eps[e].append(b)
        starts["node", shared] = s
      start = starts["node", shared]
      if head is not None:
        start, e = self.build(head, label, field_ids)
        self.eps[e].append(starts["node", shared])
      starts["whole", item] = start
    return starts["whole", item]

  def _text_without(self, node: TextWithout, label) -> tuple[int, int]:
    """Aho-Corasick automaton of the patterns with every match removed, times a count of
    non-space bytes (saturating at `min_nonspace`); states that counted enough may end."""
    goto, matched = _aho_corasick(node.patterns)
    need = node.min_nonspace
    counts = np.ones(256, np.int64)
    counts[list(node.space)] = 0
    states = {(0, 0): self.state()}
    end = self.state()
    queue = collections.deque([(0, 0)])
    while queue:
      q, c = queue.popleft()
      s = states[q, c]
      if c == need:
        self.eps[s].append(end)
      targets: dict[tuple[int, int], list[int]] = {}
      for byte in range(256):
        t = int(goto[q, byte])
        if not matched[t]:
          targets.setdefault((t, min(need, c + int(counts[byte]))), []).append(byte)
      for pair, values in targets.items():
        if pair not in states:
          states[pair] = self.state()
          queue.append(pair)
        self.edges[s].append((tuple(values), states[pair], label))
    return states[0, 0], end

  def closure(self, states) -> frozenset:
    if not hasattr(self, "_closures"):
      self._closures = {}
    out = set()
    for state in states:
      if state not in self._closures:
        stack, seen = [state], {state}
        while stack:
          for t in self.eps[stack.pop()]:
            if t not in seen:
              seen.add(t)
              stack.append(t)
        self._closures[state] = frozenset(seen)
      out |= self._closures[state]
    return frozenset(out)

  def live(self, accept: int) -> np.ndarray:
    """States from which `accept` is reachable."""
    reverse: list[list[int]] = [[] for _ in self.eps]
    for s in range(len(self.eps)):
      for t in self.eps[s]:
        reverse[t].append(s)
      for _, t, _ in self.edges[s]:
        reverse[t].append(s)
    live = np.zeros(len(self.eps), bool)
    live[accept] = True
    stack = [accept]
    while stack:
      for s in reverse[stack.pop()]:
        if not live[s]:
          live[s] = True
          stack.append(s)
    return live


# ----------------------------------------------------------------------------- DFA

@dataclasses.dataclass
class DFA:
  """A complete DFA over bytes. State 0 is dead, 1 the start."""
  next: np.ndarray       # [S, 256] int32
  field: np.ndarray      # [S, 256] int32, NO_FIELD where the byte writes no field
  option: np.ndarray     # [S, 256] int32, the enum option an option's last byte completes
  accepting: np.ndarray  # [S] bool

  @property
  def num_states(self) -> int:
    return self.next.shape[0]

  def walk(self, data: bytes) -> int:
    """The state after `data`, stopping at the first accepting state."""
    state = START
    for byte in data:
      if self.accepting[state]:
        break
      state = int(self.next[state, byte])
    return state


def determinize(node, field_names: dict[str, int]) -> DFA:
  nfa = _NFA()
  start, accept = nfa.build(node, (NO_FIELD, NO_OPTION), field_names)
  live = nfa.live(accept)
  first = nfa.closure([start])
  index = {frozenset(): DEAD, first: START}
  order = [frozenset(), first]
  rows_next, rows_field, rows_option = [np.zeros(256, np.int32)], [np.zeros(256, np.int32)], [
      np.full(256, NO_OPTION, np.int32)]
  i = 1
  while i < len(order):
    subset = order[i]
    targets: dict[int, set] = {}
    labels: dict[int, set] = {}
    for s in subset:
      for values, t, label in nfa.edges[s]:
        if not live[t]:
          continue
        for byte in values:
          targets.setdefault(byte, set()).add(t)
          labels.setdefault(byte, set()).add(label)
    row_next = np.zeros(256, np.int32)
    row_field = np.zeros(256, np.int32)
    row_option = np.full(256, NO_OPTION, np.int32)
    for byte, ts in targets.items():
      if len(labels[byte]) > 1:
        raise ValueError(f"grammar: byte {bytes([byte])!r} may belong to different fields "
                         f"or options here ({sorted(labels[byte])}); the parse is ambiguous")
      closed = nfa.closure(ts)
      if closed not in index:
        index[closed] = len(order)
        order.append(closed)
      row_next[byte] = index[closed]
      row_field[byte], row_option[byte] = next(iter(labels[byte]))
    rows_next.append(row_next)
    rows_field.append(row_field)
    rows_option.append(row_option)
    i += 1
  accepting = np.asarray([accept in s for s in order])
  return DFA(np.stack(rows_next), np.stack(rows_field), np.stack(rows_option), accepting)


def first_stop(stops: tuple[bytes, ...]) -> DFA:
  """Accepts the strings that end at their first occurrence of a stop string."""
  found = determinize(seq(Repeat(ANY), Alt(tuple(lit(s) for s in stops))), {})
  nxt = found.next.copy()
  nxt[found.accepting] = DEAD  # nothing may follow the first stop string
  return DFA(nxt, found.field, found.option, found.accepting)


def intersect(a: DFA, b: DFA) -> DFA:
  """The product automaton (labels from `a`); b's dead state kills the pair."""
  index = {(DEAD, DEAD): DEAD, (START, START): START}
  order = [(DEAD, DEAD), (START, START)]
  rows = []
  i = 0
  while i < len(order):
    sa, sb = order[i]
    row = np.zeros(256, np.int32)
    live = (a.next[sa] != DEAD) & (b.next[sb] != DEAD)
    if i != DEAD and live.any():
      pairs = list(zip(a.next[sa, live].tolist(), b.next[sb, live].tolist()))
      for pair in pairs:
        if pair not in index:
          index[pair] = len(order)
          order.append(pair)
      row[live] = [index[pair] for pair in pairs]
    rows.append(row)
    i += 1
  pa = np.asarray([p[0] for p in order])
  pb = np.asarray([p[1] for p in order])
  nxt = np.stack(rows)
  alive = nxt != DEAD
  return DFA(nxt, np.where(alive, a.field[pa], NO_FIELD),
             np.where(alive, a.option[pa], NO_OPTION), a.accepting[pa] & b.accepting[pb])


def minimize(dfa: DFA) -> DFA:
  """Moore partition refinement; transitions must agree on their target class and label."""
  klass = dfa.accepting.astype(np.int64)
  klass[DEAD] = 2  # keep the dead state's class apart even when nothing else is dead
  count = len(np.unique(klass))
  while True:
    signature = np.ascontiguousarray(np.concatenate(
        [klass[:, None], klass[dfa.next], dfa.field, dfa.option], 1).astype(np.int32))
    ids: dict[bytes, int] = {}
    refined = np.asarray([ids.setdefault(row.tobytes(), len(ids)) for row in signature])
    if len(ids) == count:
      break
    klass, count = refined, len(ids)
  # Renumber: dead -> 0, start -> 1, the rest in order of first appearance.
  mapping = {int(klass[DEAD]): DEAD}
  if int(klass[START]) not in mapping:
    mapping[int(klass[START])] = START
  for k in klass:
    if int(k) not in mapping:
      mapping[int(k)] = len(mapping)
  new = np.asarray([mapping[int(k)] for k in klass])
  size = len(mapping)
  representative = np.zeros(size, np.int64)
  representative[new[::-1]] = np.arange(len(new))[::-1]
  return DFA(new[dfa.next[representative]].astype(np.int32), dfa.field[representative],
             dfa.option[representative], dfa.accepting[representative])


# ----------------------------------------------------------------------------- grammar

def _rerooted(dfa: DFA, state: int) -> DFA:
  """The same automaton started at `state`: what it reaches from there, renumbered (dead
  0, `state` the start)."""
  order, index = [DEAD, state], {DEAD: DEAD, state: START}
  i = 1
  while i < len(order):
    for target in np.unique(dfa.next[order[i]]).tolist():
      if target not in index:
        index[target] = len(order)
        order.append(target)
    i += 1
  keep = np.asarray(order)
  remap = np.zeros(dfa.num_states, np.int32)
  remap[keep] = np.arange(len(keep), dtype=np.int32)
  return minimize(DFA(remap[dfa.next[keep]], dfa.field[keep], dfa.option[keep],
                      dfa.accepting[keep]))


def _after_prefix(dfa: DFA, prefix: bytes, name: str) -> DFA:
  """`dfa` started where `prefix` leads; the prefix may write no field and close nothing."""
  state = START
  for byte in prefix:
    if dfa.field[state, byte] != NO_FIELD or dfa.option[state, byte] != NO_OPTION:
      raise ValueError(f"grammar {name!r}: the prefix {prefix!r} would write a field")
    state = int(dfa.next[state, byte])
    if state == DEAD or dfa.accepting[state]:
      raise ValueError(f"grammar {name!r}: a turn cannot begin with the prefix {prefix!r} "
                       "(the grammar " + ("rejects it" if state == DEAD else "closes in it")
                       + ")")
  return _rerooted(dfa, state) if prefix else dfa


@dataclasses.dataclass(frozen=True)
class Grammar:
  """A turn's grammar: the tree, the closing tags that end a turn, and its fields.
  `prefix`: bytes the prompt writes before each turn (a thinking template's "<think>\n");
  the automata start after them, so the model's tokens are the rest of the turn."""
  name: str
  root: object
  stops: tuple[bytes, ...]
  prefix: bytes = b""

  def after(self, prefix) -> "Grammar":
    """This grammar for turns that the prompt has opened with `prefix` (str or bytes)."""
    prefix = prefix.encode() if isinstance(prefix, str) else bytes(prefix)
    return self if prefix == self.prefix else dataclasses.replace(self, prefix=prefix)

  @functools.cached_property
  def fields(self) -> tuple:
    return tuple(_fields(self.root, []))

  @functools.cached_property
  def text_fields(self) -> tuple[str, ...]:
    """The `Text` fields' names, in field order: the rows of `ParsedTurn.texts`."""
    return tuple(f.name for f in self.fields if isinstance(f, Text))

  def text_index(self, name: str) -> int:
    """The row of a `Text` field in `ParsedTurn.texts`."""
    if name not in self.text_fields:
      raise KeyError(f"grammar {self.name!r} has no text field {name!r}; it has "
                     f"{list(self.text_fields)}")
    return self.text_fields.index(name)

  def field_id(self, name: str) -> int:
    for i, f in enumerate(self.fields):
      if f.name == name:
        return i + 1
    raise KeyError(f"grammar {self.name!r} has no field {name!r}; it has "
                   f"{[f.name for f in self.fields]}")

  def option(self, field: str, option: bytes) -> int:
    """The value an enum field takes for `option`."""
    spec = self.fields[self.field_id(field) - 1]
    if not isinstance(spec, Enum) or option not in spec.options:
      raise KeyError(f"grammar {self.name!r}: field {field!r} has no option {option!r}")
    return spec.options.index(option)

  @functools.cached_property
  def dfa(self) -> DFA:
    ids = {f.name: i + 1 for i, f in enumerate(self.fields)}
    turn = minimize(determinize(self.root, ids))  # small before the product
    return _after_prefix(minimize(intersect(turn, first_stop(self.stops))), self.prefix,
                         self.name)

  @functools.cached_property
  def stop_dfa(self) -> DFA:
    return _after_prefix(minimize(first_stop(self.stops)), self.prefix, self.name)

  @functools.cached_property
  def literals(self) -> frozenset:
    return frozenset(_literals(self.root, set()))


# ----------------------------------------------------------------------------- tokens

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
