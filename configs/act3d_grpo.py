r"""Act3D: trajectory SFT, then GRPO with the composite judge / EM / interaction reward.

    python -m launch.build_benchmark --benchmark scanqa --source SRC --data_dir /data
    python -m launch.train --config configs/act3d_grpo.py \
        --config.model.checkpoint=/ckpt/qwen --config.data.data_dir=/data \
        --config.sft.trajectories=/data/act3d_sft.jsonl \
        --config.judge.url=http://judge-host:8000/v1 --config.judge.model=Qwen3-30B-A3B-Instruct
    python -m launch.train --config configs/act3d_grpo.py:cpu        (runs here)

Data (the reference variant): the paper's ScanQA-only setting, `spatial_benchmark/scanqa`,
split "train" (ScanQA_v1.0_train.json: 25,563 questions, the paper's ScanQA-only RL set)
and "test" (ScanQA_v1.0_val.json, the 4,675 validation questions it reports). SRC holds
both files (github.com/ATR-DBI/ScanQA) and scans/<scene_id>/ in ScanNet v2's layout
(_vh_clean_2.ply, .aggregation.json, _vh_clean_2.0.010000.segs.json, <scene_id>.txt; from
ScanNet under its terms of use); each scene is subsampled to 200,000 points (`--points`,
at most `data.points`) and given one initial 640x480 viewpoint (data_pipelines/benchmarks/
scannet.py). Building reads, subsamples and renders every scan, about 2 s a scan on a
2-core CPU (launch/build_benchmark.py): the two files cover 633 scans (562 + 71), some 20
minutes. SFT replays teacher trajectories (`sft.trajectories`): the paper's GPT-5.4
trajectories are not released, so this is a file you make, JSON lines {"question_id":
ScanQA's id, "turns": [...]} of model turns in this agent's syntax
(data_pipelines/synthetic/teachers.py). The paper's mixed corpus (5,712 trajectories,
51,543 RL questions from ScanQA, MP3D and generated QA) has no builder here.

Published setting (paper sections 3.2-3.3 and 4.1, appendix C.1): SFT on 5,712 teacher
trajectories, 2 epochs, batch 16, lr 1e-5, observations and prompt masked; then GRPO with
G = 8, 64 prompts per step, mini-batch 16 (4 optimizer steps per rollout batch), lr 2e-6,
temperature 0.7, eps 0.2, beta 0.005 (estimator unstated: k3), no entropy bonus,
per-trajectory token mean then mean over G, 12 interactions then the answer (13 turns),
640x480 renders, the system message and first user turn of appendix C.1 verbatim.
Reward (eqs. 8-9): 0.3 judge + 0.2 EM (any annotated answer) + 0.05 judge c(tau) - 0.2
R_fmt (a missing or empty answer; `reward.weights.format_rule="grammar"` also counts
grammar slips), c = 12 once an answer object has been seen (the initial view counts).

Policy: Qwen3.5-9B, as in the paper (`model.family = "qwen3_5"`: the hybrid Gated DeltaNet
decoder, jaxspatial/models/qwen3_5; `model.checkpoint` a Qwen3.5 folder). Not reproduced
here: the LLM judge unless `judge.url` names an OpenAI-compatible endpoint (the
paper's evaluation judge is Qwen3-30B-A3B-Instruct; without one the on-device rule judge,
normalised EM or token F1 >= 0.5, stands in), the observation wording after a move
(the paper gives only its content: camera and look-at point to 0.01 m), the renderer's
field of view (unstated; 90 degrees here), asynchronous vLLM rollouts. Cost: H200 GPUs in
the paper, count and hours not published (unknown); 318 SFT steps, then 500 GRPO steps of
64 prompts x 8 episodes of up to 13 turns (the RL step count is not published either).

`cpu`: tiny random Qwen3.5 policy (three Gated DeltaNet layers and one gated-attention
layer), synthetic_spatial/tiny, 100 SFT steps on the scripted teacher
(one turn, then the answer text), 10 GRPO steps of 2 prompts x 8 in 2 mini-batches;
the three CPU recipes took
11m40s together on a 2-core CPU when all three ran Qwen2.5-VL (`make recipes`).
"""

from configs.agent_recipe import base, shrink_for_cpu


def get_config(variant: str = "reference"):
  c = base("act3d_grpo", "act3d", variant)
  c.model.family = "qwen3_5"  # Qwen3.5-9B in the paper
  c.objective = dict(epsilon_low=0.2, epsilon_high=0.2, dual_clip=None, beta=0.005,
                     kl_estimator="k3", aggregation="sequence-mean-token-mean")
  c.advantage = dict(estimator="grpo", ddof=1, eps=1e-6, group_size=8)
  c.reward.weights = dict(judge_weight=0.3, exact_match_weight=0.2, interaction_weight=0.05,
                          format_weight=0.2, max_interactions=12, format_rule="paper",
                          grounding="all")
  c.rollout.update(max_turns=13, temperature=0.7)  # 12 interactions, then the answer
  # 2 epochs at batch 16: ScanQA-only, 2,550 trajectories (159 batches an epoch); the mixed
  # corpus's 5,712 would be 714 steps.
  c.sft.update(steps=318, batch=16)
  c.sft.optimizer.learning_rate = 1e-5
  c.rl.update(prompts=64, mini_batches=4)
  c.rl.optimizer.learning_rate = 2e-6
  if variant == "reference":  # ScanQA on ScanNet scans (the paper's ScanQA-only setting)
    c.data.update(builder="spatial_benchmark", config="scanqa", train_split="train",
                  eval_split="test")
  shrink_for_cpu(c)
  if variant == "cpu":
    c.reward.weights.max_interactions = 1
    c.rl.mini_batches = 2
    c.data.prompt_tokens = 600  # appendix C.1's system message is about 500 tiny tokens
  return c
