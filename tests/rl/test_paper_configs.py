"""Each paper's config builds the library's option objects; the agent recipes refuse their
full-scale variant without a pretrained checkpoint."""

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
  assert (config.optimizer.learning_rate, config.optimizer.warmup_steps,
          config.optimizer.weight_decay, config.epochs) == (1e-4, 10, 0.01, 10)
  cpu = importlib.import_module("configs.thinker3d_stage1").get_config("cpu")
  assert cpu.loss == config.loss and cpu.steps > 0
  with pytest.raises(ValueError, match="variant must be 'reference' or 'cpu'"):
    importlib.import_module("configs.thinker3d_stage1").get_config("gpu")


def test_thinker3d_stage2_config_is_the_published_recipe():
  config = importlib.import_module("configs.thinker3d_stage2").get_config()
  o = config.optimizer
  assert (o.lora_rank, o.lora_alpha, o.lora_dropout, o.learning_rate) == (64, 128, 0.05, 1e-5)
  assert (config.objective.beta, config.advantage.group_size, config.advantage.eps) == (
      0.04, 8, 1e-4)
  assert config.rollout.temperature == 0.9
  cpu = importlib.import_module("configs.thinker3d_stage2").get_config("cpu")
  assert cpu.objective == config.objective and cpu.init_from


@pytest.mark.parametrize("name", ["think3d_rl", "act3d_grpo", "peria_or_gigpo"])
def test_agent_recipes_keep_the_objective_on_cpu_and_need_a_checkpoint_at_full_scale(name):
  from jaxspatial.train import AdvantageConfig
  from launch import recipe
  module = importlib.import_module(f"configs.{name}")
  reference, cpu = module.get_config(), module.get_config("cpu")
  assert reference.recipe == cpu.recipe == "agent"
  assert cpu.objective == reference.objective and cpu.advantage == reference.advantage
  AdvantageConfig(**reference.advantage)
  assert reference.model.checkpoint == "" and reference.data.config != "tiny"
  with pytest.raises(ValueError, match="--config.model.checkpoint"):
    recipe.run(reference)
  with pytest.raises(ValueError, match="variant must be 'reference' or 'cpu'"):
    module.get_config("tpu")
