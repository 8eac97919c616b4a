"""Qwen3.5 checkpoint layout: the tensors a config implies and where each goes in the NNX
model. Names, shard checks, dtype rules and loading are Qwen3-VL's (`qwen3_vl.hf_params`);
the vision encoder's tensors are Qwen3-VL's without DeepStack mergers. Released checkpoints
also hold the multi-token-prediction head (`mtp.*`), which this policy does not run: those
tensors are skipped, as transformers skips them.
"""

from __future__ import annotations

from jaxspatial.models.hf import (Shapes, Targets, attention_shapes, attention_targets,
                                  checked_targets, decoder_shapes, decoder_targets,
                                  linear_shape, linear_target)
from jaxspatial.models.qwen3_vl.hf_params import vision_shapes, vision_targets

__all__ = ["SKIPPED", "checkpoint_shapes", "targets"]

SKIPPED = ("mtp.",)
LINEAR_PROJECTIONS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")


def checkpoint_shapes(config) -> Shapes:
  """Every tensor a checkpoint of `config` (a Qwen35Config) holds, under its canonical name,
  with its shape in torch layout."""
  t = config.text

  def mixer(out, p, i):
    if t.layer_types[i] != "linear_attention":
      attention_shapes(out, p + "self_attn.", t, query_rows=2 * t.num_attention_heads * t.head_dim,
                       bias=(t.attention_bias,) * 2, qk_norm=True)
      return
    a, c, heads = p + "linear_attn.", t.hidden_size, t.linear_num_value_heads
    for name, rows in zip(LINEAR_PROJECTIONS, (t.conv_dim, t.value_dim, heads, heads)):
      linear_shape(out, a + name, rows, c, False)
    linear_shape(out, a + "out_proj", c, t.value_dim, False)
    out[a + "conv1d.weight"] = (t.conv_dim, 1, t.linear_conv_kernel_dim)
    out[a + "dt_bias"] = (heads,)
    out[a + "A_log"] = (heads,)
    out[a + "norm.weight"] = (t.linear_value_head_dim,)

  out = decoder_shapes(t, mixer)
  out.update(vision_shapes(config.vision))
  return out


def targets(model) -> Targets:
  """Every parameter of a Qwen35 under its canonical checkpoint name, with how the torch
  tensor maps onto it (`jaxspatial.models.hf.to_param`)."""

  def mixer(out, p, layer):
    if layer.kind != "linear_attention":
      attention_targets(out, p + "self_attn.", layer.self_attn)
      return
    a, attn = p + "linear_attn.", layer.linear_attn
    for name in LINEAR_PROJECTIONS:
      linear_target(out, a + name, getattr(attn, name))
    out[a + "conv1d.weight"] = (attn.conv_weight, "conv")
    out[a + "dt_bias"] = (attn.dt_bias, None)
    out[a + "A_log"] = (attn.A_log, None)
    out[a + "norm.weight"] = (attn.norm.weight, None)

  out = decoder_targets(model.language_model, mixer)
  out.update(vision_targets(model.visual))
  return checked_targets(model, out)
