"""The OpenAI chat-completions request, parsed and checked: strict JSON (UTF-8, no NaN,
no duplicate keys), then every field the server acts on, each error an `APIError` with
the HTTP status, OpenAI's error type and code, and the parameter it is about.

Accepted: `model`, `messages` (roles system / developer / user / assistant / tool; content a
string or a list of parts: {"type": "text", "text"} and {"type": "image_url", "image_url":
{"url": "data:image/png;base64,..."}}), `max_tokens` / `max_completion_tokens`,
`temperature` (0..2; below `GREEDY_BELOW` greedy), `top_p` (0..1], `top_k` (vLLM's
extension; 0: off), `stop` (a string or up to `MAX_STOPS` strings), `seed`, `n` (1 to
`MAX_N` choices), `stream` and `stream_options.include_usage` (server-sent events in
OpenAI's chunk format), `logprobs` and `top_logprobs` (0 to 20), `chat_template_kwargs`
(vLLM's extension: keywords for the chat template). Refused with a 400 naming them: tools /
function calls, penalties other than 0, logit_bias, response formats other than text. Other
fields (user, metadata, store, ...) are ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
from typing import Any

from jaxspatial import strict_json
from jaxspatial.errors import ServiceError

MAX_STOPS = 4
MAX_N = 8             # choices per request
MAX_TOP_LOGPROBS = 20
MAX_TOP_K = (1 << 31) - 1  # an int32 per row; above the vocabulary it keeps every token
MAX_STOP_CHARS = 256
GREEDY_BELOW = 1e-3  # temperatures under it sample greedily (their logits overflow)
ROLES = ("system", "developer", "user", "assistant", "tool")
_REFUSED = {  # field -> (the value that is fine, why anything else is refused)
    "frequency_penalty": (0, "frequency_penalty is not supported (only 0)"),
    "presence_penalty": (0, "presence_penalty is not supported (only 0)"),
    "tools": (None, "tools are not supported by this server"),
    "functions": (None, "function calling is not supported by this server"),
    "tool_choice": (None, "tools are not supported by this server"),
    "function_call": (None, "function calling is not supported by this server"),
    "logit_bias": (None, "logit_bias is not supported"),
    "repetition_penalty": (1, "repetition_penalty is not supported (only 1)"),
}


class APIError(ServiceError):
  """An error returned as OpenAI's {"error": {"message", "type", "param", "code"}}."""

  def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
               code: str | None = None, param: str | None = None, headers=()):
    super().__init__(message)
    self.status, self.message, self.type, self.code, self.param = (
        int(status), message, type_, code, param)
    self.headers = tuple(headers)  # (name, value) pairs sent with it (Retry-After)

  def body(self) -> dict:
    return {"error": {"message": self.message, "type": self.type, "param": self.param,
                      "code": self.code}}


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
  return APIError(400, message, "invalid_request_error", code, param)


@dataclasses.dataclass(frozen=True)
class ImagePart:
  url: str            # a data URL; decoded by `images.decode_data_url`
  where: str          # "messages[1].content[0]"
  # An in-process caller's image (uint8 [H, W, 3]) in place of the URL (`local_request`).
  pixels: Any = dataclasses.field(default=None, compare=False)


@dataclasses.dataclass(frozen=True)
class Message:
  role: str
  parts: tuple        # str (text) and ImagePart, in order


@dataclasses.dataclass(frozen=True)
class ChatRequest:
  model: str
  messages: tuple[Message, ...]
  max_tokens: int | None = None      # None: the server's default
  temperature: float = 1.0           # OpenAI's default
  top_p: float = 1.0
  top_k: int = 0
  stop: tuple[str, ...] = ()
  seed: int | None = None
  chat_template_kwargs: dict = dataclasses.field(default_factory=dict)
  n: int = 1
  stream: bool = False
  include_usage: bool = False        # stream_options.include_usage: a last usage chunk
  logprobs: bool = False
  top_logprobs: int = 0

  @property
  def greedy(self) -> bool:
    return self.temperature < GREEDY_BELOW


