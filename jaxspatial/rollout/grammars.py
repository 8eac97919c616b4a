"""The papers' turn grammars.

Every turn is `<think>...</think>` (thinking ends at the first `</think>`) followed by a tool call or an answer (3DThinker: its
latent block first). JSON keys come in the order shown, with JSON whitespace anywhere
between tokens; numbers are JSON numbers inside each field's range (integer bounds, at
most two decimals, a fraction after a bound itself only of zeros).

Think3D   <tool_call>{"name": "pi3_tool", "arguments": {"rotation_reference_camera": 1,
          "azimuth_angle": -45, "elevation_angle": 0, "camera_view": true}}</tool_call>
          (the public code's inference schema; camera_view true = ego view)
Act3D     <tool_call>{"name": "render_view_tool", "arguments": {"action": "forward",
          "distance": 2.5}}</tool_call>     (appendix C.1; distance optional)
PERIA     <action>{"name": "image_crop", "arguments": {"image": 0, "bbox": [420, 310, 680,
          590]}}</action>                  (box tools; coordinates in [0, 1000])
3DThinker <|latent_start|><|latent_pad|> x 12 <|latent_end|><think>...</think>
          <answer>...</answer>
"""

from __future__ import annotations

from jaxspatial.envs.act3d import PRIMITIVES
from jaxspatial.envs.peria import TOOLS as PERIA_ENV_TOOLS
from jaxspatial.rollout.automaton import (JSON_WS, Enum, Grammar, Number, Repeat, TextWithout,
                                          optional, seq)

WS = JSON_WS
THINK = seq(WS, "<think>", TextWithout(b"</think>"), "</think>", WS)
ANSWER_BODY = seq(TextWithout(b"</answer>"), "</answer>")
CALL, ANSWER = 0, 1  # values of the "kind" field
ANGLE_DECIMALS = 2
PERIA_TOOLS = PERIA_ENV_TOOLS  # one list: the environment dispatches on this order
THINK3D_TOOL, ACT3D_TOOL = "pi3_tool", "render_view_tool"


def _key(name: str, value):
  return seq(f'"{name}"', WS, ":", WS, value)


def _json_call(name, arguments):
  return seq("{", WS, _key("name", name), WS, ",", WS,
             _key("arguments", seq("{", WS, arguments, WS, "}")), WS, "}")


def _call_or_answer(open_tag: str, call, close_tag: str):
  """The "kind" field: CALL after the tool tag, ANSWER after <answer>."""
  return Enum("kind", (open_tag.encode(), b"<answer>"),
              (seq(WS, call, WS, close_tag), ANSWER_BODY))


def _comma(*items):
  out = [items[0]]
  for item in items[1:]:
    out += [WS, ",", WS, item]
  return seq(*out)


def think3d(max_cameras: int = 8) -> Grammar:
  arguments = _comma(
      _key("rotation_reference_camera", Number("camera", 1, max_cameras)),
      _key("azimuth_angle", Number("azimuth", -180, 180, ANGLE_DECIMALS)),
      _key("elevation_angle", Number("elevation", -90, 90, ANGLE_DECIMALS)),
      _key("camera_view", Enum("camera_view", (b"false", b"true"))))
  root = seq(THINK, _call_or_answer("<tool_call>", _json_call(f'"{THINK3D_TOOL}"', arguments),
                                    "</tool_call>"))
  return Grammar("think3d", root, (b"</tool_call>", b"</answer>"))


def act3d(max_distance: int = 360) -> Grammar:
  action = _key("action", seq('"', Enum("action", tuple(p.encode() for p in PRIMITIVES)), '"'))
  distance = _key("distance", Number("distance", 0, max_distance, ANGLE_DECIMALS))
  arguments = seq(action, optional(seq(WS, ",", WS, distance)))
  root = seq(THINK, _call_or_answer("<tool_call>", _json_call(f'"{ACT3D_TOOL}"', arguments),
                                    "</tool_call>"))
  return Grammar("act3d", root, (b"</tool_call>", b"</answer>"))


def peria(max_images: int = 8, scale: int = 1000) -> Grammar:
  box = seq("[", WS, _comma(*[Number(f"bbox{i}", 0, scale) for i in range(4)]), WS, "]")
  arguments = _comma(_key("image", Number("image", 0, max_images - 1)), _key("bbox", box))
  name = seq('"', Enum("tool", tuple(t.encode() for t in PERIA_TOOLS)), '"')
  root = seq(THINK, _call_or_answer("<action>", _json_call(name, arguments), "</action>"))
  return Grammar("peria", root, (b"</action>", b"</answer>"))


def thinker3d(num_latents: int = 12) -> Grammar:
  latent = seq("<|latent_start|>", Repeat(seq("<|latent_pad|>"), num_latents, num_latents),
               "<|latent_end|>")
  answer = Enum("kind", (b"<answer>",), (ANSWER_BODY,))
  return Grammar("thinker3d", seq(WS, latent, THINK, answer), (b"</answer>",))


GRAMMARS = {"think3d": think3d, "act3d": act3d, "peria": peria, "thinker3d": thinker3d}
