"""Turn parsing on the host with regular expressions, as agent frameworks do it.

This is the reference the device automata are tested against and the parser of the
host-loop baseline in `benchmarks/rollout_bench.py`. A turn is cut after its first
closing tag (a serving engine's stop strings), then matched whole; numbers are checked
against their ranges after the match. Returns the fields as Python values, or None when
the turn is malformed. Written independently of `grammars.py`, from the same spec.

An answer body (between `<answer>` and the first `</answer>`) holds a byte that is not
ASCII whitespace (space, \t, \n, \r, \v, \f) and none of the tags `<think>`, `</think>`,
`<answer>`, `</answer>`, `<tool_call>`, `</tool_call>`, `<action>`, `</action>`, nor `<|`
(how every Qwen special token begins); a lone `<` is text. The regexes are linear: a
negative lookahead at one position for blankness, a tempered dot for the tags (no nested
quantifiers), so hostile model text cannot make them backtrack for long.
"""

from __future__ import annotations

import functools
import re

from jaxspatial.envs.act3d import PRIMITIVES

_WS = rb"[ \t\n\r]*"
_THINK = _WS + rb"<think>(?:(?!</think>).)*</think>" + _WS
_SPACE = rb"[ \t\n\r\x0b\x0c]"
_NOT_IN_ANSWERS = (b"<think>", b"</think>", b"<answer>", b"</answer>", b"<tool_call>",
                   b"</tool_call>", b"<action>", b"</action>", b"<|")
_ANSWER = (rb"<answer>(?!" + _SPACE + rb"*</answer>)(?P<answer>(?:(?!"
           + b"|".join(re.escape(t) for t in _NOT_IN_ANSWERS) + rb").)*)</answer>")


def _num(name: str, signed: bool, decimals: int) -> bytes:
  sign = rb"-?" if signed else rb""
  fraction = rb"(?:\.[0-9]{1,%d})?" % decimals if decimals else rb""
  return rb"(?P<%s>%s(?:0|[1-9][0-9]*)%s)" % (name.encode(), sign, fraction)


def _key(name: str, value: bytes) -> bytes:
  return rb'"' + name.encode() + rb'"' + _WS + rb":" + _WS + value


def _sep() -> bytes:
  return _WS + rb"," + _WS


def _call(name: bytes, arguments: bytes) -> bytes:
  return (rb"\{" + _WS + _key("name", name) + _sep() + _key(
      "arguments", rb"\{" + _WS + arguments + _WS + rb"\}") + _WS + rb"\}")


def _truncate(turn: bytes, stops) -> bytes:
  ends = [turn.find(s) + len(s) for s in stops if s in turn]
  return turn[:min(ends)] if ends else turn


def _in_range(text: bytes, lo: float, hi: float) -> bool:
  return lo <= float(text) <= hi


_ACT3D = re.compile(
    _THINK + rb"(?:<tool_call>" + _WS + _call(
        rb'"render_view_tool"',
        _key("action", rb'"(?P<action>' + b"|".join(p.encode() for p in PRIMITIVES) + rb')"')
        + rb"(?:" + _sep() + _key("distance", _num("distance", False, 2)) + rb")?")
    + _WS + rb"</tool_call>|" + _ANSWER + rb")", re.DOTALL)


def parse_act3d(turn: bytes, max_distance: float = 360) -> dict | None:
  match = _ACT3D.fullmatch(_truncate(turn, (b"</tool_call>", b"</answer>")))
  if match is None:
    return None
  if match["answer"] is not None:
    return {"answer": match["answer"]}
  distance = match["distance"]
  if distance is not None and not _in_range(distance, 0, max_distance):
    return None
  return {"action": PRIMITIVES.index(match["action"].decode()),
          "distance": None if distance is None else float(distance)}


_THINK3D = re.compile(
    _THINK + rb"(?:<tool_call>" + _WS + _call(
        rb'"pi3_tool"',
        _key("rotation_reference_camera", rb"(?P<camera>[1-9][0-9]*)") + _sep()
        + _key("azimuth_angle", _num("azimuth", True, 2)) + _sep()
        + _key("elevation_angle", _num("elevation", True, 2)) + _sep()
        + _key("camera_view", rb"(?P<view>true|false)"))
    + _WS + rb"</tool_call>|" + _ANSWER + rb")", re.DOTALL)


# Think3D's paper-era RL prompt allows three views: left, right, top-down.
_THINK3D_PRESETS = {(b"-45", b"0"): (-45.0, 0.0), (b"45", b"0"): (45.0, 0.0),
                    (b"0", b"60"): (0.0, 60.0)}


def parse_think3d(turn: bytes, max_cameras: int = 8, views: str = "free") -> dict | None:
  """`views="preset"`: the angles must be one of the three preset pairs, written as
  integers."""
  match = _THINK3D.fullmatch(_truncate(turn, (b"</tool_call>", b"</answer>")))
  if match is None:
    return None
  if match["answer"] is not None:
    return {"answer": match["answer"]}
  if views == "preset" and (match["azimuth"], match["elevation"]) not in _THINK3D_PRESETS:
    return None
  if not (_in_range(match["camera"], 1, max_cameras) and _in_range(match["azimuth"], -180, 180)
          and _in_range(match["elevation"], -90, 90)):
    return None
  return {"camera": int(match["camera"]), "azimuth": float(match["azimuth"]),
          "elevation": float(match["elevation"]), "ego": match["view"] == b"true"}


