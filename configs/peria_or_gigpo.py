r"""PERIA OR-GIGPO objective: episode + step-group advantages, no KL, token mean.

    (trainer: issue 8)  python -m launch.train --config configs/peria_or_gigpo.py

Published setting (paper; launch script in brackets where it differs): N = 4 rollouts per
prompt [2], gamma 0.99, omega 1.0, delta 0.9, eps 0.2, no KL and no entropy bonus, lr
1e-6 cosine with 5% warm-up, token mean over all tokens of the batch, T <= 11 turns [10],
observation tokens masked. Reward: R_rep + R_format + R_correct (MapTrace: the paper's
NDTW mapping). Cost: FSDP2 on GPU nodes, 3 epochs, in the public script.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.objective = dict(epsilon_low=0.2, epsilon_high=0.2, dual_clip=None, beta=0.0,
                     kl_estimator="k3", aggregation="token-mean")
  c.advantage = dict(estimator="or_gigpo", ddof=1, eps=1e-6, group_size=4, gamma=0.99,
                     omega=1.0, delta=0.9)
  c.reward = dict(name="peria", maptrace_mapping="paper")
  c.rollout = dict(max_turns=11, temperature=1.0, mask_observations=True)
  c.optimizer = dict(learning_rate=1e-6, warmup_ratio=0.05, schedule="cosine")
  return c
