r"""Think3D-RL: GRPO over view-tool rollouts, observation tokens masked.

    python -m launch.train --config configs/think3d_rl.py \
        --config.model.checkpoint=/ckpt/Qwen3-VL-4B-Instruct --config.data.data_dir=/data
    python -m launch.train --config configs/think3d_rl.py:cpu        (runs here)

Data (the reference variant): MindCube's train questions with Think3D's Pi3 point clouds,
`spatial_benchmark/mindcube` split "train" (RL) and "test" (evaluation, `eval.tasks` of
them). MindCube (Hugging Face `MLL-Lab/MindCube`: data/raw/MindCube_train.jsonl,
MindCube.jsonl, and the other_all_image/ images) unpacked at SRC; Think3D's 977 RL
questions are the `jialianjie/Think3DQA` rows (MindCube's format): put them at
SRC/raw/MindCube_train.jsonl to train on exactly those (the whole train file also works:
rl.steps -1 is then one epoch of it). Each image set needs a Think3D cache (Pi3, a GPU):
one cache folder for both splits, so reconstruct the two files together:

    cat SRC/raw/MindCube_train.jsonl SRC/raw/MindCube.jsonl > /tmp/mindcube_all.jsonl
    python -m launch.reconstruct_scenes --benchmark mindcube \
        --questions /tmp/mindcube_all.jsonl --root SRC --out /data/think3d_caches \
        --backend pi3 --checkpoint /ckpt/Pi3/model.safetensors --device cuda
    python -m launch.build_benchmark --benchmark mindcube --source SRC \
        --caches /data/think3d_caches --data_dir /data --width 640 --height 480

Building takes about 91 s per 400 image sets on a 2-core CPU (MindCube-Tiny's, measured);
Pi3's reconstructions on a GPU: not measured here. The stored views' size must be
`agent.width` x `agent.height` (the run refuses otherwise, naming both); `data.points`
must hold the largest cache cloud (the loader names a larger one). A run missing the
checkpoint or the prepared data stops before loading anything, naming each missing flag
and the command that makes it.

Published setting (paper section 3.4 and appendix A; the public ms-swift script where the
paper is silent): GRPO, 8 rollouts per prompt, `max_turns 3` (two views, then the answer)
in training and K = 3 views at evaluation (`eval.max_turns` 4), 4 prompts x 8 completions
per step (the script's per-device batch 1 x 4 accumulation steps x 8 GPUs; the later head
script's 24 x 8: `rl.prompts`), one epoch of the 977 MindCube prompts (steps = tasks /
prompts), lr 1e-6 with 5% warm-up,
KL beta 0.001, temperature 0.6 with repetition penalty 1.1, grad-norm clip 0.5, vision
tower frozen (LLM fully trained), accuracy 1.0 + format 1.0 rewards, no SFT. The first
prompt holds the task's input views (up to 8); views are anchored on an input camera,
ego or global (global views draw the input cameras), "(0, 0)" returns the anchor's
input image; the message after each view is stage-aware (the last one says: answer now,
no tools). Clip, KL estimator and aggregation are ms-swift defaults the script does not
pin (likely eps 0.2, k3): we use those.

The policy family is the paper's, Qwen3-VL (`model.family`; a checkpoint's config.json
decides, so a Qwen2.5-VL folder runs too, as an ablation). Pi3 reconstructions: the
dataset's clouds and views by default; `reconstruction.backend=pi3` with a local
`reconstruction.checkpoint` reconstructs each task's scene from its input views inside the
rollout, and `python -m launch.reconstruct_scenes` writes Think3D's caches offline. Not
reproduced here: the public code's per-turn message replacement (each continuation
re-sends the question, the last reply and the images; we keep one growing conversation)
and its long continuation texts (ours are short, stage-aware templates).
`agent.views="preset"` restricts angles to the paper-era RL prompt's (-45, 0), (45, 0),
(0, 60). Cost: 8 x H200 for one epoch of the 977 prompts in the paper (245 GRPO steps of
4 prompts x 8 rollouts here; its wall time is not published: unknown).

`cpu`: a tiny random Qwen3-VL policy (0.2M parameters, two DeepStack blocks) on
synthetic_spatial/tiny (built on first
use, about 20 s), 100 SFT steps on the scripted teacher (one view, then the letter; the
base policy has never seen the tool format), 10 GRPO steps of 2 prompts x 8, one view per
episode. It shows the recipe runs, not that it learns.
"""

from configs.agent_recipe import base, shrink_for_cpu


def get_config(variant: str = "reference"):
  c = base("think3d_rl", "think3d", variant)
  c.model.family = "qwen3_vl"  # Qwen3-VL-4B in the paper
  c.model.frozen = ("visual",)
  c.objective = dict(epsilon_low=0.2, epsilon_high=0.2, dual_clip=None, beta=0.001,
                     kl_estimator="k3", aggregation="sequence-mean-token-mean")
  c.advantage = dict(estimator="grpo", ddof=1, eps=1e-4, group_size=8)
  c.reward.weights = dict(accuracy_weight=1.0, format_weight=1.0)
  c.rollout.update(max_turns=3, temperature=0.6, repetition_penalty=1.1)
  # ms-swift is a Hugging Face Trainer: its cosine schedule decays to 0, and weight decay
  # skips biases and norms.
  # The public script's completions per step: 1 x 4 accumulation x 8 GPUs = 4 prompts x 8.
  c.rl.update(steps=-1, data_epochs=1.0, prompts=4)
  c.eval.max_turns = 4  # evaluation: K = 3 rendered views, then the answer (paper 3.1)
  c.rl.optimizer.update(learning_rate=1e-6, warmup_ratio=0.05, clip_norm=0.5, decay="cosine",
                        final_fraction=0.0, weight_decay_mask="transformers")
  if variant == "reference":  # MindCube's train questions with Think3D's caches
    c.data.update(builder="spatial_benchmark", config="mindcube", train_split="train",
                  eval_split="test")
  shrink_for_cpu(c)
  if variant == "cpu":
    c.data.prompt_tokens = 512  # the system message and up to 8 input views of 96 x 72
  return c
