"""Continuous batching: requests enter and leave a fixed set of decode slots
(`serving.slots`) between decode steps, so a short reply never waits for a long one and a
free slot is refilled at once.

One worker thread loops: drop what was cancelled (a waiting request unrun; a running one's
slot freed at once), admit waiting requests into free slots (a prefill per request), run
`steps` decode steps of every running slot, hand each finished reply to its future. A
request's sampling settings and key are data (per-row arrays): the compiled programs are
one decode program, a prefill per prompt-length bucket (powers of two from `min_length`,
and the capacity) and image grids, and an append per segment bucket.

A slot whose request ended keeps its cache (the prompt and the reply it wrote). A later
prompt that extends it (a conversation's next turn: the same history plus the reply and
new messages) goes into that slot and appends only what is new, from the end of the reply
when the prompt repeats it token for token, else from the end of the previous prompt; the
least recently used kept slot is the one refilled when none is free. So agent episodes
batch and reuse their caches at once.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import dataclasses
import hashlib
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np

from jaxspatial.models.sampler import RowSampling
from jaxspatial.serving import memory
from jaxspatial.serving import slots as slot_programs
from jaxspatial.serving.engine import Engine, Reply, Sampling, next_power
from jaxspatial.serving.prompt import Prompt


# Schedulers not closed yet: closed at exit, so no worker is torn down mid-call.
_OPEN: "weakref.WeakSet[Scheduler]" = weakref.WeakSet()


@atexit.register
def _close_open() -> None:
  for scheduler in list(_OPEN):
    scheduler.close()


# The most likely tokens a step can report (OpenAI's top_logprobs limit): one decode
# program computes them for every row when any running request asks.
TOP_LOGPROBS = 20

# The smallest vision-token bucket of a request's images.
MIN_VISION_TOKENS = 64

# The smallest decode window (slots attention reads; doubling up to the capacity).
MIN_WINDOW = 256

# A slot's tokens by default: every slot holds this many in its KV cache, and decode
# attends over all of them (launch.serve --max_context sets it).
DEFAULT_CONTEXT = 8192


def image_digest(image: np.ndarray) -> bytes:
  """An image's identity for prefix matching: its shape, dtype and bytes."""
  image = np.ascontiguousarray(image)
  return hashlib.blake2b(repr((image.shape, image.dtype.str)).encode() + image.tobytes(),
                         digest_size=16).digest()


class QueueFull(RuntimeError):
  """`max_queue` requests wait already (the server's 429)."""


@dataclasses.dataclass(eq=False)  # compared by identity (queue removal)
class _Request:
  prompt: Prompt
  max_tokens: int
  sampling: Sampling
  stop: tuple
  seed: int | None
  future: concurrent.futures.Future
  on_tokens: object              # callable(token ids, log-probabilities, tops) or None
  top_logprobs: int = 0          # most likely tokens reported per step
  digests: tuple = ()
  tokens: list = dataclasses.field(default_factory=list)
  logprobs: list = dataclasses.field(default_factory=list)
  tops: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(eq=False)
class _Slot:
  request: _Request | None = None   # running
  ids: np.ndarray | None = None     # what the cache holds: the prompt, then written tokens
  prompt_length: int = 0
  digests: tuple = ()               # the prompt's images, in order
  used: int = 0                     # admission counter when last filled (LRU)


