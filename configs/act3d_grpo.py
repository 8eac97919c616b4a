r"""Act3D GRPO objective (after trajectory SFT): composite judge / EM / interaction reward.

    (trainer: issue 8)  python -m launch.train --config configs/act3d_grpo.py

Published setting (paper section 4): Qwen3.5-9B, G = 8, 64 prompts per step, mini-batch
16, lr 2e-6, temperature 0.7, eps 0.2, beta 0.005 (estimator unstated: k3), no entropy
bonus, per-trajectory token mean then mean over G, up to 12 interactions, 24,576-token
context. Cost: H200 GPUs with asynchronous vLLM rollouts in the paper.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.objective = dict(epsilon_low=0.2, epsilon_high=0.2, dual_clip=None, beta=0.005,
                     kl_estimator="k3", aggregation="sequence-mean-token-mean")
  c.advantage = dict(estimator="grpo", ddof=1, eps=1e-6, group_size=8)
  c.reward = dict(name="act3d", judge_weight=0.3, exact_match_weight=0.2,
                  interaction_weight=0.05, format_weight=0.2, max_interactions=12)
  c.rollout = dict(max_turns=12, temperature=0.7, mask_observations=True)
  c.optimizer = dict(learning_rate=2e-6, prompts_per_step=64, mini_batch=16)
  return c
