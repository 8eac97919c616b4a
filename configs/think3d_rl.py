r"""Think3D-RL objective: GRPO over view-tool rollouts, observation tokens masked.

    (trainer: issue 8)  python -m launch.train --config configs/think3d_rl.py

Published setting (paper + public ms-swift script): Qwen3-VL-4B, 8 rollouts per prompt,
3 tool turns, lr 1e-6 with 5% warm-up, KL beta 0.001, temperature 0.6, accuracy 1.0 +
format 1.0 rewards. Clip, KL estimator and aggregation are ms-swift defaults the script
does not pin (likely eps 0.2, k3): we use those. Cost: 8 x H200 for one epoch of 977
MindCube prompts in the paper.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.objective = dict(epsilon_low=0.2, epsilon_high=0.2, dual_clip=None, beta=0.001,
                     kl_estimator="k3", aggregation="sequence-mean-token-mean")
  c.advantage = dict(estimator="grpo", ddof=1, eps=1e-4, group_size=8)
  c.reward = dict(name="think3d", accuracy_weight=1.0, format_weight=1.0)
  c.rollout = dict(max_turns=3, temperature=0.6, mask_observations=True)
  c.optimizer = dict(learning_rate=1e-6, warmup_ratio=0.05, grad_clip_norm=0.5)
  return c
