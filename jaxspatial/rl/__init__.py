"""RL core: objectives, advantages (GRPO, RLOO, OR-GIGPO)."""

from jaxspatial.rl.advantages import (discounted_returns, group_normalize, image_hash,
                                      lcs_length, or_gigpo_advantages, rloo_advantages,
                                      step_match_matrix, text_similarity, token_advantages)
from jaxspatial.rl.objectives import (PolicyLossConfig, aggregate, kl_divergence, policy_loss,
                                      token_entropy)

__all__ = ["PolicyLossConfig", "aggregate", "discounted_returns", "group_normalize",
           "image_hash", "kl_divergence", "lcs_length", "or_gigpo_advantages", "policy_loss",
           "rloo_advantages", "step_match_matrix", "text_similarity", "token_advantages",
           "token_entropy"]
