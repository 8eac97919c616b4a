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


def test_thinker3d_stage1_config_builds_the_projector():
  from jaxspatial.models import Projector3DConfig
  config = importlib.import_module("configs.thinker3d_stage1").get_config()
  reference = Projector3DConfig(**config.projector)
  assert reference.parameter_count() == 35_255_898
  assert (config.loss.ce_weight, config.loss.alignment_weight) == (0.1, 0.0005)
  Projector3DConfig(**config.cpu.projector)
