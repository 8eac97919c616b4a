"""Models: 3DThinker's 3D projector (the Qwen2.5-VL policy lands with issue 5)."""

from jaxspatial.models.projector3d import (TINY, Projector3D, Projector3DConfig,
                                           alignment_loss, load_torch_state_dict, stage1_loss)

__all__ = ["TINY", "Projector3D", "Projector3DConfig", "alignment_loss",
           "load_torch_state_dict", "stage1_loss"]
