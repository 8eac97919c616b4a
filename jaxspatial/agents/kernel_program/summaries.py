"""What a cell's run reports, kept short: captured output (head and tail), clipped text,
one-line summaries of the variables a cell changed, and a compact traceback."""

from __future__ import annotations

import io
import os
import traceback

ERROR_MAX_CHARS = 600
LARGE_BYTES = 500_000_000


class Capped(io.TextIOBase):
  """A text stream keeping the first and the last `cap / 2` bytes of what is written."""

  def __init__(self, cap: int):
    super().__init__()
    self._half = max(1, cap // 2)
    self._head = bytearray()
    self._tail = bytearray()
    self._dropped = 0

  def writable(self):
    return True

  @property
  def encoding(self):
    return "utf-8"

  def write(self, text):
    if not isinstance(text, str):
      raise TypeError(f"write() argument must be str, not {type(text).__name__}")
    data = str.encode(text, "utf-8", "replace")
    room = self._half - len(self._head)
    if room > 0:
      self._head += data[:room]
      data = data[room:]
    if data:
      self._tail += data
      if len(self._tail) > 2 * self._half:
        cut = len(self._tail) - self._half
        self._dropped += cut
        del self._tail[:cut]
    return len(text)

  def getvalue(self) -> str:
    tail = self._tail
    dropped = self._dropped
    if len(tail) > self._half:
      dropped += len(tail) - self._half
      tail = tail[len(tail) - self._half:]
    head = self._head.decode("utf-8", "replace")
    if not dropped:
      return head + tail.decode("utf-8", "replace")
    return (head + f"\n[... {dropped} bytes of output dropped ...]\n"
            + tail.decode("utf-8", "ignore"))


def clip(text: str, limit: int = ERROR_MAX_CHARS) -> str:
  if len(text) <= limit:
    return text
  half = (limit - 5) // 2
  return text[:half] + " ... " + text[len(text) - (limit - 5 - half):]


def short_repr(value, limit: int = 100) -> str:
  text = repr(value)
  if type(text) is not str:  # pylint: disable=unidiomatic-typecheck
    text = "<repr is not a str>"
  text = " ".join(text.split()) if limit <= 200 else text
  return clip(text, limit)


def size_key(value, np):
  kind = type(value)
  if kind in (list, dict, set, bytearray):
    return (kind, len(value))
  if kind is np.ndarray:
    return (kind, value.shape, value.dtype.str)
  return None


def summary(value, np) -> str:
  kind = type(value)
  name = kind.__name__
  if isinstance(value, np.ndarray):
    text = f"ndarray shape={value.shape} dtype={value.dtype}"
    if value.size <= 8:
      text += f" = {short_repr(value.tolist(), 80)}"
    elif value.size and value.dtype.kind in "biuf" and value.size <= 50_000_000:
      text += f" min={value.min():.4g} max={value.max():.4g}"
    if value.nbytes > LARGE_BYTES:
      text += f" [WARNING: {value.nbytes / 1e9:.2f} GB]"
    return text
  if kind in (int, float, bool, complex) or value is None:
    return f"{name} = {short_repr(value)}"
  if kind is str:
    return f"str len={len(value)} = {short_repr(value)}"
  if kind in (list, tuple, dict, set, frozenset):
    text = f"{name} len={len(value)} = {short_repr(value)}"
    items = value.values() if kind is dict else value
    total = 0
    for i, item in enumerate(items):
      if i >= 10_000:
        break
      if type(item) is np.ndarray:
        total += item.nbytes
    if total > LARGE_BYTES:
      text += f" [WARNING: arrays of {total / 1e9:.2f} GB]"
    return text
  if kind.__name__ == "module":
    return f"module {getattr(value, '__name__', '?')}"
  if callable(value) and hasattr(value, "__name__") and kind.__name__ in (
      "function", "builtin_function_or_method", "type"):
    return f"{name} {value.__name__}"
  return f"{name} = {short_repr(value)}"


def compact_error(error: BaseException, filename: str,
                   sources: dict) -> tuple[str, int | None]:
  """(a traceback of at most ERROR_MAX_CHARS: the cells' lines on the way (this cell's as
  "line N", an earlier cell's as "cell K, line N"), the exception; the line of this cell's
  statement that raised)."""
  try:
    entries = traceback.extract_tb(error.__traceback__)
  except Exception:  # pylint: disable=broad-except
    entries = []
  ours = [e for e in entries if e.filename == filename]
  line = ours[0].lineno if ours else None
  cells = [e for e in entries if e.filename in sources]
  parts = []
  for entry in cells[-4:]:
    lines = sources[entry.filename]
    source = lines[entry.lineno - 1].strip() if 0 < (entry.lineno or 0) <= len(lines) else ""
    where = "" if entry.filename == filename else f"cell {entry.filename[6:-1]}, "
    parts.append(f"{where}line {entry.lineno}: {source[:160]}")
  if entries and entries[-1].filename not in sources:
    parts.append(f"  in {os.path.basename(entries[-1].filename)}, {entries[-1].name}")
  try:
    message = str(error)
  except BaseException:  # pylint: disable=broad-except
    message = "<unprintable>"
  exc = clip(f"{type(error).__name__}: {message}" if message else type(error).__name__, 400)
  head = "\n".join(parts)
  room = ERROR_MAX_CHARS - len(exc) - 1
  if len(head) > room:
    head = head[len(head) - room:] if room > 0 else ""
  return (f"{head}\n{exc}" if head else exc), line
