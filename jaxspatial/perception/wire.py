"""The tool service's wire format: Python / numpy values as strict JSON, both ways.

An array is {"__ndarray__": {"dtype": "float32", "shape": [2, 3], "data": base64 of the
little-endian C-order bytes}} (dtypes: `DTYPES`); strings, numbers, booleans, null, lists
and objects are plain JSON (NaN and Infinity are refused: JSON has none). Decoding is
strict: a wrong dtype string, a shape that is not a list of at most `MAX_NDIM`
non-negative ints, claims more than `MAX_ELEMENTS` or does not match the data size, bad
base64, duplicate keys, non-JSON, nesting deeper than `MAX_DEPTH` or a body over the size
limit is a one-line `WireError` naming the tool, the argument and what was wrong. Bodies
are hostile input: every claim is checked before it is used, so parsing never crashes,
hangs or allocates more than the body's size.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import numpy as np

from jaxspatial import strict_json
from jaxspatial.errors import WireError

DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128")
MAX_BODY_BYTES = 64 << 20   # a 640 x 480 RGB image is 1.2 MB in base64
MAX_DEPTH = 32              # nested lists / objects in a body
MAX_NDIM = 32
# An element takes at least one byte (more in base64), so no body carries more; an empty
# array's other dimensions count too (its 0s as 1): a tool sizing a buffer by them must
# not be handed [0, 2**62].
MAX_ELEMENTS = MAX_BODY_BYTES
EXCERPT = 300               # characters of a response body quoted in an error
_ARRAY_KEY = "__ndarray__"


def _short(value, limit: int = 100) -> str:
  """repr of a claimed value, cut to one short line (a hostile shape can be 100 kB)."""
  text = repr(value)
  return text if len(text) <= limit else text[:limit - 3] + "..."


def _array_json(array: np.ndarray, where: str) -> dict:
  if array.dtype.name not in DTYPES:
    raise WireError(f"{where}: dtype {array.dtype} cannot be sent (supported: "
                    f"{', '.join(DTYPES)})")
  little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
  return {_ARRAY_KEY: {"dtype": array.dtype.name, "shape": list(array.shape),
                       "data": base64.b64encode(little.tobytes()).decode("ascii")}}


def encode_value(value: Any, where: str = "value", depth: int = 0) -> Any:
  """A Python / numpy value as wire JSON: arrays (numpy, jax, numpy scalars) tagged, the
  rest plain JSON."""
  if depth > MAX_DEPTH:
    raise WireError(f"{where}: nested deeper than {MAX_DEPTH}")
  if value is None or isinstance(value, (bool, str)):
    return value
  if isinstance(value, (int, float)) and not isinstance(value, np.generic):
    if isinstance(value, float) and not np.isfinite(value):
      raise WireError(f"{where}: {value} is not JSON (send it inside an array)")
    return value
  if isinstance(value, (np.ndarray, np.generic)) or hasattr(value, "__array__"):
    return _array_json(np.asarray(value), where)
  if isinstance(value, (list, tuple)):
    return [encode_value(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
  if isinstance(value, dict):
    out = {}
    for k, v in value.items():
      if not isinstance(k, str):
        raise WireError(f"{where}: keys must be strings, got {type(k).__name__} {k!r}")
      if k == _ARRAY_KEY:
        raise WireError(f"{where}: the key {_ARRAY_KEY!r} is the wire format's")
      out[k] = encode_value(v, f"{where}[{k!r}]", depth + 1)
    return out
  raise WireError(f"{where}: cannot send a {type(value).__name__}")


def _array_from_json(spec: Any, where: str) -> np.ndarray:
  if not isinstance(spec, dict) or set(spec) != {"dtype", "shape", "data"}:
    keys = sorted(spec) if isinstance(spec, dict) else type(spec).__name__
    raise WireError(f"{where}: an array needs exactly dtype, shape and data, got {keys}")
  dtype, shape, data = spec["dtype"], spec["shape"], spec["data"]
  if not isinstance(dtype, str) or dtype not in DTYPES:
    raise WireError(f"{where}: unknown dtype {dtype!r} (supported: {', '.join(DTYPES)})")
  if (not isinstance(shape, list) or len(shape) > MAX_NDIM
      or not all(type(d) is int and d >= 0 for d in shape)):  # bools are ints: refused
    raise WireError(f"{where}: shape must be a list of at most {MAX_NDIM} non-negative "
                    f"ints, got {_short(shape)}")
  if not isinstance(data, str):
    raise WireError(f"{where}: data must be a base64 string, got {type(data).__name__}")
  # Before numpy sees the shape: it refuses [0, 2**62, 2**62] with an error of its own.
  claimed = int(np.prod([max(d, 1) for d in shape], dtype=object))
  if claimed > MAX_ELEMENTS:
    count = claimed if claimed.bit_length() <= 64 else f"about 2**{claimed.bit_length() - 1}"
    raise WireError(f"{where}: shape {_short(shape)} of {dtype} is {count} elements"
                    f"{' (its 0s counted as 1)' if 0 in shape else ''}, over the "
                    f"{MAX_ELEMENTS} a body can carry")
  item = np.dtype(dtype).newbyteorder("<")
  size = item.itemsize * int(np.prod(shape, dtype=object))
  # Checked before decoding: a huge claimed shape never allocates.
  if len(data) != 4 * ((size + 2) // 3):
    raise WireError(f"{where}: shape {shape} of {dtype} is {size} bytes, but the data has "
                    f"{len(data)} base64 characters (~{len(data) * 3 // 4} bytes)")
  try:
    raw = base64.b64decode(data, validate=True)
  except (binascii.Error, ValueError) as error:
    raise WireError(f"{where}: data is not valid base64 ({error})") from None
  if len(raw) != size:
    raise WireError(f"{where}: shape {shape} of {dtype} is {size} bytes, data has "
                    f"{len(raw)}")
  return np.frombuffer(raw, item).reshape(shape).astype(np.dtype(dtype))  # native, writable


def decode_value(obj: Any, where: str = "value", depth: int = 0) -> Any:
  """Wire JSON back to Python: tagged arrays to numpy, the rest as parsed."""
  if depth > MAX_DEPTH:
    raise WireError(f"{where}: nested deeper than {MAX_DEPTH}")
  if isinstance(obj, list):
    return [decode_value(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(obj)]
  if isinstance(obj, dict):
    if _ARRAY_KEY in obj:
      if len(obj) != 1:
        raise WireError(f"{where}: an array object has only the key {_ARRAY_KEY!r}, got "
                        f"{sorted(obj)}")
      return _array_from_json(obj[_ARRAY_KEY], where)
    return {k: decode_value(v, f"{where}[{k!r}]", depth + 1) for k, v in obj.items()}
  return obj


def parse_json(body: bytes, where: str) -> Any:
  """Strict JSON: UTF-8, no NaN / Infinity, no duplicate keys, bounded size (nesting is
  bounded by json's recursion guard here and `MAX_DEPTH` when decoding values)."""
  if len(body) > MAX_BODY_BYTES:
    raise WireError(f"{where}: body of {len(body)} bytes is over the {MAX_BODY_BYTES} limit")
  try:
    return strict_json.loads_body(body)
  except ValueError as error:
    raise WireError(f"{where}: {error}") from None


def dumps(obj: Any) -> bytes:
  """Compact JSON bytes; NaN and Infinity refused (JSON has none)."""
  return json.dumps(obj, allow_nan=False, separators=(",", ":")).encode("utf-8")


def encode_request(args: tuple = (), kwargs: dict | None = None, tool: str = "?") -> bytes:
  where = f"tool {tool!r} request"
  return dumps({"args": encode_value(list(args), f"{where}: args"),
                 "kwargs": encode_value(dict(kwargs or {}), f"{where}: kwargs")})


def decode_request(body: bytes, tool: str = "?") -> tuple[list, dict]:
  """(args, kwargs) of a request body; a WireError naming the tool otherwise."""
  where = f"tool {tool!r} request"
  obj = parse_json(body, where)
  if not isinstance(obj, dict) or not set(obj) <= {"args", "kwargs"}:
    keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
    raise WireError(f"{where}: expected an object with 'args' and / or 'kwargs', got {keys}")
  args, kwargs = obj.get("args", []), obj.get("kwargs", {})
  if not isinstance(args, list) or not isinstance(kwargs, dict):
    raise WireError(f"{where}: 'args' must be a list and 'kwargs' an object")
  if any(not k.isidentifier() or k == _ARRAY_KEY for k in kwargs):
    raise WireError(f"{where}: argument names must be identifiers, got {sorted(kwargs)}")
  return (decode_value(args, f"{where}: args", 1), decode_value(kwargs, f"{where}: kwargs", 1))


def encode_result(result: Any, tool: str = "?") -> bytes:
  """A tool's return value (dict of arrays / strings, or a string) as a response body."""
  where = f"tool {tool!r} result"
  if isinstance(result, str):
    return dumps({"result": result})
  if not isinstance(result, dict):
    raise WireError(f"{where}: expected a dict of arrays or a str, got "
                    f"{type(result).__name__}")
  out = {}
  for k, v in result.items():
    if not isinstance(k, str):
      raise WireError(f"{where}: output names must be strings, got {k!r}")
    if isinstance(v, str):
      out[k] = v
    else:
      array = np.asarray(v)
      if array.dtype == object:
        raise WireError(f"{where}: output {k!r} is not an array (a {type(v).__name__})")
      out[k] = _array_json(array, f"{where}: output {k!r}")
  return dumps({"result": out})


def decode_result(body: bytes, tool: str = "?") -> Any:
  where = f"tool {tool!r} response"
  obj = parse_json(body, where)
  if not isinstance(obj, dict) or set(obj) != {"result"}:
    keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
    raise WireError(f"{where}: expected an object with only 'result', got {keys}")
  result = obj["result"]
  if isinstance(result, str):
    return result
  if not isinstance(result, dict):
    raise WireError(f"{where}: 'result' must be an object or a string, got "
                    f"{type(result).__name__}")
  out = {}
  for k, v in result.items():
    if isinstance(v, str):
      out[k] = v
    elif isinstance(v, dict) and _ARRAY_KEY in v and len(v) == 1:
      out[k] = _array_from_json(v[_ARRAY_KEY], f"{where}: output {k!r}")
    else:
      raise WireError(f"{where}: output {k!r} is neither an array nor a string")
  return out


def describe_inputs(args: tuple = (), kwargs: dict | None = None) -> str:
  """"image=uint8[480, 640, 3], box=list[4]": what an error says the call was given."""
  def one(v):
    if hasattr(v, "shape") and hasattr(v, "dtype"):  # numpy or jax: no copy to describe it
      return f"{np.dtype(v.dtype)}{list(v.shape)}"
    if isinstance(v, (list, tuple, dict, str)):
      return f"{type(v).__name__}[{len(v)}]"
    return type(v).__name__
  parts = [one(v) for v in args] + [f"{k}={one(v)}" for k, v in (kwargs or {}).items()]
  return ", ".join(parts) or "no inputs"


def excerpt(body: bytes | str, limit: int = EXCERPT) -> str:
  text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
  return repr(text[:limit]) + ("..." if len(text) > limit else "")

