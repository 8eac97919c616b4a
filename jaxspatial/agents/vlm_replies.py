"""Reading the loop model's replies to SpatialClaw's VLM sub-queries: `locate_reply` (boxes
and points on the 0-1000 grid), `split_thinking` / `strip_thinking` (reasoning apart from
the answer). Model-written text: bounded, never raising."""

from __future__ import annotations

import re

_NUMBER = r"(\d{1,4}(?:\.\d{1,3})?)"
_BOX = re.compile(r"[\[(]\s*" + r"\s*,\s*".join([_NUMBER] * 4) + r"\s*[\])]")
_POINT = re.compile(r"[\[(]\s*" + _NUMBER + r"\s*,\s*" + _NUMBER + r"\s*[\])]")
MAX_LOCATED = 20


def locate_reply(reply: str) -> tuple[list, list]:
  """(boxes [[x1, y1, x2, y2]], points [[x, y]]) on the 0-1000 grid from a vlm.locate reply
  (both empty: "not visible" or unreadable). A line with a box and no point gives the
  box's centre as its point."""
  text = reply[:4000] if isinstance(reply, str) else ""
  if "not visible" in text.lower():
    return [], []
  boxes, points = [], []
  for line in text.split("\n"):
    line_boxes, rest, last = [], [], 0
    for match in _BOX.finditer(line):
      rest.append(line[last:match.start()])
      last = match.end()
      x1, y1, x2, y2 = (float(v) for v in match.groups())
      if 0 <= x1 < x2 <= 1000 and 0 <= y1 < y2 <= 1000:
        line_boxes.append([x1, y1, x2, y2])
    rest.append(line[last:])
    line_points = [[float(m.group(1)), float(m.group(2))]
                   for m in _POINT.finditer(" ".join(rest))]
    line_points = [p for p in line_points if 0 <= p[0] <= 1000 and 0 <= p[1] <= 1000]
    if line_boxes and not line_points:
      line_points = [[(b[0] + b[2]) / 2, (b[1] + b[3]) / 2] for b in line_boxes]
    boxes += line_boxes
    points += line_points
  return boxes[:MAX_LOCATED], points[:MAX_LOCATED]


_FINAL = re.compile(r"^[ \t>*#_]*final answer[ \t*_]*[:：]", re.IGNORECASE | re.MULTILINE)


def split_thinking(reply: str) -> tuple[str, str]:
  """(thinking, answer) of a vlm.ask_with_thinking reply: a <think>...</think> block is the
  thinking and what follows the answer; else text up to the last "Final answer:" line is
  the thinking; else the whole reply is the answer."""
  text = reply[:200_000] if isinstance(reply, str) else ""
  lower = text.lower()
  end = lower.rfind("</think>")
  if end != -1:
    thinking = text[:end]
    opening = thinking.lower().find("<think>")
    thinking = thinking[opening + len("<think>"):] if opening != -1 else thinking
    text, answer_part = thinking, text[end + len("</think>"):]
    final = list(_FINAL.finditer(answer_part))
    answer = answer_part[final[-1].end():] if final else answer_part
    return text.strip(), answer.strip()
  final = list(_FINAL.finditer(text))
  if final:
    return text[:final[-1].start()].strip(), text[final[-1].end():].strip()
  opening = lower.find("<think>")
  if opening != -1:  # never closed: all thinking, no answer
    return text[opening + len("<think>"):].strip(), ""
  return "", text.strip()


def strip_thinking(reply: str) -> str:
  return split_thinking(reply)[1]
