"""SpatialClaw's model replies read as hostile input: the four-header code step, the
structured (one named call) step, the plan and its verification checklist, and answers.

Every reader here is a linear scan over a capped text: replies are cut to `MAX_REPLY_CHARS`
first, headers are looked for only on short lines, fences are matched line by line, and the
checklist's JSON is tried at a bounded number of places. Nothing raises on a reply except
`StepFormatError`, whose message the loop feeds back to the model as a failed step.

The code step (ours, after SpatialClaw's schema): `<think>...</think>` blocks are dropped,
then four bold headers must come in this order, each on its own line (a trailing colon,
a Markdown heading prefix and any letter case are accepted):

    **Purpose**     what this step is for
    **Reasoning**   why this step, given what is known
    **Next Goal**   what the step after it should do
    **Code**        one fenced python block (a fence cut off by the length limit is kept)

Inside the Code block a fence with a language tag opens a nested block, which a bare fence
closes; the block ends at the bare fence that closes it, or at the end of the reply.
Lines such as "Verified: 1, 3" anywhere before the code mark checklist items as checked.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any, Sequence

from jaxspatial.errors import StepFormatError
from jaxspatial.agents.kernel_program import kernel_path

MAX_REPLY_CHARS = 200_000      # a longer reply is cut here before any parsing
MAX_HEADER_LINE = 120          # only lines this short can be headers
MAX_FIELD_CHARS = 4_000        # Purpose / Reasoning / Next Goal kept for the record
MAX_CHECKLIST_ITEMS = 12
MAX_CHECK_CHARS = 300
MAX_JSON_TRIES = 16            # '[' positions tried for the checklist's JSON
MAX_PLAN_CHARS = 60_000
PRIORITIES = ("HIGH", "MEDIUM", "LOW")
HEADERS = ("purpose", "reasoning", "next goal", "code")
STRUCTURED_HEADERS = ("purpose", "reasoning", "next goal", "action")
PLAN_SECTIONS = ("task analysis", "information needs", "computation plan",
                 "verification checklist", "fallbacks")
LETTERS = "ABCDEFGHIJ"


@dataclasses.dataclass(frozen=True)
class Step:
  """One parsed step. `code` is the cell to run (for a structured step, the translation of
  its call); `call` is the structured call (name, arguments) or None; `truncated` says the
  code fence was never closed; `verified` are checklist items (1-based) the step marks."""
  purpose: str
  reasoning: str
  next_goal: str
  code: str
  call: tuple[str, dict] | None = None
  truncated: bool = False
  verified: tuple[int, ...] = ()


# --- shared scanning ----------------------------------------------------------------------

def cap(text: Any, limit: int = MAX_REPLY_CHARS) -> str:
  """`text` as a str of at most `limit` characters with Unix line ends (non-strings become
  empty)."""
  if not isinstance(text, str):
    return ""
  return text[:limit].replace("\r\n", "\n").replace("\r", "\n")


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def strip_think(text: str) -> str:
  """Drops `<think>...</think>` blocks (case-insensitive, linear); text before a closing
  tag with no opening (a template that opened the block in the prompt) goes too, and an
  opening tag never closed is removed as a tag alone."""
  lower = text.translate(_ASCII_LOWER)  # str.lower() may change the length
  out, start = [], 0
  opening = closing = -2  # -2: not searched yet; each search resumes past the last
  while True:
    if opening != -1 and opening < start:
      opening = lower.find("<think>", start)
    if closing != -1 and closing < start:
      closing = lower.find("</think>", start)
    if closing != -1 and (opening == -1 or closing < opening):
      out = []  # everything so far was thinking
      start = closing + len("</think>")
      continue
    if opening == -1:
      out.append(text[start:])
      break
    out.append(text[start:opening])
    end = lower.find("</think>", opening)
    if end == -1:
      out.append(text[opening + len("<think>"):])
      break
    start = end + len("</think>")
  return "".join(out).strip("\n")


def _header_name(line: str, names: Sequence[str]) -> tuple[str, str] | None:
  """(header name, text after it on the line) when `line` is one of `names` written as a
  bold header ("**Name**", "**Name:**", "## **Name**:", "**Name**: text"), else None."""
  if len(line) > MAX_HEADER_LINE:
    return None
  s = line.strip()
  s = s.lstrip("#").strip()
  if not s.startswith("**"):
    return None
  end = s.find("**", 2)
  if end == -1:
    return None
  inner = s[2:end].strip().rstrip(":").strip().lower()
  inner = " ".join(inner.split())
  if inner not in names:
    return None
  rest = s[end + 2:].lstrip()
  if rest.startswith(":"):
    rest = rest[1:].lstrip()
  return inner, rest


def sections(text: str, names: Sequence[str]) -> tuple[list[tuple[str, int]], list[str]]:
  """([(header name, line index)] in order of appearance, the lines), one scan."""
  lines = text.split("\n")
  found = []
  for k, line in enumerate(lines):
    hit = _header_name(line, names)
    if hit is not None:
      found.append((hit[0], k))
  return found, lines


def _fence(line: str) -> tuple[bool, str] | None:
  """(is a fence, its language tag) for a fence line ("```", "```python"), else None."""
  if len(line) > MAX_HEADER_LINE:
    return None
  s = line.strip()
  if not s.startswith("```"):
    return None
  tag = s[3:].strip()
  if "`" in tag or " " in tag:
    return None
  return True, tag.lower()


def fenced_block(lines: Sequence[str]) -> tuple[str, bool] | None:
  """(the first fenced block's body, whether its fence was left open) in `lines`, or None
  without an opening fence. A tagged fence inside opens a nested block; a bare fence
  closes the innermost."""
  start = None
  for k, line in enumerate(lines):
    if _fence(line) is not None:
      start = k
      break
  if start is None:
    return None
  depth = 1
  for k in range(start + 1, len(lines)):
    fence = _fence(lines[k])
    if fence is None:
      continue
    if fence[1]:
      depth += 1
    else:
      depth -= 1
      if depth == 0:
        return "\n".join(lines[start + 1:k]), False
  return "\n".join(lines[start + 1:]), True


_VERIFIED = re.compile(r"verified\s*:?\s*((?:#?\d{1,2}\s*(?:,|and|&)?\s*){1,12})", re.I)


def verified_items(text: str, limit: int = MAX_CHECKLIST_ITEMS) -> tuple[int, ...]:
  """Checklist numbers a reply marks, from lines "Verified: 1, 3" (short lines only)."""
  out = []
  for line in text.split("\n"):
    if len(line) > 200 or "verified" not in line.lower():
      continue
    match = _VERIFIED.search(line)
    if match:
      for number in re.findall(r"\d{1,2}", match.group(1)):
        value = int(number)
        if 1 <= value <= limit and value not in out:
          out.append(value)
  return tuple(out)


def _fields(text: str, names: Sequence[str], what: str) -> tuple[dict[str, str], list[str],
                                                                   int]:
  """{name: text} of the first occurrence of each header in order, the lines, and the line
  index of the last header. StepFormatError names missing or misordered headers."""
  found, lines = sections(text, names)
  first: dict[str, int] = {}
  for name, k in found:
    first.setdefault(name, k)
  missing = [n for n in names if n not in first]
  pretty = ", ".join(f"**{n.title()}**" for n in names)
  if missing:
    listed = ", ".join(f"**{n.title()}**" for n in missing)
    raise StepFormatError(
        f"the reply is missing {listed}. Write the {len(names)} headers {pretty} in this "
        f"order, each on its own line, then {what}.")
  order = [first[n] for n in names]
  if order != sorted(order):
    raise StepFormatError(f"the headers are out of order; write {pretty} in this order.")
  out = {}
  for i, name in enumerate(names[:-1]):
    body = lines[first[name]:order[i + 1]]
    head = _header_name(body[0], names)
    text_lines = ([head[1]] if head and head[1] else []) + body[1:]
    out[name] = "\n".join(text_lines).strip()[:MAX_FIELD_CHARS]
  return out, lines, first[names[-1]]


def parse_step(reply: Any) -> Step:
  """The four-header code step of a reply (see the module doc)."""
  text = strip_think(cap(reply))
  if not text.strip():
    raise StepFormatError("the reply is empty. Write **Purpose**, **Reasoning**, "
                          "**Next Goal** and **Code** with one ```python block.")
  fields, lines, code_at = _fields(text, HEADERS, "one ```python block under **Code**")
  head = _header_name(lines[code_at], HEADERS)
  rest = ([head[1]] if head and head[1] else []) + lines[code_at + 1:]
  block = fenced_block(rest)
  if block is None:
    raise StepFormatError("**Code** has no fenced block; put the cell in ```python ... ```.")
  code, truncated = block
  if not code.strip():
    raise StepFormatError("the ```python block under **Code** is empty; write the cell's "
                          "code in it.")
  before = "\n".join(lines[:code_at])
  return Step(fields["purpose"], fields["reasoning"], fields["next goal"], code,
              truncated=truncated, verified=verified_items(before))


# --- structured calls ---------------------------------------------------------------------

def _json_values(text: str, opener: str):
  """The JSON values that decode at each `opener` in text, in order (at most
  MAX_JSON_TRIES attempts: a bounded scan of hostile text)."""
  decoder = json.JSONDecoder()
  start = 0
  for _ in range(MAX_JSON_TRIES):
    k = text.find(opener, start)
    if k == -1:
      return
    start = k + 1
    try:
      yield decoder.raw_decode(text, k)[0]
    except (ValueError, RecursionError):
      continue


def _json_object(text: str) -> dict | None:
  """The first JSON object in text: tried at each '{'."""
  return next((value for value in _json_values(text, "{") if isinstance(value, dict)), None)


def _literal(value: Any, depth: int = 0) -> str:
  """A JSON value written as Python source (the translation of a structured call)."""
  if depth > 8:
    raise StepFormatError("the action's arguments nest too deeply")
  if value is None or isinstance(value, bool):
    return repr(value)
  if isinstance(value, int):
    return repr(value)
  if isinstance(value, float):
    if not math.isfinite(value):
      raise StepFormatError("the action's arguments hold a non-finite number")
    return repr(value)
  if isinstance(value, str):
    return repr(value)
  if isinstance(value, list):
    return "[" + ", ".join(_literal(v, depth + 1) for v in value) + "]"
  if isinstance(value, dict):
    return "{" + ", ".join(f"{_literal(str(k))}: {_literal(v, depth + 1)}"
                           for k, v in value.items()) + "}"
  raise StepFormatError(f"unsupported argument value {type(value).__name__}")


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


# Printed after a structured call: the model writes no code, so it reads the result here.
SUMMARY_SOURCE = """def _summary(value, depth=0):
    pad = '  ' * depth
    if isinstance(value, dict):
        return '\\n'.join(pad + str(k) + ': ' + _summary(v, depth + 1).lstrip()
                         for k, v in list(value.items())[:40])
    if isinstance(value, (list, tuple)) and depth < 2 and len(value) <= 20:
        return pad + '[' + ', '.join(_summary(v, 2).strip() for v in value) + ']'
    if isinstance(value, np.ndarray):
        if value.size <= 16:
            return pad + np.array2string(value, precision=3)
        text = pad + 'array ' + str(value.shape) + ' ' + str(value.dtype)
        if value.dtype.kind in 'fiub' and value.size:
            text += ' min %.4g max %.4g' % (float(value.min()), float(value.max()))
        return text
    return pad + repr(value)[:2000]
"""


def structured_code(name: str, arguments: dict, step: int) -> str:
  """The cell a structured call stands for: the tool's result (tool `name` reached by its
  kernel path: tools.SAM3.video, vlm.locate) kept as `result_{step}` (and `last_result`)
  and printed in summary; `ReturnAnswer` submits its `answer`."""
  if name == "ReturnAnswer":
    if set(arguments) - {"answer"} or "answer" not in arguments:
      raise StepFormatError('ReturnAnswer takes one argument: {"answer": ...}')
    return f"ReturnAnswer({_literal(arguments['answer'])})"
  keywords = ", ".join(f"{k}={_literal(v)}" for k, v in arguments.items())
  return (f"result_{step} = {kernel_path(name)}({keywords})\n"
          f"last_result = result_{step}\n" + SUMMARY_SOURCE +
          f"print(_summary(result_{step}))\n"
          f"if isinstance(result_{step}, dict) and isinstance(result_{step}.get('image'), "
          f"np.ndarray):\n    show(result_{step}['image'], {name!r})")


def parse_structured(reply: Any, tools: Sequence[str], step: int) -> Step:
  """A structured step: Purpose, Reasoning, Next Goal, then **Action** with one JSON object
  {"tool": NAME, "arguments": {...}}; NAME is one of `tools` or ReturnAnswer."""
  text = strip_think(cap(reply))
  if not text.strip():
    raise StepFormatError("the reply is empty. Write **Purpose**, **Reasoning**, "
                          "**Next Goal** and **Action** with one JSON object.")
  fields, lines, action_at = _fields(text, STRUCTURED_HEADERS,
                                     'one JSON object {"tool": ..., "arguments": {...}} '
                                     "under **Action**")
  head = _header_name(lines[action_at], STRUCTURED_HEADERS)
  rest = "\n".join(([head[1]] if head and head[1] else []) + lines[action_at + 1:])
  call = _json_object(rest)
  if call is None:
    raise StepFormatError('**Action** holds no JSON object; write {"tool": NAME, '
                          '"arguments": {...}}.')
  name, arguments = call.get("tool"), call.get("arguments", {})
  allowed = list(tools) + ["ReturnAnswer"]
  if not isinstance(name, str) or name not in allowed:
    raise StepFormatError(f"unknown tool {str(name)[:40]!r}; expected one of {allowed}")
  if not isinstance(arguments, dict) or not all(
      isinstance(k, str) and _IDENTIFIER.fullmatch(k) for k in arguments):
    raise StepFormatError('"arguments" must be an object whose keys are argument names')
  code = structured_code(name, arguments, step)
  before = "\n".join(lines[:action_at])
  return Step(fields["purpose"], fields["reasoning"], fields["next goal"], code,
              call=(name, arguments), verified=verified_items(before))


# --- the plan -----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CheckItem:
  priority: str      # HIGH, MEDIUM or LOW
  description: str


@dataclasses.dataclass(frozen=True)
class Plan:
  text: str                          # the plan as written (think blocks dropped, capped)
  checklist: tuple[CheckItem, ...]
  sections: tuple[str, ...]          # which of PLAN_SECTIONS were found


def _priority(value: Any) -> str:
  word = str(value).strip().upper()[:10]
  for p in PRIORITIES:
    if word.startswith(p[:3]):
      return p
  return "MEDIUM"


def _items(value: Any) -> list[CheckItem]:
  items = []
  if not isinstance(value, list):
    return items
  for entry in value[:MAX_CHECKLIST_ITEMS * 4]:
    if isinstance(entry, dict):
      description = entry.get("description", entry.get("check", entry.get("item")))
      priority = entry.get("priority", "MEDIUM")
    elif isinstance(entry, str):
      description, priority = entry, "MEDIUM"
    else:
      continue
    if not isinstance(description, str) or not description.strip():
      continue
    items.append(CheckItem(_priority(priority),
                           " ".join(description.split())[:MAX_CHECK_CHARS]))
    if len(items) == MAX_CHECKLIST_ITEMS:
      break
  return items


_BULLET = re.compile(r"^\s*(?:[-*]|\d{1,2}[.)])\s*(?:\[?\s*(HIGH|MEDIUM|LOW)\s*\]?\s*[:\-]?)?"
                     r"\s*(.+)$", re.I)


def parse_checklist(text: str) -> list[CheckItem]:
  """The verification checklist of a plan: the first JSON list of {priority, description}
  after a "verification checklist" heading (or anywhere), else the heading's bullet lines."""
  text = cap(text, MAX_PLAN_CHARS)
  lower = text.lower()
  at = lower.find("verification checklist")
  regions = [text[at:]] if at != -1 else []
  regions.append(text)
  for region in regions:
    for value in _json_values(region, "["):
      items = _items(value)
      if items:
        return items
  if at == -1:
    return []
  items = []
  for line in text[at:].split("\n")[1:]:
    if len(line) > 400:
      continue
    if _header_name(line, PLAN_SECTIONS) or line.lstrip().startswith("#"):
      if items:
        break
      continue
    match = _BULLET.match(line)
    if match:
      items.append(CheckItem(_priority(match.group(1) or "MEDIUM"),
                             " ".join(match.group(2).split())[:MAX_CHECK_CHARS]))
      if len(items) == MAX_CHECKLIST_ITEMS:
        break
  return items


