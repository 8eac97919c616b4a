"""An OpenAI-compatible chat-completions server for the judge tests (127.0.0.1, a free port).

Its replies follow a deterministic rule: it reads the case out of the judge prompt (our
layout, one field per line: "Question: ...", "Reference answers:" or "Ground truth:",
"1. ...", "2. ...", then "Predicted answer: ..." or "Prediction: ..."; parsed here
independently of the judge's code)
and answers "CORRECT" when the prediction equals a reference after normalisation
(lower case, no punctuation, no articles, single spaces), else "INCORRECT"; a prompt it
cannot read gets "UNREADABLE PROMPT". Failure modes, settable between requests:
`delay_s` (sleep before replying), `statuses` (a queue: each request pops one and gets that
HTTP status, 429 with Retry-After: 0), `malformed` (200 with broken JSON), `reply_body`
(200 with these exact bytes), `die` (close the socket without replying), `reply_fn` (a
function of the request body returning the reply text, instead of the judge rule: scripted
agents), `body_fn` (a function of the request body returning the whole 200 reply body:
replies in other shapes, e.g. content null with reasoning_content), `status_fn` (a function of the request body returning an HTTP status for it, None
for 200: a request that fails for good). Every request is
recorded (`requests`: body, headers, parsed case, start and end times).
"""

from __future__ import annotations

import http.server
import json
import re
import socket
import string
import threading
import time

_ITEM = re.compile(r"^(?P<n>\d+)\. (?P<value>.*)$")
REFERENCE_HEADERS = ("Reference answers:", "Ground truth:")
PREDICTION_LABELS = ("Predicted answer: ", "Prediction: ")


def normalise(text: str) -> str:
  text = "".join(c for c in text.lower() if c not in string.punctuation)
  return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def read_case(prompt: str) -> dict | None:
  """{"question", "references", "prediction"} from the judge prompt's layout (question,
  references header, numbered references, prediction, then anything), or None."""
  lines = prompt.split("\n")
  if len(lines) < 4 or not lines[0].startswith("Question: ") or lines[1] not in REFERENCE_HEADERS:
    return None
  references, k = [], 2
  while k < len(lines) and (item := _ITEM.match(lines[k])):
    if int(item["n"]) != len(references) + 1:
      return None
    references.append(item["value"])
    k += 1
  if not references or k == len(lines):
    return None
  label = next((p for p in PREDICTION_LABELS if lines[k].startswith(p)), None)
  if label is None:
    return None
  return {"question": lines[0][len("Question: "):], "references": references,
          "prediction": lines[k][len(label):]}


class _Server(http.server.ThreadingHTTPServer):
  daemon_threads = True
  block_on_close = False
  request_queue_size = 128  # the listen backlog is set at bind: concurrent clients connect at once


class ChatServer:
  """`with ChatServer() as server:` ... `server.base_url` ("http://127.0.0.1:PORT/v1")."""

  def __init__(self, delay_s: float = 0.0):
    self.delay_s = delay_s
    self.statuses: list[int] = []
    self.malformed = False
    self.reply_body: bytes | None = None
    self.die = False
    self.reply_fn = None
    self.body_fn = None
    self.status_fn = None
    self.requests: list[dict] = []
    self._lock = threading.Lock()
    owner = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def log_message(self, format, *args):  # pylint: disable=redefined-builtin
        del format, args

      def do_POST(self):  # pylint: disable=invalid-name
        owner._handle(self)

    self._server = _Server(("127.0.0.1", 0), Handler)
    self._thread = None

  @property
  def base_url(self) -> str:
    return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

  def __enter__(self) -> "ChatServer":
    self._thread = threading.Thread(target=self._server.serve_forever,
                                    kwargs={"poll_interval": 0.05}, daemon=True)
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._server.shutdown()
    self._server.server_close()
    self._thread.join(timeout=5)

  def _send(self, handler, status: int, body: bytes, headers=()) -> None:
    try:
      handler.send_response(status)
      handler.send_header("Content-Type", "application/json")
      handler.send_header("Content-Length", str(len(body)))
      for k, v in headers:
        handler.send_header(k, v)
      handler.end_headers()
      handler.wfile.write(body)
    except OSError:
      pass

  def _handle(self, handler) -> None:
    start = time.monotonic()
    length = int(handler.headers.get("Content-Length", 0))
    raw = handler.rfile.read(length)
    record = {"path": handler.path, "headers": dict(handler.headers.items()), "start": start}
    with self._lock:
      self.requests.append(record)
      status = self.statuses.pop(0) if self.statuses else 200
      delay, malformed, die, reply_body = (self.delay_s, self.malformed, self.die,
                                           self.reply_body)
    try:
      body = json.loads(raw)
      record["body"] = body
    except ValueError:
      record["body"] = None
    if delay:
      time.sleep(delay)
    record["end"] = time.monotonic()
    if die:
      handler.close_connection = True
      try:
        handler.connection.shutdown(socket.SHUT_RDWR)
      except OSError:
        pass
      return
    if handler.path != "/v1/chat/completions":
      self._send(handler, 404, json.dumps({"error": {"message": "not found"}}).encode())
      return
    if status != 200:
      headers = [("Retry-After", "0")] if status == 429 else []
      self._send(handler, status, json.dumps(
          {"error": {"message": f"injected status {status}", "type": "test"}}).encode(),
          headers)
      return
    if malformed:
      self._send(handler, 200, b'{"choices": [{"message": {"content": "CORR')
      return
    if reply_body is not None:
      self._send(handler, 200, reply_body)
      return
    body = record["body"]
    if (not isinstance(body, dict) or not isinstance(body.get("model"), str)
        or not isinstance(body.get("messages"), list) or not body["messages"]):
      self._send(handler, 400, json.dumps(
          {"error": {"message": "expected model and messages"}}).encode())
      return
    chosen = self.status_fn(body) if self.status_fn is not None else None
    if chosen not in (None, 200):
      self._send(handler, chosen, json.dumps(
          {"error": {"message": f"scripted status {chosen}", "type": "test"}}).encode())
      return
    user = [m.get("content", "") for m in body["messages"]
            if isinstance(m, dict) and m.get("role") == "user"]
    case = read_case(user[-1]) if user and isinstance(user[-1], str) else None
    record["case"] = case
    if self.body_fn is not None:
      self._send(handler, 200, self.body_fn(body))
      return
    if self.reply_fn is not None:
      reply = self.reply_fn(body)
    elif case is None:
      reply = "UNREADABLE PROMPT"
    else:
      prediction = normalise(case["prediction"])
      match = any(prediction == normalise(r) for r in case["references"])
      reply = "CORRECT" if match else "INCORRECT"
    prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body["messages"]
                        if isinstance(m, dict))
    self._send(handler, 200, json.dumps({
        "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion",
        "model": body["model"],
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": reply}}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1,
                  "total_tokens": prompt_tokens + 1}}).encode())