_PERIA_TOOLS = (b"image_crop", b"image_label", b"draw_line", b"draw_path", b"bounding_box",
                b"image_highlight")
_PERIA_ARGUMENTS = (b"bounding_box", b"coordinates", b"points", b"text", b"text_prompt",
                    b"question")
_PERIA_INTEGER = rb"(?:0|[1-9][0-9]*)"
# A text argument: a JSON string body without '"' or backslash, holding a byte that is not
# ASCII whitespace (one lookahead at its start: linear).
_PERIA_TEXT = rb'"(?=[^"\\]*[^"\\ \t\n\r\x0b\x0c])(?P<text>[^"\\]*)"'


def _peria_points(separator: bytes) -> bytes:
  pair = _PERIA_INTEGER + separator + _PERIA_INTEGER
  return rb"(?P<points>" + pair + rb"(?:" + separator + pair + rb")*)"


_PERIA_VALUES = {  # a flat list, or the public declarations' strings "\\boxed{...}" / "(x,y)"
    "list": rb"\[" + _WS + _peria_points(_sep()) + _WS + rb"\]",
    "boxed": (rb'"(?:' + re.escape(b"\\\\boxed{") + rb"|\()? *" + _peria_points(rb" *, *")
              + rb' *(?:\}|\))?"'),
}


@functools.lru_cache(maxsize=None)
def _peria(coordinates: str, text_tools: tuple[str, ...]) -> re.Pattern:
  """The turn regex: the six tools with their point arguments; with `text_tools` also
  those names, the argument optional, and the text keys ("text_prompt", "question")."""
  tools = _PERIA_TOOLS + tuple(t.encode() for t in text_tools)
  points = (rb'(?:"(?P<argument>bounding_box|coordinates|points)"|"text"' + _WS + rb":" + _WS
            + rb'"(?P<label>[^"]*)"' + _sep() + rb'"position")' + _WS + rb":" + _WS
            + _PERIA_VALUES[coordinates])
  index = _key("image_index", rb"(?P<image>" + _PERIA_INTEGER + rb")")
  if text_tools:
    text = rb'"(?P<text_key>text_prompt|question)"' + _WS + rb":" + _WS + _PERIA_TEXT
    arguments = index + rb"(?:" + _sep() + rb"(?:" + points + rb"|" + text + rb"))?"
  else:
    arguments = index + _sep() + points
  return re.compile(
      _THINK + rb"(?:<action>" + _WS + _call(
          rb'"(?P<tool>' + b"|".join(re.escape(t) for t in tools) + rb')"', arguments)
      + _WS + rb"</action>|" + _ANSWER + rb")", re.DOTALL)


def parse_peria(turn: bytes, max_images: int = 10, scale: int = 1000, max_points: int = 8,
                coordinates: str = "list", text_tools: tuple[str, ...] = ()) -> dict | None:
  """{"answer"} or {"tool" (an index into the six tools, then `text_tools`),
  "image_index", "argument" (an index into the argument keys bounding_box, coordinates,
  points, text, text_prompt, question; None when none was written, which only
  `text_tools` allow), "points" [(x, y), ...], "label" (image_label's text, else None),
  "text" (a text argument's bytes, else None)}. `coordinates`: "list" or "boxed"."""
  match = _peria(coordinates, tuple(text_tools)).fullmatch(
      _truncate(turn, (b"</action>", b"</answer>")))
  if match is None:
    return None
  if match["answer"] is not None:
    return {"answer": match["answer"]}
  values = re.split(rb"[ \t\n\r]*,[ \t\n\r]*", match["points"]) if match["points"] else []
  if (len(values) > 2 * max_points or not _in_range(match["image"], 0, max_images - 1)
      or not all(_in_range(v, 0, scale) for v in values)):
    return None
  groups = match.groupdict()  # no text groups without text tools
  argument = (groups["argument"] or groups.get("text_key")
              or (b"text" if groups["label"] is not None else None))
  return {"tool": (_PERIA_TOOLS + tuple(t.encode() for t in text_tools)).index(match["tool"]),
          "image_index": int(match["image"]),
          "argument": None if argument is None else _PERIA_ARGUMENTS.index(argument),
          "points": [(int(x), int(y)) for x, y in zip(values[::2], values[1::2])],
          "label": groups["label"], "text": groups.get("text")}


_THINKER3D = re.compile(
    _WS + rb"<\|latent_start\|>(?:<\|latent_pad\|>){12}<\|latent_end\|>" + _THINK + _ANSWER,
    re.DOTALL)


def parse_thinker3d(turn: bytes) -> dict | None:
  match = _THINKER3D.fullmatch(_truncate(turn, (b"</answer>",)))
  return None if match is None else {"answer": match["answer"]}


PARSERS = {"think3d": parse_think3d, "act3d": parse_act3d, "peria": parse_peria,
           "thinker3d": parse_thinker3d}
