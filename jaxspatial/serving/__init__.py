"""An OpenAI-compatible chat-completions server for a jaxspatial policy (`launch.serve`):
protocol.py (request parsing, OpenAI errors), images.py (data URLs -> images at the
policy's size), prompt.py (messages -> chat-templated token ids with image tokens),
engine.py (the policy, its stop ids and replies; static bucketed batches through the
compiled sampler), slots.py (continuous batching's programs over decode slots),
scheduler.py (requests in and out of the slots between decode steps; a conversation's
next turn reuses its slot), memory.py (a prompt's prefill memory), local.py (a policy
folder ready to serve in-process: load_local), server.py (HTTP, load_server).

Modules:
- an OpenAI-compatible chat-completions server for a policy (launch/serve.py):
- protocol.py (strict JSON; the request's fields: messages with text and image_url parts,
  max_tokens / max_completion_tokens, temperature (< 1e-3: greedy), top_p, top_k, stop, seed, n
  (<= 8), stream (+ stream_options. include_usage), logprobs / top_logprobs (<= 20); tools,
  penalties and logit_bias refused; APIError -> OpenAI's {"error": {message, type, param,
  code}}; `local_request`: an in-process caller's messages checked as a body is, images kept as
  arrays (launch.eval --checkpoint's answers and SpatialClaw's PolicyChat: no PNG / base64 round
  trip)), images.py (base64 data URLs: PNG / JPEG / WebP through PIL, RGB; `decode_limit`: 4 x
  the pixels the processor keeps, a bigger image refused from its header; remote URLs a 400,
  never fetched; resized with PIL bicubic to the model's smart-resize grid, as its processor
  does), prompt.py (each image part -> Qwen's placeholder, the folder's chat template with the
  reply opened (none: Qwen's layout + ChatFormat.prefill), the placeholder expanded to the
  image's tokens; text spelling vision tokens refused; text longer than max_context x the
  vocabulary's longest token refused before tokenising; a lone surrogate escape and a top_k past
  int32 are 400s), engine.py (a batch through sampler.generate under `jax.jit` over the model's
  split state (`Engine.split`: nothing written back, so a failed run, e.g. an allocation, leaves
  the model intact): left-padded, batch to `batch_buckets` (padding rows repeat row 0), prompt
  length and new tokens to powers of two, one program per bucket and image grids; sampling
  settings per row as data (sampler.RowSampling / sample_rows: no program per setting); replies:
  the first stop id ends it, stop strings cut on the host, finish_reason stop / length,
  completion tokens up to the one ending it), slots.py (continuous batching's device side:
  `Slots`, one KV cache of `slots` rows x capacity + 1 slots, each row with its own fill,
  position, logits, key and prompt boundary; programs, `jax.jit` over the split model with the
  slots donated: encode_image (the vision encoder per image grid) + write_tokens (a request's
  vision tokens padded to a power of two: images enter the prefill as data), prefill_into (a
  right-padded prompt per length bucket and vision bucket into one row), append_into (a segment
  after a kept row's content, or after its prompt boundary: attention slots past it turn
  invalid, recurrent layers' state comes from `snapshot`; over a power-of-two window of the
  row), decode_steps (`steps` steps of every live row over a window of the slots (the live rows'
  reach, a power of two, plus a scratch slot non-live rows write into): per-row sampling
  settings and keys, each row writing at its own slot via the families' per-row cache write,
  `attention.write_cache`; the top 20 log-probabilities when a request asks)), memory.py
  (prefill_bytes: a bound on one prompt's prefill memory (attention maps unless the fused kernel
  runs, activations, cache, vision), checked against XLA's compiled memory analysis; slot_bytes;
  free_device_bytes),
- local.py (load_local(folder) -> LocalPolicy: the model, chat format, engine, prompt builder
  and scheduler of a policy folder, the one set-up of load_server, PolicyChat.from_folder and
  recipes' PolicyBackend; the default prefill budget on accelerators), scheduler.py (Scheduler,
  the one in-process engine: `submit(prompt, max_tokens, sampling, stop, seed, on_tokens)` ->
  future of a Reply; one worker thread drops cancelled requests (a running one's slot freed at
  once), admits waiting ones into free slots, runs `steps` decode steps, ends replies at a stop
  id, max_tokens or a stop string; a finished slot keeps its cache, and a later prompt extending
  it (ids, images by digest) appends only what is new, from the end of the reply when the prompt
  repeats its tokens, else from the previous prompt's end; LRU kept slot refilled when none is
  free; a prompt + max_tokens past a slot's capacity (DEFAULT_CONTEXT 8,192), or whose prefill
  passes `memory_budget`, is a ValueError at submit; at most `max_queue` wait (QueueFull ->
  429); a failed program with the slots consumed fails the running requests and starts the slots
  afresh; stats(): requests, completed, cancelled, prefills, appends, reused_tokens,
  decode_calls, decode_steps, programs and their list), server.py (ChatServer: a Starlette app
  on uvicorn (limit_concurrency = max_connections) over a Scheduler, /v1/chat/completions (JSON,
  or server-sent chunks whose text never passes a stop string), /v1/models, /health, /stats; 400
  / 401 / 404 / 405 / 411 / 413 / 429 (queue full) / 500 (the exception's type and message, no
  traceback) / 503 (request_timeout_s) and the server goes on; n choices seeded seed + i; a
  request whose client hangs up or times out is cancelled, its slot freed if it runs; a JSON
  access line per request (jaxspatial.serving.access) and each error's message
  (jaxspatial.serving.errors); the context is a slot's capacity; load_server(folder, max_batch =
  slots, max_context, decode_steps, prefill_memory_gb: on accelerators 90% of what weights and
  slots leave))
"""

from jaxspatial.serving.engine import Engine, Reply, Sampling
from jaxspatial.serving.local import LocalPolicy, load_local
from jaxspatial.serving.prompt import Prompt, PromptBuilder
from jaxspatial.serving.protocol import APIError, ChatRequest, parse_request
from jaxspatial.serving.scheduler import QueueFull, Scheduler
from jaxspatial.serving.server import ChatServer, load_server

__all__ = ["APIError", "ChatRequest", "ChatServer", "Engine", "LocalPolicy", "Prompt",
           "PromptBuilder", "QueueFull", "Reply", "Sampling", "Scheduler", "load_local",
           "load_server", "parse_request"]
