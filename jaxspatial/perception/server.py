"""The tool service's server side: `ToolServer` serves a dict of host tools over HTTP.

    POST /tools/{name}   body {"args": [...], "kwargs": {...}} -> 200 {"result": ...}
    GET  /health         -> {"status": "ok", "tools": [...]}
    GET  /stats          -> the server's per-tool counts and latency

Bodies are in the `wire` format. Errors come back as {"error": text}, never a traceback:
400 (a malformed request, arguments the tool does not take, inputs it refuses: it raised
ValueError or TypeError), 404 (unknown tool), 411 / 413 (no or too large a body), 500 (the
tool failed otherwise: its exception's type and message). The server is a Starlette app on
uvicorn (`jaxspatial.web`): an error never drops the connection.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
import threading
import time
from typing import Callable

from jaxspatial.errors import WireError
from jaxspatial.perception.client import CallStats
from jaxspatial.perception.wire import (MAX_BODY_BYTES, decode_request, describe_inputs, dumps,
                                        encode_result)

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
LOG = logging.getLogger("jaxspatial.perception.server")


def _reply(status: int, payload: dict | bytes):
  from starlette.responses import Response  # pylint: disable=import-outside-toplevel
  body = payload if isinstance(payload, bytes) else dumps(payload)
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
