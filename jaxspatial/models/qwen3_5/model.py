"""Qwen3.5: Qwen3-VL's vision encoder (no DeepStack) in front of the hybrid Gated DeltaNet /
gated-attention decoder. The policy interface is Qwen3-VL's; the decoder's cache is hybrid
(`text.TextModel.init_cache`); the multi-token-prediction tensors (`mtp.*`) of released
checkpoints are skipped on loading."""

from __future__ import annotations

from jaxspatial.models.qwen3_5 import hf_params
from jaxspatial.models.qwen3_5.config import Qwen35Config
from jaxspatial.models.qwen3_5.text import TextModel
from jaxspatial.models.qwen3_vl.model import Qwen3VL


class Qwen35(Qwen3VL):
  """`dtype`, `param_dtype`, `attention`, `remat`: as Qwen3VL's. Implements the policy
  interface (`jaxspatial.models.policy`)."""

  family = "qwen3_5"
  config_class = Qwen35Config
  text_class = TextModel
  checkpoint_shapes = staticmethod(hf_params.checkpoint_shapes)
  checkpoint_targets = staticmethod(hf_params.targets)
  skipped_tensors = hf_params.SKIPPED
