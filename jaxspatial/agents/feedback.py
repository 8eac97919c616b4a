"""The feedback turn after each SpatialClaw step, and the condensed form of failed steps
kept in the history. Wording ours; the parts follow SpatialClaw's feedback block:

    == Step 3 feedback ==
    Status: success in 0.42 s            | error (traceback) | partial error at line N
    Output:                              stdout, capped: first 1,000 + a cut marker +
                                         last 3,000 characters; kept when the cell failed
    Warnings:                            filtered stderr (<= 500 characters), only
                                         without an error
    VLM sub-queries:                     question / answer pairs asked during the cell
    Variables:                           summaries of new or changed variables
    Memory warning:                      variables over 500 MB
    Answer submitted: ... | Answer refused: ... (attempt a of b)
    Images attached below (n): labels    the images come in the same turn, after the text
    Tool calls: Reconstruct x1, VLM x2 (3 in all)
    Checklist: 2/5 verified              or each item with its state
    Steps left: 27

Everything the cell or the model produced (stdout, stderr, tracebacks, summaries, labels,
sub-query answers) is indented by two spaces, so only this module's own lines start at
the left margin: printed text cannot forge a status, a header or an answer line.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from jaxspatial.agents.schema import CheckItem, Step

OUTPUT_CHARS = 4_000
OUTPUT_HEAD = 1_000
OUTPUT_TAIL = 3_000
WARNING_CHARS = 500
TRACEBACK_CHARS = 600
MAX_VARIABLES = 40
VARIABLE_CHARS = 300
QUERY_CHARS = 1_000
LARGE_BYTES = 500 * 1000 * 1000
INDENT = "  "


def quote(text: str) -> str:
  """Untrusted text indented by two spaces, line by line."""
  return "\n".join(INDENT + line for line in str(text).split("\n"))


def cap_output(text: str, head: int = OUTPUT_HEAD, tail: int = OUTPUT_TAIL) -> str:
  """stdout kept whole up to head + tail characters, else its head, a marker, its tail."""
  if len(text) <= head + tail:
    return text
  cut = len(text) - head - tail
  return f"{text[:head]}\n[... {cut} characters cut from the middle ...]\n{text[-tail:]}"


def cap_end(text: str, limit: int) -> str:
  return text if len(text) <= limit else text[:limit - 20] + " [... cut]"


_NOISE = ("warnings.warn(", "  warnings.warn")


def filter_stderr(text: str, limit: int = WARNING_CHARS) -> str:
  """stderr without blank, repeated and `warnings.warn(` source lines, capped."""
  seen, kept = set(), []
  for line in text[:20_000].split("\n"):
    stripped = line.strip()
    if not stripped or stripped in seen or stripped.startswith(_NOISE):
      continue
    seen.add(stripped)
    kept.append(line.rstrip())
  return cap_end("\n".join(kept), limit)


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(B|bytes|kB|KB|KiB|MB|MiB|GB|GiB|TB|TiB)\b")
_UNITS = {"B": 1, "bytes": 1, "kB": 1e3, "KB": 1e3, "KiB": 1024, "MB": 1e6, "MiB": 1 << 20,
          "GB": 1e9, "GiB": 1 << 30, "TB": 1e12, "TiB": 1 << 40}


def summary_bytes(summary: str) -> float:
  """The largest size a variable summary states ("... 1.2 GB"), 0 when none."""
  best = 0.0
  for match in _SIZE.finditer(summary[:VARIABLE_CHARS * 2]):
    best = max(best, float(match.group(1)) * _UNITS[match.group(2)])
  return best


@dataclasses.dataclass
class AnswerNote:
  """What happened to a ReturnAnswer in this step: accepted (its text), refused (why),
  or forced (accepted after the attempts ran out)."""
  value: str
  accepted: bool
  reason: str | None = None
  attempts: int = 0
  max_attempts: int = 5
  forced: bool = False


def checklist_lines(items: Sequence[CheckItem], verified: set[int], full: bool) -> list[str]:
  if not items:
    return []
  done = sum(1 for k in range(1, len(items) + 1) if k in verified)
  if not full:
    return [f"Checklist: {done}/{len(items)} verified"]
  out = [f"Checklist ({done}/{len(items)} verified):"]
  for k, item in enumerate(items, 1):
    mark = "done" if k in verified else "open"
    out.append(f"{INDENT}{k}. [{item.priority}] ({mark}) {item.description}")
  return out


def feedback_text(step: int, *, status: str, seconds: float = 0.0, stdout: str = "",
                  stderr: str = "", error: str | None = None, failing_line: int | None = None,
                  code: str = "", format_error: str | None = None,
                  queries: Sequence[tuple[str, str]] = (), variables: Sequence[str] = (),
                  answer: AnswerNote | None = None, image_labels: Sequence[str] = (),
                  images_dropped: int = 0, images_hidden: bool = False,
                  tool_calls: dict | None = None, checklist: Sequence[CheckItem] = (),
                  verified: set[int] | None = None, full_checklist: bool = False,
                  steps_left: int | None = None, timeout_s: float | None = None) -> str:
  """The feedback turn's text (see the module doc). `status` is the kernel's ("ok",
  "error", "partial", "timeout", "killed") or "format" for a reply that did not parse."""
  lines = [f"== Step {step} feedback =="]
  if status == "format":
    lines.append("Status: not run, the reply did not follow the format")
    lines.append(quote(cap_end(format_error or "", TRACEBACK_CHARS)))
  elif status == "ok":
    lines.append(f"Status: success in {seconds:.2f} s")
  elif status == "partial":
    where = f"line {failing_line}" if failing_line else "an unknown line"
    lines.append(f"Status: partial error at {where} ({seconds:.2f} s); the lines before it "
                 "ran and their variables are kept")
    lines += _failure(code, failing_line, error)
  elif status in ("timeout", "killed"):
    limit = f" of {timeout_s:g} s" if timeout_s else ""
    cause = (f"the cell ran past its time limit{limit} and was stopped" if status == "timeout"
             else "the cell was stopped (a memory, process or output limit)")
    lines.append(f"Status: error, {cause}; the kernel was restarted and earlier variables are "
                 "gone")
    lines += _failure("", None, error)
  else:
    where = f" at line {failing_line}" if failing_line else ""
    lines.append(f"Status: error{where} ({seconds:.2f} s); the cell's new variables were "
                 "removed")
    lines += _failure(code, failing_line, error or "(no traceback)")
  stdout = stdout.rstrip("\n")
  if stdout:
    lines.append("Output:")
    lines.append(quote(cap_output(stdout)))
  warnings = filter_stderr(stderr) if stderr and status == "ok" else ""
  if warnings:
    lines.append("Warnings:")
    lines.append(quote(warnings))
  if queries:
    lines.append("VLM sub-queries:")
    for question, reply in queries:
      lines.append(quote(f"Q: {cap_end(question, QUERY_CHARS)}"))
      lines.append(quote(f"A: {cap_end(reply, QUERY_CHARS)}"))
  if variables:
    lines.append("Variables:")
    shown = list(variables)[:MAX_VARIABLES]
    lines.extend(quote(cap_end(v, VARIABLE_CHARS)) for v in shown)
    if len(variables) > len(shown):
      lines.append(f"{INDENT}... and {len(variables) - len(shown)} more")
    large = [v for v in variables if summary_bytes(v) > LARGE_BYTES]
    if large:
      lines.append("Memory warning: these variables hold over 500 MB each; delete what you "
                   "no longer need (del name):")
      lines.extend(quote(cap_end(v, 120)) for v in large[:10])
  if answer is not None:
    if answer.accepted and answer.forced:
      lines.append(f"Answer submitted (accepted after {answer.attempts} attempts, the most "
                   "allowed):")
      lines.append(quote(cap_end(answer.value, 200)))
    elif answer.accepted:
      lines.append("Answer submitted:")
      lines.append(quote(cap_end(answer.value, 200)))
    else:
      lines.append(f"Answer refused (attempt {answer.attempts} of {answer.max_attempts}): "
                   f"{answer.reason}")
  if image_labels or images_dropped:
    labels = ", ".join(cap_end(label, 80) for label in image_labels) or "(none)"
    if images_hidden:
      lines.append(f"Images shown ({len(image_labels)}; not attached in this run):")
    else:
      lines.append(f"Images attached below ({len(image_labels)}):")
    lines.append(quote(labels))
    if images_dropped:
      lines.append(f"{images_dropped} more image(s) were not attached (the per-step limit)")
  calls = {k: int(v) for k, v in (tool_calls or {}).items() if int(v) > 0}
  if calls:
    total = sum(calls.values())
    lines.append("Tool calls: " + ", ".join(f"{k} x{v}" for k, v in sorted(calls.items()))
                 + f" ({total} in all)")
  lines.extend(checklist_lines(checklist, verified or set(), full_checklist))
  if steps_left is not None:
    lines.append(f"Steps left: {steps_left}")
  return "\n".join(lines)


def _failure(code: str, failing_line: int | None, error: str | None) -> list[str]:
  """The failing line's source (when the traceback does not show it) and the error, quoted."""
  out = []
  source = _line(code, failing_line)
  if source and f"line {failing_line}:" not in (error or ""):
    out.append(quote(f"line {failing_line}: {source}"))
  if error:
    out.append(quote(cap_end(error, TRACEBACK_CHARS)))
  return out


