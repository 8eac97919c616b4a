"""Models: the policy interface and its families (Qwen2.5-VL in qwen2_5_vl/, Qwen3-VL in
qwen3_vl/), the sampler, LoRA adapters, sharding rules, 3DThinker's latent block and 3D
projector; the dtype policy, attention implementations, memory estimates."""

from jaxspatial.models import memory
from jaxspatial.models.attention import IMPLEMENTATIONS as ATTENTION_IMPLEMENTATIONS
from jaxspatial.models.attention import attention, resolve as resolve_attention

from jaxspatial.models.latent3d import (Thinker3DPolicy, add_latent_tokens, expand_output_3d,
                                        grow_embeddings, image_token_rows, latent_label_mask,
                                        latent_positions)
from jaxspatial.models.lora import (LoRALinear, LoRATiedHead, apply_lora, linear_names, merge_lora,
                                   untie_adapted_head)
from jaxspatial.models.projector3d import (TINY, Projector3D, Projector3DConfig,
                                           alignment_loss, load_torch_state_dict, stage1_loss)
from jaxspatial.models.chat import ChatFormat, chat_format
from jaxspatial.models.memory import MemoryEstimate
from jaxspatial.models.policy import (FAMILIES, VisionOutput, export, load_model, load_policy,
                                      model_type, policy_class)
from jaxspatial.models.sampler import (DecodeState, Generation, SamplingConfig, append, decode,
                                       generate, prefill)
from jaxspatial.models.precision import Precision, model_options
from jaxspatial.models.sharding import RULES, logical_init, make_mesh, mesh_axes

__all__ = ["FAMILIES", "ChatFormat", "DecodeState", "Generation", "SamplingConfig", "VisionOutput", "append",
           "chat_format", "decode", "export", "generate", "load_model", "load_policy", "model_type",
           "policy_class", "prefill", "ATTENTION_IMPLEMENTATIONS", "MemoryEstimate", "Precision", "attention", "memory",
           "model_options", "resolve_attention", "RULES", "TINY", "LoRALinear", "LoRATiedHead",
           "Projector3D", "Projector3DConfig", "Thinker3DPolicy",
           "add_latent_tokens", "alignment_loss", "apply_lora", "expand_output_3d",
           "grow_embeddings", "image_token_rows", "latent_label_mask", "latent_positions",
           "linear_names", "load_torch_state_dict", "logical_init", "make_mesh", "merge_lora",
           "mesh_axes", "stage1_loss", "untie_adapted_head"]
