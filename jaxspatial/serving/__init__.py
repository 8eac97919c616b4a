"""An OpenAI-compatible chat-completions server for a jaxspatial policy (`launch.serve`):
protocol.py (request parsing, OpenAI errors), images.py (data URLs -> images at the
policy's size), prompt.py (messages -> chat-templated token ids with image tokens),
engine.py (the policy, its stop ids and replies; static bucketed batches through the
compiled sampler), slots.py (continuous batching's programs over decode slots),
scheduler.py (requests in and out of the slots between decode steps; a conversation's
next turn reuses its slot), memory.py (a prompt's prefill memory), local.py (a policy
folder ready to serve in-process: load_local), server.py (HTTP, load_server)."""

from jaxspatial.serving.engine import Engine, Reply, Sampling
from jaxspatial.serving.local import LocalPolicy, load_local
from jaxspatial.serving.prompt import Prompt, PromptBuilder
from jaxspatial.serving.protocol import APIError, ChatRequest, parse_request
from jaxspatial.serving.scheduler import QueueFull, Scheduler
from jaxspatial.serving.server import ChatServer, load_server

__all__ = ["APIError", "ChatRequest", "ChatServer", "Engine", "LocalPolicy", "Prompt",
           "PromptBuilder", "QueueFull", "Reply", "Sampling", "Scheduler", "load_local",
           "load_server", "parse_request"]
