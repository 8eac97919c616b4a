"""The OpenAI-compatible HTTP server (stdlib ThreadingHTTPServer; a thread per connection
parses, templates and decodes images, the scheduler's one thread runs the policy).

    POST /v1/chat/completions   -> chat.completion (choices[0].message.content,
                                   finish_reason "stop" | "length", usage)
    GET  /v1/models, /v1/models/{name}
    GET  /health                -> {"status": "ok", "model": name}
    GET  /stats                 -> the scheduler's counts (requests, completed, rejected,
                                   cancelled, waiting, running, slots, programs) and errors

Errors are OpenAI's {"error": {"message", "type", "param", "code"}}: 400 (malformed JSON,
a bad field, an unsupported feature, a prompt over the context), 401 (a wrong key, when
the server has one), 404 (unknown path or model), 411 / 413 (no or too large a body), 429
(the scheduler's queue is full; Retry-After), 500 (generation failed: its exception), 503
(no reply within request_timeout_s; Retry-After); the server keeps serving after any of
them. A request whose client hangs up, or that times out, is dropped: unrun if it waits,
its slot freed at once if it runs.

    server = load_server("/ckpt/Qwen2.5-VL-3B", port=0).start()
    print(server.url)   # http://127.0.0.1:PORT/v1 : the openai client's base_url
"""

from __future__ import annotations

import concurrent.futures
import http.server
import json
import pathlib
import select
import socket
import threading
import time
import traceback
import urllib.parse
import uuid

from jaxspatial.serving import images as image_lib
from jaxspatial.serving.engine import Engine, Sampling
from jaxspatial.serving.prompt import PromptBuilder
from jaxspatial.serving.protocol import APIError, invalid, parse_json, parse_request
from jaxspatial.serving.scheduler import DEFAULT_CONTEXT, QueueFull, Scheduler

MAX_BODY_BYTES = 32 << 20
WAIT_POLL_S = 0.1  # how often a waiting request checks that its client is still there


class ClientGone(Exception):
  """The client hung up while its request waited."""


def _dumps(obj) -> bytes:
  return json.dumps(obj, allow_nan=False, ensure_ascii=False).encode("utf-8")


class _HTTPServer(http.server.ThreadingHTTPServer):
  daemon_threads = True
  block_on_close = False
  request_queue_size = 128

  def __init__(self, *args, **kwargs):
    self.connections: set = set()  # open keep-alive connections, closed by `stop`
    self.connections_lock = threading.Lock()
    super().__init__(*args, **kwargs)

  def process_request(self, request, client_address):
    with self.connections_lock:
      self.connections.add(request)
    super().process_request(request, client_address)

  def shutdown_request(self, request):
    with self.connections_lock:
      self.connections.discard(request)
    super().shutdown_request(request)

  def close_connections(self) -> None:
    with self.connections_lock:
      connections = list(self.connections)
    for connection in connections:
      try:
        connection.shutdown(socket.SHUT_RDWR)  # wakes a handler waiting for the next request
      except OSError:
        pass


