"""A policy folder made ready to serve on this machine's devices, the one set-up every
in-process caller shares (`launch.serve`, `launch.eval --checkpoint`, SpatialClaw's
PolicyChat): the model and its processor (`models.load_policy`), the chat format, the
engine (stop ids, replies), the prompt builder (the folder's chat template, images resized
as its processor does) and the continuous-batching scheduler over its slots.

    policy = load_local("/ckpt/Qwen2.5-VL-3B", slots=8)
    reply = policy.scheduler.generate(policy.builder.build(local_request(...)), 64)
"""

from __future__ import annotations

import dataclasses
import pathlib

import jax.numpy as jnp

from jaxspatial.serving import images as image_lib
from jaxspatial.serving import memory
from jaxspatial.serving.engine import Engine
from jaxspatial.serving.prompt import PromptBuilder
from jaxspatial.serving.scheduler import DEFAULT_CONTEXT, Scheduler


@dataclasses.dataclass
class LocalPolicy:
  name: str              # the folder's name
  model: object
  tokenizer: object
  chat: object           # models.chat.ChatFormat
  engine: Engine
  builder: PromptBuilder
  scheduler: Scheduler


def model_context(model) -> int:
  """The model's max_position_embeddings (config.json's, or its text config's)."""
  raw = getattr(model.config, "raw", None) or {}
  text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
  value = text.get("max_position_embeddings", raw.get("max_position_embeddings"))
  return int(value) if isinstance(value, int) and value > 0 else 32768


def load_local(folder, dtype: str = "float32", chat_format: str = "auto", slots: int = 8,
               capacity: int | None = None, cache_dtype: str | None = None,
               max_images: int = 8, seed: int = 0, reuse: bool = True,
               min_length: int = 64, decode_steps: int = 4, max_queue: int = 256,
               prefill_memory_gb: float | None = None) -> LocalPolicy:
  """`slots` decode slots of `capacity` tokens (default the model's context, at most
  DEFAULT_CONTEXT); `cache_dtype` (default `dtype`); `max_images` per request;
  `prefill_memory_gb`: what one prompt's prefill may take (default, on an accelerator: 90%
  of the memory left once the weights and the slots are in; on a CPU unchecked)."""
  # pylint: disable=import-outside-toplevel
  from jaxspatial.models import chat as chat_lib
  from jaxspatial.models.policy import load_policy
  folder = pathlib.Path(folder)
  cache_dtype = cache_dtype or dtype
  processor, model = load_policy(folder, dtype=jnp.dtype(dtype), param_dtype=jnp.dtype(dtype))
  tokenizer = getattr(processor, "tokenizer", processor)
  chat = chat_lib.chat_format(chat_format, folder, tokenizer)
  engine = Engine(model, tokenizer, chat.stop_ids(tokenizer), min_length=min_length,
                  cache_dtype=cache_dtype)
  capacity = capacity or min(model_context(model), DEFAULT_CONTEXT)
  builder = PromptBuilder(tokenizer, model, chat, max_images=max_images, max_context=capacity,
                          max_image_pixels=image_lib.decode_limit(model))
  budget = None if prefill_memory_gb is None else int(prefill_memory_gb * 1e9)
  free = memory.free_device_bytes()
  if budget is None and free is not None:
    budget = int(0.9 * (free - memory.slot_bytes(model, slots, capacity, cache_dtype)))
    if budget <= 0:
      raise ValueError(f"{slots} slots of {capacity} tokens do not fit the device's "
                       f"{memory.gigabytes(free)} left after the weights: fewer slots "
                       "(--max_batch) or a shorter context (--max_context)")
  scheduler = Scheduler(engine, slots=slots, capacity=capacity, steps=decode_steps, seed=seed,
                        max_queue=max_queue, reuse=reuse, memory_budget=budget)
  return LocalPolicy(folder.name, model, tokenizer, chat, engine, builder, scheduler)


__all__ = ["LocalPolicy", "load_local", "model_context"]
