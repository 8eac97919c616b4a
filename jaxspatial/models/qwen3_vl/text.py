"""The Qwen3 text decoder of Qwen3-VL in Flax NNX.

Grouped-query attention with QK-norm (RMSNorm over each head's `head_dim` on queries and
keys, before the rotary), q / k / v / o biases only where `attention_bias` says, interleaved
M-RoPE, RMSNorm, SwiGLU MLP, tied or untied embeddings. DeepStack: `residuals[k]` (the
vision encoder's k-th DeepStack features placed at the image tokens, zero elsewhere) is
added to the hidden state after decoder layer k, as transformers adds them at the visual
positions. Layers and the decoder loop: `jaxspatial.models.layers`, `.decoder`.
"""

from __future__ import annotations

import jax

from jaxspatial.models import layers
from jaxspatial.models.decoder import TextDecoder
from jaxspatial.models.qwen3_vl.rope import mrope_cos_sin

Array = jax.Array


class Attention(layers.Attention):
  """Qwen3's: QK-norm, biases where `attention_bias` says."""

  def __init__(self, config, **options):
    super().__init__(config, bias=(config.attention_bias,) * 2, norm=layers.RMSNorm,
                     **options)


class TextModel(TextDecoder):
  """Embeddings, Qwen3 decoder layers, final norm and the LM head."""

  attention_class = Attention
  mrope_cos_sin = staticmethod(mrope_cos_sin)
