"""The fields every agent recipe (recipes/agents.py) reads, with the CPU variant's sizes.

Each paper's config (think3d_rl.py, act3d_grpo.py, peria_or_gigpo.py) starts from
`base(name, agent, variant)`, sets its published values, and ends with `shrink_for_cpu(c)`:
the `cpu` variant keeps the objective and shrinks the rest (a tiny random policy, the tiny
synthetic dataset, short episodes) so the recipe runs end to end here.
"""

import ml_collections

VARIANTS = ("reference", "cpu")


def base(name: str, agent: str, variant: str) -> ml_collections.ConfigDict:
  if variant not in VARIANTS:
    raise ValueError(f"{name}: variant must be 'reference' or 'cpu', got {variant!r}")
  c = ml_collections.ConfigDict()
  c.recipe = "agent"
  c.name = name
  c.variant = variant
  c.seed = 0
  c.workdir = f"outputs/{name}" + ("_cpu" if variant == "cpu" else "")
  c.mesh = dict(data=-1, fsdp=1, tensor=1)
  # checkpoint: a Hugging Face folder of a policy family (its config.json's model_type picks
  # the family); "" = a tiny random policy of `family` (cpu variant). family: the paper's
  # policy family ("qwen2_5_vl", "qwen3_vl", "qwen3_5"); a checkpoint of another family still loads
  # (an ablation), with a note. chat_format: how replies open, "auto" (the checkpoint's chat
  # template: a Thinking model's "<think>\n" prefill; stop ids from generation_config.json),
  # "instruct" or "thinking".
  # shape / layers (no checkpoint): a random policy of a released checkpoint's shape
  # (jaxspatial.models.shapes.PUBLISHED, e.g. "Qwen3.5-9B"; its family replaces `family`),
  # its decoder cut to `layers` when > 0; "" = the family's tiny policy. For memory
  # planning and throughput before the weights arrive (benchmarks/device_suite's recipes).
  # frozen: parameter paths that do not train (e.g. ("visual",): the vision tower).
  # dtype / param_dtype / cache_dtype: bf16 compute over float32 master weights, a bf16 KV
  # cache (jaxspatial.models.precision); attention "auto": cuDNN flash attention on GPU;
  # remat: recompute each layer in the backward pass (3B-9B policies at 16 x 8 episodes).
  c.model = dict(checkpoint="", family="qwen2_5_vl", shape="", layers=0, chat_format="auto",
                 frozen=(),
                 dtype="bfloat16", param_dtype="float32", cache_dtype="bfloat16",
                 attention="auto", remat=True)
  # input_views: Think3D's first prompt holds up to this many input views; views: its
  # action space, "free" angles or the public RL prompt's three "preset" views.
  # splat_radius / point_radius: how the environment renders the scene's cloud: fixed
  # (2 x splat_radius + 1)-pixel splats (point_radius 0: Think3D's public renderer, 3x3), or
  # discs of world radius point_radius capped at splat_radius pixels.
  c.agent = dict(name=agent, width=640, height=480, hfov_deg=90.0, max_images=8,
                 input_views=8, views="free", splat_radius=1, point_radius=0.0)
  c.data = dict(builder="synthetic_spatial", config="base", data_dir="outputs/data",
                build=False, train_split="train", eval_split="test", points=262_144,
                prompt_tokens=4096)
  # max_turns = the environment's tool calls + 1 (the last turn answers)
  c.rollout = dict(max_turns=4, max_turn_tokens=1024, temperature=1.0, top_p=1.0,
                   constrained=False, repetition_penalty=1.0)
  c.reward = dict(weights={})
  # The LLM judge of free-form answers (Act3D's R_judge; PERIA's fallback after the rule
  # check): an OpenAI-compatible endpoint (vLLM, SGLang, ...) at `url` serving `model`, its
  # key from the environment variable `api_key_env` ("auto": $OPENAI_API_KEY, sent to
  # api.openai.com only); or `checkpoint`: a jaxspatial policy
  # folder that judges on device inside the rollout (no host round trip); neither = the
  # on-device rule judge.
  # Act3D's training judge samples at temperature 0.1 with 64 tokens, its evaluation judge
  # at 0 with 4 (jaxspatial.perception.judge); max_requests 0: no budget.
  # PERIA's perception tools as host tools: public names from jaxspatial.perception.TOOLS,
  # run on this host or served by launch/perception_server.py at `url`; their text results
  # hold at most max_tokens. models: Hugging Face folders by family for the tools run here
  # (sam3 and grounding_dino need one; ocr "" = PP-OCRv4 from the rapidocr wheel, a folder
  # = PaddleOCR-VL).
  c.perception = dict(tools=(), url="", models=dict(ocr="", sam3="", grounding_dino=""),
                      max_tokens=256, timeout_s=60.0, retries=1)
  c.judge = dict(url="", model="", api_key_env="auto", timeout_s=60.0, retries=3,
                 concurrency=16, max_requests=0, checkpoint="")
  # Think3D's scene reconstructed from each task's input images inside the rollout (one
  # host call per batch at its start; jaxspatial.perception.reconstruct's adapters): backend
  # "pi3", "vggt" or "da3" from the local `checkpoint` on torch `device`, its cloud padded to
  # `points` (0: data.points); on_error "raise" or "flag" (the episode starts done).
  # backend "" = the dataset's clouds and cameras.
  c.reconstruction = dict(backend="", checkpoint="", device="cpu", points=0, timeout_s=600.0,
                          on_error="raise")
  # The phases; `optimizer` is jaxspatial.train.OptimizerConfig (total_steps: the phase's
  # updates). sft.steps 0: no SFT. sft.trajectories: a teacher trajectory file
  # (data_pipelines/synthetic/teachers.py), or "scripted" for the synthetic dataset's
  # scripted teacher. rl.steps -1: `rl.data_epochs` passes over the training split's tasks.
  c.sft = dict(steps=0, batch=16, micro_batches=1, trajectories="",
               optimizer=dict(learning_rate=1e-5, warmup_ratio=0.0, clip_norm=1.0,
                              weight_decay=0.0, decay="cosine", final_fraction=0.1,
                              weight_decay_mask="all"))
  # rl.share_prompts: a group's prompt is prefilled once and its cache repeated to the
  # group's rows (False: every row prefills its own copy, the earlier path, for benchmarks).
  c.rl = dict(steps=500, data_epochs=1.0, prompts=16, mini_batches=1, epochs=1,
              micro_batches=1, share_prompts=True,
              optimizer=dict(learning_rate=1e-6, warmup_ratio=0.0, clip_norm=1.0,
                             weight_decay=0.0, decay="cosine", final_fraction=0.1,
                             weight_decay_mask="all"))
  # eval.max_turns: the turns of a benchmark evaluation's episodes (`launch.eval
  # --benchmark`), 0 = rollout.max_turns (Think3D: the paper's K = 3 views at evaluation,
  # the public RL script's 2 in training).
  c.eval = dict(batch=64, tasks=1024, max_turns=0)
  c.checkpoint = dict(every=50, keep=3, keep_aside=2, restart_from_zero=False)
  c.log_every = 10
  c.snapshot_every = 100
  c.resume = True
  c.resume_overrides = ()      # config keys a resumed run may change ("*": any)
  c.faults = dict(kill_after_step=-1, sigterm_after_step=-1, nan_at_step=-1)  # tests
  return c


def shrink_for_cpu(c) -> ml_collections.ConfigDict:
  """The `cpu` variant's sizes (no-op for `reference`)."""
  if c.variant == "cpu":
    c.model.update(checkpoint="", dtype="float32", param_dtype="float32",
                   cache_dtype="float32", remat=False)
    # the tiny dataset's views: their size (Think3D renders with it) and splats
    # (data_pipelines.synthetic.samples.SampleConfig's: 3x3 splats leave 8% of a room view
    # showing the background through the cloud's gaps)
    c.agent.update(width=96, height=72, splat_radius=4, point_radius=0.08)
    c.data.update(config="tiny", build=True, points=32_768, prompt_tokens=400)
    c.rollout.update(max_turns=2, max_turn_tokens=72)
    c.sft.update(steps=100, batch=8, trajectories="scripted")
    c.sft.optimizer.update(learning_rate=3e-3, warmup_ratio=0.1)
    c.rl.update(steps=10, prompts=2)
    c.rl.optimizer.update(learning_rate=2e-4, warmup_ratio=0.1)
    c.eval.update(batch=16, tasks=32, max_turns=0)
    c.checkpoint.update(every=10, keep=2)
    c.log_every = 5
    c.snapshot_every = 5
  return c
