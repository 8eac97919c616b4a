"""Generation for the server: a batch of prompts as one left-padded batch through
`models.sampler.generate` under jit, shapes padded to buckets so the number of compiled
programs stays small, and each row's tokens turned into its reply (stop tokens, stop
strings cut on the host, the length limit, token counts).

Buckets: the batch to the next of `batch_buckets` (padding rows repeat the first row),
the prompt length and the new-token budget to powers of two (at least `min_length` and
`min_new_tokens`). One program per (batch, length, budget, image grids): sampling settings are per-row data.
Images are preprocessed per image (`model.vision_inputs`, jitted per image size) and their
pixel values concatenated in order over the batch, as the sampler takes them. Programs take
the model's split state as an argument (`Engine.split`): a failed run leaves the model
intact and the engine serves on.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspatial.models.sampler import RowSampling, SamplingConfig, generate
from jaxspatial.serving.prompt import Prompt


def next_power(value: int, least: int) -> int:
  size = max(int(least), 1)
  while size < value:
    size *= 2
  return size


@dataclasses.dataclass(frozen=True)
class Sampling:
  """A request's sampling settings (data to the programs: `sampler.RowSampling`)."""
  temperature: float = 0.0   # 0: greedy
  top_p: float = 1.0
  top_k: int = 0


@dataclasses.dataclass(frozen=True)
class Reply:
  text: str
  finish_reason: str         # "stop" or "length"
  completion_tokens: int
  prompt_tokens: int
  # The scheduler's: the text's tokens (a stop id left out), each one's log-probability
  # and, when asked, the most likely tokens' ((id, log-probability), ...) at its step.
  tokens: tuple = dataclasses.field(default=(), compare=False)
  logprobs: tuple = dataclasses.field(default=(), compare=False)
  top_logprobs: tuple = dataclasses.field(default=(), compare=False)


# Programs are `jax.jit` over the model's split state (graphdef static, the state an
# argument): nothing is written back, so a run that fails (an allocation, a bad input)
# leaves the model intact, and a call costs no state traversal (nnx.jit's milliseconds).
@functools.partial(jax.jit, static_argnames=("graphdef", "config", "grids"))
def _generate(graphdef, state, ids, mask, key, pixels, sequence_grids, rows, config, grids):
  model = nnx.merge(graphdef, state)
  return generate(model, ids, mask, key, config, pixels, grids, sequence_grids, rows)


