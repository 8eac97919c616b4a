"""Perception tools as an HTTP service: a tool runs in one process, rollouts call it remotely.

A host tool is a plain callable, numpy in and numpy out: `fn(*args, **arrays_and_args) ->
dict[str, np.ndarray]`, or `-> str` for a text tool (PERIA's OCR returns JSON text).
`ToolServer(tools)` serves a dict of them; `RemoteTool(url, name)` is callable like the
local tool, so `HostTool` / `TextTool` take either.

    POST /tools/{name}   body {"args": [...], "kwargs": {...}} -> 200 {"result": ...}
    GET  /health         -> {"status": "ok", "tools": [...]}
    GET  /stats          -> the server's per-tool counts and latency

Wire format (JSON): an array is {"__ndarray__": {"dtype": "float32", "shape": [2, 3],
"data": base64 of the little-endian C-order bytes}} (dtypes: `DTYPES`); strings, numbers,
booleans, null, lists and objects are plain JSON (NaN and Infinity are refused: JSON has
none). Decoding is strict: a wrong dtype string, a shape that is not a list of
non-negative ints or does not match the data size, bad base64, duplicate keys, non-JSON,
nesting deeper than `MAX_DEPTH` or a body over the size limit is a `WireError` naming the
tool and what was wrong. Errors come back as {"error": text}, never a traceback: 400 (a
malformed request, arguments the tool does not take, inputs it refuses: it raised
ValueError or TypeError), 404 (unknown tool), 411 / 413 (no or too large a body), 500 (the
tool failed otherwise: its exception's type and message). The server is a Starlette app on
uvicorn (`jaxspatial.web`): an error never drops the connection.

`RemoteTool` gives each request `timeout_s` (a watchdog closes the socket at the deadline,
so a server that trickles bytes cannot hold a call), retries connection errors, timeouts
and 5xx with exponential backoff (never 4xx, which are deterministic, or a malformed 200), and stops at a total
deadline; every failure is one `ToolError` naming the tool, the URL, the input shapes and
the cause. Server responses are hostile input: parsing never crashes or hangs.

`TOOL_FACTORIES` (family name -> `factory(folder=None, names=None)` returning {tool name:
callable} for `names`, default all the family's) is
what `launch/perception_server.py` serves from: "echo" and "empty" (diagnostics, no model)
and PERIA's perception families "ocr", "sam3", "grounding_dino" from the registry
(`jaxspatial.perception.tools`; a family's model folder goes to its factory). `build_tools`
takes families and public tool names alike.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import http.client
import inspect
import json
import logging
import re
import socket
import threading
import time
import urllib.parse
from typing import Any, Callable

import numpy as np

from jaxspatial.perception import tools as perception_tools
from jaxspatial import strict_json
from jaxspatial.errors import ToolError, TransportError, WireError  # one ToolError, local or remote

DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128")
MAX_BODY_BYTES = 64 << 20   # a 640 x 480 RGB image is 1.2 MB in base64
MAX_DEPTH = 32              # nested lists / objects in a body
MAX_NDIM = 32
MAX_ARRAY_BYTES = 1 << 62   # numpy's index range, whatever the body limit
EXCERPT = 300               # characters of a response body quoted in an error
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_ARRAY_KEY = "__ndarray__"
LOG = logging.getLogger("jaxspatial.perception.server")


RETRYABLE = ("timeout", "refused", "disconnected", "connection")


# --- wire format ---------------------------------------------------------------------------

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
                    f"ints, got {shape!r:.100}")
  if not isinstance(data, str):
    raise WireError(f"{where}: data must be a base64 string, got {type(data).__name__}")
  item = np.dtype(dtype).newbyteorder("<")
  # numpy refuses a shape whose dimensions multiply past its index range even when one
  # of them is 0 (an empty array): that is the sender's mistake, not a crash here.
  if item.itemsize * int(np.prod([max(d, 1) for d in shape], dtype=object)) > MAX_ARRAY_BYTES:
    raise WireError(f"{where}: shape {shape} of {dtype} is past what an array can hold")
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


def _dumps(obj: Any) -> bytes:
  return json.dumps(obj, allow_nan=False, separators=(",", ":")).encode("utf-8")


def encode_request(args: tuple = (), kwargs: dict | None = None, tool: str = "?") -> bytes:
  where = f"tool {tool!r} request"
  return _dumps({"args": encode_value(list(args), f"{where}: args"),
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
    return _dumps({"result": result})
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
  return _dumps({"result": out})


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


# --- HTTP client ---------------------------------------------------------------------------

def http_request(url: str, method: str = "GET", body: bytes | None = None,
                 headers: dict | None = None, timeout_s: float = 30.0,
                 max_response_bytes: int = MAX_BODY_BYTES) -> tuple[int, dict, bytes]:
  """(status, headers with lower-case names, body) of one request, all within `timeout_s`:
  a watchdog shuts the socket at the deadline (a socket timeout alone bounds each read,
  not the response). Raises TransportError when no complete response arrives."""
  parts = urllib.parse.urlsplit(url)
  if parts.scheme not in ("http", "https") or not parts.hostname:
    raise ValueError(f"expected an http(s) URL, got {url!r}")
  path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
  connection_class = (http.client.HTTPSConnection if parts.scheme == "https"
                      else http.client.HTTPConnection)
  try:
    conn = connection_class(parts.hostname, parts.port, timeout=timeout_s)
  except ValueError as error:  # a malformed port
    raise ValueError(f"expected an http(s) URL, got {url!r}: {error}") from None
  expired = threading.Event()
  sockets = []  # the connection hands its socket to an HTTP/1.0 response: keep our own

  def expire():
    expired.set()
    for sock in list(sockets):
      try:
        sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked recv / send
      except OSError:
        pass

  watchdog = threading.Timer(timeout_s, expire)
  watchdog.daemon = True
  watchdog.start()
  response = None
  try:
    conn.connect()
    sockets.append(conn.sock)
    if expired.is_set():
      raise TimeoutError
    conn.request(method, path, body=body, headers=dict(headers or {}))
    response = conn.getresponse()
    chunks, size = [], 0
    while True:
      chunk = response.read(1 << 16)
      if not chunk:
        break
      size += len(chunk)
      if size > max_response_bytes:
        raise TransportError("oversize", f"response over {max_response_bytes} bytes")
      chunks.append(chunk)
    if expired.is_set():  # the watchdog's shutdown reads as a clean end of stream
      raise TimeoutError
    return response.status, {k.lower(): v for k, v in response.getheaders()}, b"".join(chunks)
  except TransportError:
    raise
  except (OSError, http.client.HTTPException) as error:
    if expired.is_set() or isinstance(error, TimeoutError):
      raise TransportError("timeout", f"no complete response within {timeout_s:.3g} s") from None
    if isinstance(error, ConnectionRefusedError):
      raise TransportError("refused", f"connection refused ({error})") from None
    if isinstance(error, (http.client.RemoteDisconnected, http.client.IncompleteRead,
                          ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
      raise TransportError("disconnected", "the server closed the connection mid-request "
                           f"({type(error).__name__}: {str(error)[:200]})") from None
    if isinstance(error, http.client.HTTPException):
      raise TransportError("protocol", f"malformed HTTP response ({type(error).__name__}: "
                           f"{str(error)[:200]})") from None
    raise TransportError("connection", f"{type(error).__name__}: {str(error)[:200]}") from None
  finally:
    watchdog.cancel()
    if response is not None:
      response.close()  # an HTTP/1.0 response owns the socket once the connection closes
    conn.close()


class CallStats:
  """Thread-safe per-name counters: calls, failures, attempts, and the latency of the calls
  that succeeded (count, total seconds, max)."""

  def __init__(self):
    self._lock = threading.Lock()
    self._rows: dict[str, dict] = {}

  def record(self, name: str, seconds: float, ok: bool, attempts: int = 1) -> None:
    with self._lock:
      row = self._rows.setdefault(name, {"calls": 0, "failures": 0, "attempts": 0,
                                         "latency": {"count": 0, "total_s": 0.0, "max_s": 0.0}})
      row["calls"] += 1
      row["failures"] += not ok
      row["attempts"] += attempts
      if ok:
        latency = row["latency"]
        latency["count"] += 1
        latency["total_s"] += seconds
        latency["max_s"] = max(latency["max_s"], seconds)

  def snapshot(self) -> dict[str, dict]:
    with self._lock:
      return json.loads(json.dumps(self._rows))  # a deep copy


# --- server --------------------------------------------------------------------------------

def _reply(status: int, payload: dict | bytes):
  from starlette.responses import Response  # pylint: disable=import-outside-toplevel
  body = payload if isinstance(payload, bytes) else _dumps(payload)
  return Response(body, status, media_type="application/json")


def _check_arguments(tool: Callable, name: str, args: list, kwargs: dict) -> None:
  """Arguments the tool does not take are the caller's mistake (400, not retried)."""
  try:
    signature = inspect.signature(tool)
  except (TypeError, ValueError):
    return  # a builtin without a signature: the call itself will say
  try:
    signature.bind(*args, **kwargs)
  except TypeError as error:
    raise WireError(f"tool {name!r} request: {error} (the tool's signature is "
                    f"{name}{signature}; given {describe_inputs(args, kwargs)})") from None


