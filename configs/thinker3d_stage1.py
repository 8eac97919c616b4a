r"""3DThinker stage 1: SFT with the latent-alignment loss (0.1 CE + 0.0005 alignment).

    python -m launch.train --config configs/thinker3d_stage1.py \
        --config.model.checkpoint=/models/Qwen2.5-VL-3B-Instruct \
        --config.data.jsonl=/data/3DThinker/data/train.jsonl \
        --config.data.image_root=/data/3DThinker \
        --config.data.features=/data/3DThinker/data \
        --config.data.eval_jsonl=/data/MindCube_tinybench_raw_qa.jsonl \
        --config.data.eval_image_root=/data/MindCube/data
    python -m launch.train --config configs/thinker3d_stage1.py:cpu [--config.key=value]

`reference` (the default) holds the published setting (public code): Qwen2.5-VL-3B, 12
latents, projector mlp_depth 6 (fusion 391 -> 1374 tokens, 2048 channels), 10 epochs,
per-device batch 1, lr 1e-4 with 10 warm-up steps then linear decay to 0 (transformers'
default scheduler, which the script keeps), weight decay 0.01 except on biases and norms
(transformers' Trainer rule), bf16, vision tower frozen, LLM fully fine-tuned, projector
trained; 8 GPUs in the paper's runs (a global batch of 8 here). Prompts and frames as the
public code makes them (data_pipelines/thinker3d_data.py): the frames, then `text_input`
and its "imagine the mental 3D scene first" instruction; frames of 480 x 640 (391 vision
tokens each); `<output_3D>` expanded to the 12-latent block. Batches hold examples with
the same number of frames (one compiled program per count: 2, 3 or 4 in MindCube).
What it needs (missing ones are named at launch; a missing frame names its path, a
missing feature file its idx):
  model.checkpoint  a Hugging Face Qwen2.5-VL folder: Qwen/Qwen2.5-VL-3B-Instruct (config,
                    safetensors, tokenizer); the latent tokens are added to its tokenizer
                    (ids 151665-151667, inside the 3B's 151,936 embedding rows)
  data.jsonl        3DThinker-10K, the training rows (huggingface.co/datasets/jankin123/
                    3DThinker-10K; the 3DThinker repository's data/example.jsonl holds 99):
                    text_input, image_input, text_output, answer, idx
  data.image_root   the folder the rows' image_input paths resolve under
                    (data/other_all_image_resize/...: MindCube's frames,
                    github.com/mll-lab-nu/MindCube, resized to 480 x 640 by 3DThinker's
                    feature script; frames of another size are resized here the same way)
  data.features     the folder holding feature_vggt/{idx}/vggt.npz ([1, N, 1374, 2048]), from
                    3DThinker's preprocessing/feature/extract_vggt_feature.py (VGGT-1B)
  data.eval_jsonl   optional: MindCube-Tiny's questions (the public evaluation; frames under
                    data.eval_image_root, default data.image_root; `data.eval_limit` the
                    first N); without it there is no held-out evaluation
On a CPU the reference variant runs with a small checkpoint and float32
(tests/recipes/test_thinker3d_reference.py overrides steps, batch, dtypes and the
projector's depth and width).

Cost (`cpu`): 3m05s with stage 2 on a 2-core CPU (`make thinker3d`): a 0.61M-parameter
Qwen2.5-VL-shaped policy (2 layers, width 128) and a 3-layer projector, on the synthetic
three-view task (data_pipelines/synthetic/thinker3d.py; 56x56 views of 4 vision tokens,
stand-in geometry features of 5 + 4x4 tokens x 32 channels), 300 steps of batch 16. It
writes the held-out table (alignment loss down, latent similarity up), curve.png,
completions.html.
"""

import ml_collections

# The published runs' precision: bf16 compute over float32 master weights (the scripts'
# `bf16`), a bf16 KV cache; fused attention; remat per layer.
REFERENCE_MODEL = dict(dtype="bfloat16", param_dtype="float32", cache_dtype="bfloat16",
                       attention="auto", remat=True)

