"""Every config and variant is complete: its `recipe` names an experiment, it holds what the
trainer reads, and its phases and the library dataclasses it feeds build from the config
alone (no model), so an incomplete variant fails here, not hours into a run."""

import importlib

import pytest

import recipes
from jaxspatial.models import Precision
from jaxspatial.rollout import RolloutConfig, make_agent
from jaxspatial.rollout.thinker3d import Thinker3DRolloutConfig
from jaxspatial.train import Phase
from jaxspatial.train.thinker3d import Stage1Config
from recipes import agents, look_around, thinker3d

TRAINING = [("demo", None), *[(name, variant) for name in (
    "think3d_rl", "act3d_grpo", "peria_or_gigpo", "thinker3d_stage1", "thinker3d_stage2")
    for variant in ("reference", "cpu")]]


def _load(name, variant):
  module = importlib.import_module(f"configs.{name}")
  return module.get_config() if variant is None else module.get_config(variant)


@pytest.mark.parametrize("name,variant", TRAINING)
def test_every_training_config_builds_its_phases(name, variant):
  c = _load(name, variant)
  assert c.recipe in recipes.RECIPES
  for key in ("seed", "workdir", "resume", "resume_overrides", "log_every", "mesh.data",
              "mesh.fsdp", "mesh.tensor", "checkpoint.every", "checkpoint.keep",
              "checkpoint.keep_aside", "checkpoint.restart_from_zero",
              "faults.kill_after_step", "faults.sigterm_after_step", "faults.nan_at_step"):
    node = c
    for part in key.split("."):
      assert part in node, f"{name}:{variant} lacks {key}"
      node = node[part]
  Precision.from_config(c.model)
  if c.recipe == "look_around":
    phases = look_around.make_phases(c)
    RolloutConfig(**c.rollout)
  elif c.recipe == "agent":
    phases = agents.make_phases(c, max(c.rl.steps, 0))
    RolloutConfig(**c.rollout)
    agent = make_agent(c.agent, c.rollout.max_turns, c.reward.get("weights", {}))
    assert agent.max_calls == c.rollout.max_turns - 1
  else:
    steps = c.sft.steps if c.stage == 1 else c.rl.steps
    phases = thinker3d.make_phases(c, max(steps, 0), Stage1Config(0, 1, **c.loss)
                                   if c.stage == 1 else None)
    Thinker3DRolloutConfig((1, 2, 3), (4,), num_latents=c.latents.num_latents,
                           **c.rollout)
  assert phases and all(isinstance(p, Phase) for p in phases)
  for phase in phases:
    optimizer = phase.optimizer_config()
    assert optimizer.total_steps >= 1 and optimizer.learning_rate > 0
    if phase.is_rl:
      assert phase.advantage.group_size >= 2
      assert phase.step.loss.beta == 0 or phase.reference in ("frozen", "lora_disabled")


def test_one_spelling_per_knob():
  """Group size, warm-up and the optimizer live in one place with one name in every
  config."""
  for name, variant in TRAINING:
    c = _load(name, variant)
    flat = str(c.to_dict())
    for old in ("'group':", "'warmup':", "'updates_per_batch'", "'lora_rank'",
                "'inject_nan_step'", "'freeze_vision'"):
      assert old not in flat, (name, variant, old)
    assert "grpo" not in c, (name, variant)


@pytest.mark.parametrize("name", ["think3d_rl", "act3d_grpo", "peria_or_gigpo"])
def test_cpu_agents_render_the_scene_as_the_tiny_dataset_was_rendered(name):
  """The environment's views beside the dataset's stored ones: the same splats (3x3 splats
  show the background through a 32k-point room's gaps), the reference variants Think3D's
  public 3x3 splats."""
  from data_pipelines.synthetic import SampleConfig  # pylint: disable=import-outside-toplevel
  for variant, want in (("cpu", (SampleConfig.splat_radius, SampleConfig.point_radius)),
                        ("reference", (1, None))):
    c = _load(name, variant)
    params = make_agent(c.agent, c.rollout.max_turns).params
    assert (params.splat_radius, params.point_radius) == want, (name, variant)


def test_render_options_refuse_a_negative_point_radius():
  from jaxspatial.rollout.contract import render_options  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match="agent.point_radius"):
    render_options({"splat_radius": 1, "point_radius": -0.1})