class ToolServer:
  """Serves `tools` (name -> callable) over HTTP (a Starlette app on uvicorn: `jaxspatial.web`;
  each call on a worker thread): `start()` / `stop()` or a `with` block; `url` once started
  (port 0 picks a free port). `max_concurrent` bounds the tool calls running at once (None:
  one per request; 1 for a backend that is not thread-safe); the others wait their turn.
  `max_connections`: open connections at most (more get 503).

  Status codes: 400 for the caller's mistakes (a malformed body, arguments the tool does
  not take, inputs the tool refuses: it raised ValueError or TypeError), 404, 405, 411,
  413, 500 when the tool fails otherwise or its result cannot be sent; an error body is
  {"error": text} with the exception's type and message (its traceback goes to the
  `jaxspatial.perception.server` log, never to the caller), and the connection stays
  usable."""

  def __init__(self, tools: dict[str, Callable], host: str = "127.0.0.1", port: int = 0,
               max_body_bytes: int = MAX_BODY_BYTES, max_concurrent: int | None = None,
               max_connections: int = 1024):
    for name, tool in tools.items():
      if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"ToolServer: tool names must match {_NAME.pattern}, got {name!r}")
      if not callable(tool):
        raise TypeError(f"ToolServer: tool {name!r} is a {type(tool).__name__}, not callable")
    if max_concurrent is not None and max_concurrent < 1:
      raise ValueError(f"ToolServer: max_concurrent must be >= 1 or None, got {max_concurrent}")
    # pylint: disable=import-outside-toplevel
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route
    from jaxspatial import web
    self.tools = dict(tools)
    self.host, self.port, self.max_body_bytes = host, int(port), int(max_body_bytes)
    self.slots = (threading.BoundedSemaphore(max_concurrent) if max_concurrent
                  else contextlib.nullcontext())
    self._stats = CallStats()
    self.app = Starlette(routes=[
        Route("/health", self._health, methods=["GET"]),
        Route("/stats", self._stats_route, methods=["GET"]),
        Route("/tools/{name:path}", self._call, methods=["POST"]),
    ], exception_handlers={HTTPException: self._http_error, Exception: self._crash})
    self._web = web.BackgroundServer(self.app, host, port, max_connections, name="tool-server")

  @property
  def url(self) -> str:
    if not self._web.running:
      raise RuntimeError("ToolServer.url: the server is not started")
    return f"http://{self._web.address}"

  def record(self, name: str, seconds: float, ok: bool) -> None:
    self._stats.record(name, seconds, ok)

  def stats(self) -> dict[str, dict]:
    """Per tool: calls, failures, attempts, latency of the successful calls."""
    return self._stats.snapshot()

  # --- handlers --------------------------------------------------------------------------

  async def _health(self, request):
    del request
    return _reply(200, {"status": "ok", "tools": sorted(self.tools)})

  async def _stats_route(self, request):
    del request
    return _reply(200, self.stats())

  async def _http_error(self, request, error):
    if error.status_code == 404:
      return _reply(404, {"error": f"no such path {request.url.path!r}: GET /health, GET "
                                   "/stats, POST /tools/{name}"})
    return _reply(error.status_code, {"error": f"{request.method} {request.url.path}: "
                                               f"{error.detail}"})

  async def _crash(self, request, error):
    LOG.error("%s %s failed", request.method, request.url.path, exc_info=error)
    return _reply(500, {"error": f"{request.method} {request.url.path} failed: "
                                 f"{type(error).__name__}: {str(error)[:2000]}"})

  async def _call(self, request):
    from starlette.concurrency import run_in_threadpool  # pylint: disable=import-outside-toplevel
    from starlette.requests import ClientDisconnect  # pylint: disable=import-outside-toplevel
    name = request.path_params["name"]
    tool = self.tools.get(name)
    if tool is None:
      return _reply(404, {"error": f"unknown tool {name!r}; this server has "
                                   f"{sorted(self.tools)}"})
    length = request.headers.get("content-length")
    if length is None or not length.strip().isdigit() or len(length.strip()) > 15:
      return _reply(411 if length is None else 400,
                    {"error": f"tool {name!r} request: Content-Length missing or invalid "
                              f"({length!r})"})
    if int(length) > self.max_body_bytes:
      return _reply(413, {"error": f"tool {name!r} request: body of {int(length)} bytes is "
                                   f"over the server's {self.max_body_bytes} limit"})
    try:
      body = await request.body()
    except ClientDisconnect:
      return _reply(400, {"error": f"tool {name!r} request: the client went away mid-body"})
    start = time.perf_counter()
    status, payload = await run_in_threadpool(self._run, name, tool, body)
    self.record(name, time.perf_counter() - start, status == 200)
    return _reply(status, payload)

  def _run(self, name: str, tool: Callable, body: bytes) -> tuple[int, dict | bytes]:
    """(status, payload) of one call, on a worker thread."""
    try:
      args, kwargs = decode_request(body, name)
      _check_arguments(tool, name, args, kwargs)
    except WireError as error:
      return 400, {"error": str(error)}
    try:
      with self.slots:
        result = tool(*args, **kwargs)
    except (ValueError, TypeError) as error:  # the inputs, refused: not worth a retry
      return 400, {"error": f"tool {name!r} refused its inputs: {type(error).__name__}: "
                            f"{error}"[:4000]}
    except Exception as error:  # pylint: disable=broad-except
      LOG.error("tool %r raised", name, exc_info=error)
      return 500, {"error": f"tool {name!r} raised {type(error).__name__}: {error}"[:4000]}
    try:
      return 200, encode_result(result, name)
    except WireError as error:
      return 500, {"error": str(error)}

  # --- lifecycle -------------------------------------------------------------------------

  def start(self) -> "ToolServer":
    self._web.start()
    return self

  def stop(self) -> None:
    """Stops accepting and ends open connections (calls in flight get 5 s)."""
    self._web.stop()

  def __enter__(self) -> "ToolServer":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()


