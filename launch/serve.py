r"""Serves a jaxspatial policy as an OpenAI-compatible chat-completions API until SIGTERM
or SIGINT.

    python -m launch.serve --checkpoint /ckpt/Qwen2.5-VL-3B --host 127.0.0.1 --port 8000

`--checkpoint`: a Hugging Face folder `models.load_policy` reads (Qwen2.5-VL, Qwen3-VL:
config.json, safetensors, tokenizer with its chat template, generation_config.json's stop
ids). Serves POST /v1/chat/completions (text and data-URL images, stop sequences,
temperature / top-p / top-k, seeds, usage counts; concurrent requests continuously
batched over --max_batch decode slots) and GET /v1/models,
/health, /stats; the model's name is the folder's (`--name`). Prints the base URL once
listening (with --port 0, the port it picked): give it to an OpenAI client as base_url,
or to a run's `judge.url` so this model is its judge. Each request is logged on stderr (a
JSON line: id, status, tokens, milliseconds), each error with its message. `--api-key-env` names an environment
variable holding a key the clients must send (none by default).
"""

from __future__ import annotations

# Before anything starts the XLA backend.
from jaxspatial import xla_workarounds

xla_workarounds.apply()
# pylint: disable=wrong-import-position

import logging
import os
import signal
import threading

from absl import app, flags

from recipes import cli
from jaxspatial.serving import load_server

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "the policy's Hugging Face folder "
                                  "(required)", required=True)
_HOST = flags.DEFINE_string("host", "127.0.0.1", "the address to listen on")
_PORT = flags.DEFINE_integer("port", 8000, "the port (0: a free one)")
_NAME = flags.DEFINE_string("name", None, "the served model's name (default: the folder's)")
_MAX_BATCH = flags.DEFINE_integer("max_batch", 8, "decode slots: requests generated at once "
                                  "(continuous batching: a freed slot takes the next request)")
_MAX_CONTEXT = flags.DEFINE_integer("max_context", None, "a slot's tokens, prompt and reply, "
                                    "which its KV cache holds (default: the model's "
                                    "context, at most 8192)")
_DECODE_STEPS = flags.DEFINE_integer("decode_steps", 4, "decode steps per program call (a "
                                     "finished request's slot frees at the call's end)")
_PREFILL_GB = flags.DEFINE_float("prefill_memory_gb", None, "device memory one prompt's "
                                  "prefill may take; a prompt needing more gets 400 (default: "
                                  "on an accelerator 90% of what the weights and the slots "
                                  "leave; on a CPU unchecked)")
_MAX_CONNECTIONS = flags.DEFINE_integer("max_connections", 1024, "open connections at most "
                                        "(more get 503)")
_MAX_QUEUE = flags.DEFINE_integer("max_queue", 256, "requests waiting at most; more get 429 "
                                  "with Retry-After")
_TIMEOUT = flags.DEFINE_float("request_timeout_s", 600.0, "a request unanswered longer gets "
                              "503 and is dropped (its slot freed if it runs)")
_MAX_TOKENS = flags.DEFINE_integer("default_max_tokens", 512, "new tokens when a request "
                                   "gives no max_tokens")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "parameters and "
                           "computation (bfloat16 also for the KV cache)")
_CHAT = flags.DEFINE_enum("chat_format", "auto", ["auto", "instruct", "thinking"],
                          "how a reply opens when the folder has no chat template")
_KEY_ENV = flags.DEFINE_string("api_key_env", None, "an environment variable holding the "
                               "key clients must send as 'Authorization: Bearer KEY' (default: "
                               "none: no key asked)")


def main(argv) -> None:
  del argv
  # The access log (a JSON line per request) and the error log, on stderr.
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
  key = None
  if _KEY_ENV.value:
    key = os.environ.get(_KEY_ENV.value)
    if not key:
      raise app.UsageError(f"--api_key_env: ${_KEY_ENV.value} is not set")
  try:
    cli.need_policy(_CHECKPOINT.value)
    server = load_server(_CHECKPOINT.value, _HOST.value, _PORT.value, _NAME.value,
                         max_batch=_MAX_BATCH.value, max_context=_MAX_CONTEXT.value,
                         decode_steps=_DECODE_STEPS.value, chat_format=_CHAT.value, dtype=_DTYPE.value,
                         cache_dtype=_DTYPE.value, default_max_tokens=_MAX_TOKENS.value,
                         api_key=key, max_queue=_MAX_QUEUE.value,
                         max_connections=_MAX_CONNECTIONS.value,
                         prefill_memory_gb=_PREFILL_GB.value,
                         request_timeout_s=_TIMEOUT.value)
  except (FileNotFoundError, ValueError) as error:  # a missing or malformed folder: usage
    raise app.UsageError(str(error)) from None
  stop = threading.Event()
  for number in (signal.SIGTERM, signal.SIGINT):
    signal.signal(number, lambda *_: stop.set())
  with server:
    print(f"serving {server.model_name} at {server.url} (POST /chat/completions, "
          "GET /models)", flush=True)
    while not stop.wait(0.5):
      pass
  print("server stopped", flush=True)


if __name__ == "__main__":
  cli.run(main)
