"""The rollout's log-probabilities as the update's old ones (`Phase.old_logprobs`
"rollout"): where they are not the policy's own, or the update is not on-policy, the phase
refuses them (that they give the recompute path's loss and gradient: tests/rollout/
test_episode.py, beside the rollout program it shares)."""

import pytest

from jaxspatial.rollout import episode
from jaxspatial.train import AdvantageConfig, OptimizerConfig, Phase, StepConfig


def test_rollout_logprobs_need_an_on_policy_update():
  rl = dict(name="rl", steps=2, optimizer=OptimizerConfig(), step=StepConfig(objective="grpo"),
            advantage=AdvantageConfig(group_size=2), old_logprobs="rollout")
  with pytest.raises(ValueError, match="one epoch, one mini-batch.*1 epochs x 2 mini-batches"):
    Phase(**rl, mini_batches=2)
  with pytest.raises(ValueError, match="'recompute' or 'rollout', got 'cached'"):
    Phase(**{**rl, "old_logprobs": "cached"})
  assert episode.reshaped_by(episode.RolloutConfig(repetition_penalty=1.1, top_k=20)) == (
      "repetition_penalty 1.1", "top_k 20")
