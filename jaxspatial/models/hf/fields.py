"""Typed reads of a Hugging Face JSON file (config.json, preprocessor_config.json): every
refusal is a ModelFolderError naming the file, the field, the expected and the found value,
so a bad folder fails before anything is traced."""

from __future__ import annotations

import json
import math
import numbers
import pathlib

from jaxspatial.errors import ModelFolderError

MAX_DIM = 2 ** 31 - 1     # a tensor dimension (int32 indexing)
MAX_LAYERS = 10_000       # decoder layers / vision blocks (Qwen2.5-VL-72B has 80)
MISSING = object()        # a field that is absent (None is JSON's null)


def is_number(value) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def show(value) -> str:
  """A found value for a message: its repr (cut at 80 characters) and its type."""
  if value is MISSING:
    return "nothing (the field is missing)"
  text = repr(value)
  text = text if len(text) <= 80 else text[:77] + "..."
  return f"{text} ({type(value).__name__})"


def read_json(path: pathlib.Path):
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
    raise ModelFolderError(f"{path}: not valid JSON ({type(error).__name__}: "
                           f"{str(error)[:200]})") from None


class Fields:
  """Typed reads of one JSON object; errors name file, field, expected, got."""

  def __init__(self, source: str, values: dict, prefix: str = ""):
    self.source, self.values, self.prefix = source, values, prefix

  def fail(self, name: str, expected: str, got) -> ModelFolderError:
    return ModelFolderError(f"{self.source}: {self.prefix}{name}: expected {expected}, got "
                            f"{show(got)}")

  def get(self, name: str, default=MISSING):
    return self.values.get(name, default)

  def nested(self, name: str) -> "Fields | None":
    """The object `name` as Fields (prefix `name.`), or None where it is missing or null."""
    values = self.object(name)
    return None if values is None else Fields(self.source, values, f"{self.prefix}{name}.")

  def integer(self, name: str, low: int, high: int, default=MISSING, value=MISSING) -> int:
    value = self.get(name, default) if value is MISSING else value
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
      raise self.fail(name, f"an integer in [{low}, {high}]", value)
    return value

  def number(self, name: str, default=MISSING, value=MISSING) -> float:
    value = self.get(name, default) if value is MISSING else value
    if not is_number(value) or not math.isfinite(value) or value <= 0:
      raise self.fail(name, "a finite number > 0", value)
    return float(value)

  def boolean(self, name: str, default=MISSING) -> bool:
    value = self.get(name, default)
    if not isinstance(value, bool):
      raise self.fail(name, "true or false", value)
    return value

  def choice(self, name: str, allowed: tuple, why: str, default=MISSING):
    value = self.get(name, default)
    if value not in allowed or isinstance(value, bool):
      listed = " or ".join(repr(a) for a in allowed)
      raise self.fail(name, f"{listed} ({why})", value)
    return value

  def object(self, name: str):
    """A nested object, or None where the field is missing or null."""
    value = self.get(name, None)
    if value is not None and not isinstance(value, dict):
      raise self.fail(name, "an object", value)
    return value


def rope_theta(rope: Fields | None, section: Fields, default: float) -> float:
  """The rope's theta: from the rope block where it has one, else from the section."""
  if rope is not None and "rope_theta" in rope.values:
    return rope.number("rope_theta")
  return section.number("rope_theta", default)
