"""Observation messages built on device: static text tokenised once on the host, numbers
formatted on device into single-byte tokens, and the image's vision tokens.

A template is a string with `{}` for each number (two decimals) or `{:d}` for an integer,
and `<|image_pad|>` where the image goes, e.g. the Act3D tool response. Static pieces are tokenised separately, so a message's token
ids are the same in training, in the compiled rollout and in the host reference (they may
differ from tokenising the whole string at once; byte-level BPEs such as Qwen2's split
digits anyway). Numbers are written with two decimals into a fixed-width slot; unused
slot positions are padding (attention mask 0), which M-RoPE positions skip.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np

from jaxspatial.rollout.automaton import token_bytes

Array = jax.Array
INTEGER_DIGITS = 4
SLOT_WIDTH = 1 + INTEGER_DIGITS + 3  # sign, integer digits, point, two decimals
IMAGE_PLACEHOLDER = "<|image_pad|>"
_NUMBER_FIELD = re.compile(r"\{(:d)?\}")


@dataclasses.dataclass(frozen=True)
class ObservationTemplate:
  """Token layout of one observation message (static)."""
  pieces: tuple[tuple[int, ...], ...]  # static token ids between the numbers
  byte_tokens: tuple[int, ...]          # [256] the single-byte token of every byte value
  pad_token: int
  integers: tuple[bool, ...] = ()       # per number: written as an integer (`{:d}`)

  def is_integer(self, k: int) -> bool:
    return bool(self.integers) and self.integers[k]

  @property
  def num_numbers(self) -> int:
    return len(self.pieces) - 1

  @property
  def length(self) -> int:
    return sum(len(p) for p in self.pieces) + self.num_numbers * SLOT_WIDTH


def compile_template(tokenizer, template: str, image_tokens: int,
                     pad_token: int | None = None) -> ObservationTemplate:
  """`image_tokens` vision tokens replace the image placeholder."""
  if template.count(IMAGE_PLACEHOLDER) > 1:
    raise ValueError("compile_template: at most one image per observation message")
  text = template.replace(IMAGE_PLACEHOLDER, IMAGE_PLACEHOLDER * image_tokens)
  parts = _NUMBER_FIELD.split(text)  # text, flag, text, flag, ..., text
  pieces = tuple(tuple(tokenizer.encode(p, add_special_tokens=False)) for p in parts[::2])
  integers = tuple(flag is not None for flag in parts[1::2])
  all_bytes, special = token_bytes(tokenizer)
  byte_tokens = [-1] * 256
  for i, data in enumerate(all_bytes):
    if len(data) == 1 and not special[i] and byte_tokens[data[0]] < 0:
      byte_tokens[data[0]] = i
  needed = b"-.0123456789"
  missing = [chr(b) for b in needed if byte_tokens[b] < 0]
  if missing:
    raise ValueError(f"compile_template: the tokenizer has no single-byte token for {missing}")
  if pad_token is None:
    pad_token = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  return ObservationTemplate(pieces, tuple(byte_tokens), int(pad_token), integers)


def format_number(template: ObservationTemplate, value: Array,
                  as_integer: bool = False) -> tuple[Array, Array]:
  """(ids [SLOT_WIDTH], mask) of `value` with two decimals, rounded half away from zero,
  '-' only when the rounded value is not zero; magnitudes clip at 9999.99. `as_integer`: the
  value rounded half away from zero to an integer, the point and decimals masked."""
  if as_integer:
    value = jnp.sign(value) * jnp.floor(jnp.abs(value) + 0.5)
  hundredths = jnp.minimum(jnp.floor(jnp.abs(value) * 100.0 + 0.5), 10 ** (INTEGER_DIGITS + 2) - 1
                           ).astype(jnp.int32)
  hundredths = jnp.where(jnp.isfinite(value), hundredths, 0)
  integer, fraction = hundredths // 100, hundredths % 100
  powers = 10 ** np.arange(INTEGER_DIGITS - 1, -1, -1)
  digits = (integer // powers) % 10  # most significant first
  significant = (integer >= powers) | (powers == 1)
  chars = jnp.concatenate([jnp.asarray([ord("-")]), ord("0") + digits, jnp.asarray([ord(".")]),
                           jnp.stack([ord("0") + fraction // 10, ord("0") + fraction % 10])])
  mask = jnp.concatenate([(hundredths > 0)[None] & (value < 0)[None], significant,
                          jnp.full(3, not as_integer)])
  table = jnp.asarray(template.byte_tokens, jnp.int32)
  return jnp.where(mask, table[chars], template.pad_token), mask


def observation_tokens(template: ObservationTemplate, numbers_K: Array) -> tuple[Array, Array]:
  """(ids [length], mask [length]) of one message."""
  if numbers_K.shape != (template.num_numbers,):
    raise ValueError(f"observation_tokens: expected {template.num_numbers} numbers, got shape "
                     f"{numbers_K.shape}")
  ids, masks = [], []
  for k, piece in enumerate(template.pieces):
    ids.append(jnp.asarray(piece, jnp.int32))
    masks.append(jnp.ones(len(piece), bool))
    if k < template.num_numbers:
      i, m = format_number(template, numbers_K[k], template.is_integer(k))
      ids.append(i)
      masks.append(m)
  return jnp.concatenate(ids), jnp.concatenate(masks)


def format_number_host(value: float, integer: bool = False) -> str:
  """The host twin of `format_number` (for references and viewers)."""
  value = float(np.float32(value))
  if not np.isfinite(value):
    return "0" if integer else "0.00"
  if integer:
    value = float(np.sign(value) * np.floor(abs(value) + 0.5))
  hundredths = min(int(np.floor(np.float32(abs(value)) * np.float32(100.0) + np.float32(0.5))),
                   10 ** (INTEGER_DIGITS + 2) - 1)
  sign = "-" if value < 0 and hundredths > 0 else ""
  if integer:
    return f"{sign}{hundredths // 100}"
  return f"{sign}{hundredths // 100}.{hundredths % 100:02d}"


def observation_tokens_host(template: ObservationTemplate, numbers) -> tuple[np.ndarray,
                                                                            np.ndarray]:
  """(ids, mask) of a message in the device layout, built on the host from the formatted
  string: each number right-aligned in its slot, the sign first, padding masked."""
  ids, mask = [], []
  for k, piece in enumerate(template.pieces):
    ids += list(piece)
    mask += [True] * len(piece)
    if k < template.num_numbers:
      text = format_number_host(numbers[k], template.is_integer(k))
      sign, body = ("-", text[1:]) if text.startswith("-") else ("", text)
      integer = body.split(".")[0]
      slot = [template.pad_token] * SLOT_WIDTH
      used = [False] * SLOT_WIDTH
      if sign:
        slot[0], used[0] = template.byte_tokens[ord("-")], True
      for j, ch in enumerate(body):
        at = 1 + INTEGER_DIGITS - len(integer) + j
        slot[at], used[at] = template.byte_tokens[ord(ch)], True
      ids += slot
      mask += used
  return np.asarray(ids, np.int32), np.asarray(mask, bool)
