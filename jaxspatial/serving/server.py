"""The OpenAI-compatible HTTP server: a Starlette app on uvicorn (asyncio; request parsing,
templating and image decoding in a thread pool, the scheduler's one thread runs the policy).

    POST /v1/chat/completions   -> chat.completion (choices[n].message.content, logprobs,
                                   finish_reason "stop" | "length", usage), or with
                                   "stream": true server-sent chat.completion.chunk events
                                   (a usage chunk with stream_options.include_usage), then
                                   "data: [DONE]"
    GET  /v1/models, /v1/models/{name}
    GET  /health                -> {"status": "ok", "model": name}
    GET  /stats                 -> the scheduler's counts (requests, completed, rejected,
                                   cancelled, waiting, running, slots, programs) and errors

Errors are OpenAI's {"error": {"message", "type", "param", "code"}}: 400 (malformed JSON,
a bad field, an unsupported feature, a prompt over the context), 401 (a wrong key, when
the server has one), 404 (unknown path or model), 405, 411 / 413 (no or too large a body),
429 (the scheduler's queue is full; Retry-After), 500 (generation failed: its exception's
type and message, never a traceback), 503 (no reply within request_timeout_s, or more than
`max_connections` open; Retry-After); the server keeps serving after any of them. A request
whose client hangs up, or that times out, is dropped: unrun if it waits, its slot freed at
once if it runs. Every request is logged on `jaxspatial.serving.access` (one JSON line:
request id, method, path, status, prompt and completion tokens, milliseconds) and every
error with its message on `jaxspatial.serving.errors`.

    server = load_server("/ckpt/Qwen2.5-VL-3B", port=0).start()
    print(server.url)   # http://127.0.0.1:PORT/v1 : the openai client's base_url
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
import uuid

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from jaxspatial import web
from jaxspatial.serving.engine import Engine, Reply, Sampling
from jaxspatial.serving.prompt import Prompt, PromptBuilder
from jaxspatial.serving.protocol import (APIError, ChatRequest, invalid, parse_json,
                                         parse_request)
from jaxspatial.serving.scheduler import QueueFull, Scheduler

MAX_BODY_BYTES = 32 << 20
WAIT_POLL_S = 0.1  # how often a waiting request checks that its client is still there
ACCESS = logging.getLogger("jaxspatial.serving.access")
ERRORS = logging.getLogger("jaxspatial.serving.errors")


class ClientGone(Exception):
  """The client hung up while its request waited."""


def _dumps(obj) -> bytes:
  return json.dumps(obj, allow_nan=False, ensure_ascii=False).encode("utf-8")


def _json(status: int, payload: dict, headers=()) -> Response:
  return Response(_dumps(payload), status, headers=dict(headers),
                  media_type="application/json")


@dataclasses.dataclass
class _Prepared:
  request: ChatRequest
  prompt: Prompt
  max_tokens: int
  sampling: Sampling


@dataclasses.dataclass
class _Log:
  """What the access log line says of a request."""
  id: str
  method: str
  path: str
  status: int = 200
  prompt_tokens: int = 0
  completion_tokens: int = 0
  start: float = dataclasses.field(default_factory=time.monotonic)


class _Stream:
  """One choice's text as it streams: only a prefix that the final reply keeps is sent (no
  text past a stop string, no half of a multi-byte character)."""

  def __init__(self, engine: Engine, stop: tuple, logprobs: bool):
    self.engine, self.stop, self.logprobs = engine, stop, logprobs
    self.tokens: list = []
    self.sent = ""
    self.held: list = []  # log-probability entries not sent yet

  def add(self, ids, entries) -> tuple[str, list]:
    """(new text to send, log-probability entries to send) after new tokens."""
    self.tokens += [t for t in ids if t not in self.engine.stop_ids]
    self.held += entries
    text = self.engine.decode(self.tokens)
    if self.stop:
      cuts = [text.find(s) for s in self.stop if s in text]
      text = text[:min(cuts)] if cuts else text[:max(len(text) - max(map(len, self.stop)) + 1,
                                                      0)]
    text = text.rstrip("\ufffd")
    delta = text[len(self.sent):] if text.startswith(self.sent) else ""
    self.sent += delta
    if self.stop:  # which tokens the reply keeps is known at its end only
      return delta, []
    entries, self.held = self.held, []
    return delta, entries

  def finish(self, reply: Reply, entries: list) -> tuple[str, list]:
    """The rest of the reply's text and log-probability entries."""
    delta = reply.text[len(self.sent):] if reply.text.startswith(self.sent) else ""
    self.sent += delta
    return delta, entries


