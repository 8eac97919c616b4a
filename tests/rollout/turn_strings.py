"""Random and adversarial turns for the grammars (valid samples, then mutations)."""

from __future__ import annotations

import random

import jax
import numpy as np

from jaxspatial.envs.act3d import PRIMITIVES
from jaxspatial.rollout import parse
from jaxspatial.rollout.grammars import PERIA_TOOLS

WORDS = ("the", "chair", "is", "left", "of", "table", "<", ">", "</", "think", "answer",
         "</thin", "</tool_cal", "{", "}", '"', "ä", "→", "1.5", "-", "\n", "<|im_end|>")
FRAGMENTS = ("</tool_call>", "</answer>", "</think>", "<think>", "<answer>", "<tool_call>",
             "<|im_end|>", "<action>", "</action>", '"', ",", ":", "{", "}", "[", "]", "-", ".",
             "0", "9", "007", "1.234", " ", "\n", "\t", "ego", "true", "turn_", "e")


def _ws(rng):
  return rng.choice(("", "", " ", "\n", " \n ", "\t", "\r\n"))


def _think(rng):
  return _ws(rng) + "<think>" + " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 6))
                                         ).replace("</think>", "") + "</think>" + _ws(rng)


def _number(rng, lo, hi, decimals, edge=0.15):
  if rng.random() < edge:  # out of range, too many decimals, leading zeros, signs
    return rng.choice((str(hi + 1), str(lo - 1), f"{hi}.5", f"{hi}.01", "00", "01", "-0",
                       "1.", ".5", "1.234", "+1", "1e2", str(hi), str(lo), f"{hi}.0"))
  value = rng.uniform(lo, hi)
  if decimals and rng.random() < 0.5:
    return f"{value:.{rng.randint(1, decimals)}f}"
  return str(int(value))


# Answer bodies: legal ones with '<' and odd spacing, blank ones, and tags (each tag of the
# grammars and Qwen special-token spellings) dropped into a legal one.
LEGAL_ANSWERS = ("A", "(B) sofa", "chair", "two < three", "C.", "x < 3", "a<b", "<3 m", "</",
                 "< |", "|>", "<thinking>", "<Answer>", "</answe", "<tool_call", "ä→",
                 " B ", "\x0bA\x0c", "\u00a0", "<<")
BLANK_ANSWERS = ("", " ", "\n\t ", "\r\n", "\x0b\x0c")
TAGS_IN_ANSWERS = ("<think>", "</think>", "<answer>", "<tool_call>", "</tool_call>",
                   "<action>", "</action>", "<|im_end|>", "<|im_start|>", "<|latent_pad|>",
                   "<|", "<|endoftext|>")
NOT_IN_ANSWERS = tuple(t.encode() for t in (
    "<think>", "</think>", "<answer>", "</answer>", "<tool_call>", "</tool_call>",
    "<action>", "</action>", "<|"))


def legal_answer(body: bytes) -> bool:
  """The answer rule from its definition: a byte other than ASCII whitespace
  (`bytes.strip`'s set), and no tag or special-token opening `<|`."""
  return bool(body.strip()) and not any(tag in body for tag in NOT_IN_ANSWERS)


def answer_body(rng) -> str:
  kind = rng.random()
  if kind < 0.8:
    return rng.choice(LEGAL_ANSWERS)
  if kind < 0.87:
    return rng.choice(BLANK_ANSWERS)
  legal = rng.choice(LEGAL_ANSWERS)
  i = rng.randint(0, len(legal))
  return legal[:i] + rng.choice(TAGS_IN_ANSWERS) + legal[i:]


def _answer(rng):
  return "<answer>" + answer_body(rng) + "</answer>"


def _call(name, arguments, rng, open_tag="<tool_call>", close_tag="</tool_call>"):
  s = _ws
  return (f'{open_tag}{s(rng)}{{{s(rng)}"name"{s(rng)}:{s(rng)}"{name}"{s(rng)},{s(rng)}'
          f'"arguments"{s(rng)}:{s(rng)}{{{s(rng)}{arguments}{s(rng)}}}{s(rng)}}}{s(rng)}'
          f'{close_tag}')


