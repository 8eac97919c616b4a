"""An agent's turns written from fields, in exactly the syntax its grammar accepts: what the
scripted teachers, the tiny test policy's tokenizer corpus and the demo's expert write.
Each agent's `call_turn(thought, **fields)` builds its tool call from these pieces; every
agent shares `answer_turn`.

  <think>{thought}</think><tool_call>{"name": ..., "arguments": {...}}</tool_call>
  <think>{thought}</think><answer>{answer}</answer>
"""

from __future__ import annotations

import json
import numbers

from jaxspatial.rollout.grammars import ANGLE_DECIMALS

THINK_CLOSE = "</think>"


def think(thought: str) -> str:
  if THINK_CLOSE in thought:
    raise ValueError(f"a thought cannot hold {THINK_CLOSE!r}: got {thought!r}")
  return f"<think>{thought}</think>"


def number(value, decimals: int = ANGLE_DECIMALS):
  """A JSON number the grammars accept: integers as integers, other values rounded to
  `decimals` places (1.5 stays 1.5, 3.0 stays 3.0)."""
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise TypeError(f"expected a number, got {value!r}")
  if isinstance(value, numbers.Integral):
    return int(value)
  return round(float(value), decimals)


def call(open_tag: str, close_tag: str, thought: str, name: str, arguments: dict) -> str:
  """A tool-call turn: `arguments` in the grammar's key order, values as JSON."""
  body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
  return f"{think(thought)}{open_tag}{body}{close_tag}"


def answer_prefix(thought: str) -> str:
  """The start of an answer turn, for forcing a policy to answer now."""
  return f"{think(thought)}<answer>"


def answer_turn(thought: str, answer: str) -> str:
  """An answer turn; the answer must be non-blank and free of the closing tag."""
  if not str(answer).strip() or "</answer>" in str(answer):
    raise ValueError(f"an answer must be non-blank text without '</answer>', got {answer!r}")
  return f"{answer_prefix(thought)}{answer}</answer>"


class AnswerTurns:
  """Mixin for agents: `answer_turn` and `answer_prefix` as methods, and the chat
  template's reply opening. An agent's `prefill` field is what its policy's template writes
  where a reply opens (a thinking model's "<think>\n"; see `models.ChatFormat`): the first
  prompt and every observation message end with it, and the grammar starts after it."""

  prefill: str

  def opened(self, message: str) -> str:
    """A prompt or observation message that ends where a reply opens, with the prefill."""
    return message + self.prefill

  def turn_grammar(self, grammar):
    return grammar.after(self.prefill)

  def answer_turn(self, thought: str, answer: str) -> str:
    return answer_turn(thought, answer)

  def answer_prefix(self, thought: str) -> str:
    return answer_prefix(thought)