# --- client --------------------------------------------------------------------------------

class RemoteTool:
  """A tool on a `ToolServer`, callable like the local one (`tool(*args, **kwargs)`).

  Each attempt gets `timeout_s`; connection errors, timeouts and 5xx are retried `retries`
  times after `backoff_s`, 2 x `backoff_s`, ... ; the whole call stops at `deadline_s`
  (default: every attempt's timeout plus the backoffs, and a second). Failures raise
  `ToolError`."""

  def __init__(self, url: str, name: str, timeout_s: float = 30.0, retries: int = 2,
               backoff_s: float = 0.5, deadline_s: float | None = None,
               max_response_bytes: int = MAX_BODY_BYTES, stats: CallStats | None = None):
    if not timeout_s > 0 or retries < 0 or backoff_s < 0:
      raise ValueError(f"RemoteTool {name!r}: expected timeout_s > 0, retries >= 0 and "
                       f"backoff_s >= 0, got {timeout_s}, {retries}, {backoff_s}")
    self.url = url.rstrip("/")
    self.name = name
    self.endpoint = f"{self.url}/tools/{urllib.parse.quote(name, safe='')}"
    self.timeout_s, self.retries, self.backoff_s = float(timeout_s), int(retries), float(backoff_s)
    self.deadline_s = (float(deadline_s) if deadline_s is not None else
                       (self.retries + 1) * self.timeout_s
                       + self.backoff_s * (2 ** self.retries - 1) + 1.0)
    self.max_response_bytes = int(max_response_bytes)
    self._stats = stats if stats is not None else CallStats()

  def stats(self) -> dict[str, dict]:
    """{tool name: calls, failures, attempts, latency {count, total_s, max_s}} (shared by
    the tools of one `remote_tools` call)."""
    return self._stats.snapshot()

  def _error(self, args, kwargs, cause: str) -> ToolError:
    return ToolError(f"tool {self.name!r} at {self.endpoint} (inputs: "
                     f"{describe_inputs(args, kwargs)}): {cause}")

  def __call__(self, *args, **kwargs):
    start = time.perf_counter()
    attempts = 0
    try:
      body = encode_request(args, kwargs, self.name)
    except WireError as error:
      self._stats.record(self.name, 0.0, False, 0)
      raise self._error(args, kwargs, str(error)) from None
    deadline = start + self.deadline_s
    cause = "no attempt made"
    while True:
      remaining = deadline - time.perf_counter()
      if remaining <= 0:
        cause = f"{cause}; the call's deadline of {self.deadline_s:g} s passed"
        break
      attempts += 1
      try:
        status, _, data = http_request(self.endpoint, "POST", body,
                                       {"Content-Type": "application/json"},
                                       min(self.timeout_s, remaining), self.max_response_bytes)
      except TransportError as error:
        cause, retry = str(error), error.kind in RETRYABLE
      else:
        if status == 200:
          try:
            result = decode_result(data, self.name)
          except WireError as error:
            self._stats.record(self.name, time.perf_counter() - start, False, attempts)
            raise self._error(args, kwargs, f"malformed response: {error}") from None
          self._stats.record(self.name, time.perf_counter() - start, True, attempts)
          return result
        cause, retry = f"HTTP {status}: {_error_text(data)}", status >= 500
      if not retry or attempts > self.retries:
        break
      pause = self.backoff_s * 2 ** (attempts - 1)
      time.sleep(max(0.0, min(pause, deadline - time.perf_counter())))
    self._stats.record(self.name, time.perf_counter() - start, False, attempts)
    raise self._error(args, kwargs, f"{cause} ({attempts} attempt(s))")


