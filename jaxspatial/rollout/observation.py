"""Observation messages built on device: static text tokenised once on the host, numbers
formatted on device into single-byte tokens, and the image's vision tokens.

A template is a string with `{}` for each number (two decimals) or `{:d}` for an integer,
and `<|image_pad|>` where the image goes, e.g. the Act3D tool response. Static pieces are tokenised separately, so a message's token
ids are the same in training, in the compiled rollout and in the host reference (they may
differ from tokenising the whole string at once; byte-level BPEs such as Qwen2's split
digits anyway). Numbers are written with two decimals into a fixed-width slot; unused
slot positions are padding (attention mask 0), which M-RoPE positions skip.

A template may have variants (a tuple of strings: e.g. a tool's result with its image,
an invalid call's error text, the final turn's "answer now"): all are padded to one
length with masked tokens, so every episode's message sits in the same slots whichever
variant it shows; a variant without the image carries the image group masked.

`{text}` marks a text slot (at most one per variant): `text_tokens` positions filled at
run time with a host tool's tokenised result (PERIA's perception tools), unused positions
masked.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np

from jaxspatial.rollout.token_table import single_byte_tokens, token_bytes

Array = jax.Array
INTEGER_DIGITS = 4
SLOT_WIDTH = 1 + INTEGER_DIGITS + 3  # sign, integer digits, point, two decimals
IMAGE_PLACEHOLDER = "<|image_pad|>"
_FIELD = re.compile(r"\{(:d|text)?\}")
TEXT_FIELD = "{text}"


@dataclasses.dataclass(frozen=True)
class MessageVariant:
  """One variant's layout: static token pieces between its numbers, and the masked tokens
  before them that pad it to the template's length (a variant without an image carries
  the image group masked there, so every message holds the same vision tokens)."""
  pieces: tuple[tuple[int, ...], ...]
  integers: tuple[bool, ...]
  has_image: bool = False
  padding: tuple[int, ...] = ()
  text_gap: int = -1        # the gap (between pieces) holding the text slot; -1: none
  text_tokens: int = 0      # the text slot's width

  @property
  def num_numbers(self) -> int:
    return len(self.pieces) - 1 - (self.text_gap >= 0)

  @property
  def text_length(self) -> int:
    return (sum(len(p) for p in self.pieces) + self.num_numbers * SLOT_WIDTH
            + (self.text_tokens if self.text_gap >= 0 else 0))


@dataclasses.dataclass(frozen=True)
class ObservationTemplate:
  """Token layout of an observation message (static): one variant or several (e.g. a tool's
  result with its image, an error text), all padded to one length; each episode's message
  picks one variant per turn. Variant k formats the first `num_numbers` of the numbers."""
  variants: tuple[MessageVariant, ...]
  byte_tokens: tuple[int, ...]          # [256] the single-byte token of every byte value
  pad_token: int
  text_tokens: int = 0                  # the width of a `{text}` slot (0: none)

  @property
  def pieces(self) -> tuple[tuple[int, ...], ...]:
    return self.variants[0].pieces

  @property
  def integers(self) -> tuple[bool, ...]:
    return self.variants[0].integers

  def is_integer(self, k: int, variant: int = 0) -> bool:
    return self.variants[variant].integers[k]

  @property
  def num_numbers(self) -> int:
    return max(v.num_numbers for v in self.variants)

  @property
  def num_variants(self) -> int:
    return len(self.variants)

  @property
  def length(self) -> int:
    return self.variants[0].text_length + len(self.variants[0].padding)


def _variant_pieces(tokenizer, template: str, image_tokens: int):
  if template.count(IMAGE_PLACEHOLDER) > 1:
    raise ValueError("compile_template: at most one image per observation message, got "
                     f"{template.count(IMAGE_PLACEHOLDER)} in {template!r}")
  if template.count(TEXT_FIELD) > 1:
    raise ValueError(f"compile_template: at most one {TEXT_FIELD} slot per message, got "
                     f"{template.count(TEXT_FIELD)} in {template!r}")
  text = template.replace(IMAGE_PLACEHOLDER, IMAGE_PLACEHOLDER * image_tokens)
  parts = _FIELD.split(text)  # text, flag, text, flag, ..., text
  pieces = tuple(tuple(tokenizer.encode(p, add_special_tokens=False)) for p in parts[::2])
  flags = parts[1::2]
  integers = tuple(flag == ":d" for flag in flags if flag != "text")
  text_gap = flags.index("text") if "text" in flags else -1
  return pieces, integers, IMAGE_PLACEHOLDER in template, text_gap


def compile_template(tokenizer, template: str | tuple[str, ...], image_tokens: int,
                     pad_token: int | None = None, text_tokens: int = 0
                     ) -> ObservationTemplate:
  """`image_tokens` vision tokens replace the image placeholder. A tuple of strings gives
  a template with variants (variant 0 first); a variant without the placeholder gets the
  image group masked, since every message must hold one image's vision tokens when any
  does. A `{text}` slot takes `text_tokens` positions."""
  texts = (template,) if isinstance(template, str) else tuple(template)
  if not texts:
    raise ValueError("compile_template: no template text")
  compiled = [_variant_pieces(tokenizer, t, image_tokens) for t in texts]
  has_text = any(gap >= 0 for *_, gap in compiled)
  if has_text and text_tokens < 1:
    raise ValueError(f"compile_template: a variant has a {TEXT_FIELD} slot: text_tokens must "
                     f"be >= 1, got {text_tokens}")
  text_tokens = int(text_tokens) if has_text else 0
  any_image = any(has_image for _, _, has_image, _ in compiled)
  if pad_token is None:
    pad_token = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  image_group = tuple(tokenizer.encode(IMAGE_PLACEHOLDER * image_tokens,
                                       add_special_tokens=False)) if image_tokens else ()
  variants = []
  for pieces, integers, has_image, text_gap in compiled:
    lacking = image_group if any_image and not has_image else ()
    variants.append((MessageVariant(pieces, integers, has_image, text_gap=text_gap,
                                    text_tokens=text_tokens if text_gap >= 0 else 0),
                     lacking))
  length = max(v.text_length + len(lacking) for v, lacking in variants)
  variants = tuple(dataclasses.replace(v, padding=lacking + (int(pad_token),) * (
      length - v.text_length - len(lacking))) for v, lacking in variants)
  byte_tokens = single_byte_tokens(*token_bytes(tokenizer))
  needed = b"-.0123456789"
  missing = [chr(b) for b in needed if byte_tokens[b] < 0]
  if missing:
    raise ValueError(f"compile_template: the tokenizer has no single-byte token for {missing}")
  return ObservationTemplate(variants, tuple(byte_tokens), int(pad_token), text_tokens)


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


def _variant_tokens(template: ObservationTemplate, variant: MessageVariant,
                   numbers_K: Array, text) -> tuple[Array, Array]:
  # The padding goes first: the message's last slot must be a real token, since the next
  # turn's first token is sampled from the logits there.
  ids = [jnp.asarray(variant.padding, jnp.int32)]
  masks = [jnp.zeros(len(variant.padding), bool)]
  number = 0
  for k, piece in enumerate(variant.pieces):
    ids.append(jnp.asarray(piece, jnp.int32))
    masks.append(jnp.ones(len(piece), bool))
    if k == len(variant.pieces) - 1:
      break
    if k == variant.text_gap:
      text_ids, text_mask = text
      ids.append(jnp.where(text_mask, text_ids, template.pad_token).astype(jnp.int32))
      masks.append(text_mask.astype(bool))
    else:
      i, m = format_number(template, numbers_K[number], variant.integers[number])
      ids.append(i)
      masks.append(m)
      number += 1
  return jnp.concatenate(ids), jnp.concatenate(masks)


def observation_tokens(template: ObservationTemplate, numbers_K: Array,
                       variant: Array | int = 0, text=None) -> tuple[Array, Array]:
  """(ids [length], mask [length]) of one message, in variant `variant` (an int array under
  jit: every variant is laid out, the chosen one selected). `text`: (ids, mask)
  [text_tokens] for the `{text}` slot (None: an empty slot)."""
  if numbers_K.shape != (template.num_numbers,):
    raise ValueError(f"observation_tokens: expected {template.num_numbers} numbers, got shape "
                     f"{numbers_K.shape}")
  width = template.text_tokens
  if text is None:
    text = (jnp.zeros(width, jnp.int32), jnp.zeros(width, bool))
  elif tuple(jnp.shape(text[0])) != (width,) or tuple(jnp.shape(text[1])) != (width,):
    raise ValueError(f"observation_tokens: expected text ids and mask of shape ({width},), "
                     f"got {jnp.shape(text[0])} and {jnp.shape(text[1])}")
  if template.num_variants == 1:
    return _variant_tokens(template, template.variants[0], numbers_K, text)
  laid_out = [_variant_tokens(template, v, numbers_K, text) for v in template.variants]
  ids = jnp.stack([i for i, _ in laid_out])
  masks = jnp.stack([m for _, m in laid_out])
  chosen = jnp.clip(jnp.asarray(variant, jnp.int32), 0, template.num_variants - 1)
  return ids[chosen], masks[chosen]


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


def observation_tokens_host(template: ObservationTemplate, numbers,
                            variant: int = 0, text_ids=()) -> tuple[np.ndarray, np.ndarray]:
  """(ids, mask) of a message in the device layout, built on the host from the formatted
  string: each number right-aligned in its slot, the sign first, padding masked; the text
  slot holds `text_ids` first, then masked padding."""
  layout = template.variants[variant]
  ids, mask = list(layout.padding), [False] * len(layout.padding)
  number = 0
  for k, piece in enumerate(layout.pieces):
    ids += list(piece)
    mask += [True] * len(piece)
    if k == len(layout.pieces) - 1:
      break
    if k == layout.text_gap:
      given = list(text_ids)[:layout.text_tokens]
      ids += given + [template.pad_token] * (layout.text_tokens - len(given))
      mask += [True] * len(given) + [False] * (layout.text_tokens - len(given))
      continue
    text = format_number_host(numbers[number], layout.integers[number])
    number += 1
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
