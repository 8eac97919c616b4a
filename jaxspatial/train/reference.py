"""The reference policy of GRPO's KL term, needed only when beta > 0.

Two kinds, as the papers use them:
  "frozen"         a copy of the parameters taken when GRPO starts (full fine-tuning);
  "lora_disabled"  the policy itself with every LoRA adapter switched off (3DThinker's
                   stage 2: the reference is the base model), so no second copy is held.

The frozen copy keeps the shardings of the parameters it copied; it is saved once with
the run's checkpoints (`Checkpointer.save_reference`) so a resumed run uses the same one.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspatial.train.logprobs import token_logprobs

Array = jax.Array
KINDS = ("frozen", "lora_disabled")


@functools.partial(jax.jit, static_argnames=("graph", "kind", "temperature"))
def _logprobs_with(graph, state, kind, values, batch, temperature):
  model = nnx.merge(graph, state)
  current = nnx.state(model, nnx.Param if kind == "frozen" else nnx.LoRAParam)
  nnx.replace_by_pure_dict(current, values)
  nnx.update(model, current)
  return jax.lax.stop_gradient(token_logprobs(model, batch.tokens, batch.attention_mask,
                                              batch.images, temperature))


@dataclasses.dataclass
class ReferencePolicy:
  kind: str
  params: dict | None = None  # "frozen": the copied parameters (a pure dict)

  @classmethod
  def create(cls, kind: str, model) -> "ReferencePolicy":
    if kind == "frozen":
      params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
      return cls(kind, jax.tree.map(jnp.copy, params))
    if kind == "lora_disabled":
      if not jax.tree.leaves(nnx.state(model, nnx.LoRAParam)):
        raise ValueError("ReferencePolicy('lora_disabled'): the model has no LoRA adapters; "
                         "apply_lora first or use the 'frozen' reference")
      return cls(kind)
    raise ValueError(f"ReferencePolicy: kind must be one of {KINDS}, got {kind!r}")

  @classmethod
  def frozen_for_run(cls, model, checkpointer) -> "ReferencePolicy":
    """The run's frozen reference: the one saved with its checkpoints when resuming, else a
    copy of the model's parameters now, saved."""
    reference = cls.create("frozen", model)
    saved = checkpointer.restore_reference(reference.params)
    if saved is None:
      checkpointer.save_reference(reference.params)
    else:
      reference.params = saved
    return reference

  def logprobs(self, model, batch, temperature: float = 1.0) -> Array:
    """[B, S] log-probabilities of the batch's tokens under the reference."""
    graph, state = nnx.split(model)
    if self.kind == "frozen":
      values = self.params
    else:  # B = A = 0 makes every adapter's update zero: the base model
      values = jax.tree.map(jnp.zeros_like, nnx.to_pure_dict(nnx.state(model, nnx.LoRAParam)))
    return _logprobs_with(graph, state, self.kind, values, batch, temperature)