def _error_text(data: bytes) -> str:
  """A server's {"error": ...} text, or an excerpt of whatever it sent."""
  try:
    obj = json.loads(data.decode("utf-8"))
    if isinstance(obj, dict) and isinstance(obj.get("error"), str):
      return obj["error"][:2000]
  except (ValueError, RecursionError):
    pass
  return f"body {excerpt(data)}"


def health(url: str, timeout_s: float = 5.0) -> dict:
  """The server's /health answer; ToolError when it is not {"status": "ok", "tools": [...]}."""
  endpoint = f"{url.rstrip('/')}/health"
  try:
    status, _, data = http_request(endpoint, timeout_s=timeout_s, max_response_bytes=1 << 20)
  except TransportError as error:
    raise ToolError(f"tool server at {endpoint}: {error}") from None
  if status != 200:
    raise ToolError(f"tool server at {endpoint}: HTTP {status}: {_error_text(data)}")
  try:
    obj = parse_json(data, f"tool server at {endpoint}")
  except WireError as error:
    raise ToolError(str(error)) from None
  if (not isinstance(obj, dict) or obj.get("status") != "ok"
      or not isinstance(obj.get("tools"), list)):
    raise ToolError(f"tool server at {endpoint}: unhealthy answer {excerpt(data)}")
  return obj