class _Handler(http.server.BaseHTTPRequestHandler):
  server_version = "jaxspatial-chat/1"
  protocol_version = "HTTP/1.1"  # keep-alive: every response has a Content-Length
  timeout = 120

  def log_message(self, format, *args):  # pylint: disable=redefined-builtin
    del format, args

  def _send(self, status: int, payload: dict, headers=()) -> None:
    body = _dumps(payload)
    try:
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(body)))
      for name, value in headers:
        self.send_header(name, value)
      if self.close_connection:
        self.send_header("Connection", "close")
      self.end_headers()
      self.wfile.write(body)
    except OSError:
      self.close_connection = True

  def _error(self, error: APIError) -> None:
    self.server.owner.count_error()
    self._send(error.status, error.body(), error.headers)

  def _client_gone(self) -> bool:
    """Whether the client closed its connection (readable with nothing to read)."""
    try:
      readable, _, _ = select.select([self.connection], [], [], 0)
      return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:
      return True

  def do_GET(self):  # pylint: disable=invalid-name
    owner: ChatServer = self.server.owner
    path = urllib.parse.urlsplit(self.path).path.rstrip("/")
    if path == "/health":
      self._send(200, {"status": "ok", "model": owner.model_name})
    elif path == "/stats":
      self._send(200, owner.stats())
    elif path == "/v1/models":
      self._send(200, {"object": "list", "data": [owner.model_card()]})
    elif path.startswith("/v1/models/"):
      name = urllib.parse.unquote(path[len("/v1/models/"):])
      if name == owner.model_name:
        self._send(200, owner.model_card())
      else:
        self._error(APIError(404, f"model {name!r} does not exist; this server serves "
                                  f"{owner.model_name!r}", "invalid_request_error",
                             "model_not_found", "model"))
    else:
      self._error(APIError(404, f"no such path {path!r}: GET /v1/models, /health, /stats; "
                                "POST /v1/chat/completions", "invalid_request_error",
                           "not_found"))

  def do_POST(self):  # pylint: disable=invalid-name
    owner: ChatServer = self.server.owner
    path = urllib.parse.urlsplit(self.path).path.rstrip("/")
    length = self.headers.get("Content-Length")
    if length is None or not length.strip().isdigit() or len(length.strip()) > 15:
      self.close_connection = True  # an unknown body length: the stream cannot be reused
      self._error(APIError(411 if length is None else 400, f"Content-Length missing or "
                           f"invalid ({length!r})", "invalid_request_error"))
      return
    length = int(length)
    if length > owner.max_body_bytes:
      self.close_connection = True  # the unread body must not be parsed as a request
      self._error(APIError(413, f"the request body of {length} bytes is over this server's "
                                f"{owner.max_body_bytes} limit", "invalid_request_error",
                           "request_too_large"))
      return
    try:
      body = self.rfile.read(length)
    except OSError:
      self.close_connection = True
      return
    if len(body) < length:
      self.close_connection = True
      return
    if path != "/v1/chat/completions":
      self._error(APIError(404, f"no such path {path!r}: POST /v1/chat/completions",
                           "invalid_request_error", "not_found"))
      return
    if owner.api_key is not None and self.headers.get("Authorization") != (
        f"Bearer {owner.api_key}"):
      self._error(APIError(401, "missing or wrong API key (Authorization: Bearer ...)",
                           "authentication_error", "invalid_api_key"))
      return
    try:
      self._send(200, owner.complete(body, self._client_gone))
    except ClientGone:
      self.close_connection = True  # nobody to answer
    except APIError as error:
      self._error(error)
    except Exception as error:  # generation failed: the client's answer, the server goes on
      self._error(APIError(500, f"generation failed: {type(error).__name__}: "
                                f"{str(error)[:2000]}", "server_error", "internal_error"))
      owner.last_traceback = traceback.format_exc()


class ChatServer:
  """Serves one policy: `builder` (messages -> prompts), `scheduler` (prompts -> replies).
  `default_max_tokens` when a request gives none (bounded by what the context leaves); the
  context (prompt plus new tokens) is a scheduler slot's capacity; `api_key` (None: none
  asked)."""

  def __init__(self, builder: PromptBuilder, scheduler: Scheduler, model_name: str,
               host: str = "127.0.0.1", port: int = 0, default_max_tokens: int = 512,
               max_body_bytes: int = MAX_BODY_BYTES,
               api_key: str | None = None, request_timeout_s: float = 600.0):
    self.builder, self.scheduler, self.model_name = builder, scheduler, model_name
    self.host, self.port = host, int(port)
    self.default_max_tokens, self.max_context = int(default_max_tokens), scheduler.capacity
    self.max_body_bytes, self.api_key = int(max_body_bytes), api_key
    self.request_timeout_s = float(request_timeout_s)
    self.created = int(time.time())
    self.last_traceback = None
    self._errors = 0
    self._lock = threading.Lock()
    self._server: _HTTPServer | None = None
    self._thread: threading.Thread | None = None

  # --- the API ---------------------------------------------------------------------------

  def model_card(self) -> dict:
    return {"id": self.model_name, "object": "model", "created": self.created,
            "owned_by": "jaxspatial"}

  def count_error(self) -> None:
    with self._lock:
      self._errors += 1

  def stats(self) -> dict:
    with self._lock:
      errors = self._errors
    return {**self.scheduler.stats(), "errors": errors}

  def complete(self, body: bytes, gone=lambda: False) -> dict:
    """The chat.completion for a request body, or an APIError. `gone()`: whether the
    client has hung up (its request is then dropped if it has not started: ClientGone)."""
    request = parse_request(parse_json(body))
    if request.model != self.model_name:
      raise APIError(404, f"model {request.model!r} does not exist; this server serves "
                          f"{self.model_name!r}", "invalid_request_error", "model_not_found",
                     "model")
    prompt = self.builder.build(request)
    room = self.max_context - len(prompt.ids)
    if room < 1:
      raise invalid(f"the prompt has {len(prompt.ids)} tokens: no room for a reply in this "
                    f"server's context of {self.max_context}", "messages",
                    "context_length_exceeded")
    max_tokens = (request.max_tokens if request.max_tokens is not None
                  else min(self.default_max_tokens, room))
    if max_tokens > room:
      raise invalid(f"the prompt has {len(prompt.ids)} tokens and {max_tokens} more were "
                    f"asked for: over this server's context of {self.max_context}",
                    "max_tokens", "context_length_exceeded")
    sampling = (Sampling() if request.greedy
                else Sampling(request.temperature, request.top_p, request.top_k))
    try:
      future = self.scheduler.submit(prompt, max_tokens, sampling, request.stop, request.seed)
    except QueueFull as error:
      raise APIError(429, f"the server is busy: {error}; retry later", "rate_limit_error",
                     "queue_full", headers=(("Retry-After", "1"),)) from None
    reply = self._wait(future, gone)
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()), "model": self.model_name, "system_fingerprint": None,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": reply.text},
                         "logprobs": None, "finish_reason": reply.finish_reason}],
            "usage": {"prompt_tokens": reply.prompt_tokens,
                      "completion_tokens": reply.completion_tokens,
                      "total_tokens": reply.prompt_tokens + reply.completion_tokens}}

  def _wait(self, future, gone):
    """The reply, polling the client: a request whose client hung up, or that waited past
    `request_timeout_s`, is cancelled (dropped unrun, or its slot freed if it runs)."""
    start = time.monotonic()
    while True:
      try:
        return future.result(timeout=WAIT_POLL_S)
      except concurrent.futures.TimeoutError:
        pass
      if gone():
        future.cancel()
        raise ClientGone()
      if time.monotonic() - start > self.request_timeout_s:
        future.cancel()
        raise APIError(503, f"no reply within this server's request_timeout_s of "
                            f"{self.request_timeout_s:g} s; the request was dropped",
                       "server_error", "timeout", headers=(("Retry-After", "1"),))

  # --- lifecycle -------------------------------------------------------------------------

  @property
  def url(self) -> str:
    """The API's base URL (what an OpenAI client takes as base_url), ending in /v1."""
    if self._server is None:
      raise RuntimeError("ChatServer.url: the server is not started")
    host, port = self._server.server_address[:2]
    if host in ("0.0.0.0", "::"):
      host = "127.0.0.1"
    return f"http://{host}:{port}/v1"

  def start(self) -> "ChatServer":
    if self._server is None:
      server = _HTTPServer((self.host, self.port), _Handler)
      server.owner = self
      self._server = server
      self._thread = threading.Thread(target=server.serve_forever,
                                      kwargs={"poll_interval": 0.05}, daemon=True,
                                      name=f"chat-server-{server.server_address[1]}")
      self._thread.start()
    return self

  def stop(self) -> None:
    """Stops listening, closes idle keep-alive connections and the scheduler."""
    if self._server is not None:
      self._server.shutdown()
      self._server.server_close()
      self._server.close_connections()
      self._thread.join(timeout=5)
      self._server = self._thread = None
    self.scheduler.close()

  def __enter__(self) -> "ChatServer":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()


