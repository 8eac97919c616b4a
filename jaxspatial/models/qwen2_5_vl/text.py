"""The Qwen2 text decoder of Qwen2.5-VL in Flax NNX: grouped-query attention with biased
q / k / v projections and sectioned M-RoPE, RMSNorm, SwiGLU MLP, tied or untied embeddings
(layers and the decoder loop: `jaxspatial.models.layers`, `jaxspatial.models.decoder`)."""

from __future__ import annotations

import jax

from jaxspatial.models import layers
from jaxspatial.models.decoder import TextDecoder
from jaxspatial.models.qwen2_5_vl.rope import mrope_cos_sin

Array = jax.Array


class Attention(layers.Attention):
  """Qwen2's: biased q / k / v, no o bias, no QK-norm."""

  def __init__(self, config, **options):
    super().__init__(config, bias=(True, False), **options)


class TextModel(TextDecoder):
  """Embeddings, Qwen2 decoder layers, final norm and the LM head."""

  attention_class = Attention
  mrope_cos_sin = staticmethod(mrope_cos_sin)