class Scheduler:
  """Serves prompts of `engine`'s policy by continuous batching over `slots` rows of
  `capacity` tokens (prompt and reply). `steps`: decode steps per program call (a slot
  freed mid-call waits for its end); `reuse`: kept slots serve conversations' next turns.
  At most `max_queue` requests wait (more: QueueFull). `memory_budget`: bytes a prompt's
  prefill may take (`memory.prefill_bytes`; None: unchecked); a prompt over it is refused
  at submit."""

  def __init__(self, engine: Engine, slots: int = 8, capacity: int = DEFAULT_CONTEXT,
               steps: int = 4,
               seed: int = 0, max_queue: int = 256, min_segment: int = 32,
               reuse: bool = True, memory_budget: int | None = None):
    if slots < 1 or capacity < 2 or steps < 1:
      raise ValueError(f"Scheduler: slots >= 1, capacity >= 2 and steps >= 1 expected, got "
                       f"slots={slots}, capacity={capacity}, steps={steps}")
    self.engine, self.capacity, self.steps = engine, int(capacity), int(steps)
    self.max_queue, self.min_segment, self.reuse = int(max_queue), int(min_segment), reuse
    self.memory_budget = memory_budget
    self._rows = [_Slot() for _ in range(int(slots))]
    self._key = jax.random.PRNGKey(seed)
    self._queue: collections.deque[_Request] = collections.deque()
    self._cond = threading.Condition()
    self._stop = False
    self._admitted = 0
    self._counts = collections.Counter()
    self._programs: set = set()
    self._state = None
    self._thread = threading.Thread(target=self._run, name="chat-scheduler", daemon=True)
    self._thread.start()
    _OPEN.add(self)

  @property
  def slots(self) -> int:
    return len(self._rows)

  # --- requests --------------------------------------------------------------------------

  def check(self, prompt: Prompt, max_tokens: int) -> None:
    """ValueError when the prompt and `max_tokens` do not fit a slot."""
    if len(prompt.ids) < 1 or max_tokens < 1:
      raise ValueError(f"expected a prompt and max_tokens >= 1, got {len(prompt.ids)} prompt "
                       f"tokens and max_tokens {max_tokens}")
    if len(prompt.ids) + max_tokens > self.capacity:
      raise ValueError(f"the prompt's {len(prompt.ids)} tokens and max_tokens {max_tokens} "
                       f"exceed a slot's capacity of {self.capacity} tokens")
    if self.memory_budget is not None:
      bucket = self._segment(len(prompt.ids), 0)
      model = self.engine.model
      need = memory.prefill_bytes(model, bucket, tuple(memory.image_patches(model, image.shape)
                                                       for image in prompt.images),
                                  self.engine.cache_dtype)
      if need > self.memory_budget:
        raise ValueError(f"the prompt's {len(prompt.ids)} tokens (prefilled as {bucket}) and "
                         f"{len(prompt.images)} images need about {memory.gigabytes(need)} "
                         f"to prefill, over this server's prefill memory budget of "
                         f"{memory.gigabytes(self.memory_budget)}")

  def submit(self, prompt: Prompt, max_tokens: int, sampling: Sampling = Sampling(),
             stop=(), seed: int | None = None, on_tokens=None,
             top_logprobs: int = 0) -> concurrent.futures.Future:
    """A future of the `Reply` (its tokens' log-probabilities, and the `top_logprobs` most
    likely tokens at each step, up to TOP_LOGPROBS). `on_tokens(ids, logprobs, tops)` is
    called from the worker with each run of new tokens as they are generated (streaming);
    cancelling the future drops the request, or frees its slot if it runs."""
    self.check(prompt, int(max_tokens))
    if not 0 <= top_logprobs <= TOP_LOGPROBS:
      raise ValueError(f"top_logprobs: expected 0 to {TOP_LOGPROBS}, got {top_logprobs}")
    future = concurrent.futures.Future()
    request = _Request(prompt, int(max_tokens), sampling, tuple(stop), seed, future, on_tokens,
                       int(top_logprobs), tuple(image_digest(image) for image in prompt.images))
    with self._cond:
      if self._stop:
        raise RuntimeError("the scheduler is stopped")
      waiting = sum(not r.future.cancelled() for r in self._queue)
      if waiting >= self.max_queue:
        self._counts["rejected"] += 1
        raise QueueFull(f"{waiting} requests are waiting, this server's limit "
                        f"(max_queue {self.max_queue})")
      self._queue.append(request)
      self._counts["requests"] += 1
      self._cond.notify()
    return future

  def generate(self, prompt: Prompt, max_tokens: int, sampling: Sampling = Sampling(),
               stop=(), seed: int | None = None) -> Reply:
    return self.submit(prompt, max_tokens, sampling, stop, seed).result()

  def stats(self) -> dict:
    """requests, completed, failed, rejected (queue full), cancelled (waiting or running),
    waiting, running, slots, prefills, appends (turns that reused a kept slot),
    prefilled_tokens, reused_tokens, decode_calls, decode_steps (row steps run), programs
    (compiled so far: decode, prefill per bucket and grids, append per bucket and grids)."""
    with self._cond:
      counts = dict(self._counts)
      waiting = sum(not r.future.cancelled() for r in self._queue)
      running = sum(row.request is not None for row in self._rows)
      programs = sorted(self._programs, key=repr)
    names = ("requests", "completed", "failed", "rejected", "cancelled", "prefills", "appends",
             "prefilled_tokens", "reused_tokens", "decode_calls", "decode_steps")
    return {**{name: counts.get(name, 0) for name in names}, "waiting": waiting,
            "running": running, "slots": self.slots, "capacity": self.capacity,
            "programs": len(programs), "program_list": [list(map(str, p)) for p in programs]}

  def close(self) -> None:
    with self._cond:
      self._stop = True
      self._cond.notify()
    self._thread.join(timeout=30)
    _OPEN.discard(self)

  # --- the worker ------------------------------------------------------------------------

  def _run(self) -> None:
    while True:
      with self._cond:
        while not self._stop and not self._queue and not any(r.request for r in self._rows):
          self._cond.wait()
        if self._stop:
          self._fail_all(RuntimeError("the server is stopping"))
          return
      try:
        self._drop_cancelled()
        self._admit()
        if any(row.request is not None for row in self._rows):
          self._decode()
      except Exception as error:  # pylint: disable=broad-except
        # The slots were donated to the failed call: their content is gone, so every
        # running request fails with the error and the slots start afresh. Waiting
        # requests are untouched and the worker goes on.
        self._reset(error)

  def _fail_all(self, error) -> None:
    for request in self._queue:
      _resolve(request.future, error=error)
    self._queue.clear()
    for row in self._rows:
      if row.request is not None:
        _resolve(row.request.future, error=error)
        row.request = None

  def _reset(self, error) -> None:
    """After a program failed with the slots donated: running requests fail, no cache is
    kept, the slots start afresh."""
    with self._cond:
      for row in self._rows:
        if row.request is not None:
          _resolve(row.request.future, error=error)
          self._counts["failed"] += 1
        row.request, row.ids = None, None
    self._state = None

  def _call(self, program, *args):
    """program(graphdef, params, slots, *args) -> (slots, ...) or slots; the slot state
    replaced by the result. A failure that consumed the donated slots resets them."""
    graphdef, params = self.engine.split
    state = self._slots()
    try:
      out = program(graphdef, params, state, *args)
    except Exception as error:
      if any(leaf.is_deleted() for leaf in jax.tree.leaves(state)):
        self._reset(error)
      raise
    self._state = out[0] if isinstance(out, tuple) else out
    return out

  def _drop_cancelled(self) -> None:
    with self._cond:
      for row in self._rows:
        if row.request is not None and row.request.future.cancelled():
          row.request, row.ids = None, None  # what it wrote is not a reply: not kept
          self._counts["cancelled"] += 1

  def _slots(self):
    if self._state is None:
      graphdef, params = self.engine.split
      self._state = slot_programs.init_slots(graphdef, params, self.slots, self.capacity,
                                             self.engine.cache_dtype)
    return self._state

  def _admit(self) -> None:
    while True:
      with self._cond:
        if not self._queue:
          return
        request = self._queue[0]
        if request.future.cancelled():
          self._queue.popleft()
          self._counts["cancelled"] += 1
          continue
        choice = self._place(request)
        if choice is None:
          return  # every slot runs: the request waits for one to free
        self._queue.popleft()
        index, base, restore = choice
        row = self._rows[index]
        row.request = request
        self._admitted += 1
        row.used = self._admitted
      try:
        self._fill(index, row, request, base, restore)
      except Exception as error:  # pylint: disable=broad-except
        # This request fails (a bad input, an allocation); the rows go on (`_call`).
        with self._cond:
          if row.request is request:
            row.request, row.ids = None, None
            self._counts["failed"] += 1
        _resolve(request.future, error=error)

  def _place(self, request: _Request):
    """(row, tokens of the row's cache kept, restore to its prompt boundary) for a request,
    or None when every row runs."""
    ids, n = request.prompt.ids, len(request.prompt.ids)
    best = None
    if self.reuse:
      for index, row in enumerate(self._rows):
        if row.request is not None or row.ids is None:
          continue
        k = len(row.digests)
        if request.digests[:k] != row.digests:
          continue
        for base, restore in ((len(row.ids), False), (row.prompt_length, True)):
          if (base < n and self._segment(n, base) >= n - base
              and np.array_equal(ids[:base], row.ids[:base])
              and (best is None or base > best[1])):
            best = (index, base, restore)
            break
    if best is not None:
      return best
    free = [i for i, row in enumerate(self._rows) if row.request is None]
    if not free:
      return None
    index = min(free, key=lambda i: (self._rows[i].ids is not None, self._rows[i].used))
    return index, 0, False

  def _segment(self, n: int, base: int) -> int:
    """The padded length of a prompt's n - base new tokens after `base` kept ones."""
    if base == 0:
      return min(next_power(n, self.engine.min_length), self.capacity)
    return min(next_power(n - base, self.min_segment), self.capacity - base)

  def _key_for(self, request: _Request):
    if request.seed is not None:
      return jax.random.PRNGKey(request.seed % (1 << 32))
    self._key, key = jax.random.split(self._key)
    return key

  def _vision(self, images):
    """(vision tokens of the images in order, padded to a power of two; their grids
    [1, K, 3], K padded to a power of two by repeating; the bucket) or Nones: data to the
    prefill, so image sizes compile only their encoder."""
    if not images:
      return None, None, ()
    graphdef, params = self.engine.split
    model = self.engine.model
    grids = [model.image_grid(image.shape[:2]) for image in images]
    encoded = []
    for image, grid in zip(images, grids):
      self._programs.add(("encode", grid))
      encoded.append(slot_programs.encode_image(graphdef, params,
                                                self.engine.pixel_values([image]), grid))
    counts = [tokens.tokens_NxC.shape[0] for tokens in encoded]
    width = next_power(sum(counts), MIN_VISION_TOKENS)
    buffer = jax.tree.map(lambda t: jnp.zeros(t.shape[:-2] + (width,) + t.shape[-1:], t.dtype),
                          encoded[0])
    offset = 0
    for tokens, count in zip(encoded, counts):
      buffer = slot_programs.write_tokens(buffer, tokens, jnp.int32(offset))
      offset += count
    k = next_power(len(grids), 1)
    padded = grids + [grids[-1]] * (k - len(grids))
    return buffer, jnp.asarray([padded], jnp.int32), (width, k)

  def _fill(self, index: int, row: _Slot, request: _Request, base: int, restore: bool):
    ids = np.asarray(request.prompt.ids, np.int32)
    key = self._key_for(request)
    kept_images = len(row.digests) if base else 0
    vision, sequence_grids, bucket = self._vision(request.prompt.images[kept_images:])
    length = self._segment(len(ids), base)
    padded, mask, real = _right_padded(ids[base:], length, self.engine.pad_id)
    at = jnp.asarray(index, jnp.int32)
    if base == 0:
      self._programs.add(("prefill", length, bucket))
      self._call(slot_programs.prefill_into, at, padded, mask, real, vision, sequence_grids,
                 key, self.engine.cache_dtype)
      self._counts["prefills"] += 1
    else:
      window = min(next_power(base + length, MIN_WINDOW), self.capacity + 1)
      self._programs.add(("append", length, bucket, window))
      self._call(slot_programs.append_into, at, jnp.asarray(restore), padded, mask, real,
                 vision, sequence_grids, key, window)
      self._counts["appends"] += 1
      self._counts["reused_tokens"] += base
    self._counts["prefilled_tokens"] += len(ids) - base
    row.ids, row.prompt_length, row.digests = ids, len(ids), request.digests

  def _decode(self) -> None:
    running = [(i, row.request) for i, row in enumerate(self._rows) if row.request is not None]
    live = np.zeros(self.slots, bool)
    remaining = np.zeros(self.slots, np.int32)
    temperature = np.zeros(self.slots, np.float32)
    top_k = np.zeros(self.slots, np.int32)
    top_p = np.ones(self.slots, np.float32)
    for i, request in running:
      live[i] = True
      remaining[i] = request.max_tokens - len(request.tokens)
      s = request.sampling
      temperature[i], top_k[i], top_p[i] = s.temperature, s.top_k, s.top_p
    top = TOP_LOGPROBS if any(request.top_logprobs for _, request in running) else 0
    # The slots the live rows reach in this call, plus the scratch slot: attention reads
    # that window, a power of two, not the whole capacity.
    reach = max(len(self._rows[i].ids) + min(self.steps, int(remaining[i])) for i, _ in running)
    window = min(next_power(reach + 1, MIN_WINDOW), self.capacity + 1)
    self._programs.add(("decode", self.steps, top, window))
    _, tokens, logps, lives, top_logps, top_ids = self._call(
        slot_programs.decode_steps, jnp.asarray(live), jnp.asarray(remaining),
        RowSampling.create(temperature, top_k, top_p), self.steps, self.engine.stop_ids,
        self.engine.pad_id, top, window)
    tokens, logps, lives = np.asarray(tokens), np.asarray(logps), np.asarray(lives)
    top_logps, top_ids = np.asarray(top_logps), np.asarray(top_ids)
    self._counts["decode_calls"] += 1
    self._counts["decode_steps"] += int(lives.sum())
    for i, request in running:
      row = self._rows[i]
      new = tokens[i][lives[i]].tolist()
      new_logps = logps[i][lives[i]].tolist()
      k = request.top_logprobs
      new_tops = [tuple(zip(ids[:k].tolist(), values[:k].tolist())) for ids, values in
                  zip(top_ids[i][lives[i]], top_logps[i][lives[i]])] if k else [()] * len(new)
      row.ids = np.concatenate([row.ids, np.asarray(new, np.int32)])
      request.tokens += new
      request.logprobs += new_logps
      request.tops += new_tops
      if request.on_tokens is not None and new:
        try:
          request.on_tokens(new, new_logps, new_tops)
        except Exception as error:  # pylint: disable=broad-except
          # The consumer failed (a stream's client went away): this request ends.
          with self._cond:
            row.request, row.ids = None, None
            self._counts["failed"] += 1
          _resolve(request.future, error=error)
          continue
      if self._finished(request):
        reply = self.engine.reply(np.asarray(request.tokens), len(request.prompt.ids),
                                  request.max_tokens, request.stop)
        n = reply.completion_tokens
        if n and request.tokens[n - 1] in self.engine.stop_ids:
          n -= 1  # the stop id is not in the text
        reply = dataclasses.replace(reply, tokens=tuple(request.tokens[:n]),
                                    logprobs=tuple(request.logprobs[:n]),
                                    top_logprobs=tuple(request.tops[:n]))
        with self._cond:
          row.request = None
          self._counts["completed"] += 1
        _resolve(request.future, result=reply)

  def _finished(self, request: _Request) -> bool:
    tokens = request.tokens
    if len(tokens) >= request.max_tokens or (tokens and tokens[-1] in self.engine.stop_ids):
      return True
    return bool(request.stop) and any(s in self.engine.decode(tokens) for s in request.stop)


def _resolve(future, result=None, error=None) -> None:
  """Sets a future's outcome unless it was cancelled meanwhile (futures stay pending while
  their request runs, so a client can cancel a running request)."""
  try:
    if error is not None:
      future.set_exception(error)
    else:
      future.set_result(result)
  except concurrent.futures.InvalidStateError:
    pass


def _right_padded(ids: np.ndarray, length: int, pad_id: int):
  """([1, length] ids, mask, real length []): the padding's slots are written over next."""
  padded = np.full((1, length), pad_id, np.int32)
  mask = np.zeros((1, length), bool)
  padded[0, :len(ids)] = ids
  mask[0, :len(ids)] = True
  return jnp.asarray(padded), jnp.asarray(mask), jnp.asarray(len(ids), jnp.int32)


__all__ = ["DEFAULT_CONTEXT", "QueueFull", "Scheduler", "TOP_LOGPROBS"]