class ChatServer:
  """Serves one policy: `builder` (messages -> prompts), `scheduler` (prompts -> replies).
  `default_max_tokens` when a request gives none (bounded by what the context leaves); the
  context (prompt plus new tokens) is a scheduler slot's capacity; `api_key` (None: none
  asked); `max_connections`: open connections at most (more get 503)."""

  def __init__(self, builder: PromptBuilder, scheduler: Scheduler, model_name: str,
               host: str = "127.0.0.1", port: int = 0, default_max_tokens: int = 512,
               max_body_bytes: int = MAX_BODY_BYTES, api_key: str | None = None,
               request_timeout_s: float = 600.0, max_connections: int = 1024):
    self.builder, self.scheduler, self.model_name = builder, scheduler, model_name
    self.engine = scheduler.engine
    self.host, self.port = host, int(port)
    self.default_max_tokens, self.max_context = int(default_max_tokens), scheduler.capacity
    self.max_body_bytes, self.api_key = int(max_body_bytes), api_key
    self.request_timeout_s = float(request_timeout_s)
    self.max_connections = int(max_connections)
    self.created = int(time.time())
    self._errors = 0
    self._lock = threading.Lock()
    self._web: web.BackgroundServer | None = None
    self.app = Starlette(routes=[
        Route("/v1/chat/completions", self._completions, methods=["POST"]),
        Route("/v1/models", self._models, methods=["GET"]),
        Route("/v1/models/{name:path}", self._model, methods=["GET"]),
        Route("/health", self._health, methods=["GET"]),
        Route("/stats", self._stats, methods=["GET"]),
    ], exception_handlers={HTTPException: self._http_error, Exception: self._crash})

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

  def prepare(self, body: bytes) -> _Prepared:
    """A request body checked and templated into a prompt, or an APIError."""
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
    try:
      self.scheduler.check(prompt, max_tokens)
    except ValueError as error:  # past a slot or the prefill memory budget
      raise invalid(str(error), "messages", "context_length_exceeded") from None
    sampling = (Sampling() if request.greedy
                else Sampling(request.temperature, request.top_p, request.top_k))
    return _Prepared(request, prompt, max_tokens, sampling)

  def submit(self, prepared: _Prepared, on_tokens=None) -> list:
    """The futures of a request's `n` choices (choice i seeded with seed + i), or a 429."""
    request, futures = prepared.request, []
    try:
      for i in range(request.n):
        seed = None if request.seed is None else request.seed + i
        futures.append(self.scheduler.submit(
            prepared.prompt, prepared.max_tokens, prepared.sampling, request.stop, seed,
            None if on_tokens is None else on_tokens(i),
            request.top_logprobs if request.logprobs else 0))
    except QueueFull as error:
      for future in futures:
        future.cancel()
      raise APIError(429, f"the server is busy: {error}; retry later", "rate_limit_error",
                     "queue_full", headers=(("Retry-After", "1"),)) from None
    return futures

  def logprob_entries(self, tokens, logprobs, tops) -> list[dict]:
    """OpenAI's logprobs.content entries of tokens."""
    def entry(token, logprob):
      text = self.engine.decode([token])
      return {"token": text, "logprob": float(logprob), "bytes": list(text.encode())}
    return [{**entry(t, lp), "top_logprobs": [entry(i, v) for i, v in top]}
            for t, lp, top in zip(tokens, logprobs, tops)]

  def completion(self, rid: str, prepared: _Prepared, replies: list[Reply]) -> dict:
    choices = []
    for index, reply in enumerate(replies):
      logprobs = None
      if prepared.request.logprobs:
        logprobs = {"content": self.logprob_entries(reply.tokens, reply.logprobs,
                                                    reply.top_logprobs)}
      choices.append({"index": index, "message": {"role": "assistant", "content": reply.text},
                      "logprobs": logprobs, "finish_reason": reply.finish_reason})
    return {"id": rid, "object": "chat.completion", "created": int(time.time()),
            "model": self.model_name, "system_fingerprint": None, "choices": choices,
            "usage": self._usage(prepared, replies)}

  def _usage(self, prepared: _Prepared, replies) -> dict:
    prompt, completion = len(prepared.prompt.ids), sum(r.completion_tokens for r in replies)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}

  # --- handlers --------------------------------------------------------------------------

  async def _health(self, request: Request) -> Response:
    del request
    return _json(200, {"status": "ok", "model": self.model_name})

  async def _stats(self, request: Request) -> Response:
    del request
    return _json(200, self.stats())

  async def _models(self, request: Request) -> Response:
    del request
    return _json(200, {"object": "list", "data": [self.model_card()]})

  async def _model(self, request: Request) -> Response:
    name = request.path_params["name"]
    if name == self.model_name:
      return _json(200, self.model_card())
    return self._error(_Log("-", "GET", request.url.path), APIError(
        404, f"model {name!r} does not exist; this server serves {self.model_name!r}",
        "invalid_request_error", "model_not_found", "model"))

  async def _http_error(self, request: Request, error: HTTPException) -> Response:
    log = _Log("-", request.method, request.url.path)
    if error.status_code == 404:
      return self._error(log, APIError(404, f"no such path {request.url.path!r}: GET "
                                            "/v1/models, /health, /stats; POST "
                                            "/v1/chat/completions", "invalid_request_error",
                                       "not_found"))
    return self._error(log, APIError(error.status_code, f"{request.method} "
                                                        f"{request.url.path}: {error.detail}",
                                     "invalid_request_error"))

  async def _crash(self, request: Request, error: Exception) -> Response:
    return self._failure(_Log("-", request.method, request.url.path), error)

  def _error(self, log: _Log, error: APIError) -> Response:
    self.count_error()
    log.status = error.status
    ERRORS.warning("%s %s %s %d %s", log.id, log.method, log.path, error.status,
                   error.message[:500])
    self._access(log)
    return _json(error.status, error.body(), error.headers)

  def _failure(self, log: _Log, error: Exception) -> Response:
    ERRORS.error("%s generation failed", log.id, exc_info=error)
    return self._error(log, APIError(500, f"generation failed: {type(error).__name__}: "
                                          f"{str(error)[:2000]}", "server_error",
                                     "internal_error"))

  @staticmethod
  def _access(log: _Log) -> None:
    ACCESS.info(json.dumps({"id": log.id, "method": log.method, "path": log.path,
                            "status": log.status, "prompt_tokens": log.prompt_tokens,
                            "completion_tokens": log.completion_tokens,
                            "ms": round(1e3 * (time.monotonic() - log.start), 1)}))

  async def _body(self, request: Request) -> bytes:
    length = request.headers.get("content-length")
    if length is None or not length.strip().isdigit() or len(length.strip()) > 15:
      raise APIError(411 if length is None else 400, f"Content-Length missing or invalid "
                                                     f"({length!r})", "invalid_request_error")
    if int(length) > self.max_body_bytes:
      raise APIError(413, f"the request body of {int(length)} bytes is over this server's "
                          f"{self.max_body_bytes} limit", "invalid_request_error",
                     "request_too_large")
    body = bytearray()
    try:
      async for chunk in request.stream():
        body += chunk
        if len(body) > self.max_body_bytes:
          raise APIError(413, f"the request body is over this server's "
                              f"{self.max_body_bytes} limit", "invalid_request_error",
                         "request_too_large")
    except ClientDisconnect:
      raise ClientGone() from None
    return bytes(body)

  async def _completions(self, request: Request) -> Response:
    log = _Log(f"chatcmpl-{uuid.uuid4().hex}", "POST", request.url.path)
    try:
      if self.api_key is not None and request.headers.get("authorization") != (
          f"Bearer {self.api_key}"):
        raise APIError(401, "missing or wrong API key (Authorization: Bearer ...)",
                       "authentication_error", "invalid_api_key")
      prepared = await run_in_threadpool(self.prepare, await self._body(request))
      log.prompt_tokens = len(prepared.prompt.ids)
      if prepared.request.stream:
        # Submitted before the response starts: a full queue is still a 429.
        loop, events = asyncio.get_running_loop(), asyncio.Queue()

        def on_tokens(index):
          def push(ids, logprobs, tops):
            loop.call_soon_threadsafe(events.put_nowait, (index, ids, logprobs, tops))
          return push

        futures = self.submit(prepared, on_tokens)
        for index, future in enumerate(futures):
          future.add_done_callback(lambda _, i=index: loop.call_soon_threadsafe(
              events.put_nowait, (i, None, None, None)))
        return StreamingResponse(self._events(prepared, futures, events, log),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
      futures = self.submit(prepared)
      replies = await self._wait(request, futures, log)
      log.completion_tokens = sum(r.completion_tokens for r in replies)
      self._access(log)
      return _json(200, self.completion(log.id, prepared, replies))
    except ClientGone:
      log.status = 499  # nobody to answer
      self._access(log)
      return Response(status_code=499)
    except APIError as error:
      return self._error(log, error)
    except Exception as error:  # pylint: disable=broad-except
      return self._failure(log, error)

  async def _wait(self, request: Request, futures: list, log: _Log) -> list[Reply]:
    """The replies, polling the client: a request whose client hung up, or that waited
    past `request_timeout_s`, is cancelled (dropped unrun, or its slot freed if it runs)."""
    waiting = [asyncio.wrap_future(f) for f in futures]
    while True:
      _, pending = await asyncio.wait(waiting, timeout=WAIT_POLL_S)
      if not pending:
        return [f.result() for f in futures]
      if await request.is_disconnected():
        for future in futures:
          future.cancel()
        raise ClientGone()
      if time.monotonic() - log.start > self.request_timeout_s:
        for future in futures:
          future.cancel()
        raise APIError(503, f"no reply within this server's request_timeout_s of "
                            f"{self.request_timeout_s:g} s; the request was dropped",
                       "server_error", "timeout", headers=(("Retry-After", "1"),))

  async def _events(self, prepared: _Prepared, futures: list, events: asyncio.Queue,
                    log: _Log):
    """The chunks of a streamed completion, as server-sent events: `events` carries each
    choice's new tokens, then its end. Starlette cancels this generator when the client
    hangs up (its requests are then cancelled)."""
    wants = prepared.request
    streams = [_Stream(self.engine, wants.stop, wants.logprobs) for _ in range(wants.n)]
    created = int(time.time())

    def chunk(choices, usage=None) -> bytes:
      body = {"id": log.id, "object": "chat.completion.chunk", "created": created,
              "model": self.model_name, "system_fingerprint": None, "choices": choices}
      if wants.include_usage:
        body["usage"] = usage
      return b"data: " + _dumps(body) + b"\n\n"

    def delta(index, text, entries, finish=None, role=False) -> dict:
      content = {"role": "assistant", "content": text} if role else {"content": text}
      logprobs = {"content": entries} if wants.logprobs else None
      return {"index": index, "delta": content, "logprobs": logprobs, "finish_reason": finish}

    try:
      for index in range(wants.n):
        yield chunk([delta(index, "", [], role=True)])
      done = 0
      while done < wants.n:
        left = self.request_timeout_s - (time.monotonic() - log.start)
        try:
          index, ids, logprobs, tops = await asyncio.wait_for(events.get(), max(left, 0.001))
        except asyncio.TimeoutError:
          log.status = 503
          yield b"data: " + _dumps(APIError(
              503, f"no reply within this server's request_timeout_s of "
                   f"{self.request_timeout_s:g} s; the request was dropped", "server_error",
              "timeout").body()) + b"\n\n"
          return
        stream = streams[index]
        if ids is not None:
          kept = [k for k, t in enumerate(ids) if t not in self.engine.stop_ids]
          entries = self.logprob_entries([ids[k] for k in kept], [logprobs[k] for k in kept],
                                         [tops[k] for k in kept]) if wants.logprobs else []
          text, entries = stream.add(ids, entries)
          if text or entries:
            yield chunk([delta(index, text, entries)])
          continue
        done += 1
        reply = futures[index].result()
        log.completion_tokens += reply.completion_tokens
        entries = []
        if wants.logprobs and wants.stop:
          entries = self.logprob_entries(reply.tokens, reply.logprobs, reply.top_logprobs)
        text, entries = stream.finish(reply, entries)
        yield chunk([delta(index, text, entries, reply.finish_reason)])
      if wants.include_usage:
        body = {"id": log.id, "object": "chat.completion.chunk", "created": created,
                "model": self.model_name, "system_fingerprint": None, "choices": [],
                "usage": self._usage(prepared, [f.result() for f in futures])}
        yield b"data: " + _dumps(body) + b"\n\n"
      yield b"data: [DONE]\n\n"
    except Exception as error:  # pylint: disable=broad-except
      self.count_error()
      log.status = 500
      ERRORS.error("%s generation failed", log.id, exc_info=error)
      yield b"data: " + _dumps(APIError(500, f"generation failed: {type(error).__name__}: "
                                             f"{str(error)[:2000]}", "server_error",
                                        "internal_error").body()) + b"\n\n"
    finally:
      if log.status == 200 and any(not f.done() for f in futures):
        log.status = 499  # the client hung up mid-stream
      for future in futures:
        future.cancel()
      self._access(log)

  # --- lifecycle -------------------------------------------------------------------------

  @property
  def url(self) -> str:
    """The API's base URL (what an OpenAI client takes as base_url), ending in /v1."""
    if self._web is None:
      raise RuntimeError("ChatServer.url: the server is not started")
    return f"http://{self._web.address}/v1"

  def start(self) -> "ChatServer":
    if self._web is None:
      self._web = web.BackgroundServer(self.app, self.host, self.port, self.max_connections,
                                       name="chat-server").start()
    return self

  def stop(self) -> None:
    """Stops listening, ends open connections and closes the scheduler."""
    if self._web is not None:
      self._web.stop()
      self._web = None
    self.scheduler.close()

  def __enter__(self) -> "ChatServer":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()


def load_server(checkpoint, host: str = "127.0.0.1", port: int = 0,
                model_name: str | None = None, max_batch: int = 8, chat_format: str = "auto",
                dtype: str = "float32", cache_dtype: str = "float32",
                max_context: int | None = None, seed: int = 0, min_length: int = 64,
                max_queue: int = 256, decode_steps: int = 4,
                prefill_memory_gb: float | None = None, **options) -> ChatServer:
  """A ChatServer (not started) for a Hugging Face checkpoint folder `load_policy` reads,
  set up by `serving.local.load_local`: `max_batch` decode slots of `max_context` tokens
  (prompt and reply; default the model's context, at most DEFAULT_CONTEXT); `min_length`:
  the smallest prompt bucket; `decode_steps`: decode steps per program call;
  `prefill_memory_gb`: what one prompt's prefill may take; `options`: ChatServer's."""
  from jaxspatial.serving.local import load_local  # pylint: disable=import-outside-toplevel
  policy = load_local(checkpoint, dtype, chat_format, max_batch, max_context, cache_dtype,
                      seed=seed, min_length=min_length, decode_steps=decode_steps,
                      max_queue=max_queue, prefill_memory_gb=prefill_memory_gb)
  return ChatServer(policy.builder, policy.scheduler, model_name or policy.name, host, port,
                    **options)
