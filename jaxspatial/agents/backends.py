"""The models SpatialClaw's loop talks to: `chat(messages, temperature, max_tokens) -> str`.

Messages are OpenAI-shaped dicts whose content is a string or a list of parts, text
{"type": "text", "text": ...} and images {"type": "image", "image": uint8 [H, W, 3]}
(numpy; each backend encodes them its own way).

- EndpointChat: an OpenAI-compatible endpoint (`perception.judge.ChatEndpoint`:
  concurrency, retries, a request budget, the key from an environment variable); images
  as PNG data URLs, as recipes/benchmark_backends.py's EndpointBackend sends them. A seed
  goes in the endpoint's `extra_body` (the caller sets it for a whole run).
- PolicyChat: a jaxspatial policy folder on this machine's devices, through the serving
  path a chat server uses: `serving.PromptBuilder` (the folder's chat template, images
  resized as its processor does, vision tokens expanded) and `serving.Scheduler`
  (continuous batching): concurrent episodes' requests decode together, and by default
  (`reuse_prefix`) each episode's step goes into the slot its previous step left and
  appends only what is new (the reply, the feedback, new images). Generation runs until
  the chat format's stop token (or `max_tokens`); the host runs the code between requests.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol, Sequence

import numpy as np


class ChatModel(Protocol):
  name: str

  def chat(self, messages: Sequence[dict], temperature: float = 0.0,
           max_tokens: int = 1024) -> str:
    ...


def _parts(content: Any) -> list:
  if isinstance(content, str):
    return [{"type": "text", "text": content}]
  return list(content)


def openai_messages(messages: Sequence[dict]) -> list[dict]:
  """Messages with image parts as OpenAI image_url parts (PNG data URLs); text-only
  contents stay strings."""
  from jaxspatial.rollout.api_agent import png_data_url  # pylint: disable=import-outside-toplevel
  out = []
  for message in messages:
    content = message["content"]
    if isinstance(content, str):
      out.append({"role": message["role"], "content": content})
      continue
    parts = []
    for part in content:
      if part["type"] == "image":
        parts.append({"type": "image_url", "image_url": {"url": png_data_url(part["image"])}})
      else:
        parts.append({"type": "text", "text": part["text"]})
    out.append({"role": message["role"], "content": parts})
  return out


def count_images(messages: Sequence[dict]) -> int:
  return sum(1 for m in messages if not isinstance(m["content"], str)
             for p in m["content"] if p["type"] == "image")


class EndpointChat:
  """An OpenAI-compatible chat endpoint as the loop's model."""

  def __init__(self, endpoint):
    self.endpoint = endpoint
    self.name = endpoint.model

  def chat(self, messages: Sequence[dict], temperature: float = 0.0,
           max_tokens: int = 1024) -> str:
    return self.endpoint.complete(openai_messages(messages), temperature=temperature,
                                  max_tokens=max_tokens)

  def close(self) -> None:
    pass


class PolicyChat:
  """A jaxspatial policy as the loop's model (see the module doc). Build it from a folder
  (`from_folder`) or on a benchmark backend's scheduler (`from_scheduler`). `seed` seeds
  each request's sampling key (the request's number folded in)."""

  def __init__(self, scheduler, builder, name: str, seed: int = 0, owns_scheduler: bool = True):
    self.scheduler, self.builder, self.name = scheduler, builder, name
    self.engine = scheduler.engine
    self.seed, self._owns = int(seed), owns_scheduler
    self._requests = 0
    self._closed = False
    self._lock = threading.Lock()

  @classmethod
  def from_folder(cls, folder, dtype: str = "float32", chat_format: str = "auto",
                  max_batch: int = 8, max_images: int = 128, seed: int = 0,
                  reuse_prefix: bool = True, capacity: int | None = None) -> "PolicyChat":
    """`max_batch` decode slots of `capacity` tokens each (`serving.local.load_local`)."""
    from jaxspatial.serving.local import load_local  # pylint: disable=import-outside-toplevel
    policy = load_local(folder, dtype, chat_format, slots=max_batch, capacity=capacity,
                        max_images=max_images, seed=seed, reuse=reuse_prefix)
    return cls(policy.scheduler, policy.builder, policy.name, seed=seed)

  @classmethod
  def from_scheduler(cls, scheduler, builder, name: str, max_images: int = 128,
                     seed: int = 0) -> "PolicyChat":
    """On a scheduler the caller owns, with a prompt builder taking `max_images` images."""
    from jaxspatial.serving.prompt import PromptBuilder  # pylint: disable=import-outside-toplevel
    wide = PromptBuilder(builder.tokenizer, builder.model, builder.chat, max_images=max_images,
                         max_image_pixels=builder.max_image_pixels)
    return cls(scheduler, wide, name, seed=seed, owns_scheduler=False)

  def chat(self, messages: Sequence[dict], temperature: float = 0.0,
           max_tokens: int = 1024) -> str:
    # pylint: disable=import-outside-toplevel
    from jaxspatial.serving.engine import Sampling
    from jaxspatial.serving.protocol import local_request
    request = local_request(self.name, messages, max_tokens=int(max_tokens),
                            temperature=float(temperature))
    prompt = self.builder.build(request)
    sampling = Sampling(temperature=0.0 if request.greedy else request.temperature)
    with self._lock:
      if self._closed:
        raise RuntimeError("PolicyChat is closed")
      self._requests += 1
      seed = (self.seed * 1_000_003 + self._requests) % (1 << 31)
    return self.scheduler.generate(prompt, int(max_tokens), sampling, seed=seed).text

  def stats(self) -> dict:
    """The scheduler's counts (requests, appends: steps that reused their slot, ...)."""
    return self.scheduler.stats()

  def close(self) -> None:
    with self._lock:
      if not self._closed:
        self._closed = True
        if self._owns:
          self.scheduler.close()


class ScriptedChat:
  """Replies from a function of the messages (tests, scripted agents): `reply(messages)
  -> str`. Records every request."""

  def __init__(self, reply, name: str = "scripted"):
    self.reply, self.name = reply, name
    self.requests: list[list[dict]] = []
    self._lock = threading.Lock()

  def chat(self, messages: Sequence[dict], temperature: float = 0.0,
           max_tokens: int = 1024) -> str:
    del temperature, max_tokens
    with self._lock:
      self.requests.append(list(messages))
    return self.reply(list(messages))

  def close(self) -> None:
    pass


def images_of(message: dict) -> list[np.ndarray]:
  """The images of one message, in order."""
  return [p["image"] for p in _parts(message["content"]) if p["type"] == "image"]
