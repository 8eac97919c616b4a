r"""3DThinker stage 2: GRPO with format + answer + latent-similarity rewards.

    python -m launch.train --config configs/thinker3d_stage2.py \
        --config.init_from=outputs/thinker3d_stage1 \
        --config.model.checkpoint=/models/Qwen2.5-VL-3B-Instruct \
        --config.data.jsonl=/data/3DThinker/data/train.jsonl \
        --config.data.image_root=/data/3DThinker \
        --config.data.features=/data/3DThinker/data \
        --config.data.eval_jsonl=/data/MindCube_tinybench_raw_qa.jsonl \
        --config.data.eval_image_root=/data/MindCube/data
    python -m launch.train --config configs/thinker3d_stage2.py:cpu [--config.key=value]

`reference` (the default) holds the published setting (public code): Qwen2.5-VL-3B with
LoRA r 64 / alpha 128 / dropout 0.05 on every linear layer of the language model and its
LM head (the trainer's `find_all_linear_names`), beta 0.04 with k3 (no clamp), 8
generations, lr 1e-5 decaying linearly to 0 (transformers' default scheduler), no weight
decay, eps 0.2, num_iterations 1 (so the ratio is 1 and the clip is inactive), std eps
1e-4, per-sequence token mean then batch mean, reference = the policy with LoRA disabled,
temperature 1.0 (the trainer's generation config; its 0.9 default is unused),
projector frozen from stage 1; with no latent block the latent reward scores the hidden
states after the assistant header; 8 GPUs, ZeRO-3. It starts from stage 1's workdir
(`init_from`: the policy and projector) over the architecture and tokenizer of
`model.checkpoint` (the same folder stage 1 started from), on the same rows as stage 1
(the public conversion keeps text_input as the problem, answer as the response, the
frames and idx: the prompt is stage 1's), the latent reward against each row's VGGT
features. Its inputs and where to get them: configs/thinker3d_stage1.py.

Cost (`cpu`): 3m05s with stage 1 on a 2-core CPU (`make thinker3d`); it starts from the
stage-1 checkpoint `init_from` names (configs/thinker3d_stage1.py:cpu): LoRA r 8 on the
tiny policy's linear layers and LM head, 4 prompts x 8 generations per step, 40 steps;
rewards inside the compiled rollout.
"""

import ml_collections

from configs.thinker3d_stage1 import (REFERENCE_MODEL, REFERENCE_PROJECTOR, TRAINER,
                                      cpu_settings, reference_data, trainer_settings)


def get_config(variant: str = "reference") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.recipe = "thinker3d"         # recipes/thinker3d.py
  c.name = "thinker3d_stage2"
  c.stage = 2
  c.variant = variant
  c.seed = 0
  c.objective = dict(epsilon_low=0.2, epsilon_high=0.2, dual_clip=None, beta=0.04,
                     kl_estimator="k3", aggregation="sequence-mean-token-mean")
  c.advantage = dict(estimator="grpo", ddof=1, eps=1e-4, group_size=8)
  c.reward = dict(name="thinker3d", token_axis_quirk=False, latent_fallback="after_header")
  c.latents = dict(num_latents=12)
  lora = dict(rank=64, alpha=128, dropout=0.05,
              targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                       "down_proj", "lm_head"))
  # One epoch; per device 1 completion x 2 accumulation on 8 GPUs: 16 completions (2
  # prompts x 8 generations) an update, in 2 micro-batches.
  c.rl = dict(steps=-1, data_epochs=1, prompts=2, mini_batches=1, epochs=1, micro_batches=2,
              optimizer=dict(learning_rate=1e-5, warmup_steps=0, weight_decay=0.0,
                             clip_norm=1.0, **TRAINER))
  if variant == "reference":
    trainer_settings(c)
    c.eval = dict(batch=8)
    c.workdir = "outputs/thinker3d_stage2"
    c.init_from = "outputs/thinker3d_stage1"
    c.model = dict(REFERENCE_MODEL, checkpoint="", lora=lora)
    c.data = reference_data()
    c.projector = dict(REFERENCE_PROJECTOR)  # stage 1's, restored from init_from
    c.loss = dict(ce_weight=0.1, alignment_weight=0.0005, mode="mse")
    c.rollout = dict(temperature=1.0, max_new_tokens=2048)
    return c
  if variant != "cpu":
    raise ValueError(f"thinker3d_stage2: variant must be 'reference' or 'cpu', got {variant!r}")
  cpu_settings(c)
  c.workdir = "outputs/thinker3d_stage2_cpu"
  c.init_from = "outputs/thinker3d_stage1_cpu"
  c.loss = dict(ce_weight=0.1, alignment_weight=0.0005, mode="mse")  # held-out evaluation
  c.projector = dict(mlp_depth=3, latent_tokens=64)
  c.model.lora = dict(lora, rank=8, alpha=16, dropout=0.0)  # dropout 0: rollout and update
                                                            # see one policy
  c.rl.update(steps=40, prompts=4, micro_batches=1)
  c.rl.optimizer.update(learning_rate=5e-4, warmup_steps=2)
  return c