def act3d_turn(rng):
  if rng.random() < 0.25:
    return _think(rng) + _answer(rng)
  action = rng.choice(PRIMITIVES + ("stop", "Forward"))
  args = f'"action": "{action}"'
  if rng.random() < 0.6:
    args += f', "distance": {_number(rng, 0, 360, 2)}'
  return _think(rng) + _call("render_view_tool", args, rng)


def think3d_turn(rng):
  if rng.random() < 0.25:
    return _think(rng) + _answer(rng)
  args = (f'"rotation_reference_camera": {_number(rng, 1, 8, 0)}, '
          f'"azimuth_angle": {_number(rng, -180, 180, 2)}, '
          f'"elevation_angle": {_number(rng, -90, 90, 2)}, '
          f'"camera_view": {rng.choice(("true", "false", "True"))}')
  return _think(rng) + _call("pi3_tool", args, rng)


PERIA_KEYS = {"image_crop": "bounding_box", "image_label": "text", "draw_line": "coordinates",
              "draw_path": "points", "bounding_box": "bounding_box",
              "image_highlight": "bounding_box"}
PERIA_POINTS = {"image_label": 1, "draw_path": None}  # None: 2 to 8 (the default maximum)
LABELS = ("Tree", "a, b", "", " ", "ä→", "}", "x \\", 'say "hi"', "</think>", "line\nbreak")


def _peria_points(rng, tool, coordinates):
  count = PERIA_POINTS.get(tool, 2)
  if count is None or rng.random() < 0.1:
    count = rng.randint(1, 9)  # one past the grammar's 8 now and then
  values = [_number(rng, 0, 1000, 0, 0.05) for _ in range(2 * count)]
  if rng.random() < 0.05:
    values.pop()  # an odd number of coordinates
  if coordinates == "list":
    sep = lambda: _ws(rng) + "," + _ws(rng)
    return "[" + _ws(rng) + sep().join(values) + _ws(rng) + "]"
  space = lambda: rng.choice(("", "", "", " ", "  ", "\n" if rng.random() < 0.1 else ""))
  opener, closer = rng.choice((("\\\\boxed{", "}"), ("(", ")"), ("", ""), ("\\boxed{", "}"),
                               ("\\\\boxed{", ""), ("[", "]")))
  return f'"{opener}{space()}' + (space() + "," + space()).join(values) + f'{space()}{closer}"'


# Text arguments: legal ones (a non-space byte, no '"' or backslash; one past the device's
# 256 kept bytes), blank ones, and ones with a quote, a backslash or a closing tag.
TEXT_VALUES = ("chair", "red chair", "chair. table.", "ä→ x", " <3 ", "a,b}", "x" * 300) * 2 + (
    "", " ", "\t\n", 'say "hi"', "a\\b", "a\\\"b", "</action>", "<|im_end|>")
TEXT_KEYS = ("text_prompt", "question")


def peria_text_call(rng, tool, coordinates="list"):
  """A perception tool's arguments: image_index alone, with a box, or with a text
  argument (now and then the other text key, a point key or both)."""
  args = f'"image_index": {_number(rng, 0, 9, 0)}'
  kind = rng.random()
  if kind < 0.2:
    return args
  if kind < 0.4:
    key = rng.choice(("bounding_box",) * 4 + ("points", "text_prompt"))
    value = _peria_points(rng, "image_crop", coordinates)
    return args + f', "{key}"{_ws(rng)}:{_ws(rng)}{value}'
  value = f'"{rng.choice(TEXT_VALUES)}"' if rng.random() < 0.95 else "7"
  key = rng.choice(TEXT_KEYS + ("text",) * (rng.random() < 0.05))
  args += f', "{key}"{_ws(rng)}:{_ws(rng)}{value}'
  if rng.random() < 0.05:  # a box after the text: the grammar holds one argument
    args += ', "bounding_box": [1, 2, 3, 4]'
  return args


