"""The recipes: each paper's experiment (and the demo) for `jaxspatial.train.Trainer`.

A config's `recipe` key names its experiment here:
  look_around   the main job (configs/demo.py): SFT on a scripted explorer, then GRPO
  agent         the papers' agents (configs/think3d_rl.py, act3d_grpo.py, peria_or_gigpo.py)
  thinker3d     3DThinker's stages 1 and 2 (configs/thinker3d_stage1.py, _stage2.py)
Adding a recipe is one module with an `Experiment` subclass and one line in RECIPES.
`launch.export` writes a run's policy as a Hugging Face folder (recipes/export.py).
"""

from __future__ import annotations

import importlib

RECIPES = {
    "look_around": "recipes.look_around:LookAround",
    "agent": "recipes.agents:AgentRecipe",
    "thinker3d": "recipes.thinker3d:Thinker3D",
}


def experiment_class(config):
  """The Experiment subclass the config's `recipe` names."""
  name = config.get("recipe")
  if name not in RECIPES:
    raise ValueError(f"config recipe: expected one of {sorted(RECIPES)}, got {name!r}")
  module, cls = RECIPES[name].split(":")
  return getattr(importlib.import_module(module), cls)


def experiment(config):
  """The experiment the config's `recipe` names."""
  return experiment_class(config)(config)


def train(config) -> dict:
  """Trains the config's recipe with the library trainer; returns its results."""
  from jaxspatial.train import Trainer, initialize_from_env  # pylint: disable=import-outside-toplevel
  initialize_from_env()  # before the recipe's modules start the backend
  return Trainer(config, experiment(config)).run()


def evaluate(config, checkpoint: str | None = None, split: str | None = None,
             best: bool = False) -> dict:
  """Evaluates a run's checkpoint (default: the config's workdir; the latest step, or the
  best) with the recipe's evaluation, on `split` (default: the config's)."""
  from jaxspatial.train import Trainer, initialize_from_env  # pylint: disable=import-outside-toplevel
  initialize_from_env()
  return Trainer(config, experiment(config)).evaluate(checkpoint, split, best)
