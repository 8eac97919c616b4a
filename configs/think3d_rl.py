r"""Think3D-RL: GRPO over view-tool rollouts, observation tokens masked.

    python -m launch.train --config configs/think3d_rl.py \
        --config.model.checkpoint=/ckpt/Qwen2.5-VL-3B --config.data.data_dir=/data
    python -m launch.train --config configs/think3d_rl.py:cpu        (runs here)

Published setting (paper + public ms-swift script): Qwen3-VL-4B (Qwen2.5-VL-shaped models
load here), 8 rollouts per prompt, 3 tool turns, lr 1e-6 with 5% warm-up, KL beta 0.001,
temperature 0.6, accuracy 1.0 + format 1.0 rewards, no SFT. Clip, KL estimator and
aggregation are ms-swift defaults the script does not pin (likely eps 0.2, k3): we use
those. Cost: 8 x H200 for one epoch of 977 MindCube prompts in the paper.

`cpu`: a tiny random policy (0.20M parameters) on synthetic_spatial/tiny (built on first use,
about 20 s), 100 SFT steps on the scripted teacher (one view, then the letter; the base
policy has never seen the tool format), 10 GRPO steps of 2 prompts x 8; the three CPU
recipes take 12m49s together (`make recipes`) on
a 2-core CPU. It shows the recipe runs, not that it learns.
"""

from configs.agent_recipe import base, shrink_for_cpu


def get_config(variant: str = "reference"):
  c = base("think3d_rl", "think3d", variant)
  c.objective = dict(epsilon_low=0.2, epsilon_high=0.2, dual_clip=None, beta=0.001,
                     kl_estimator="k3", aggregation="sequence-mean-token-mean")
  c.advantage = dict(estimator="grpo", ddof=1, eps=1e-4, group_size=8)
  c.reward.weights = dict(accuracy_weight=1.0, format_weight=1.0)
  c.rollout.update(max_turns=4, temperature=0.6)   # 3 tool turns, then the answer
  c.grpo.update(learning_rate=1e-6, warmup_ratio=0.05, clip_norm=0.5, prompts=16)
  shrink_for_cpu(c)
  return c