def peria_turn(rng, coordinates="list", text_tools=()):
  """The public tools' calls: "image_index", then the tool's own argument (now and then
  another tool's, which the grammar accepts and the environment rejects); `coordinates`
  "boxed": the public declarations' strings ("\\\\boxed{...}", "(x,y)"). `text_tools`:
  perception tools too (`peria_text_call`), and interaction tools now and then written
  with a text argument or none."""
  if rng.random() < 0.25:
    return _think(rng) + _answer(rng)
  if text_tools and rng.random() < 0.5:
    tool = rng.choice(text_tools)
    args = peria_text_call(rng, tool, coordinates)
    return _think(rng) + _call(tool, args, rng, "<action>", "</action>")
  if text_tools and rng.random() < 0.15:
    tool = rng.choice(PERIA_TOOLS)
    args = peria_text_call(rng, tool, coordinates)
    return _think(rng) + _call(tool, args, rng, "<action>", "</action>")
  tool = rng.choice(PERIA_TOOLS + ("image_zoom",) * (rng.random() < 0.03))
  key = PERIA_KEYS.get(tool, "bounding_box")
  if rng.random() < 0.1:
    key = rng.choice(tuple(PERIA_KEYS.values()) + ("bbox", "position"))
  value = _peria_points(rng, tool, coordinates)
  if key == "text":
    value = f'"{rng.choice(LABELS)}"{_ws(rng)},{_ws(rng)}"position"{_ws(rng)}:{_ws(rng)}{value}'
  args = f'"image_index": {_number(rng, 0, 9, 0)}, "{key}"{_ws(rng)}:{_ws(rng)}{value}'
  return _think(rng) + _call(tool, args, rng, "<action>", "</action>")


def thinker3d_turn(rng):
  pads = "<|latent_pad|>" * rng.choice((12, 12, 12, 11, 13))
  return _ws(rng) + "<|latent_start|>" + pads + "<|latent_end|>" + _think(rng) + _answer(rng)


VALID = {"act3d": act3d_turn, "think3d": think3d_turn, "peria": peria_turn,
         "thinker3d": thinker3d_turn}


def mutate(text: str, rng) -> str:
  kind = rng.randrange(6)
  i = rng.randint(0, len(text))
  if kind == 0 and text:
    return text[:i] + text[i + 1:]
  if kind == 1:
    return text[:i] + rng.choice(FRAGMENTS) + text[i:]
  if kind == 2 and text:
    j = rng.randint(0, len(text))
    return text[:min(i, j)]  + text[max(i, j):]
  if kind == 3:
    return text[:i]  # truncated
  if kind == 4:
    return text + rng.choice(FRAGMENTS) + rng.choice(WORDS)  # text after the close
  return "".join(rng.choice(FRAGMENTS + WORDS) for _ in range(rng.randint(1, 12)))


def turns(grammar: str, count: int, seed: int = 0) -> list[str]:
  rng = random.Random(seed)
  out = []
  for _ in range(count):
    text = VALID[grammar](rng)
    for _ in range(rng.choice((0, 0, 1, 1, 2, 3))):
      text = mutate(text, rng)
    out.append(text)
  return out


def corpus(seed: int = 0) -> list[str]:
  """Text to train the test tokenizer on: every grammar's turns."""
  return [t for g in VALID for t in turns(g, 300, seed)]


def parse_batch(automaton, ids_list):
  """The device parse of tokenised turns (padded into one batch), on the host."""
  length = max(len(i) for i in ids_list)
  tokens = np.zeros((len(ids_list), length), np.int32)
  for row, ids in enumerate(ids_list):
    tokens[row, :len(ids)] = ids
  counts = np.asarray([len(i) for i in ids_list], np.int32)

  @jax.jit
  def run(tokens, counts):
    def one(t, n):
      before, final = parse.walk_states(automaton, t, n)
      return parse.parse_turn(automaton, t, before, n, final)
    return jax.vmap(one)(tokens, counts)
  return jax.device_get(run(tokens, counts))
