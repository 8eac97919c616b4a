"""Each paper's objective config builds the library's option objects."""

import importlib

import pytest

from jaxspatial.rl import PolicyLossConfig


@pytest.mark.parametrize("name,estimator,beta,aggregation", [
    ("think3d_rl", "grpo", 0.001, "sequence-mean-token-mean"),
    ("act3d_grpo", "grpo", 0.005, "sequence-mean-token-mean"),
    ("thinker3d_stage2", "grpo", 0.04, "sequence-mean-token-mean"),
    ("peria_or_gigpo", "or_gigpo", 0.0, "token-mean"),
])
def test_paper_configs(name, estimator, beta, aggregation):
  config = importlib.import_module(f"configs.{name}").get_config()
  loss = PolicyLossConfig(**config.objective)
  assert loss.beta == beta and loss.aggregation == aggregation
  assert config.advantage.estimator == estimator
  if estimator == "or_gigpo":
    assert (config.advantage.gamma, config.advantage.omega, config.advantage.delta) == (
        0.99, 1.0, 0.9)
