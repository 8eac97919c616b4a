"""Experiment configs as Python files; each header gives its command and its cost.

- demo.py (the main job on a CPU), render_demo.py, rollout_demo.py; the papers' recipes:
  think3d_rl.py, act3d_grpo.py, peria_or_gigpo.py (agent_recipe.py: their shared fields),
  thinker3d_stage1.py, thinker3d_stage2.py;
- spatialclaw.py (evaluation only: the loop's, kernel's and tools' settings for `launch.eval
  --benchmark NAME --agent spatialclaw`). Each takes a variant: the default `reference` holds
  the published settings and needs `--config.model.checkpoint` and the real data (Think3D-RL:
  MindCube train / test with Think3D caches; Act3D: ScanQA train / val on ScanNet scans + a
  teacher file; PERIA: ChartQA train / test at 800 x 600 + a teacher file; 3DThinker's
  `data.jsonl`, `data.image_root`, `data.features`, optionally `data.eval_jsonl`; each header
  gives the build and launch commands; a missing one is named at launch); `:cpu` runs here (tiny
  random policy, synthetic data; `make recipes`, `make thinker3d`);
- tests/recipes/test_agent_reference.py runs each agent reference variant's step on stand-ins of
  its data (Act3D's and PERIA's in `make train-checks`)
"""