def parse_plan(reply: Any) -> Plan:
  """The plan of a planning reply; never raises (a plan without sections is kept as
  text; an unreadable checklist is empty)."""
  text = strip_think(cap(reply, MAX_PLAN_CHARS)).strip()
  lower = text.lower()
  found = tuple(s for s in PLAN_SECTIONS if s in lower)
  return Plan(text, tuple(parse_checklist(text)), found)


# --- answers ------------------------------------------------------------------------------

def answer_text(value: Any) -> str | None:
  """A ReturnAnswer value as text (str, int or float; bools and others are None)."""
  if isinstance(value, bool) or value is None:
    return None
  if isinstance(value, str):
    return value.strip()[:1000]
  if isinstance(value, int):
    return str(value)
  if isinstance(value, float):
    return repr(value) if math.isfinite(value) else None
  try:  # numpy scalars
    import numpy as np  # pylint: disable=import-outside-toplevel
    if isinstance(value, np.generic) and value.shape == ():
      return answer_text(value.item())
  except ImportError:  # pragma: no cover
    pass
  return None


_LETTER = re.compile(r"^\(?\s*([A-J])\s*[).:]?(?:\s|$)")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def check_answer(value: Any, options: Sequence[str] = (),
                 kind: str = "text") -> tuple[str | None, str | None]:
  """(the answer as the prediction text, None) or (None, why it is refused).

  With `options`: an option letter ("B", "(B)", "B. the chair") or an option's exact
  text (case-insensitive) -> the letter. `kind` "number": a finite number. Otherwise any
  non-empty text."""
  text = answer_text(value)
  if text is None:
    return None, (f"ReturnAnswer takes a str, int or float; got {type(value).__name__}")
  if not text:
    return None, "the answer is empty"
  if options:
    letters = LETTERS[:len(options)]
    match = _LETTER.match(text)
    if match and match.group(1) in letters:
      return match.group(1), None
    folded = " ".join(text.lower().split())
    for k, option in enumerate(options):
      if folded == " ".join(str(option).lower().split()):
        return letters[k], None
    return None, (f"expected one option letter ({', '.join(letters)}); got {text[:60]!r}")
  if kind == "number":
    match = _NUMBER.search(text[:200])
    if match is None or not math.isfinite(float(match.group(0))):
      return None, f"expected a number; got {text[:60]!r}"
    return match.group(0), None
  return text, None