class Engine:
  """Runs batches of prompts for one policy. `stop_ids`: tokens that end a reply (the
  chat format's); `cache_dtype`: the KV cache's."""

  def __init__(self, model, tokenizer, stop_ids, batch_buckets=(1, 2, 4, 8), min_length=64,
               min_new_tokens=16, cache_dtype: str = "float32"):
    if not batch_buckets or any(b < 1 for b in batch_buckets):
      raise ValueError(f"Engine.batch_buckets: expected sizes >= 1, got {batch_buckets!r}")
    self.model, self.tokenizer = model, tokenizer
    self.stop_ids = tuple(int(t) for t in stop_ids)
    self.batch_buckets = tuple(sorted(set(int(b) for b in batch_buckets)))
    self.min_length, self.min_new_tokens = int(min_length), int(min_new_tokens)
    self.cache_dtype = cache_dtype
    self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    self.vocab = len(tokenizer)
    self.programs: set = set()
    self._lock = threading.Lock()
    self._split = None
    self._pixels = jax.jit(lambda image: model.vision_inputs(image[None, None])[0])

  @property
  def split(self) -> tuple:
    """(graphdef, state) of the model, split once: the programs' static and argument."""
    if self._split is None:
      self._split = nnx.split(self.model)
    return self._split

  @property
  def max_batch(self) -> int:
    return self.batch_buckets[-1]

  def shapes(self, prompts, max_new_tokens: int) -> tuple[int, int, int]:
    batch = next(b for b in self.batch_buckets if b >= len(prompts))
    length = next_power(max(len(p.ids) for p in prompts), self.min_length)
    return batch, length, next_power(max_new_tokens, self.min_new_tokens)

  def generate(self, prompts: list[Prompt], max_new_tokens: int,
               sampling: Sampling | Sequence[Sampling], key) -> tuple[np.ndarray, int]:
    """(tokens [len(prompts), budget] int32, the batch size it ran at). `sampling`: one
    for every prompt or one per prompt; the settings are data (`sampler.RowSampling`), so
    they compile nothing new."""
    if not 1 <= len(prompts) <= self.max_batch:
      raise ValueError(f"Engine.generate: {len(prompts)} prompts; expected 1 to "
                       f"{self.max_batch}")
    settings = [sampling] * len(prompts) if isinstance(sampling, Sampling) else list(sampling)
    if len(settings) != len(prompts):
      raise ValueError(f"Engine.generate: {len(settings)} sampling settings for "
                       f"{len(prompts)} prompts")
    batch, length, budget = self.shapes(prompts, max_new_tokens)
    rows = list(prompts) + [prompts[0]] * (batch - len(prompts))
    settings += [settings[0]] * (batch - len(prompts))
    row_sampling = RowSampling.create([s.temperature for s in settings],
                                      [s.top_k for s in settings],
                                      [s.top_p for s in settings])
    ids = np.full((batch, length), self.pad_id, np.int32)
    mask = np.zeros((batch, length), bool)
    for r, prompt in enumerate(rows):
      ids[r, length - len(prompt.ids):] = prompt.ids
      mask[r, length - len(prompt.ids):] = True
    pixels = sequence_grids = None
    grids = ()
    views = max(len(p.images) for p in rows)
    if views:
      grids = tuple(self.model.image_grid(image.shape[:2]) for p in rows for image in p.images)
      pixels = self.pixel_values([image for p in rows for image in p.images])
      fill = grids[0]
      per_row = []
      for p in rows:
        own = [self.model.image_grid(image.shape[:2]) for image in p.images] or [fill]
        per_row.append(own + [own[-1]] * (views - len(own)))  # padded by repeating
      sequence_grids = jnp.asarray(per_row, jnp.int32)
    config = SamplingConfig(max_new_tokens=budget, stop_tokens=self.stop_ids,
                            pad_token=self.pad_id, cache_dtype=self.cache_dtype)
    with self._lock:
      self.programs.add((batch, length, budget, grids))
    graphdef, state = self.split
    out = _generate(graphdef, state, jnp.asarray(ids), jnp.asarray(mask), key, pixels,
                    sequence_grids, row_sampling, config, grids)
    return np.asarray(out.tokens)[:len(prompts)], batch

  def pixel_values(self, images) -> jax.Array:
    """The vision encoder's input of images at the policy's size, concatenated in order
    (each image preprocessed on its own: a program per image size)."""
    return jnp.concatenate([self._pixels(jnp.asarray(image)) for image in images])

  def reply(self, tokens: np.ndarray, prompt_tokens: int, max_tokens: int,
            stop: tuple[str, ...] = ()) -> Reply:
    """A row's reply: its first `max_tokens` tokens up to a stop token (not in the text)
    or the first stop string (cut there; the tokens counted up to the one completing
    it). finish_reason "stop" at either, else "length"."""
    tokens = [int(t) for t in tokens[:max_tokens]]
    end = next((k for k, t in enumerate(tokens) if t in self.stop_ids), None)
    if end is not None:
      used, finish, content = end + 1, "stop", tokens[:end]
    else:
      used, finish, content = len(tokens), "length", tokens
    text = self.decode(content)
    if stop:
      found = [(text.find(s), s) for s in stop if s in text]
      if found:
        cut, _ = min(found)
        text, finish = text[:cut], "stop"
        used = next(k for k in range(1, len(content) + 1)
                    if any(s in self.decode(content[:k]) for s in stop))
    return Reply(text, finish, used, prompt_tokens)

  def decode(self, tokens) -> str:
    """Text of tokens: ids past the tokenizer's (a padded vocabulary) have none; special
    tokens are skipped, as OpenAI-compatible servers do."""
    return self.tokenizer.decode([t for t in tokens if t < self.vocab],
                                 skip_special_tokens=True)
