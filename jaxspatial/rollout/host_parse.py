"""Turn parsing on the host with regular expressions, as agent frameworks do it.

This is the reference the device automata are tested against and the parser of the
host-loop baseline in `benchmarks/rollout_bench.py`. A turn is cut after its first
closing tag (a serving engine's stop strings), then matched whole; numbers are checked
against their ranges after the match. Returns the fields as Python values, or None when
the turn is malformed. Written independently of `grammars.py`, from the same spec.
"""

from __future__ import annotations

import re

from jaxspatial.envs.act3d import PRIMITIVES

_WS = rb"[ \t\n\r]*"
_THINK = _WS + rb"<think>(?:(?!</think>).)*</think>" + _WS
_ANSWER = rb"<answer>(?P<answer>.*)</answer>"


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


def parse_think3d(turn: bytes, max_cameras: int = 8) -> dict | None:
  match = _THINK3D.fullmatch(_truncate(turn, (b"</tool_call>", b"</answer>")))
  if match is None:
    return None
  if match["answer"] is not None:
    return {"answer": match["answer"]}
  if not (_in_range(match["camera"], 1, max_cameras) and _in_range(match["azimuth"], -180, 180)
          and _in_range(match["elevation"], -90, 90)):
    return None
  return {"camera": int(match["camera"]), "azimuth": float(match["azimuth"]),
          "elevation": float(match["elevation"]), "ego": match["view"] == b"true"}


_PERIA_TOOLS = (b"image_crop", b"draw_line", b"bounding_box", b"image_highlight")
_PERIA = re.compile(
    _THINK + rb"(?:<action>" + _WS + _call(
        rb'"(?P<tool>' + b"|".join(_PERIA_TOOLS) + rb')"',
        _key("image", rb"(?P<image>0|[1-9][0-9]*)") + _sep() + _key(
            "bbox", rb"\[" + _WS + _sep().join(_num(f"b{i}", False, 0) for i in range(4))
            + _WS + rb"\]"))
    + _WS + rb"</action>|" + _ANSWER + rb")", re.DOTALL)


def parse_peria(turn: bytes, max_images: int = 8, scale: int = 1000) -> dict | None:
  match = _PERIA.fullmatch(_truncate(turn, (b"</action>", b"</answer>")))
  if match is None:
    return None
  if match["answer"] is not None:
    return {"answer": match["answer"]}
  box = [match[f"b{i}"] for i in range(4)]
  if not _in_range(match["image"], 0, max_images - 1) or not all(
      _in_range(b, 0, scale) for b in box):
    return None
  return {"tool": _PERIA_TOOLS.index(match["tool"]), "image": int(match["image"]),
          "bbox": [int(b) for b in box]}


_THINKER3D = re.compile(
    _WS + rb"<\|latent_start\|>(?:<\|latent_pad\|>){12}<\|latent_end\|>" + _THINK + _ANSWER,
    re.DOTALL)


def parse_thinker3d(turn: bytes) -> dict | None:
  match = _THINKER3D.fullmatch(_truncate(turn, (b"</answer>",)))
  return None if match is None else {"answer": match["answer"]}


PARSERS = {"think3d": parse_think3d, "act3d": parse_act3d, "peria": parse_peria,
           "thinker3d": parse_thinker3d}
