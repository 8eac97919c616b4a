r"""PERIA: cold-start SFT, then OR-GIGPO (episode + step-group advantages), no KL, token mean.

    python -m launch.build_benchmark --benchmark chartqa --source "SRC/ChartQA Dataset" \
        --data_dir /data --width 800 --height 600
    python -m launch.train --config configs/peria_or_gigpo.py \
        --config.model.checkpoint=/ckpt/Qwen3-VL-8B-Thinking --config.data.data_dir=/data \
        --config.sft.trajectories=/data/peria_sft.jsonl
    python -m launch.train --config configs/peria_or_gigpo.py:cpu    (runs here)

Data (the reference variant): ChartQA, one of PERIA's image benchmarks and the one with a
training split our builders read, `spatial_benchmark/chartqa` split "train"
(train/train_human.json + train_augmented.json + train/png/, 28,299 questions) and "test"
(test/, 2,500; `launch.eval --benchmark chartqa` scores ChartQA's relaxed accuracy per
part, the recipe's own evaluation PERIA's reward rule (the public manager's) unless
`judge.url`). SRC is the
"ChartQA Dataset" folder of github.com/vis-nlp/ChartQA. Charts are letterboxed to 800 x
600 (`agent.width` x `agent.height`: the run refuses another stored size, naming both);
image 0 of each episode is the task's chart (envs/peria.py), and the scenes have no point
cloud (geometry "none"), so `data.points` is small. PERIA's other benchmarks (ReasonMap,
MapTrace, CartoMapQA, Visual Probing, Cube 3-View, ...) have no builder here. SFT replays
cold-start trajectories (`sft.trajectories`; PERIA's are not public): a file you make,
JSON lines {"question_id": ChartQA's id ("train_human_12"), "turns": [...]} of model turns
in this agent's syntax (data_pipelines/synthetic/teachers.py). Building ChartQA
letterboxes some 20,000 charts: tens of minutes on a 2-core CPU (estimated: MindCube-Tiny's
408 image sets took 91 s).

Published setting (paper; launch script in brackets where it differs): SFT lr 1e-5, batch
32; then N = 4 rollouts per prompt [2], gamma 0.99, omega 1.0, delta 0.9, eps 0.2, no KL
and no entropy bonus, lr 1e-6 cosine with 5% warm-up, token mean over all tokens of the
batch, T <= 11 turns [10] (10 tool calls, then the answer; the image list holds 11),
observation tokens masked, temperature 1.0. Reward: R_rep (consecutive repeats, the public
reward's tiers) + R_format + R_correct (MapTrace: the paper's NDTW mapping). The six
interaction tools with the public argument names (`image_index`, `bounding_box`,
`coordinates`, `points`, `text` + `position`), the public messages (success, per-error
texts, the format error after which the episode continues), "Observation 0:" before the
first image. Step groups match the observation each step produced (the image a call
made; answers, malformed turns and rejected calls their own keys).

The policy family is the paper's, Qwen3-VL (`model.family`; the public SFT base is
Qwen3-VL-8B-Thinking): with `model.chat_format` "auto" a Thinking checkpoint's chat template
opens every reply with "<think>\n" and its generation_config.json's stop ids end turns; the
`cpu` variant's tiny policy takes the thinking format too. Perception tools are host tools
(`perception.tools`, jaxspatial.perception.TOOLS): the reference variant calls PERIA's
twelve (the paper's 18 tools are these and the six interaction tools): five OCR (PP-OCRv4
on this host; PaddleOCR-VL, PERIA's model, with `perception.models.ocr`), six SAM 3 and
GroundingDINO. Those seven need model folders, `--config.perception.models.sam3=/path` and
`--config.perception.models.grounding_dino=/path` (building the policy fails naming the
missing one), or a `launch/perception_server.py` at `--config.perception.url` serving all
twelve. A perception call writes `image_index` and either an optional `bounding_box` or
the tool's text argument (`text_prompt` for text_segment, concept_count and
presence_check, `question` for grounding_dino), passed to the tool by that name; the
system prompt names each tool's arguments. The LLM-judge fallback of R_correct with
`judge.url`. Not reproduced here: SAM 3.1 (transformers' SAM 3 runs its tools), PERIA's
training mixture (ChartQA alone here; on the synthetic 3D sets image 0 is a render of
the scene), `image_label`'s text (drawn as a marker only: no text rendering on device).
Cost: FSDP2 on GPU nodes, 3 epochs, in the public script (node-hours not published:
unknown); here 500 SFT steps of 32, then 500 OR-GIGPO steps of 16 prompts x 4 episodes of
up to 11 turns.

`cpu`: a tiny random Qwen3-VL policy, synthetic_spatial/tiny, 100 SFT steps on the
scripted teacher (a centre crop, then the letter), 10 OR-GIGPO steps of 4 prompts x 4;
with Think3D-RL's it takes 10m20s on a 2-core CPU (`make recipes` runs all three).
"""

from configs.agent_recipe import base, shrink_for_cpu


def get_config(variant: str = "reference"):
  c = base("peria_or_gigpo", "peria", variant)
  c.model.family = "qwen3_vl"  # Qwen3-VL-8B-Thinking in the public code
  c.perception.tools = ("text_ocr", "formula_ocr", "table_ocr", "text_spotting",
                        "map_text_ocr", "auto_segment", "bbox_segment", "text_segment",
                        "exemplar_segment", "concept_count", "presence_check",
                        "grounding_dino")
  if variant == "cpu":
    c.model.chat_format = "thinking"  # as the public SFT base's template
    c.perception.tools = ()
  c.objective = dict(epsilon_low=0.2, epsilon_high=0.2, dual_clip=None, beta=0.0,
                     kl_estimator="k3", aggregation="token-mean")
  c.advantage = dict(estimator="or_gigpo", ddof=1, eps=1e-6, group_size=4, gamma=0.99,
                     omega=1.0, delta=0.9)
  # PEDIA's action budget: 4,096 tokens per reply (its 32,768-token response cap over the
  # episode is not enforced: the static cache holds every turn's budget).
  c.rollout.update(max_turns=11, temperature=1.0, max_turn_tokens=4096)
  c.agent.max_images = 11  # image 0 and one per tool call
  c.sft.update(steps=500, batch=32)
  c.sft.optimizer.learning_rate = 1e-5
  # verl's cosine schedule (min_lr_ratio 0) after 5% warm-up; AdamW over all parameters
  c.rl.prompts = 16
  c.rl.optimizer.update(learning_rate=1e-6, warmup_ratio=0.05, decay="cosine",
                        final_fraction=0.0)
  if variant == "reference":  # ChartQA's charts, image 0 of each episode
    c.data.update(builder="spatial_benchmark", config="chartqa", train_split="train",
                  eval_split="test", points=1024)  # no cloud: geometry "none"
    c.agent.update(width=800, height=600)  # the builder's ChartQA size
  shrink_for_cpu(c)
  if variant == "cpu":
    c.rl.prompts = 4
    c.data.prompt_tokens = 600  # the system message describes six tools: ~450 tiny tokens
  return c