def parse_json(body: bytes) -> Any:
  """Strict JSON of a request body, or a 400 (a lone surrogate escape such as "\\ud800"
  included: it is no Unicode text, and would fail later as a 500)."""
  try:
    obj = strict_json.loads_body(body, "request body")
  except ValueError as error:
    raise invalid(str(error)) from None
  try:
    json.dumps(obj, ensure_ascii=False).encode("utf-8")
  except UnicodeEncodeError as error:
    raise invalid(f"request body: a string holds a lone surrogate "
                  f"({error.object[error.start:error.end]!r}), which is not Unicode text; "
                  "escape characters outside the BMP as a surrogate pair") from None
  return obj


def _number(obj: dict, name: str, default, low: float, high: float, low_open=False):
  value = obj.get(name)
  if value is None:
    return default
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise invalid(f"{name}: expected a number, got {type(value).__name__} {value!r:.60}",
                  name)
  if not (low < value if low_open else low <= value) or value > high:
    bracket = "(" if low_open else "["
    raise invalid(f"{name}: expected a number in {bracket}{low:g}, {high:g}], got {value!r}",
                  name)
  return float(value)


def _integer(obj: dict, name: str, low: int, high: int | None = None):
  value = obj.get(name)
  if value is None:
    return None
  if isinstance(value, bool) or not isinstance(value, int):
    raise invalid(f"{name}: expected an integer, got {type(value).__name__} {value!r:.60}",
                  name)
  if value < low or (high is not None and value > high):
    raise invalid(f"{name}: expected an integer >= {low}"
                  + (f" and <= {high}" if high is not None else "") + f", got {value}", name)
  return value


def _flag(obj: dict, name: str, where: str | None = None) -> bool:
  value = obj.get(name)
  if value is not None and not isinstance(value, bool):
    raise invalid(f"{where or name}: expected true or false, got {value!r:.60}", where or name)
  return bool(value)


def _content(content: Any, where: str) -> tuple:
  if content is None:
    return ()
  if isinstance(content, str):
    return (content,)
  if not isinstance(content, list):
    raise invalid(f"{where}: expected a string or a list of content parts, got "
                  f"{type(content).__name__}", where)
  parts = []
  for i, part in enumerate(content):
    at = f"{where}[{i}]"
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
      raise invalid(f"{at}: expected an object with a 'type', got {part!r:.80}", at)
    kind = part["type"]
    if kind in ("text", "input_text"):
      text = part.get("text")
      if not isinstance(text, str):
        raise invalid(f"{at}.text: expected a string, got {type(text).__name__}", at)
      parts.append(text)
    elif kind == "image_url":
      image = part.get("image_url")
      url = image.get("url") if isinstance(image, dict) else image
      if not isinstance(url, str):
        raise invalid(f"{at}.image_url: expected {{'url': 'data:image/...;base64,...'}}, "
                      f"got {image!r:.80}", at)
      parts.append(ImagePart(url, at))
    else:
      raise invalid(f"{at}: content part type {kind!r} is not supported (text, image_url)",
                    at)
  return tuple(parts)


def _messages(value: Any) -> tuple[Message, ...]:
  if not isinstance(value, list) or not value:
    raise invalid("messages: expected a non-empty list of messages", "messages")
  out = []
  for i, message in enumerate(value):
    where = f"messages[{i}]"
    if not isinstance(message, dict):
      raise invalid(f"{where}: expected an object, got {type(message).__name__}", where)
    role = message.get("role")
    if role not in ROLES:
      raise invalid(f"{where}.role: expected one of {', '.join(ROLES)}, got {role!r:.60}",
                    f"{where}.role")
    if message.get("tool_calls") or message.get("function_call"):
      raise invalid(f"{where}: tool calls are not supported by this server", where)
    if "content" not in message or (message["content"] is None and role != "assistant"):
      raise invalid(f"{where}.content: missing (a string or a list of content parts)",
                    f"{where}.content")
    parts = _content(message["content"], f"{where}.content")
    if role not in ("user",) and any(isinstance(p, ImagePart) for p in parts):
      raise invalid(f"{where}: images are accepted in user messages only (role {role!r})",
                    where)
    out.append(Message(role, parts))
  return tuple(out)


def _stop(value: Any) -> tuple[str, ...]:
  if value is None:
    return ()
  stops = [value] if isinstance(value, str) else value
  if (not isinstance(stops, list) or len(stops) > MAX_STOPS
      or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops)):
    raise invalid(f"stop: expected a string or a list of at most {MAX_STOPS} non-empty "
                  f"strings of at most {MAX_STOP_CHARS} characters, got {value!r:.100}",
                  "stop")
  return tuple(dict.fromkeys(stops))


