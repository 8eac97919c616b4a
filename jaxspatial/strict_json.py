"""JSON as hostile input: `loads` refuses NaN / Infinity and duplicate keys (json's
defaults accept both), so a body means one thing to every reader. The HTTP tool service
and the chat-completions server parse requests with it."""

from __future__ import annotations

import json
from typing import Any


def _no_constant(name: str):
  raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs):
  out = {}
  for key, value in pairs:
    if key in out:
      raise ValueError(f"duplicate key {key!r}")
    out[key] = value
  return out


def loads(text: str) -> Any:
  """json.loads without NaN / Infinity and duplicate keys (a ValueError naming them;
  RecursionError for absurd nesting, as json.loads)."""
  return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique_keys)


def loads_body(body: bytes, name: str = "body") -> Any:
  """`loads` of a UTF-8 HTTP body; any failure is one ValueError naming `name`, the cause
  and how the body starts."""
  try:
    text = body.decode("utf-8")
  except UnicodeDecodeError as error:
    raise ValueError(f"{name} is not UTF-8 ({error})") from None
  try:
    return loads(text)
  except (ValueError, RecursionError) as error:
    raise ValueError(f"malformed JSON in the {name} ({str(error)[:200]}); it starts "
                     f"{text[:80]!r}") from None
