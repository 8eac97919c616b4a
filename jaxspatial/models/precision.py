"""The dtype policy: the computation's, the parameters' and the KV cache's dtypes.

Accelerator recipes compute in bfloat16 over float32 master weights (the optimizer updates
float32; every matmul reads a bf16 cast); CPU tests keep float32 throughout. bfloat16
parameters are for rollout-only or evaluation jobs: a training job refuses them, as bf16
weights swallow updates smaller than 2^-8 of the weight. Whatever the policy, logits,
log-probabilities, losses, rewards and advantages are float32 (the model casts logits up;
the losses and the RL statistics are written in float32).

Numerics of the GRPO ratio: the old log-probabilities are recomputed by the training
forward pass (`jaxspatial.train.batch_logprobs`), not taken from the sampler, so the
ratio is exactly 1 at the first update whatever the dtype. The sampler's own
log-probabilities (incremental, through the KV cache) agree with the recomputed ones to
1e-5 nats in float32 (measured 5e-7) and 1e-2 nats in bfloat16 (measured 2.4e-3, max over
tokens) on the tiny policy; bf16 logits stay within 0.02 of float32's (measured 5e-3)
(tests/models/test_precision.py).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def _getter(model_config):
  """get(key, default) over a dict, a ConfigDict or an object with attributes."""
  if hasattr(model_config, "get"):
    return model_config.get
  return lambda key, default: getattr(model_config, key, default)


def _dtype(field: str, name: str):
  if name not in DTYPES:
    raise ValueError(f"model.{field}: expected one of {sorted(DTYPES)}, got {name!r}")
  return DTYPES[name]


@dataclasses.dataclass(frozen=True)
class Precision:
  dtype: str = "float32"          # computation (activations, matmul inputs)
  param_dtype: str = "float32"    # parameters: float32 master weights when training
  cache_dtype: str = "float32"    # the rollout's KV cache

  def __post_init__(self):
    for field in ("dtype", "param_dtype", "cache_dtype"):
      _dtype(field, getattr(self, field))

  @classmethod
  def from_config(cls, model_config) -> "Precision":
    """From a config's `model` block (`dtype`, `param_dtype`, `cache_dtype`; float32 where
    a field is absent)."""
    get = _getter(model_config)
    return cls(dtype=get("dtype", "float32"), param_dtype=get("param_dtype", "float32"),
               cache_dtype=get("cache_dtype", "float32"))

  @property
  def compute(self):
    return _dtype("dtype", self.dtype)

  @property
  def params(self):
    return _dtype("param_dtype", self.param_dtype)

  @property
  def cache(self):
    return _dtype("cache_dtype", self.cache_dtype)

  def model_kwargs(self) -> dict:
    """`dtype` and `param_dtype` for `Qwen25VL(...)` / `Qwen25VL.from_pretrained(...)`."""
    return dict(dtype=self.compute, param_dtype=self.params)

  def check_trainable(self, job: str) -> "Precision":
    """Refuses bfloat16 parameters for a job that takes optimizer steps."""
    if self.param_dtype != "float32":
      raise ValueError(f"{job}: model.param_dtype {self.param_dtype!r} is for rollout-only or "
                       "evaluation jobs; training keeps float32 master weights (set "
                       "model.param_dtype=float32, model.dtype=bfloat16 for bf16 compute)")
    return self


def model_options(model_config) -> dict:
  """`Qwen25VL(...)` / `Qwen25VL.from_pretrained(...)` keywords from a config's `model`
  block: the dtype policy, `attention` ("auto") and `remat` (False)."""
  get = _getter(model_config)
  return dict(**Precision.from_config(model_config).model_kwargs(),
              attention=get("attention", "auto"), remat=bool(get("remat", False)))
