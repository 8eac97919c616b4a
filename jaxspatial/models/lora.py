"""LoRA adapters on chosen linear layers: y = W x + (alpha / r) B A dropout(x).

`apply_lora` wraps every `nnx.Linear` whose attribute name is in `targets` (e.g. q_proj,
v_proj) in place; the adapter's A and B are `nnx.LoRAParam`s, so an optimizer built
with `wrt=nnx.LoRAParam` trains the adapters alone. B starts at zero, so a fresh adapter
leaves the model unchanged. "lm_head" in `targets` adapts a text model's LM head; a tied
head (no `lm_head` layer: logits = h E^T) gets `LoRATiedHead`, an adapter on the logits
alone while the embedding E stays shared with the input lookup (PEFT's LoRA on a tied
`lm_head`, as 3DThinker's stage 2 trains it). `linear_names` lists a model's linear
layers (3DThinker's targets: all of the language model's, plus "lm_head"). `merge_lora`
folds B A into the base kernels and unwraps (a tied head's adapter cannot be folded into
the shared embedding: `untie_adapted_head` first gives the model its own LM head,
E^T + (alpha / r) A B, as an exported folder needs).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspatial.models.layers import tied_logits

Array = jax.Array


def _init_adapter(module, in_features: int, out_features: int, dtype, axes, rank: int,
                  alpha: float, dropout: float, rngs: nnx.Rngs) -> None:
  """A [in, rank] and B [rank, out] (B zero: a fresh adapter changes nothing), sharded by
  the base's (input, output) logical axes under a mesh, so the adapters are placed as the
  jitted steps will return them."""
  if rank <= 0:
    raise ValueError(f"LoRA rank must be positive, got {rank}")
  a_meta = {"out_sharding": (axes[0], None)} if axes else {}
  b_meta = {"out_sharding": (None, axes[1])} if axes else {}
  module.lora_a = nnx.LoRAParam(nnx.initializers.he_uniform()(rngs.params(),
                                                              (in_features, rank), dtype),
                                **a_meta)
  module.lora_b = nnx.LoRAParam(jnp.zeros((rank, out_features), dtype), **b_meta)
  module.scale = alpha / rank
  module.dropout = nnx.Dropout(dropout, rngs=rngs) if dropout > 0 else None


def _mesh_axes(param) -> tuple | None:
  return (None if jax.sharding.get_abstract_mesh().empty
          else param.get_metadata().get("out_sharding"))


def _low_rank(module, x: Array) -> Array:
  update = x if module.dropout is None else module.dropout(x)
  return (update @ module.lora_a[...] @ module.lora_b[...]) * module.scale


class LoRALinear(nnx.Module):
  def __init__(self, base: nnx.Linear, rank: int, alpha: float, dropout: float = 0.0, *,
               rngs: nnx.Rngs):
    self.base = base
    in_features, out_features = base.kernel[...].shape
    _init_adapter(self, in_features, out_features, base.kernel[...].dtype,
                  _mesh_axes(base.kernel), rank, alpha, dropout, rngs)

  def __call__(self, x: Array) -> Array:
    return self.base(x) + _low_rank(self, x)

  def merged(self) -> nnx.Linear:
    kernel = self.base.kernel[...]
    self.base.kernel[...] = kernel + (self.lora_a[...] @ self.lora_b[...] * self.scale).astype(
        kernel.dtype)
    return self.base


class LoRATiedHead(nnx.Module):
  """A LoRA adapter on a tied LM head: logits = h E^T + (alpha / r) (dropout(h) A) B, with
  E the (shared, unchanged) token embedding."""

  def __init__(self, embed: nnx.Embed, rank: int, alpha: float, dropout: float = 0.0, *,
               rngs: nnx.Rngs):
    self.embed = embed
    vocab, width = embed.embedding[...].shape
    axes = _mesh_axes(embed.embedding)  # (vocab, embed): the head maps embed -> vocab
    _init_adapter(self, width, vocab, embed.embedding[...].dtype,
                  axes[::-1] if axes else None, rank, alpha, dropout, rngs)

  def __call__(self, x: Array) -> Array:
    return tied_logits(self.embed, x) + _low_rank(self, x).astype(jnp.float32)


def _children(module):
  for name, child in vars(module).items():
    if isinstance(child, nnx.Module):
      yield module, name, child
    elif isinstance(child, (list, nnx.List)):
      for index, item in enumerate(child):
        if isinstance(item, nnx.Module):
          yield child, index, item


def linear_names(model: nnx.Module) -> tuple[str, ...]:
  """The attribute names of every `nnx.Linear` in `model` (sorted, each once)."""
  names, stack = set(), [model]
  while stack:
    for _, key, child in _children(stack.pop()):
      if isinstance(child, nnx.Linear) and isinstance(key, str):
        names.add(key)
      elif not isinstance(child, (nnx.Linear, LoRALinear, LoRATiedHead)):
        stack.append(child)
  return tuple(sorted(names))


def apply_lora(model: nnx.Module, targets: tuple[str, ...], rank: int, alpha: float,
               dropout: float = 0.0, *, rngs: nnx.Rngs) -> int:
  """Wraps the target linears in place (and, with "lm_head", a tied LM head); returns how
  many were adapted."""
  count = 0
  if ("lm_head" in targets and getattr(model, "lm_head", False) is None
      and isinstance(getattr(model, "embed_tokens", None), nnx.Embed)):
    # nnx.data: a tied model built lm_head as a static None.
    model.lm_head = nnx.data(LoRATiedHead(model.embed_tokens, rank, alpha, dropout, rngs=rngs))
    count += 1
  stack = [model]
  while stack:
    module = stack.pop()
    for parent, key, child in list(_children(module)):
      if isinstance(child, nnx.Linear) and isinstance(key, str) and key in targets:
        setattr(parent, key, LoRALinear(child, rank, alpha, dropout, rngs=rngs))
        count += 1
      elif not isinstance(child, (nnx.Linear, LoRALinear, LoRATiedHead)):
        stack.append(child)
  if count == 0:
    raise ValueError(f"apply_lora: no nnx.Linear named any of {targets}")
  return count


def untie_adapted_head(text_model: nnx.Module) -> bool:
  """Replaces a `LoRATiedHead` on `text_model.lm_head` by an untied `nnx.Linear` LM head of
  kernel E^T + (alpha / r) A B [embed, vocab] (its own parameter: the logits are unchanged,
  the input embedding stays E). Returns whether there was one. The caller's config must then
  say the head is untied (`tie_word_embeddings` false)."""
  head = getattr(text_model, "lm_head", None)
  if not isinstance(head, LoRATiedHead):
    return False
  table = head.embed.embedding[...]
  update = (head.lora_a[...].astype(jnp.float32) @ head.lora_b[...].astype(jnp.float32)
            ) * head.scale
  kernel = (table.astype(jnp.float32).T + update).astype(table.dtype)
  vocab, width = table.shape
  linear = nnx.Linear(width, vocab, use_bias=False, dtype=head.embed.dtype,
                      param_dtype=table.dtype, rngs=nnx.Rngs(0))
  linear.kernel[...] = kernel
  text_model.lm_head = nnx.data(linear)
  return True


def merge_lora(model: nnx.Module) -> int:
  """Folds every adapter into its base kernel and removes the wrappers."""
  count = 0
  stack = [model]
  while stack:
    module = stack.pop()
    for parent, key, child in list(_children(module)):
      if isinstance(child, LoRATiedHead):
        raise ValueError("merge_lora: the adapter on the tied LM head cannot be folded into "
                         "the embedding it shares with the input lookup")
      if isinstance(child, LoRALinear):
        merged = child.merged()
        if isinstance(key, str):
          setattr(parent, key, merged)
        else:
          parent[key] = merged
        count += 1
      else:
        stack.append(child)
  return count
