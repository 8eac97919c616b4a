"""Grammars as minimal byte DFAs whose transitions carry the field they write.

A `Grammar` (a `regex_ast` tree and the closing tags that end a turn) compiles to a minimal
DFA over the 256 byte values whose transitions carry the field (and, on an enum option's
last byte, the option) they write. A turn ends at the first closing tag (`stops`, e.g.
`</tool_call>`, `</answer>`), as a serving engine's stop strings do. The DFA accepts
exactly the turns that match the grammar and contain no closing tag before their end: the
grammar intersected with "no stop string except as a suffix". State 0 is the dead state,
state 1 the start. `token_table` walks a tokenizer's vocabulary through it into the tables
a rollout uses on device.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from jaxspatial.rollout.nfa import NFA, NO_FIELD, NO_OPTION
from jaxspatial.rollout.regex_ast import (ANY, Alt, Enum, Repeat, Text, collect_fields,
                                          collect_literals, lit, seq)

DEAD, START = 0, 1


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
  nfa = NFA()
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
    return tuple(collect_fields(self.root, []))

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
    return frozenset(collect_literals(self.root, set()))

