"""The papers' turn grammars.

Every turn is `<think>...</think>` (thinking ends at the first `</think>`) followed by a
tool call or an answer (3DThinker: its latent block first). JSON keys come in the order
shown, with JSON whitespace anywhere between tokens; numbers are JSON numbers inside each
field's range (integer bounds, at most two decimals, a fraction after a bound itself only
of zeros).

An answer body, the bytes between `<answer>` and the first `</answer>`, is
- not blank: at least one byte that is not ASCII whitespace (space, \t, \n, \r, \v, \f:
  `bytes.isspace`, the set the rewards' "empty answer" check uses; Act3D calls an empty
  answer malformed);
- tag-free: none of the turn grammars' tags `<think>`, `</think>`, `<answer>`,
  `<tool_call>`, `</tool_call>`, `<action>`, `</action>` (`</answer>` only as its closer),
  and no `<|`, the opening of every Qwen special token (`<|im_end|>`, `<|latent_pad|>`, ...),
  so none can be spelled byte by byte either.
Tags are matched exactly (case-sensitive, as every parser reads them); a `<` alone is text:
"x < 3", "a<b", "<3 m", "</", "<thinking>" are answers.

Think3D   <tool_call>{"name": "pi3_tool", "arguments": {"rotation_reference_camera": 1,
          "azimuth_angle": -45, "elevation_angle": 0, "camera_view": true}}</tool_call>
          (the public code's inference schema; camera_view true = ego view)
Act3D     <tool_call>{"name": "render_view_tool", "arguments": {"action": "forward",
          "distance": 2.5}}</tool_call>     (appendix C.1; distance optional)
PERIA     <action>{"name": "image_crop", "arguments": {"image_index": 0, "bounding_box":
          [420, 310, 680, 590]}}</action>  (the public tools' arguments: see `peria`;
          with perception tools also {"image_index": 0, "text_prompt": "chair"})
3DThinker <|latent_start|><|latent_pad|> x 12 <|latent_end|><think>...</think>
          <answer>...</answer>
"""

from __future__ import annotations

import functools

from jaxspatial.envs.act3d import PRIMITIVES
from jaxspatial.envs.peria import ARGUMENTS as PERIA_ENV_ARGUMENTS
from jaxspatial.envs.peria import TEXT_ARGUMENTS as PERIA_ENV_TEXT_ARGUMENTS
from jaxspatial.envs.peria import TOOLS as PERIA_ENV_TOOLS
from jaxspatial.rollout.automaton import Grammar
from jaxspatial.rollout.regex_ast import (JSON_WS, Enum, Number, Repeat, Text, TextWithout,
                                          alt, optional, seq)

WS = JSON_WS
TAGS = (b"<think>", b"</think>", b"<answer>", b"</answer>", b"<tool_call>", b"</tool_call>",
        b"<action>", b"</action>")
SPECIAL_TOKEN_OPEN = b"<|"  # how every Qwen special token begins (see the docstring)
THINK = seq(WS, "<think>", TextWithout(b"</think>"), "</think>", WS)
ANSWER_BODY = seq(TextWithout(TAGS + (SPECIAL_TOKEN_OPEN,), min_nonspace=1), "</answer>")
CALL, ANSWER = 0, 1  # values of the "kind" field
ANGLE_DECIMALS = 2
PERIA_TOOLS = PERIA_ENV_TOOLS  # one list: the environment dispatches on this order
PERIA_ARGUMENTS = PERIA_ENV_ARGUMENTS  # the "argument" field's options, in this order
PERIA_TEXT_ARGUMENTS = PERIA_ENV_TEXT_ARGUMENTS  # text keys (with perception tools only)
PERIA_POINT_ARGUMENTS = PERIA_ARGUMENTS[:len(PERIA_ARGUMENTS) - len(PERIA_TEXT_ARGUMENTS)]
PERIA_TEXT = "text_value"  # the field holding a text argument's bytes
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


# The paper-era RL prompt's views (azimuth, elevation): left, right, top-down.
THINK3D_PRESET_VIEWS = ((-45, 0), (45, 0), (0, 60))


