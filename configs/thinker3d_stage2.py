r"""3DThinker stage 2 objective: GRPO with format + answer + latent-similarity rewards.

    (trainer: issue 8)  python -m launch.train --config configs/thinker3d_stage2.py

Published setting (public code): Qwen2.5-VL-3B with LoRA r 64 / alpha 128 / dropout 0.05,
beta 0.04 with k3 (no clamp), 8 generations, lr 1e-5, eps 0.2, num_iterations 1 (so the
ratio is 1 and the clip is inactive), std eps 1e-4, per-sequence token mean then batch
mean, reference = the policy with LoRA disabled, temperature 0.9. Cost: 8 GPUs, ZeRO-3.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.objective = dict(epsilon_low=0.2, epsilon_high=0.2, dual_clip=None, beta=0.04,
                     kl_estimator="k3", aggregation="sequence-mean-token-mean")
  c.advantage = dict(estimator="grpo", ddof=1, eps=1e-4, group_size=8)
  c.reward = dict(name="thinker3d", token_axis_quirk=False)
  c.rollout = dict(temperature=0.9, num_latents=12, max_completion_tokens=2048)
  c.optimizer = dict(learning_rate=1e-5, lora_rank=64, lora_alpha=128, lora_dropout=0.05)
  return c
