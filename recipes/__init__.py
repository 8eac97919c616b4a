"""The recipes: each paper's experiment (and the demo) for `jaxspatial.train.Trainer`.

A config's `recipe` key names its experiment here:
  look_around   the main job (configs/demo.py): SFT on a scripted explorer, then GRPO
  agent         the papers' agents (configs/think3d_rl.py, act3d_grpo.py, peria_or_gigpo.py)
  thinker3d     3DThinker's stages 1 and 2 (configs/thinker3d_stage1.py, _stage2.py)
Adding a recipe is one module with an `Experiment` subclass and one line in RECIPES.
`launch.export` writes a run's policy as a Hugging Face folder (recipes/export.py).

Modules:
- cli.py (the launch tools' one entry: absl flags, a config mistake in one line, --help exits
  0; define_flags / flag_values: a dataclass of options as flags), benchmark_command.py
  (launch.eval --benchmark: BenchmarkOptions, the backend, agent config and judge, run, report)
- the experiments the trainer runs, by the config's `recipe` key (RECIPES):
- look_around.py (the main job, configs/demo.py), agents.py (Think3D-RL, Act3D, PERIA: a Hugging
  Face policy, TFDS tasks (synthetic or a prepared benchmark:
  `data.builder="spatial_benchmark"`), teacher SFT (records by question_id on a benchmark), GRPO
  / OR-GIGPO, accuracy per question family or benchmark category; `check_inputs`: a missing
  checkpoint, dataset, split or trajectory file named at once with the flag or the build
  command; the stored views ride along for Think3D and for PERIA on a benchmark, their size
  checked against agent.width / height; Think3D refuses data without clouds), thinker3d.py
  (3DThinker stages 1 and 2: `reference` on a Hugging Face Qwen2.5-VL folder and the published
  data, `cpu` on the synthetic task; examples grouped by frame count, one shape each),
- common.py (the CPU configs' small policy, each process's evaluation rows),
- benchmark_eval.py (`evaluate_predictions`: a benchmark's questions and
  predictions[setting][seed][question_id] (text or score) -> the protocol's scores, `summarize`
  per setting, results.json / results.md),
- benchmark_run.py (`run_benchmark`, launch.eval --benchmark: the questions read with their
  views left encoded, in the question file's order (`choose_questions`: all, the first --limit
  N, or --ids), only their records decoded (`task_stream`); settings "no_tools" (the question's
  views + text, a system prompt asking for the letter, a 1-5 word phrase or a number) and
  "tools" (the agent's episodes), once per seed; each item recorded the moment its backend
  reports it (`on_done`): judged where the protocol judges (an LLMJudge on the question's
  strings, `judge_case`; a judge failure fails the item), scored, appended to predictions.jsonl
  (eval.prediction_log); a rerun skips recorded items (`resume_key` in run.json); a failed item
  scores 0 with its error, counted per setting and category; a progress bar per setting; at the
  end predictions.jsonl rewritten in order, results.json / results.md from it
  (`results_from_rows`; partial ones on KeyboardInterrupt / SystemExit), episodes.html (views
  saved as PNG files when recorded), run.json with the judge's verdict counts),
  benchmark_backends.py (EndpointBackend: ChatEndpoint, views as PNG data URLs, `complete_each`
  for answers (each reported as it ends, the answer after a <think> block), api_rollout for the
  real rows' episodes, seeded; PolicyBackend: a policy folder, serving's PromptBuilder + one
  Scheduler for answers (each seeded with the run's seed and its question's id: an answer
  does not depend on its neighbours or its row) and SpatialClaw's PolicyChat, AgentRollout
  for episodes (every seed of a question in one group-shared rollout); `benchmark_agent`: a
  paper config's agent with its reconstruction and perception tools, `evaluation_turns`),
- export.py (`export_checkpoint` -> Exported(folder, step, checkpoint, family): look_around, the
  agent recipes and 3DThinker's stages (stage 2's LoRA merged) through `Trainer.restore` and
  `write_policy_folder`), rollout_demo.py (the rollout tools: build, show, profile),
  render_demo.py (the render demo's contact sheet); `train(config)`, `evaluate(config, ...)`
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
  """Trains the config's recipe with the library trainer; returns its results. The work
  directory is held first: a second run on it stops before building anything."""
  from jaxspatial.train import Trainer, hold_workdir, initialize_from_env  # pylint: disable=import-outside-toplevel
  initialize_from_env()  # before the recipe's modules start the backend
  with hold_workdir(config.workdir):
    return Trainer(config, experiment(config)).run()


def evaluate(config, checkpoint: str | None = None, split: str | None = None,
             best: bool = False) -> dict:
  """Evaluates a run's checkpoint (default: the config's workdir; the latest step, or the
  best) with the recipe's evaluation, on `split` (default: the config's)."""
  from jaxspatial.train import Trainer, initialize_from_env  # pylint: disable=import-outside-toplevel
  initialize_from_env()
  return Trainer(config, experiment(config)).evaluate(checkpoint, split, best)
