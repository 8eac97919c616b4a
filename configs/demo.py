r"""The main job on a CPU: SFT a small policy on a scripted explorer, then GRPO, then
evaluate against answering from the first view. What `make demo` runs.

    python -m launch.train --config configs/demo.py [--config.key=value ...]

Cost: about 13 minutes on a 2-core CPU, no accelerator (SFT ~3 min, GRPO ~7 min, the
rest compiling and evaluating). To fit, the demo shrinks everything: a 0.64M-parameter
Qwen2.5-VL-shaped policy (2 layers, width 128) with a 600-token BPE trained on the
templates, 56x56 renders (4 vision tokens), a one-box scene
(data_pipelines/synthetic/look_around.py), at most one camera move (Act3D's turn_left /
turn_right, 90-degree steps) before answering, and turns of at most 40 tokens. Outputs under `workdir`: metrics.jsonl and TensorBoard events,
curve.png, rollouts.html (test episodes), results.json, checkpoints/.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.recipe = "look_around"     # recipes/look_around.py
  c.name = "demo"
  c.variant = "cpu"
  c.seed = 0
  c.workdir = "outputs/demo"
  c.mesh = dict(data=-1, fsdp=1, tensor=1)      # -1: all devices
  c.model = dict(hidden=128, intermediate=256, layers=2, heads=4, kv_heads=2,
                 vision_depth=2, vision_hidden=64, vocab=600,
                 # the dtype policy (jaxspatial.models.precision): float32 on a CPU
                 dtype="float32", param_dtype="float32", cache_dtype="float32",
                 attention="auto", remat=False)
  # splat_radius 2 (5x5 splats): at 3x3 the floor's far band shows the background through
  # its gaps at 56x56 and 6,000 points.
  c.scene = dict(width=56, height=56, hfov_deg=90.0, points=6000, turn_step_deg=90.0,
                 splat_radius=2)
  c.data = dict(train_tasks=480, test_tasks=240, sft_trajectories=384)
  c.rollout = dict(max_turns=2, max_turn_tokens=40, temperature=1.0)   # RolloutConfig
  # The phases; `optimizer` is jaxspatial.train.OptimizerConfig (total_steps: the phase's).
  c.sft = dict(steps=400, batch=16, micro_batches=1,
               optimizer=dict(learning_rate=3e-3, warmup_steps=20, clip_norm=1.0))
  # rl.share_prompts: each group's prompt prefilled once (False: once per row, for benchmarks).
  c.rl = dict(steps=120, prompts=8, mini_batches=1, epochs=1, micro_batches=1, share_prompts=True,
              optimizer=dict(learning_rate=2e-4, warmup_steps=5, clip_norm=1.0))
  c.objective = dict(epsilon_low=0.2, epsilon_high=0.2, beta=0.0,     # PolicyLossConfig
                     aggregation="sequence-mean-token-mean")
  c.advantage = dict(estimator="grpo", group_size=8, ddof=1, eps=1e-6)  # AdvantageConfig
  c.eval = dict(batch=80)
  # keep_aside: damaged / superseded step folders kept, newest first; restart_from_zero: start
  # again at step 0 when every saved step was found damaged
  c.checkpoint = dict(every=50, keep=2, keep_aside=2, restart_from_zero=False)
  c.log_every = 10
  c.snapshot_every = 60        # GRPO steps between rollout HTML snapshots
  c.resume = True
  c.resume_overrides = ()      # config keys a resumed run may change ("*": any)
  c.evaluate = True
  # tests: SIGKILL / SIGTERM the process after this step; a NaN loss at this step
  c.faults = dict(kill_after_step=-1, sigterm_after_step=-1, nan_at_step=-1)
  return c
