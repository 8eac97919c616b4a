r"""3DThinker stage 1: SFT with the latent-alignment loss (0.1 CE + 0.0005 alignment).

    (trainer: issue 8)  python -m launch.train --config configs/thinker3d_stage1.py

Published setting (public code): Qwen2.5-VL-3B, 12 latents, projector with mlp_depth 6
(fusion 391 -> 1374 tokens, 2048 channels), 10 epochs, per-device batch 1, lr 1e-4 with 10
warm-up steps, weight decay 0.01, bf16, vision tower frozen, LLM fully fine-tuned,
projector trained. Cost: 8 GPUs in the paper's runs.
The `cpu` variant (`--config.variant=cpu`) uses the tiny model and the stand-in geometry
features of the synthetic dataset; it runs in minutes here once the trainer exists.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.variant = "reference"
  c.loss = dict(ce_weight=0.1, alignment_weight=0.0005, mode="mse")
  c.latents = dict(num_latents=12)
  c.projector = dict(mlp_depth=6, mm_hidden_size=2048, hidden_size=2048, latent_size=12,
                     fusion_input=391, fusion_output=1374)
  c.optimizer = dict(learning_rate=1e-4, warmup_steps=10, weight_decay=0.01, epochs=10)
  c.freeze_vision = True
  c.cpu = dict(model="tiny", projector=dict(mlp_depth=3, mm_hidden_size=64, hidden_size=32,
                                            latent_size=12, fusion_input=6, fusion_output=69),
               features="geometry_stand_in", learning_rate=1e-3, epochs=2)
  return c