def _context_of(model) -> int:
  raw = getattr(model.config, "raw", None) or {}
  text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
  value = text.get("max_position_embeddings", raw.get("max_position_embeddings"))
  return int(value) if isinstance(value, int) and value > 0 else 32768


def load_server(checkpoint, host: str = "127.0.0.1", port: int = 0,
                model_name: str | None = None, max_batch: int = 8, chat_format: str = "auto",
                dtype: str = "float32", cache_dtype: str = "float32",
                max_context: int | None = None, seed: int = 0, min_length: int = 64,
                max_queue: int = 256, decode_steps: int = 4, **options) -> ChatServer:
  """A ChatServer (not started) for a Hugging Face checkpoint folder `load_policy` reads.
  `max_batch`: the scheduler's decode slots (requests generated at once); `max_context`:
  a slot's tokens, prompt and reply (default the model's context, at most
  DEFAULT_CONTEXT); `min_length`: the smallest prompt bucket; `decode_steps`: decode steps
  per program call; `options`: ChatServer's."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from jaxspatial.models import chat as chat_lib  # pylint: disable=import-outside-toplevel
  from jaxspatial.models.policy import load_policy  # pylint: disable=import-outside-toplevel
  folder = pathlib.Path(checkpoint)
  processor, model = load_policy(folder, dtype=jnp.dtype(dtype), param_dtype=jnp.dtype(dtype))
  tokenizer = getattr(processor, "tokenizer", processor)
  chat = chat_lib.chat_format(chat_format, folder, tokenizer)
  engine = Engine(model, tokenizer, chat.stop_ids(tokenizer), min_length=min_length,
                  cache_dtype=cache_dtype)
  context = max_context or min(_context_of(model), DEFAULT_CONTEXT)
  builder = PromptBuilder(tokenizer, model, chat, max_context=context,
                          max_image_pixels=image_lib.decode_limit(model))
  scheduler = Scheduler(engine, slots=max_batch, capacity=context, steps=decode_steps,
                        seed=seed, max_queue=max_queue)
  return ChatServer(builder, scheduler, model_name or folder.name, host, port, **options)