def wait_healthy(url: str, timeout_s: float = 60.0, interval_s: float = 0.1,
                 process=None) -> dict:
  """Polls /health until the server answers ok (its answer) or `timeout_s` passes
  (ToolError with the last cause). `process` (a Popen): fail at once if it exits."""
  deadline = time.monotonic() + timeout_s
  cause = "no attempt made"
  while True:
    if process is not None and process.poll() is not None:
      raise ToolError(f"tool server at {url}: its process exited with code "
                      f"{process.returncode} before it was healthy")
    remaining = deadline - time.monotonic()
    if remaining <= 0:
      raise ToolError(f"tool server at {url} not healthy after {timeout_s:g} s: {cause}")
    try:
      return health(url, timeout_s=max(0.05, min(2.0, remaining)))
    except ToolError as error:
      cause = str(error)
    time.sleep(max(0.0, min(interval_s, deadline - time.monotonic())))


def remote_tools(url: str, names=None, **options) -> dict[str, RemoteTool]:
  """{name: RemoteTool} for `names` (default: every tool the server's /health lists),
  sharing one stats table. `options` go to RemoteTool."""
  if names is None:
    names = health(url)["tools"]
  stats = options.pop("stats", None) or CallStats()
  return {n: RemoteTool(url, n, stats=stats, **options) for n in names}


