"""The wire format between the kernel and its controller, both directions, over two pipes
(never pickle):
    header  struct "<4sII": b"JSK1", JSON length, number of arrays
    JSON    UTF-8 object {"msg": {...}, "arrays": [[dtype, shape], ...]}
    arrays  each array's bytes in C order, in the order of "arrays"
Inside "msg" an array is {"\\x00array": index}, a non-finite float {"\\x00float": "nan"};
user dictionaries may not have keys starting with "\\x00". Dtypes: bool and numeric
(ALLOWED_DTYPES). numpy is imported where an array is made, never at module level.
"""

from __future__ import annotations

import json
import math
import os
import struct

MAGIC = b"JSK1"
HEADER = struct.Struct("<4sII")
ARRAY_KEY = "\x00array"
FLOAT_KEY = "\x00float"
ALLOWED_DTYPES = frozenset({"|b1", "|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8",
                            "<f2", "<f4", "<f8", "<c8", "<c16"})
MAX_DEPTH = 64
MAX_NDIM = 8


def encode_value(value, arrays: list, depth: int = 0):
  """`value` as JSON-able data; numpy arrays appended to `arrays`. A TypeError / ValueError
  names what cannot be sent (anything but None, bool, int, float, str, lists, tuples,
  str-keyed dicts, numpy scalars and bool / numeric arrays)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  if depth > MAX_DEPTH:
    raise ValueError(f"nesting deeper than {MAX_DEPTH} levels")
  kind = type(value)
  if value is None or kind in (bool, str, int):
    return value
  if kind is float:
    return value if math.isfinite(value) else {FLOAT_KEY: repr(value)}
  if isinstance(value, np.ndarray):
    array = np.ascontiguousarray(value)
    if array.dtype.str not in ALLOWED_DTYPES:
      raise TypeError(f"arrays of dtype {array.dtype} cannot be sent (bool and numeric "
                      "dtypes only)")
    if array.ndim > MAX_NDIM:
      raise ValueError(f"arrays of more than {MAX_NDIM} dimensions cannot be sent")
    arrays.append(array)
    return {ARRAY_KEY: len(arrays) - 1}
  if isinstance(value, np.generic):
    if value.dtype.str not in ALLOWED_DTYPES:
      raise TypeError(f"numpy scalars of dtype {value.dtype} cannot be sent")
    return encode_value(value.item(), arrays, depth + 1)
  if kind in (list, tuple):
    return [encode_value(item, arrays, depth + 1) for item in value]
  if kind is dict:
    out = {}
    for key, item in value.items():
      if type(key) is not str:  # pylint: disable=unidiomatic-typecheck
        raise TypeError(f"dictionary keys must be str, not {type(key).__name__}")
      if key.startswith("\x00"):
        raise ValueError("dictionary keys may not start with NUL")
      out[key] = encode_value(item, arrays, depth + 1)
    return out
  raise TypeError(f"a {kind.__name__} cannot be sent: JSON values and bool / numeric numpy "
                  "arrays only")


def decode_value(data, arrays: list, depth: int = 0):
  """The inverse of `encode_value` (arrays by index into `arrays`); ValueError on anything
  malformed."""
  if depth > MAX_DEPTH + 1:
    raise ValueError("nesting too deep")
  kind = type(data)
  if data is None or kind in (bool, str, int, float):
    return data
  if kind is list:
    return [decode_value(item, arrays, depth + 1) for item in data]
  if kind is dict:
    if ARRAY_KEY in data:
      index = data[ARRAY_KEY]
      if len(data) != 1 or type(index) is not int or not 0 <= index < len(arrays):  # pylint: disable=unidiomatic-typecheck
        raise ValueError("bad array reference")
      return arrays[index]
    if FLOAT_KEY in data:
      if len(data) != 1 or data[FLOAT_KEY] not in ("nan", "inf", "-inf"):
        raise ValueError("bad float")
      return float(data[FLOAT_KEY])
    if any(key.startswith("\x00") for key in data):
      raise ValueError("reserved key")
    return {key: decode_value(item, arrays, depth + 1) for key, item in data.items()}
  raise ValueError(f"unexpected {kind.__name__}")


def frame_message(msg: dict, arrays=()) -> list:
  """The buffers of one message (header, JSON, each array's bytes)."""
  specs = [[array.dtype.str, list(array.shape)] for array in arrays]
  body = json.dumps({"msg": msg, "arrays": specs}, allow_nan=False,
                    separators=(",", ":")).encode("utf-8")
  return [HEADER.pack(MAGIC, len(body), len(specs)), body] + [
      memoryview(array).cast("B") if array.nbytes else b"" for array in arrays]


def check_array_specs(specs, count: int, max_bytes: int) -> list[tuple[str, tuple, int]]:
  """(dtype, shape, nbytes) of each declared array; ValueError for a dtype outside
  ALLOWED_DTYPES, a malformed shape, a count that differs from the header or more than
  `max_bytes` in all."""
  if type(specs) is not list or len(specs) != count:  # pylint: disable=unidiomatic-typecheck
    raise ValueError("array list does not match the header")
  out, total = [], 0
  for spec in specs:
    if type(spec) is not list or len(spec) != 2:  # pylint: disable=unidiomatic-typecheck
      raise ValueError("malformed array spec")
    dtype, shape = spec
    if dtype not in ALLOWED_DTYPES:
      raise ValueError(f"dtype {str(dtype)[:20]!r} is not allowed")
    if (type(shape) is not list or len(shape) > MAX_NDIM  # pylint: disable=unidiomatic-typecheck
        or any(type(d) is not int or not 0 <= d <= 1 << 40 for d in shape)):  # pylint: disable=unidiomatic-typecheck
      raise ValueError("malformed array shape")
    nbytes = int(dtype[2:]) if dtype[1] != "b" else 1
    for d in shape:
      nbytes *= d
    total += nbytes
    if total > max_bytes:
      raise ValueError(f"arrays larger than {max_bytes} bytes")
    out.append((dtype, tuple(shape), nbytes))
  return out


def _read_exact(fd: int, n: int) -> bytearray:
  buf = bytearray(n)
  view = memoryview(buf)
  got = 0
  while got < n:
    k = os.readv(fd, [view[got:]])
    if k == 0:
      raise EOFError("the controller closed the channel")
    got += k
  return buf


def read_message(fd: int):
  """One message from the (trusted) controller: (msg, arrays)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  magic, size, count = HEADER.unpack(_read_exact(fd, HEADER.size))
  if magic != MAGIC:
    raise ValueError("bad magic")
  envelope = json.loads(_read_exact(fd, size).decode("utf-8"))
  arrays = []
  for dtype, shape, nbytes in check_array_specs(envelope["arrays"], count, 1 << 40):
    arrays.append(np.frombuffer(_read_exact(fd, nbytes), dtype=dtype).reshape(shape))
  return envelope["msg"], arrays


def write_buffers(fd: int, buffers) -> None:
  for buf in buffers:
    view = memoryview(buf).cast("B")
    while len(view):
      view = view[os.write(fd, view):]
