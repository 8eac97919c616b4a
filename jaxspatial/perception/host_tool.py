"""Host tools: perception models outside the compiled program, called from inside it.

A `HostTool` wraps a host function over numpy batches with declared per-example output
shapes (fixed: padded, with valid masks and counts), so it can be called from jit, vmap and
a multi-device mesh through `jax.pure_callback`:

  ocr = HostTool("boxes", fn, outputs={"boxes": ((20, 4), jnp.float32), "count": ((), jnp.int32)})
  out = ocr(image=image_HxWx3, active=flag)        # one example's inputs (inside vmap: B)

Under `vmap` the tool makes one host call per batch: `fn` always receives arrays with a
leading batch axis (size 1 outside vmap) and returns a dict of arrays [B, *shape]. Rows
whose `active` input is False are the caller's to skip (the wrapper passes them through:
static shapes mean every episode reaches the call, lax.cond under vmap runs both sides).

Failures: each call gets `timeout_s` (the host function runs on a worker thread; a call
that overruns is abandoned, not killed: Python cannot kill a thread) and `retries` more
attempts. Then `on_error="raise"` fails the program with a `ToolError` naming the tool,
the input shapes and the cause; `on_error="flag"` returns zeros with the `failed` output
True for the batch, so a rollout survives and the trajectory records it (`TextTool` turns
it into the observation text "Error executing {tool}: tool failed: ..."). Call counts,
rows, failures and latency are in `stats()` (per tool, thread-safe).

`TextTool` is the form PERIA's perception tools take in a rollout: a host function
(image, bounding_box, and a text argument as its keyword when the model wrote one, e.g.
text_prompt="chair") -> observation text, tokenised on the host into `max_tokens` ids with
a mask (text is tokenised as text: special tokens spelled in it stay ordinary bytes).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxspatial.errors import ToolError

ON_ERROR = ("raise", "flag")


@dataclasses.dataclass
class ToolStats:
  calls: int = 0          # host calls (one per batch)
  rows: int = 0           # examples over all calls
  failures: int = 0       # calls that failed after their retries
  retries: int = 0        # attempts repeated
  seconds: float = 0.0    # total host time
  max_seconds: float = 0.0

  def as_dict(self, prefix: str) -> dict[str, float]:
    mean = self.seconds / self.calls if self.calls else 0.0
    return {f"{prefix}/calls": float(self.calls), f"{prefix}/rows": float(self.rows),
            f"{prefix}/failures": float(self.failures), f"{prefix}/retries": float(self.retries),
            f"{prefix}/mean_s": mean, f"{prefix}/max_s": self.max_seconds}


def _shapes(arrays: dict) -> str:
  return ", ".join(f"{k} {np.asarray(v).dtype}{list(np.shape(v))}" for k, v in arrays.items())


class HostTool:
  """A host function with fixed output shapes, callable under jit / vmap / a mesh.

  `fn(**inputs) -> dict[str, np.ndarray]`: inputs batched [B, ...], outputs [B, *shape].
  `outputs`: name -> (per-example shape, dtype). A `failed` [B] bool output is added."""

  def __init__(self, name: str, fn: Callable, outputs: dict, timeout_s: float = 60.0,
               retries: int = 1, on_error: str = "raise"):
    if on_error not in ON_ERROR:
      raise ValueError(f"HostTool {name!r}: on_error must be one of {ON_ERROR}, got "
                       f"{on_error!r}")
    if not timeout_s > 0 or retries < 0:
      raise ValueError(f"HostTool {name!r}: expected timeout_s > 0 and retries >= 0, got "
                       f"{timeout_s}, {retries}")
    if "failed" in outputs:
      raise ValueError(f"HostTool {name!r}: the output name 'failed' is the wrapper's")
    self.name, self.fn = name, fn
    self.outputs = {k: (tuple(int(d) for d in shape), jnp.dtype(dtype))
                    for k, (shape, dtype) in outputs.items()}
    self.timeout_s, self.retries, self.on_error = float(timeout_s), int(retries), on_error
    self._stats = ToolStats()
    self._lock = threading.Lock()
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4,
                                                       thread_name_prefix=f"tool-{name}")

  def stats(self) -> dict[str, float]:
    with self._lock:
      return self._stats.as_dict(f"tools/{self.name}")

  def __call__(self, **inputs):
    """Outputs for one example's `inputs` (jax arrays; under vmap, one host call for the
    batch). Returns a dict of the declared outputs and `failed` (bool)."""
    names = tuple(inputs)
    values = [jnp.asarray(v) for v in inputs.values()]
    ranks = tuple(v.ndim for v in values)
    result = {k: jax.ShapeDtypeStruct(shape, dtype) for k, (shape, dtype) in self.outputs.items()}
    result["failed"] = jax.ShapeDtypeStruct((), jnp.bool_)

    def host(*arrays):
      arrays = [np.asarray(a) for a in arrays]
      lead = np.broadcast_shapes(*(a.shape[:a.ndim - r] for a, r in zip(arrays, ranks)))
      size = int(np.prod(lead)) if lead else 1
      flat = {n: np.broadcast_to(a, lead + a.shape[a.ndim - r:]).reshape(
          (size,) + a.shape[a.ndim - r:]) for n, a, r in zip(names, arrays, ranks)}
      out = self.call_batch(flat)
      return {k: v.reshape(lead + v.shape[1:]) for k, v in out.items()}

    return jax.pure_callback(host, result, *values, vmap_method="expand_dims")

  def call_batch(self, inputs: dict) -> dict[str, np.ndarray]:
    """The host side: `inputs` batched [B, ...]; outputs checked against the declaration."""
    batch = next(iter(inputs.values())).shape[0] if inputs else 1
    start = time.perf_counter()
    cause, attempts = None, 0
    for attempt in range(self.retries + 1):
      attempts = attempt + 1
      future = self._pool.submit(self.fn, **inputs)
      try:
        out = self._checked(future.result(timeout=self.timeout_s), batch)
        break
      except concurrent.futures.TimeoutError:
        future.cancel()
        cause = f"no result within {self.timeout_s:g} s"
      except Exception as error:  # a backend's failure is reported, whatever it is
        cause = f"{type(error).__name__}: {str(error)[:500]}"
    else:
      out = None
    seconds = time.perf_counter() - start
    with self._lock:
      s = self._stats
      s.calls, s.rows, s.retries = s.calls + 1, s.rows + batch, s.retries + attempts - 1
      s.seconds, s.max_seconds = s.seconds + seconds, max(s.max_seconds, seconds)
      s.failures += out is None
    if out is not None:
      out["failed"] = np.zeros(batch, bool)
      return out
    message = (f"host tool {self.name!r} failed after {attempts} attempt(s) on inputs "
               f"{_shapes(inputs)}: {cause}")
    if self.on_error == "raise":
      raise ToolError(message)
    self.last_error = message
    failed = {k: np.zeros((batch,) + shape, dtype) for k, (shape, dtype) in self.outputs.items()}
    failed["failed"] = np.ones(batch, bool)
    return failed

  def _checked(self, out, batch: int) -> dict[str, np.ndarray]:
    if not isinstance(out, dict):
      raise TypeError(f"expected a dict of arrays, got {type(out).__name__}")
    missing = sorted(set(self.outputs) - set(out))
    if missing:
      raise ValueError(f"missing outputs {missing}")
    checked = {}
    for k, (shape, dtype) in self.outputs.items():
      value = np.asarray(out[k])
      if value.shape != (batch,) + shape:
        raise ValueError(f"output {k!r}: expected shape {(batch,) + shape}, got {value.shape}")
      checked[k] = value.astype(dtype, copy=False)
    return checked


def encode_text(tokenizer, text: str, max_tokens: int, pad_token: int = 0):
  """(ids [max_tokens] int32, mask [max_tokens] bool): `text` tokenised as plain text (a
  special token spelled in it stays bytes), cut to `max_tokens`."""
  try:
    ids = tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
  except TypeError:  # a tokenizer without the option
    ids = tokenizer.encode(text, add_special_tokens=False)
  ids = list(ids)[:max_tokens]
  out = np.full(max_tokens, pad_token, np.int32)
  out[:len(ids)] = ids
  mask = np.zeros(max_tokens, bool)
  mask[:len(ids)] = True
  return out, mask


# PERIA's text arguments by their public names (SAM 3's text tools, GroundingDINO): a
# TextTool's `text_key` input indexes this list.
TEXT_KEYS = ("text_prompt", "question")
GENERIC_ARGUMENTS = ("image_index", "bounding_box")  # a tool without declared arguments


def decode_text_bytes(row) -> str:
  """A -1 padded row of byte values as text (UTF-8, invalid bytes replaced)."""
  row = np.asarray(row).reshape(-1)
  end = int(np.argmax(row < 0)) if (row < 0).any() else row.size
  return bytes(row[:end].astype(np.uint8).tolist()).decode("utf-8", errors="replace")


class TextTool(HostTool):
  """A perception tool whose result is observation text: `fn(image_HxWx3 uint8, bounding_box
  [x1, y1, x2, y2] on the 0..scale grid or None, **text) -> str`, called for the active
  rows of a batch, `text` being the model's text argument as its keyword (one of
  `text_keys`, e.g. text_prompt="chair"; none when the call wrote none, so `fn(image,
  box)` serves tools without text); outputs `ids` [max_tokens] int32, `mask` [max_tokens]
  bool. A key the tool does not take is its host function's to refuse (the registry's
  tools answer with their error text, as PERIA's server fails on an unexpected keyword).
  A row whose call raised gets the text "Error executing {name}: tool failed: ..." (the
  model sees that its tool failed, as from PERIA's server); a batch-level failure
  (timeout) follows `on_error`. `arguments` (its public argument names, image_index
  first) and `optional` (those it may omit) describe it in the agent's system prompt;
  by default image_index and an optional bounding_box."""

  def __init__(self, name: str, fn: Callable, tokenizer, max_tokens: int = 128,
               timeout_s: float = 60.0, retries: int = 1, on_error: str = "flag",
               text_keys: tuple[str, ...] = TEXT_KEYS, arguments: tuple[str, ...] | None = None,
               optional: tuple[str, ...] | None = None):
    if max_tokens < 1:
      raise ValueError(f"TextTool {name!r}: max_tokens must be >= 1, got {max_tokens}")
    self.text_fn, self.tokenizer, self.max_tokens = fn, tokenizer, int(max_tokens)
    self.text_keys = tuple(text_keys)
    if len(set(self.text_keys)) < len(self.text_keys) or not all(
        isinstance(k, str) and k.isidentifier() for k in self.text_keys):
      raise ValueError(f"TextTool {name!r}: text_keys must be distinct keyword names, got "
                       f"{text_keys!r}")
    self.arguments = GENERIC_ARGUMENTS if arguments is None else tuple(arguments)
    self.optional = (("bounding_box",) if arguments is None and optional is None
                     else tuple(optional or ()))
    unknown = sorted(set(self.optional) - set(self.arguments))
    if unknown:
      raise ValueError(f"TextTool {name!r}: optional arguments {unknown} are not among its "
                       f"arguments {self.arguments}")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    self.pad_token = int(pad)
    super().__init__(name, self._rows, {"ids": ((max_tokens,), jnp.int32),
                                        "mask": ((max_tokens,), jnp.bool_)},
                     timeout_s=timeout_s, retries=retries, on_error=on_error)

  def text(self, image, bounding_box=None, **text) -> str:
    """One call's observation text (`text`: the model's text argument, e.g.
    text_prompt="chair"); a raising backend becomes the tool's error text."""
    try:
      result = self.text_fn(np.asarray(image, np.uint8), bounding_box, **text)
      if not isinstance(result, str):
        raise TypeError(f"expected the tool's text, got {type(result).__name__}")
      return result
    except Exception as error:  # the model sees the failure, the rollout goes on
      return f"Error executing {self.name}: tool failed: {type(error).__name__}: {error}"[:500]

  def _rows(self, image, box, has_box, active, text, text_key):
    batch = image.shape[0]
    ids = np.full((batch, self.max_tokens), self.pad_token, np.int32)
    mask = np.zeros((batch, self.max_tokens), bool)
    for b in np.flatnonzero(np.asarray(active, bool)):
      box_b = [float(v) for v in np.asarray(box[b]).reshape(-1)] if has_box[b] else None
      key = int(np.asarray(text_key[b]))
      written = ({self.text_keys[key]: decode_text_bytes(text[b])}
                 if 0 <= key < len(self.text_keys) else {})
      ids[b], mask[b] = encode_text(self.tokenizer, self.text(image[b], box_b, **written),
                                    self.max_tokens, self.pad_token)
    return {"ids": ids, "mask": mask}

  def __call__(self, image, box, has_box, active, text=None, text_key=None):
    """(ids, mask) for one episode: `image` [H, W, 3] uint8, `box` [4] (0..scale), `has_box`
    and `active` bool; `text` [N] int32 the text argument's bytes (-1 padded) and
    `text_key` its key's index in `text_keys` (-1: no text argument). A batch whose call
    failed (flag mode) shows the failure text."""
    if (text is None) != (text_key is None):
      raise ValueError(f"TextTool {self.name!r}: give text and text_key together (the bytes "
                       f"and which of {self.text_keys} the model wrote), got only "
                       + ("text" if text_key is None else "text_key"))
    if text is None:
      text, text_key = jnp.full((1,), -1, jnp.int32), jnp.asarray(-1, jnp.int32)
    text, text_key = jnp.asarray(text, jnp.int32), jnp.asarray(text_key, jnp.int32)
    if text.ndim != 1 or text_key.ndim != 0:
      raise ValueError(f"TextTool {self.name!r}: expected one episode's text [N] and "
                       f"text_key [], got shapes {text.shape} and {text_key.shape}")
    out = super().__call__(image=image, box=box, has_box=has_box, active=active, text=text,
                           text_key=text_key)
    fail_ids, fail_mask = encode_text(self.tokenizer, f"Error executing {self.name}: tool "
                                      "failed (no result from the host).", self.max_tokens,
                                      self.pad_token)
    failed = out["failed"]
    return (jnp.where(failed, jnp.asarray(fail_ids), out["ids"]),
            jnp.where(failed, jnp.asarray(fail_mask), out["mask"]) & active)