# --- the registry the launch script serves from --------------------------------------------

def echo(*args, **kwargs) -> dict[str, Any]:
  """Diagnostic: returns its keyword inputs (arrays and strings; numbers and lists as
  arrays) and positional ones as arg0, arg1, ..."""
  values = {**{f"arg{i}": v for i, v in enumerate(args)}, **kwargs}
  return {k: v if isinstance(v, str) else np.asarray(v) for k, v in values.items()}


def empty(*args, **kwargs) -> dict[str, Any]:
  """Diagnostic: takes anything, returns nothing (the round trip's fixed cost)."""
  del args, kwargs
  return {}


def _no_model(family: str, tools: dict[str, Callable]) -> Callable:
  """A factory for a family that takes no model folder."""
  def factory(folder=None, names=None) -> dict[str, Callable]:
    if folder:
      raise ValueError(f"tool family {family!r} takes no model folder, got {folder!r}")
    return {n: fn for n, fn in tools.items() if names is None or n in names}
  return factory


def _registry_family(family: str, folder=None, names=None) -> dict[str, Callable]:
  """The family's tools (`names`, default all) of `jaxspatial.perception.TOOLS` as text
  functions (`text_fn`: `fn(image, bounding_box=None, **arguments) -> str`) on one
  backend: the folder's (loaded once), else the family's default (OCR: PP-OCRv4) or its
  environment variable; a family that needs a folder and has none is a ModelFolderError
  naming the first tool asked for."""
  chosen = perception_tools.select([family] if names is None else names,
                                   {family: folder} if folder else None)
  return {name: tool.text_fn() for name, tool in chosen.items()}


TOOL_FACTORIES: dict[str, Callable[..., dict[str, Callable]]] = {
    "echo": _no_model("echo", {"echo": echo}),
    "empty": _no_model("empty", {"empty": empty}),
    **{family: functools.partial(_registry_family, family)
       for family in perception_tools.FAMILIES},
}


def _family_of(name: str) -> str:
  """A family's own name, or the family of a public perception tool."""
  return name if name in TOOL_FACTORIES else perception_tools.TOOLS[name].family


def build_tools(names, models: dict | None = None) -> dict[str, Callable]:
  """The tools of `names`, each a `TOOL_FACTORIES` family (all its tools) or a public
  perception tool name (`jaxspatial.perception.TOOLS`); `models` {family: model folder}
  (empty folders are ignored). ValueError for an unknown name, a folder for a family not
  served, or a tool named twice; ModelFolderError (a ValueError) for a family whose folder
  is missing or does not load."""
  names = list(names)
  unknown = [n for n in names if n not in TOOL_FACTORIES and n not in perception_tools.TOOLS]
  if unknown:
    raise ValueError(f"unknown tool families or tools {unknown}; families: "
                     f"{sorted(TOOL_FACTORIES)}; tools: {sorted(perception_tools.TOOLS)}")
  models = {k: v for k, v in dict(models or {}).items() if v}
  strange = sorted(set(models) - set(TOOL_FACTORIES))
  if strange:
    raise ValueError(f"model folders for unknown families {strange}; families: "
                     f"{sorted(TOOL_FACTORIES)}")
  families = list(dict.fromkeys(_family_of(n) for n in names))
  unused = sorted(set(models) - set(families))
  if unused:
    raise ValueError(f"model folders given for {unused}, but no tool of "
                     f"{'that family' if len(unused) == 1 else 'those families'} is served "
                     f"(serving {names})")
  # Each family's factory runs once, for the tools asked of it (None: all of them).
  wanted = {f: None if f in names else list(dict.fromkeys(n for n in names
                                                         if _family_of(n) == f))
            for f in families}
  built = {f: TOOL_FACTORIES[f](models.get(f), wanted[f]) for f in families}
  tools: dict[str, Callable] = {}
  for name in names:
    family = _family_of(name)
    chosen = built[family] if name == family else {name: built[family][name]}
    for tool, fn in chosen.items():
      if tool in tools:
        raise ValueError(f"tool {tool!r} of family {family!r} is already served by another "
                         f"entry in {names}")
      tools[tool] = fn
  return tools
