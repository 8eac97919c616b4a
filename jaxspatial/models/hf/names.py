"""The name map between Hugging Face checkpoint keys and NNX parameters.

A family describes its checkpoint twice, both by canonical key (`canonical_key`: the 4.x
names `model.*`, `visual.*`, `lm_head.weight`): `checkpoint_shapes(config)`, every tensor
with its torch-layout shape, and `targets(model)`, every parameter with how the torch
tensor maps onto it (None: as is; "t": a linear's kernel, transposed; "patch": the Conv3d
patch kernel, flattened and transposed; "conv": a depthwise Conv1d kernel). Loading and
export both walk `targets`, so neither matches key paths by pattern.
"""

from __future__ import annotations

import math
from typing import Callable

from flax import nnx

from jaxspatial.errors import ModelFolderError

Targets = dict[str, tuple[nnx.Param, str | None]]
Shapes = dict[str, tuple[int, ...]]


def canonical_key(key: str) -> str:
  """One name per tensor across the 4.x and 5.x layouts (4.x: model.*, visual.*)."""
  if key.startswith("model.visual."):
    return key[len("model."):]
  if key.startswith("model.language_model."):
    return "model." + key[len("model.language_model."):]
  return key


def hf_key(canonical: str) -> str:
  """The transformers 5.x name of a canonical key (what its `save_pretrained` writes)."""
  if canonical.startswith("visual."):
    return "model." + canonical
  if canonical.startswith("model."):
    return "model.language_model." + canonical[len("model."):]
  return canonical


def to_param(value, how: str | None):
  """A torch-layout tensor in our layout."""
  if how == "t":
    return value.T
  if how == "patch":
    return value.reshape(value.shape[0], -1).T
  if how == "conv":  # a depthwise Conv1d kernel [C, 1, K] as [K, C]
    return value[:, 0, :].T
  return value


def from_param(value, how: str | None, shape: tuple[int, ...]):
  """Our parameter value in torch layout of `shape`."""
  if how == "t":
    return value.T
  if how == "patch":
    return value.T.reshape(shape)
  if how == "conv":
    return value.T[:, None, :]
  return value


def torch_shape(shape: tuple[int, ...], how: str | None, stored: tuple[int, ...]):
  """The torch-layout shape a parameter of `shape` takes (`stored`: the checkpoint's, for
  the patch kernel's inner sizes)."""
  shape = tuple(shape)
  if how == "t":
    return shape[::-1]
  if how == "patch":
    inner = stored[1:] if math.prod(stored[1:]) == shape[0] else shape[:1]
    return shape[1:] + tuple(inner)
  if how == "conv":
    return (shape[1], 1, shape[0])
  return shape


def linear_target(out: Targets, prefix: str, layer) -> None:
  out[prefix + ".weight"] = (layer.kernel, "t")
  if layer.bias is not None:
    out[prefix + ".bias"] = (layer.bias, None)


def linear_shape(out: Shapes, prefix: str, rows: int, cols: int, bias: bool) -> None:
  out[prefix + ".weight"] = (rows, cols)
  if bias:
    out[prefix + ".bias"] = (rows,)


def checked_targets(model, out: Targets) -> Targets:
  """`out`, refused when some parameter of `model` has no checkpoint name in it."""
  covered = {id(param) for param, _ in out.values()}
  unnamed = [".".join(map(str, path)) for path, value in nnx.iter_graph(model)
             if isinstance(value, nnx.Param) and id(value) not in covered]
  if unnamed:  # a parameter without a checkpoint name would be left uninitialised
    raise ModelFolderError(f"{type(model).__name__} parameters without a checkpoint name: "
                           f"{unnamed[:5]}")
  return out


# --- the Qwen decoder (`jaxspatial.models.decoder.TextDecoder`) --------------------------

def attention_targets(out: Targets, prefix: str, attention) -> None:
  """q / k / v / o projections and, where the module has them, the QK-norms."""
  for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
    linear_target(out, prefix + name, getattr(attention, name))
  if attention.q_norm is not None:
    out[prefix + "q_norm.weight"] = (attention.q_norm.weight, None)
    out[prefix + "k_norm.weight"] = (attention.k_norm.weight, None)


def attention_shapes(out: Shapes, prefix: str, t, *, query_rows: int, bias: tuple[bool, bool],
                     qk_norm: bool) -> None:
  """What `attention_targets` names, for a decoder config `t`; `bias`: (q / k / v, o)."""
  d, c, kv = t.head_dim, t.hidden_size, t.num_key_value_heads * t.head_dim
  for name, rows in (("q_proj", query_rows), ("k_proj", kv), ("v_proj", kv)):
    linear_shape(out, prefix + name, rows, c, bias[0])
  linear_shape(out, prefix + "o_proj", c, t.num_attention_heads * d, bias[1])
  if qk_norm:
    out[prefix + "q_norm.weight"] = (d,)
    out[prefix + "k_norm.weight"] = (d,)


def decoder_targets(text, mixer: Callable[[Targets, str, nnx.Module], None]) -> Targets:
  """Embeddings, each layer's mixer (`mixer(out, "model.layers.i.", layer)`), MLP and
  norms, the final norm and an untied head."""
  out = {"model.embed_tokens.weight": (text.embed_tokens.embedding, None),
         "model.norm.weight": (text.norm.weight, None)}
  if text.lm_head is not None:
    out["lm_head.weight"] = (text.lm_head.kernel, "t")
  for i, layer in enumerate(text.layers):
    p = f"model.layers.{i}."
    mixer(out, p, layer)
    for name in ("gate_proj", "up_proj", "down_proj"):
      linear_target(out, p + "mlp." + name, getattr(layer.mlp, name))
    out[p + "input_layernorm.weight"] = (layer.input_layernorm.weight, None)
    out[p + "post_attention_layernorm.weight"] = (layer.post_attention_layernorm.weight, None)
  return out


def decoder_shapes(t, mixer: Callable[[Shapes, str, int], None]) -> Shapes:
  """What `decoder_targets` names, for a decoder config `t` (`mixer(out, prefix, i)`)."""
  c = t.hidden_size
  out = {"model.embed_tokens.weight": (t.vocab_size, c)}
  for i in range(t.num_hidden_layers):
    p = f"model.layers.{i}."
    mixer(out, p, i)
    out[p + "mlp.gate_proj.weight"] = (t.intermediate_size, c)
    out[p + "mlp.up_proj.weight"] = (t.intermediate_size, c)
    out[p + "mlp.down_proj.weight"] = (c, t.intermediate_size)
    out[p + "input_layernorm.weight"] = (c,)
    out[p + "post_attention_layernorm.weight"] = (c,)
  out["model.norm.weight"] = (c,)
  if not t.tie_word_embeddings:
    out["lm_head.weight"] = (t.vocab_size, c)
  return out
