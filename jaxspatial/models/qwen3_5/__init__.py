"""Qwen3.5 (dense) in Flax NNX: Qwen3-VL's vision encoder without DeepStack, and the hybrid
decoder of Gated DeltaNet linear attention (chunked and recurrent forms of the gated delta
rule) and gated full attention; checkpoint loading and export."""

from jaxspatial.errors import ModelFolderError
from jaxspatial.models.qwen3_5.config import (LAYER_TYPES, Qwen35Config, TextConfig,
                                              default_layer_types)
from jaxspatial.models.qwen3_5.delta_rule import (CHUNK_SIZE, FORMS, causal_conv, chunked,
                                                  gated_delta_rule, recurrent)
from jaxspatial.models.qwen3_5.export import save_pretrained, state_dict
from jaxspatial.models.qwen3_5.hf_params import checkpoint_shapes, targets
from jaxspatial.models.qwen3_5.model import Qwen35
from jaxspatial.models.qwen3_5.text import GatedAttention, GatedDeltaNet, TextModel

__all__ = ["CHUNK_SIZE", "FORMS", "GatedAttention", "GatedDeltaNet", "LAYER_TYPES",
           "ModelFolderError", "Qwen35", "Qwen35Config", "TextConfig", "TextModel", "causal_conv",
           "checkpoint_shapes", "chunked", "default_layer_types", "gated_delta_rule",
           "recurrent", "save_pretrained", "state_dict", "targets"]