def parse_request(obj: Any) -> ChatRequest:
  """A `ChatRequest` from the parsed JSON body, or an `APIError` (400)."""
  if not isinstance(obj, dict):
    raise invalid(f"the request body must be a JSON object, got {type(obj).__name__}")
  model = obj.get("model")
  if not isinstance(model, str) or not model:
    raise invalid("model: expected the served model's name (a string); GET /v1/models "
                  "lists it", "model")
  if "messages" not in obj:
    raise invalid("messages: missing", "messages")
  messages = _messages(obj["messages"])
  for name, (fine, why) in _REFUSED.items():
    value = obj.get(name)
    if value is not None and value != fine and not (fine is None and value in ([], "none")):
      raise invalid(f"{name}: {why}; got {value!r:.60}", name)
  stream, logprobs = _flag(obj, "stream"), _flag(obj, "logprobs")
  options = obj.get("stream_options")
  if options is not None and (not isinstance(options, dict) or not stream):
    raise invalid("stream_options: expected an object, with stream=true", "stream_options")
  include_usage = _flag(options or {}, "include_usage", "stream_options.include_usage")
  top = _integer(obj, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
  if top and not logprobs:
    raise invalid("top_logprobs: needs logprobs=true", "top_logprobs")
  format_ = obj.get("response_format")
  if format_ is not None and format_ != {"type": "text"}:
    raise invalid(f"response_format: only {{'type': 'text'}} is supported, got "
                  f"{format_!r:.80}", "response_format")
  lengths = {k: _integer(obj, k, 1) for k in ("max_completion_tokens", "max_tokens")}
  given = {k: v for k, v in lengths.items() if v is not None}
  if len(set(given.values())) > 1:
    raise invalid(f"max_tokens {given['max_tokens']} and max_completion_tokens "
                  f"{given['max_completion_tokens']} disagree: give one", "max_tokens")
  kwargs = obj.get("chat_template_kwargs") or {}
  if not isinstance(kwargs, dict):
    raise invalid("chat_template_kwargs: expected an object", "chat_template_kwargs")
  return ChatRequest(
      model=model, messages=messages, max_tokens=next(iter(given.values()), None),
      temperature=_number(obj, "temperature", 1.0, 0.0, 2.0),
      top_p=_number(obj, "top_p", 1.0, 0.0, 1.0, low_open=True),
      top_k=0 if obj.get("top_k") == -1 else (_integer(obj, "top_k", 0, MAX_TOP_K) or 0),  # vLLM: -1 off
      stop=_stop(obj.get("stop")), seed=_integer(obj, "seed", -(1 << 63), (1 << 64) - 1),
      chat_template_kwargs=dict(kwargs), n=_integer(obj, "n", 1, MAX_N) or 1, stream=stream,
      include_usage=include_usage, logprobs=logprobs, top_logprobs=top)


LOCAL_IMAGE = "local-image:"  # the URL an in-process image part stands behind


def local_request(model: str, messages, **fields) -> ChatRequest:
  """A ChatRequest from an in-process caller's messages (role; content a string or parts
  {"type": "text", "text"} / {"type": "image", "image": uint8 [H, W, 3]}), checked as a
  request body is, its images kept as arrays: no PNG / base64 round trip. `fields`: the
  body's other fields (max_tokens, temperature, ...)."""
  images, body = [], []
  for message in messages:
    content = message["content"]
    if not isinstance(content, str):
      parts = []
      for part in content:
        if part.get("type") == "image":
          images.append(part["image"])
          parts.append({"type": "image_url",
                        "image_url": {"url": f"{LOCAL_IMAGE}{len(images) - 1}"}})
        else:
          parts.append(part)
      content = parts
    body.append({**message, "content": content})
  request = parse_request({"model": model, "messages": body, **fields})
  return dataclasses.replace(request, messages=tuple(
      Message(m.role, tuple(dataclasses.replace(p, pixels=images[int(p.url[len(LOCAL_IMAGE):])])
                            if isinstance(p, ImagePart) else p for p in m.parts))
      for m in request.messages))
