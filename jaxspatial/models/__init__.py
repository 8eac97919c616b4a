"""Models: Qwen2.5-VL (in qwen2_5_vl/), LoRA adapters, sharding rules, 3DThinker's projector."""

from jaxspatial.models.latent3d import (GeometryStandInExtractor, VGGTExtractor, add_latent_tokens,
                                        expand_output_3d, grow_embeddings, latent_label_mask)
from jaxspatial.models.lora import LoRALinear, apply_lora, merge_lora
from jaxspatial.models.projector3d import (TINY, Projector3D, Projector3DConfig,
                                           alignment_loss, load_torch_state_dict, stage1_loss)
from jaxspatial.models.sharding import RULES, logical_init, make_mesh, mesh_axes

__all__ = ["RULES", "TINY", "GeometryStandInExtractor", "VGGTExtractor", "add_latent_tokens",
           "expand_output_3d", "grow_embeddings", "latent_label_mask", "LoRALinear", "Projector3D", "Projector3DConfig", "alignment_loss",
           "apply_lora", "load_torch_state_dict", "logical_init", "make_mesh", "merge_lora",
           "mesh_axes", "stage1_loss"]