def _line(code: str, number: int | None) -> str:
  if not number or not code:
    return ""
  lines = code.split("\n")
  if 1 <= number <= len(lines):
    return lines[number - 1].strip()[:200]
  return ""


def condensed_step(step: Step, failing_line: int | None, error: str | None) -> str:
  """A failed step as the history keeps it: the purpose, and the code cut after the line
  that raised, marked as the error (lines after it dropped)."""
  lines = step.code.split("\n")
  kind = (error or "error").strip().split("\n")[-1][:120] or "error"
  if failing_line and 1 <= failing_line <= len(lines):
    kept = lines[:failing_line]
    cut = len(lines) - failing_line
    kept.append(f"# ^ ERROR here: {kind}" + (f" ({cut} later line(s) removed)" if cut else ""))
  else:
    kept = lines + [f"# ERROR: {kind}"]
  return (f"**Purpose**\n{step.purpose}\n\n**Reasoning**\n(condensed: this step failed)\n\n"
          f"**Next Goal**\n{step.next_goal}\n\n**Code**\n```python\n" + "\n".join(kept)
          + "\n```")


def condensed_reply(reply: str, limit: int = 2_000) -> str:
  """An unparseable reply as the history keeps it."""
  text = reply if isinstance(reply, str) else ""
  return text if len(text) <= limit else text[:limit] + "\n[... rest of this reply cut]"
