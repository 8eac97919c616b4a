"""RL core: objectives, advantages (GRPO, RLOO, OR-GIGPO).

Modules:
- objectives.py: policy_loss (clip, dual clip, TIS, KL k1/k2/k3, aggregations)
- advantages.py: group_normalize (GRPO), RLOO, OR-GIGPO (LCS + image hashes)
- rewards/: text.py (string rules: option letters, 3DThinker's letter by the public reward's
  priority of patterns, PERIA's R_rep on consecutive repeats and the public reward manager's
  R_format, R_correct and judge gate),
- device_text.py (byte-level parsing on device, the same rules), papers.py (Think3D, Act3D,
  3DThinker, PERIA rewards)

Each paper's setting in these option names, and our choices where the sources are silent: PAPERS.md.
"""

from jaxspatial.rl.advantages import (discounted_returns, group_normalize, image_hash,
                                      lcs_length, or_gigpo_advantages, rloo_advantages,
                                      step_match_matrix, text_similarity, token_advantages)
from jaxspatial.rl.objectives import (PolicyLossConfig, aggregate, kl_divergence, policy_loss,
                                      token_entropy)

__all__ = ["PolicyLossConfig", "aggregate", "discounted_returns", "group_normalize",
           "image_hash", "kl_divergence", "lcs_length", "or_gigpo_advantages", "policy_loss",
           "rloo_advantages", "step_match_matrix", "text_similarity", "token_advantages",
           "token_entropy"]
