"""Qwen3.5 checkpoint layout: the tensors a config implies and where each goes in the NNX
model. Names, shard checks, dtype rules and loading are Qwen3-VL's (`qwen3_vl.hf_params`);
the vision encoder's tensors are Qwen3-VL's without DeepStack mergers. Released checkpoints
also hold the multi-token-prediction head (`mtp.*`), which this policy does not run: those
tensors are skipped, as transformers skips them.
"""

from __future__ import annotations

from flax import nnx

from jaxspatial.models.qwen3_vl.hf_params import (CheckpointError, _linear, _linear_shapes,
                                                  checked_targets, vision_shapes,
                                                  vision_targets)

__all__ = ["CheckpointError", "SKIPPED", "checkpoint_shapes", "targets"]

SKIPPED = ("mtp.",)


def checkpoint_shapes(config) -> dict[str, tuple[int, ...]]:
  """Every tensor a checkpoint of `config` (a Qwen35Config) holds, under its canonical name,
  with its shape in torch layout."""
  t = config.text
  d, c = t.head_dim, t.hidden_size
  out = {"model.embed_tokens.weight": (t.vocab_size, c)}
  for i, kind in enumerate(t.layer_types):
    p = f"model.layers.{i}."
    if kind == "linear_attention":
      a = p + "linear_attn."
      heads = t.linear_num_value_heads
      _linear_shapes(out, a + "in_proj_qkv", t.conv_dim, c, False)
      _linear_shapes(out, a + "in_proj_z", t.value_dim, c, False)
      _linear_shapes(out, a + "in_proj_b", heads, c, False)
      _linear_shapes(out, a + "in_proj_a", heads, c, False)
      _linear_shapes(out, a + "out_proj", c, t.value_dim, False)
      out[a + "conv1d.weight"] = (t.conv_dim, 1, t.linear_conv_kernel_dim)
      out[a + "dt_bias"] = (heads,)
      out[a + "A_log"] = (heads,)
      out[a + "norm.weight"] = (t.linear_value_head_dim,)
    else:
      a = p + "self_attn."
      _linear_shapes(out, a + "q_proj", 2 * t.num_attention_heads * d, c, t.attention_bias)
      _linear_shapes(out, a + "k_proj", t.num_key_value_heads * d, c, t.attention_bias)
      _linear_shapes(out, a + "v_proj", t.num_key_value_heads * d, c, t.attention_bias)
      _linear_shapes(out, a + "o_proj", c, t.num_attention_heads * d, t.attention_bias)
      out[a + "q_norm.weight"] = (d,)
      out[a + "k_norm.weight"] = (d,)
    out[p + "mlp.gate_proj.weight"] = (t.intermediate_size, c)
    out[p + "mlp.up_proj.weight"] = (t.intermediate_size, c)
    out[p + "mlp.down_proj.weight"] = (c, t.intermediate_size)
    out[p + "input_layernorm.weight"] = (c,)
    out[p + "post_attention_layernorm.weight"] = (c,)
  out["model.norm.weight"] = (c,)
  if not t.tie_word_embeddings:
    out["lm_head.weight"] = (t.vocab_size, c)
  out.update(vision_shapes(config.vision))
  return out


def targets(model) -> dict[str, tuple[nnx.Param, str | None]]:
  """Every parameter of a Qwen35 under its canonical checkpoint name, with how the torch
  tensor maps onto it (`qwen3_vl.hf_params.to_param`)."""
  text = model.language_model
  out = {"model.embed_tokens.weight": (text.embed_tokens.embedding, None),
         "model.norm.weight": (text.norm.weight, None)}
  if text.lm_head is not None:
    out["lm_head.weight"] = (text.lm_head.kernel, "t")
  for i, layer in enumerate(text.layers):
    p = f"model.layers.{i}."
    if layer.kind == "linear_attention":
      a, mixer = p + "linear_attn.", layer.linear_attn
      for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
        _linear(out, a + name, getattr(mixer, name))
      out[a + "conv1d.weight"] = (mixer.conv_weight, "conv")
      out[a + "dt_bias"] = (mixer.dt_bias, None)
      out[a + "A_log"] = (mixer.A_log, None)
      out[a + "norm.weight"] = (mixer.norm.weight, None)
    else:
      a, mixer = p + "self_attn.", layer.self_attn
      for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        _linear(out, a + name, getattr(mixer, name))
      out[a + "q_norm.weight"] = (mixer.q_norm.weight, None)
      out[a + "k_norm.weight"] = (mixer.k_norm.weight, None)
    for name in ("gate_proj", "up_proj", "down_proj"):
      _linear(out, p + "mlp." + name, getattr(layer.mlp, name))
    out[p + "input_layernorm.weight"] = (layer.input_layernorm.weight, None)
    out[p + "post_attention_layernorm.weight"] = (layer.post_attention_layernorm.weight, None)
  out.update(vision_targets(model.visual))
  return checked_targets(model, out)
