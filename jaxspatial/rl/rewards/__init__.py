"""Rewards of the five systems: on device from episode records, and as string rules."""

from jaxspatial.rl.rewards import device_text, text
from jaxspatial.rl.rewards.papers import (Act3DRewardConfig, Think3DRewardConfig,
                                          act3d_flags_text, act3d_reward, act3d_reward_text,
                                          latent_similarity, maptrace_reward, normalized_dtw,
                                          parse_letter_text, peria_correct_text,
                                          peria_reward, peria_reward_text,
                                          think3d_reward, think3d_reward_text,
                                          thinker3d_format_text, thinker3d_letter_text,
                                          thinker3d_reward)

__all__ = ["Act3DRewardConfig", "Think3DRewardConfig", "act3d_flags_text", "act3d_reward",
           "act3d_reward_text", "device_text", "latent_similarity", "maptrace_reward",
           "normalized_dtw", "parse_letter_text", "peria_correct_text", "peria_reward",
           "peria_reward_text", "text",
           "think3d_reward", "think3d_reward_text", "thinker3d_format_text",
           "thinker3d_letter_text", "thinker3d_reward"]
