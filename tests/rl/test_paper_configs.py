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
  o = config.sft.optimizer
  assert (o.learning_rate, o.warmup_steps, o.weight_decay, config.sft.data_epochs) == (
      1e-4, 10, 0.01, 10)
  cpu = importlib.import_module("configs.thinker3d_stage1").get_config("cpu")
  assert cpu.loss == config.loss and cpu.sft.steps > 0
  with pytest.raises(ValueError, match="variant must be 'reference' or 'cpu'"):
    importlib.import_module("configs.thinker3d_stage1").get_config("gpu")


def test_thinker3d_stage2_config_is_the_published_recipe():
  config = importlib.import_module("configs.thinker3d_stage2").get_config()
  lora = config.model.lora
  assert (lora.rank, lora.alpha, lora.dropout, config.rl.optimizer.learning_rate) == (
      64, 128, 0.05, 1e-5)
  assert (config.objective.beta, config.advantage.group_size, config.advantage.eps) == (
      0.04, 8, 1e-4)
  # The public trainer samples at temperature 1 whatever its config says (0.9).
  assert config.rollout.temperature == 1.0
  cpu = importlib.import_module("configs.thinker3d_stage2").get_config("cpu")
  assert cpu.objective == config.objective and cpu.init_from


@pytest.mark.parametrize("name", ["think3d_rl", "act3d_grpo", "peria_or_gigpo"])
def test_agent_recipes_keep_the_objective_on_cpu_and_need_a_checkpoint_at_full_scale(name):
  import recipes
  from jaxspatial.train import AdvantageConfig
  module = importlib.import_module(f"configs.{name}")
  reference, cpu = module.get_config(), module.get_config("cpu")
  assert reference.recipe == cpu.recipe == "agent"
  assert cpu.objective == reference.objective and cpu.advantage == reference.advantage
  AdvantageConfig(**reference.advantage)
  assert reference.model.checkpoint == "" and reference.data.config != "tiny"
  with pytest.raises(ValueError, match="--config.model.checkpoint"):
    recipes.train(reference)
  with pytest.raises(ValueError, match="variant must be 'reference' or 'cpu'"):
    module.get_config("tpu")


def test_think3d_rl_reference_is_the_public_script():
  """Think3D-RL (paper section 3.4, the public ms-swift script): the vision tower frozen,
  `max_turns 3` (two views, then the answer), temperature 0.6 with repetition penalty 1.1,
  one epoch of the data, beta 0.001, lr 1e-6 with 5% warm-up, grad-norm 0.5."""
  from jaxspatial.rollout import make_agent
  from recipes.agents import rl_steps
  c = importlib.import_module("configs.think3d_rl").get_config()
  assert tuple(c.model.frozen) == ("visual",)
  assert (c.rollout.max_turns, c.rollout.temperature, c.rollout.repetition_penalty) == (
      3, 0.6, 1.1)
  assert (c.rl.steps, c.rl.data_epochs) == (-1, 1.0)
  o = c.rl.optimizer
  assert (o.learning_rate, o.warmup_ratio, o.clip_norm) == (1e-6, 0.05, 0.5)
  agent = make_agent(c.agent, c.rollout.max_turns)
  assert agent.max_calls == 2 and agent.params.num_prompt_images == 8
  # 977 MindCube prompts, 16 a step: one epoch is 61 steps.
  c.rl.prompts = 16
  questions = [{"questions": "[" + ", ".join(["{}"] * 1) + "]"}] * 977
  assert rl_steps(c, questions) == 61


def test_act3d_and_peria_budgets_match_their_papers():
  """Act3D: 12 interactions, then the answer; PERIA: T <= 11 turns (10 calls, then the
  answer), an image list that holds them all."""
  from jaxspatial.rollout import make_agent
  act3d = importlib.import_module("configs.act3d_grpo").get_config()
  assert make_agent(act3d.agent, 13).max_calls == 12 and act3d.rollout.max_turns == 13
  peria = importlib.import_module("configs.peria_or_gigpo").get_config()
  agent = make_agent(peria.agent, peria.rollout.max_turns)
  assert agent.max_calls == 10 and agent.params.max_images >= peria.rollout.max_turns


@pytest.mark.parametrize("name", ["think3d_rl", "act3d_grpo", "peria_or_gigpo",
                                  "thinker3d_stage1", "thinker3d_stage2"])
def test_every_recipe_holds_a_dtype_policy(name):
  """Reference variants: bf16 compute over float32 master weights, a bf16 cache; the cpu
  variants keep float32; both build a Precision and the model keywords."""
  from jaxspatial.models import Precision, model_options
  module = importlib.import_module(f"configs.{name}")
  for variant, compute, cache in (("reference", "bfloat16", "bfloat16"),
                                  ("cpu", "float32", "float32")):
    model = module.get_config(variant).model
    policy = Precision.from_config(model)
    assert (model.dtype, model.param_dtype, model.cache_dtype) == (compute, "float32", cache)
    assert policy.check_trainable(name) is policy
    assert set(model_options(model)) == {"dtype", "param_dtype", "attention", "remat"}


@pytest.mark.parametrize("name", ["demo", "rollout_demo"])
def test_cpu_configs_hold_a_float32_dtype_policy(name):
  model = importlib.import_module(f"configs.{name}").get_config().model
  assert (model.dtype, model.param_dtype, model.cache_dtype) == ("float32",) * 3
