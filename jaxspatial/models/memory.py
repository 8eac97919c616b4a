"""Device memory a job will need, estimated before anything compiles.

Per device: parameters, gradients and optimizer state (AdamW's two float32 moments of the
trainable parameters) are split over the mesh's ('fsdp', 'tensor') axes as the sharding
rules split them; the rollout's KV cache and the training activations over the batch axes
('data', 'fsdp'). Activations are a model of what the backward pass keeps per decoder
layer (after Korthikanti et al., 2022: the matmul inputs, the MLP's gates, the attention
probabilities unless the attention is fused) plus the float32 logits and their
log-softmax (and their gradient); with remat a layer keeps its input only, and one layer's
activations (and their gradients) are live at a time. The vision tower's activations are left out (frozen in Think3D; small against
the text's at the papers' sizes). XLA's buffer assignment reuses and fuses, so the real
peak differs; the estimate is for learning before compiling that a batch will not fit.
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
from flax import nnx

GiB = 2 ** 30


def size(nbytes: int) -> str:
  return f"{nbytes / GiB:.2f} GiB" if nbytes >= GiB else f"{nbytes / 2 ** 20:.1f} MiB"


def _bytes(leaves) -> int:
  return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in leaves)


def parameter_bytes(model, wrt=nnx.Param) -> int:
  """Bytes of the model's parameters (an abstract model's too: shapes only)."""
  return _bytes(jax.tree.leaves(nnx.state(model, wrt)))


def parameter_count(model, wrt=nnx.Param) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, wrt)))


def kv_cache_bytes(text_config, batch: int, length: int, dtype) -> int:
  """Keys and values of every layer: [batch, length, kv_heads, head_dim] each."""
  c = text_config
  return (2 * c.num_hidden_layers * batch * length * c.num_key_value_heads * c.head_dim
          * jnp.dtype(dtype).itemsize)


def cache_bytes(model, batch: int, length: int, dtype) -> int:
  """The decode cache the model's own `init_cache` builds (shapes only, nothing allocated):
  keys and values of every attention layer, plus Qwen3.5's constant-size recurrent state
  and convolution inputs of its linear-attention layers."""
  cache = jax.eval_shape(lambda: model.language_model.init_cache(batch, length, dtype))
  return _bytes(jax.tree.leaves(cache))


def activation_bytes(text_config, batch: int, length: int, dtype, *, remat: bool = False,
                     fused_attention: bool = False) -> int:
  """What the backward pass of one micro-batch of `batch` x `length` tokens keeps."""
  c = text_config
  tokens, p = batch * length, jnp.dtype(dtype).itemsize
  kv = c.num_key_value_heads * c.head_dim
  # norm outputs (2, kept in float32 for the variance), q k v, attention output, o_proj
  # input, residual; MLP: gate, up, their product (and SiLU's input)
  per_token = (2 * c.hidden_size * 4 + (c.hidden_size + 2 * kv) * p + 3 * c.hidden_size * p
               + 4 * c.intermediate_size * p)
  if fused_attention:  # the kernel keeps a log-sum-exp per query and head
    attention = tokens * c.num_attention_heads * 4
  else:  # float32 scores and probabilities
    attention = 2 * batch * c.num_attention_heads * length * length * 4
  layer = tokens * per_token + attention
  logits = 3 * tokens * c.vocab_size * 4  # float32 logits, log-softmax and their gradient
  if remat:  # layer inputs, and one layer recomputed with its gradients
    return c.num_hidden_layers * tokens * c.hidden_size * p + 2 * layer + logits
  return c.num_hidden_layers * layer + layer + logits


def device_memory():
  """(bytes the first device can hold or None, its kind)."""
  device = jax.devices()[0]
  stats = None
  try:
    stats = device.memory_stats()
  except Exception:  # pylint: disable=broad-except
    pass  # some backends (CPU) have none
  limit = (stats or {}).get("bytes_limit")
  if not limit and device.platform == "cpu":  # the host's memory is the device's
    limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  return (int(limit) if limit else None), device.device_kind


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
  parameters: int
  gradients: int
  optimizer: int
  kv_cache: int
  activations: int
  device_bytes: int | None
  device_kind: str

  @property
  def total(self) -> int:
    # the rollout and the update run one after the other: the larger of the cache and the
    # activations is live with the parameters and optimizer state
    return self.parameters + self.gradients + self.optimizer + max(self.kv_cache,
                                                                   self.activations)

  @property
  def fits(self) -> bool | None:
    return None if self.device_bytes is None else self.total <= self.device_bytes

  def table(self) -> str:
    rows = [("parameters", self.parameters), ("gradients", self.gradients),
            ("optimizer state", self.optimizer), ("rollout KV cache", self.kv_cache),
            ("training activations", self.activations), ("peak (estimate)", self.total)]
    lines = [f"memory per device (estimate), {self.device_kind}:"]
    lines += [f"  {name:<22}{size(value):>12}" for name, value in rows]
    if self.device_bytes is None:
      lines.append("  device memory: not reported by this backend")
    else:
      verdict = "fits" if self.fits else "DOES NOT FIT: lower the batch, add micro-batches, remat or shard"
      lines.append(f"  {'device memory':<22}{size(self.device_bytes):>12}: {verdict}")
    return "\n".join(lines)


def estimate(model, precision, *, rollout_batch: int, cache_length: int, train_batch: int,
             train_length: int, micro_batches: int = 1, remat: bool = False,
             fused_attention: bool = False, trainable=nnx.Param, training: bool = True,
             mesh=None) -> MemoryEstimate:
  """The job's memory per device. `precision`: a `Precision`; `trainable`: the optimizer's
  `wrt` filter; `mesh` (or the one set by `jax.set_mesh`): how the work splits."""
  shape = dict(mesh.shape) if mesh is not None else dict(jax.sharding.get_abstract_mesh().shape)
  data = shape.get("data", 1) * shape.get("fsdp", 1)
  model_split = shape.get("fsdp", 1) * shape.get("tensor", 1)
  text = model.config.text
  trained = parameter_count(model, trainable) if training else 0
  per_micro = max(1, math.ceil(train_batch / micro_batches / data))
  activations = activation_bytes(text, per_micro, train_length, precision.compute, remat=remat,
                                 fused_attention=fused_attention) if training else 0
  limit, kind = device_memory()
  return MemoryEstimate(
      parameters=parameter_bytes(model) // model_split,
      gradients=4 * trained // model_split,
      optimizer=2 * 4 * trained // model_split,
      kv_cache=cache_bytes(model, math.ceil(rollout_batch / data), cache_length,
                           precision.cache),
      activations=activations, device_bytes=limit, device_kind=kind)
