"""Random and adversarial turns for the grammars (valid samples, then mutations)."""

from __future__ import annotations

import random

from jaxspatial.envs.act3d import PRIMITIVES
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


def _answer(rng):
  return "<answer>" + rng.choice(("A", "(B) sofa", "chair", "", "two < three", "C.")) + "</answer>"


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


def peria_turn(rng):
  if rng.random() < 0.25:
    return _think(rng) + _answer(rng)
  box = ", ".join(_number(rng, 0, 1000, 0, 0.05) for _ in range(4))
  args = f'"image": {_number(rng, 0, 7, 0)}, "bbox": [{box}]'
  return _think(rng) + _call(rng.choice(PERIA_TOOLS), args, rng, "<action>", "</action>")


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