def think3d(max_cameras: int = 8, views: str = "free") -> Grammar:
  """`views="free"`: any azimuth in [-180, 180] and elevation in [-90, 90]; "preset": only
  the pairs of THINK3D_PRESET_VIEWS (field "view", the pair's index)."""
  if views == "free":
    angles = _comma(_key("azimuth_angle", Number("azimuth", -180, 180, ANGLE_DECIMALS)),
                    _key("elevation_angle", Number("elevation", -90, 90, ANGLE_DECIMALS)))
  elif views == "preset":
    elevation = lambda value: seq(WS, ",", WS, _key("elevation_angle", str(value)))
    angles = _key("azimuth_angle", Enum(
        "view", tuple(str(a).encode() for a, _ in THINK3D_PRESET_VIEWS),
        tuple(elevation(e) for _, e in THINK3D_PRESET_VIEWS)))
  else:
    raise ValueError(f"grammars.think3d: views must be 'free' or 'preset', got {views!r}")
  arguments = _comma(
      _key("rotation_reference_camera", Number("camera", 1, max_cameras)), angles,
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


PERIA_COORDINATES = ("list", "boxed")


def _peria_points(max_points: int, scale: int, coordinates: str):
  """1 to max_points (x, y) pairs, one field per coordinate slot: "list" [x1, y1, ...]
  (the paper's example), "boxed" the public declarations' string "\\\\boxed{x1,y1,...}"
  or "(x,y)" (either opener or none, as the server strips them; spaces allowed)."""
  space = WS if coordinates == "list" else Repeat(seq(" "))
  def pair(k):
    return seq(Number(f"x{k}", 0, scale), space, ",", space, Number(f"y{k}", 0, scale))
  more = seq()
  for k in reversed(range(1, max_points)):
    more = optional(seq(space, ",", space, pair(k), more))
  if coordinates == "list":
    return seq("[", WS, pair(0), more, WS, "]")
  return seq('"', optional(alt("\\\\boxed{", "(")), space, pair(0), more, space,
             optional(alt("}", ")")), '"')


@functools.lru_cache(maxsize=None)  # one Grammar (and so one compiled DFA) per setting
def peria(max_images: int = 10, scale: int = 1000, max_points: int = 8,
          coordinates: str = "list", text_tools: tuple[str, ...] = ()) -> Grammar:
  """{"name": tool, "arguments": {"image_index": k, ARGUMENT: [x1, y1, ...]}} with the
  public tools' argument names: "bounding_box" (image_crop, bounding_box,
  image_highlight), "coordinates" (draw_line), "points" (draw_path), or "text": "...",
  "position" (image_label; the text has no '"'). Fields: tool, image_index, argument
  (the key written: the environment rejects one that is not the tool's, as the public
  server fails on an unexpected keyword), and x{k}, y{k} per point slot; a call's point
  count is the number of x fields present. `coordinates`: PERIA_COORDINATES.
  `text_tools`: host perception tools after the six (e.g. "text_ocr"). With them the
  argument is optional for every tool (the environment rejects an interaction tool
  without its own) and may also be a text one, "text_prompt" or "question" (the SAM 3 and
  GroundingDINO tools' public names) with a JSON string holding no '"' or backslash and a
  non-space byte: {"image_index": 0, "text_prompt": "chair"}; its bytes are the
  PERIA_TEXT field. A text tool takes `image_index` alone, with a "bounding_box", or
  with a text argument; which keys it accepts is its host tool's to say."""
  if coordinates not in PERIA_COORDINATES:
    raise ValueError(f"grammars.peria: coordinates must be one of {PERIA_COORDINATES}, got "
                     f"{coordinates!r}")
  value = seq(WS, ":", WS, _peria_points(max_points, scale, coordinates))
  continuations = {
      "text": seq(WS, ":", WS, '"', TextWithout(b'"'), '"', WS, ",", WS, '"position"', value),
      "text_prompt": seq(WS, ":", WS, '"', Text(PERIA_TEXT), '"')}
  continuations["question"] = continuations["text_prompt"]  # one shared text field
  keys = PERIA_ARGUMENTS if text_tools else PERIA_POINT_ARGUMENTS
  argument = Enum("argument", tuple(f'"{a}"'.encode() for a in keys),
                  tuple(continuations.get(a, value) for a in keys))
  index = _key("image_index", Number("image_index", 0, max_images - 1))
  arguments = (seq(index, optional(seq(WS, ",", WS, argument))) if text_tools
               else _comma(index, argument))
  name = seq('"', Enum("tool", tuple(t.encode() for t in PERIA_TOOLS + tuple(text_tools))),
             '"')
  root = seq(THINK, _call_or_answer("<action>", _json_call(name, arguments), "</action>"))
  return Grammar("peria", root, (b"</action>", b"</answer>"))


def thinker3d(num_latents: int = 12) -> Grammar:
  latent = seq("<|latent_start|>", Repeat(seq("<|latent_pad|>"), num_latents, num_latents),
               "<|latent_end|>")
  answer = Enum("kind", (b"<answer>",), (ANSWER_BODY,))
  return Grammar("thinker3d", seq(WS, latent, THINK, answer), (b"</answer>",))


GRAMMARS = {"think3d": think3d, "act3d": act3d, "peria": peria, "thinker3d": thinker3d}
