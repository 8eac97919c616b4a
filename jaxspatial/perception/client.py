"""The tool service's client side: one bounded HTTP request, `RemoteTool`, health checks.

`RemoteTool(url, name)` is callable like the local tool, so `HostTool` / `TextTool` take
either. It gives each request `timeout_s` (a watchdog closes the socket at the deadline, so
a server that trickles bytes cannot hold a call), retries connection errors (a response
cut short of its Content-Length among them), timeouts and 5xx with exponential backoff
(never 4xx, which are deterministic, or a malformed 200), and stops at a total deadline;
every failure is one `ToolError` naming the tool, the URL, the input shapes and the cause.
Server responses are hostile input: parsing never crashes or hangs.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.parse

from jaxspatial.errors import ToolError, TransportError, WireError  # one ToolError, local or remote
from jaxspatial.perception.wire import (MAX_BODY_BYTES, decode_result, describe_inputs,
                                        encode_request, excerpt, parse_json)

RETRYABLE = ("timeout", "refused", "disconnected", "connection")


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
    if response.length:  # what Content-Length promised and never came: read(n) does not say
      raise TransportError("disconnected", "the server closed the connection mid-response "
                           f"({size} of the {size + response.length} bytes its Content-Length "
                           "promised)")
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
