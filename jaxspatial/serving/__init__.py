"""An OpenAI-compatible chat-completions server for a jaxspatial policy (`launch.serve`):
protocol.py (request parsing, OpenAI errors), images.py (data URLs -> images at the
policy's size), prompt.py (messages -> chat-templated token ids with image tokens),
engine.py (bucketed batches through the compiled sampler; stop strings, finish reasons,
token counts), batcher.py (concurrent requests -> batches), prefix_cache.py (a
conversation's kept cache: each request appends what is new), server.py (HTTP,
load_server)."""

from jaxspatial.serving.batcher import Batcher
from jaxspatial.serving.engine import Engine, Reply, Sampling
from jaxspatial.serving.prefix_cache import PrefixCache
from jaxspatial.serving.prompt import Prompt, PromptBuilder
from jaxspatial.serving.protocol import APIError, ChatRequest, parse_request
from jaxspatial.serving.scheduler import QueueFull, Scheduler
from jaxspatial.serving.server import ChatServer, load_server

__all__ = ["APIError", "Batcher", "ChatRequest", "ChatServer", "Engine", "PrefixCache", "Prompt",
           "PromptBuilder", "QueueFull", "Reply", "Sampling", "Scheduler", "load_server",
           "parse_request"]
