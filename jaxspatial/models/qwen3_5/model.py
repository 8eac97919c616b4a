"""Qwen3.5: Qwen3-VL's vision encoder (no DeepStack) in front of the hybrid Gated DeltaNet /
gated-attention decoder. The policy interface is Qwen3-VL's; the decoder's cache is hybrid
(`text.TextModel.init_cache`)."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from jaxspatial.models.qwen2_5_vl.hf_params import scan
from jaxspatial.models.qwen3_5.config import Qwen35Config
from jaxspatial.models.qwen3_5.hf_params import SKIPPED, checkpoint_shapes, targets
from jaxspatial.models.qwen3_5.text import TextModel
from jaxspatial.models.qwen3_vl.hf_params import load_weights
from jaxspatial.models.qwen3_vl.model import Qwen3VL
from jaxspatial.models.qwen3_vl.vision import VisionModel


class Qwen35(Qwen3VL):
  """`dtype`, `param_dtype`, `attention`, `remat`: as Qwen3VL's. Implements the policy
  interface (`jaxspatial.models.policy`)."""

  family = "qwen3_5"
  config_class = Qwen35Config

  def __init__(self, config: Qwen35Config, *, rngs: nnx.Rngs, dtype=jnp.float32,
               param_dtype=jnp.float32, attention: str = "auto", remat: bool = False):  # pylint: disable=super-init-not-called
    self.config = config
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype, attention=attention,
              remat=remat)
    self.visual = VisionModel(config.vision, **kw)
    self.language_model = TextModel(config.text, **kw)

  @classmethod
  def from_pretrained(cls, folder, *, dtype=jnp.float32, param_dtype=jnp.float32,
                      seed: int = 0, attention: str = "auto", remat: bool = False) -> "Qwen35":
    """Builds from `config.json` and loads the safetensors tensor by tensor, with Qwen3-VL's
    checks (config field by field, index and shard headers against the config, NaN / Inf
    refused as read); the multi-token-prediction tensors (`mtp.*`) are skipped."""
    config = Qwen35Config.from_hf(folder)
    tensors = scan(folder, checkpoint_shapes(config), config.text.tie_word_embeddings,
                   skip=SKIPPED)
    model = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(seed), dtype=dtype,
                                       param_dtype=param_dtype, attention=attention,
                                       remat=remat))
    load_weights(model, folder, tensors, targets(model))
    return model