# The public projector: mm_hidden_size is the policy's width (3B: 2048; 7B: 3584),
# fusion_input the vision tokens of a 480 x 640 frame, fusion_output x hidden_size VGGT's
# last aggregator block (5 special + 37 x 37 patch tokens, 2048 channels).
REFERENCE_PROJECTOR = dict(mlp_depth=6, mm_hidden_size=2048, hidden_size=2048, latent_size=12,
                           fusion_input=391, fusion_output=1374, latent_tokens=64)

# transformers' Trainer defaults, which both stages' scripts keep: linear decay to 0 after
# the warm-up, no weight decay on biases and norms.
TRAINER = dict(decay="linear", final_fraction=0.0, weight_decay_mask="transformers")


def trainer_settings(c: ml_collections.ConfigDict) -> None:
  """What the trainer reads, for both stages and variants (jaxspatial/train/trainer.py)."""
  c.mesh = dict(data=-1, fsdp=1, tensor=1)      # -1: all devices
  c.checkpoint = dict(every=100, keep=2, keep_aside=2, restart_from_zero=False)
  c.log_every = 10
  c.resume = True
  c.resume_overrides = ()
  c.evaluate = True
  c.faults = dict(kill_after_step=-1, sigterm_after_step=-1, nan_at_step=-1)  # tests


def reference_data() -> dict:
  """The reference variant's inputs (see the module docstring); empty: not given."""
  return dict(jsonl="", image_root="", features="", eval_jsonl="", eval_image_root="",
              eval_limit=0)


def cpu_settings(c: ml_collections.ConfigDict) -> None:
  """The synthetic task and the tiny policy, shared by both stages' cpu variants."""
  trainer_settings(c)
  c.model = dict(hidden=128, intermediate=256, layers=2, heads=4, kv_heads=2, vision_depth=2,
                 vision_hidden=64, vocab=500, dtype="float32", param_dtype="float32",
                 cache_dtype="float32", attention="auto", remat=False)
  c.scene = dict(width=56, height=56, hfov_deg=90.0, points=6000)
  c.data = dict(train=384, test=96, cache="outputs/thinker3d_data")
  c.features = dict(grid=4, channels=32)           # stand-in: 5 + 16 tokens
  c.model.frozen = ("visual",)
  c.rollout = dict(max_new_tokens=48, temperature=1.0)  # stage 2's, as the reference
  c.eval = dict(batch=48)


def get_config(variant: str = "reference") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.recipe = "thinker3d"         # recipes/thinker3d.py
  c.name = "thinker3d_stage1"
  c.stage = 1
  c.variant = variant
  c.seed = 0
  c.loss = dict(ce_weight=0.1, alignment_weight=0.0005, mode="mse")   # Stage1Config
  c.latents = dict(num_latents=12)
  if variant == "reference":
    trainer_settings(c)
    c.workdir = "outputs/thinker3d_stage1"
    c.model = dict(REFERENCE_MODEL, checkpoint="", frozen=("visual",))
    c.data = reference_data()
    c.rollout = dict(max_new_tokens=2048, temperature=1.0)  # evaluation, as stage 2 samples
    c.eval = dict(batch=8)
    c.projector = dict(REFERENCE_PROJECTOR)
    # steps -1: `data_epochs` passes over the training examples; per-device batch 1 on the
    # paper's 8 GPUs: a global batch of 8
    c.sft = dict(steps=-1, data_epochs=10, batch=8, micro_batches=1,
                 optimizer=dict(learning_rate=1e-4, warmup_steps=10, weight_decay=0.01,
                                clip_norm=1.0, **TRAINER))
    return c
  if variant != "cpu":
    raise ValueError(f"thinker3d_stage1: variant must be 'reference' or 'cpu', got {variant!r}")
  cpu_settings(c)
  c.workdir = "outputs/thinker3d_stage1_cpu"
  c.projector = dict(mlp_depth=3, latent_tokens=64)  # widths follow the model and features
  c.sft = dict(steps=300, batch=16, micro_batches=1,
               optimizer=dict(learning_rate=2e-3, warmup_steps=20, weight_decay=0.01,
                              clip_norm=1.0, **TRAINER))
  return c
