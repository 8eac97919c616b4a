"""Thompson construction of a grammar tree into an NFA with labelled byte edges.

An edge carries the (field, option) label its byte writes; `TextWithout` becomes an
Aho-Corasick automaton with every match removed. `automaton.determinize` turns the NFA into
a DFA.
"""

from __future__ import annotations

import collections

import numpy as np

from jaxspatial.rollout.regex_ast import (Alt, Bytes, Enum, Number, Repeat, Seq, Text,
                                          TextWithout, continuation_plan, lit, number_strings,
                                          optional, seq)

NO_FIELD, NO_OPTION = 0, -1


def aho_corasick(patterns: tuple[bytes, ...]) -> tuple[np.ndarray, np.ndarray]:
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

class NFA:
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
      plan = continuation_plan(node.continuations) if node.continuations is not None else None
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
      for text, open_fraction in number_strings(node.lo, node.hi, node.decimals):
        tail = fraction if open_fraction else zeros
        options.append(seq(lit(text), optional(tail)) if tail else lit(text))
      return self.build(Alt(tuple(options)), field, field_ids)
    raise TypeError(f"grammar: unknown node {type(node).__name__}")

  def _continuation(self, item, plan: dict, starts: dict, b: int, label, field_ids) -> int:
    """The start of an enum continuation ending at `b`, built on first use: its head (if
    any), then its shared node, itself built once (`continuation_plan`)."""
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
    goto, matched = aho_corasick(node.patterns)
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

