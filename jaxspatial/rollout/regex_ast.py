"""The grammar tree: a small regular expression over bytes with labelled fields.

A grammar is a tree of `lit`, `Bytes`, `Seq`, `Alt`, `Repeat`, and `TextWithout` (free
text holding none of a set of patterns, optionally with at least n non-space bytes) with
labelled fields (`Enum`, `Number`, and `Text`: a TextWithout whose bytes are the field's
value). A field appears once in a grammar; an enum's options may share a continuation (see
`Enum`), which then holds its fields once. `nfa` builds it into an automaton, `automaton`
makes that a minimal DFA; the papers' grammars are in `grammars`.
"""

from __future__ import annotations

import dataclasses


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
  (`continuation_plan`)."""
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


def continuation_plan(continuations: tuple) -> dict:
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


def collect_fields(node, out: list) -> list:
  if isinstance(node, (Enum, Number, Text)):
    if any(f.name == node.name for f in out):
      raise ValueError(f"grammar: field {node.name!r} appears twice")
    out.append(node)
  if isinstance(node, Enum) and node.continuations:
    shared = []
    for head, item in continuation_plan(node.continuations).values():
      if head is not None:
        collect_fields(head, out)
      if item not in shared:
        shared.append(item)
        collect_fields(item, out)
  elif isinstance(node, (Seq, Alt)):
    for item in node.items:
      collect_fields(item, out)
  elif isinstance(node, Repeat):
    collect_fields(node.item, out)
  return out


def collect_literals(node, out: set) -> set:
  """Byte strings the grammar spells out (whole `lit`s and enum options)."""
  if isinstance(node, Seq) and node.items and all(
      isinstance(i, Bytes) and len(i.values) == 1 for i in node.items):
    out.add(bytes(next(iter(i.values)) for i in node.items))
  if isinstance(node, Enum):
    out.update(node.options)
    for item in node.continuations or ():
      collect_literals(item, out)
  if isinstance(node, (Seq, Alt)):
    for item in node.items:
      collect_literals(item, out)
  elif isinstance(node, Repeat):
    collect_literals(node.item, out)
  return out


def number_strings(lo: int, hi: int, decimals: int) -> list[tuple[bytes, bool]]:
  """(integer part with sign, whether a fraction may follow) for the numbers in [lo, hi].
  A fraction after the bound itself may only be zeros, handled by the caller."""
  out = []
  for value in range(max(lo, 0), hi + 1):
    out.append((str(value).encode(), value < hi))
  if lo < 0:
    for magnitude in range(0, -lo + 1):
      out.append((b"-" + str(magnitude).encode(), magnitude < -lo))
  return out

