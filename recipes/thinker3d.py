"""3DThinker's two stages (configs/thinker3d_stage1.py, thinker3d_stage2.py), on the published
data (variant `reference`) or on the synthetic three-view task (`cpu`).

    python -m launch.train --config configs/thinker3d_stage1.py:cpu   # SFT + latent alignment
    python -m launch.train --config configs/thinker3d_stage2.py:cpu   # GRPO from stage 1

Stage 1 trains the policy and the 3D projector (vision tower frozen) on
`0.1 CE + 0.0005 alignment`; stage 2 restores it, adds LoRA adapters to the language model
(its linear layers and LM head, as `model.lora.targets` lists) and runs GRPO (format +
answer + latent-similarity rewards, computed inside the compiled rollout) with the KL
term against the LoRA-disabled base; the projector stays frozen. Both evaluate the
held-out split before and after and write results.json, curve.png, completions.html and
checkpoints.

The variants differ in where the policy and the data come from, nothing else:
  reference  the Hugging Face Qwen2.5-VL folder `model.checkpoint` (the latent tokens added
             to its tokenizer), the training JSONL `data.jsonl` with frames under
             `data.image_root` and VGGT features under `data.features`
             (data_pipelines/thinker3d_data.py: the public code's prompt, 480 x 640 frames,
             391 tokens each); held out: MindCube-Tiny `data.eval_jsonl` (no targets or
             features: greedy format, accuracy per setting, reward = format + correct)
  cpu        a small random policy with a tokenizer trained on the task, the synthetic
             three-view task (data_pipelines/synthetic/thinker3d.py) with stand-in features;
             held out: its test split (teacher-forced CE and alignment, greedy rollouts with
             latent similarity)
Examples are grouped by their number of views (`Split`: one compiled shape each); an epoch
shuffles each group, cuts it into batches (a group smaller than a batch repeats) and
shuffles the batches, so step k's batch is a function of the seed and k alone.

`recipes/thinker3d.py` (`recipe = "thinker3d"`; stage 2's module is the language model with
its adapters, built from stage 1's checkpoint `init_from`):
- Stage 1, `StepConfig(objective="thinker3d_stage1", options=Stage1Config(...))` on `Thinker3DPolicy` (model +
  projector): per sample `0.1 CE + 0.0005 alignment`, CE over target tokens except latent
  pads, latents = final hidden states at the start token and the next T - 1 positions (the
  positions before each pad; pads embedded as pads), image embeddings = the input
  embeddings at the image tokens, split per image; batch loss = mean over samples (the
  reference's batch 1 per device). Vision tower frozen through the optimizer's filter.
- Stage 2: LoRA on the language model (adapters only train; the projector stays frozen),
  the reference is the LoRA-disabled base, and `rollout/thinker3d.py` compiles sampling
  and all three rewards into one program. The latent reward scores the latents the
  sampler generated (inference mode: hidden states fed back), not the reference code's
  teacher-forced re-read one position later. With no latent block (a start token, then an
  end token after it) it scores the public fallback: the final hidden states at the 12
  positions from the one after `<|im_start|>assistant` (`latent_fallback="after_header"`:
  the prompt's closing newline, then the first 11 generated; `"generated"`; `"none"`: 0),
  0 when the completion is shorter than the window. The format reward walks the 3DThinker
  grammar automaton (12 pads exactly, a non-empty tag-free answer; the code's regex checks
  neither). `correct` uses the public letter rule. LoRA covers every linear of the
  language model and the tied LM head (`LoRATiedHead`: logits = h E^T + (alpha / r) h A B);
  sampling at temperature 1.0; linear decay to 0.
- Training-mode and inference-mode latents agree at latent 0 only (same prefix); after
  it they differ by about the latents' own norm on a trained tiny policy
  (tests/train/test_thinker3d.py prints the per-index distances).
- Synthetic targets: `GeometryStandInExtractor` (not VGGT), written to and read from the
  published cache layout under a folder keyed by every setting the features depend on.
- The reference variant (`data_pipelines/thinker3d_data.py`): the checkpoint's tokenizer
  gains the three latent tokens (the embedding grows only when they fall past its rows;
  Qwen2.5-VL-3B's already hold them), rows are read and every frame and feature file is
  checked before the model loads, one feature file is read to check its shape against
  the projector, frames and features load per batch. The prompt: Qwen's template with its
  default system turn, the frames, `text_input` + the public instruction; stage 2 samples
  the same prompts (the public conversion keeps text_input, answer, frames and idx).
  Held out: MindCube-Tiny questions, no targets or features: format, accuracy (and per
  setting), reward = format + correct. `steps=-1` runs `data_epochs` epochs.
  tests/recipes/test_thinker3d_reference.py runs both stages one step each through
  `launch.train` on rows of the public example JSONL with a tiny random Qwen2.5-VL folder
  (about 2.5 minutes on 2 cores: `make train-checks`, as the agent recipes' reference steps).
- Everything runs under one mesh built from `config.mesh`: parameters (LoRA adapters
  included) are created with their shardings, so each program compiles once; an array
  committed differently from what a jitted step returns (e.g. an unsharded adapter) makes
  the step compile again after the first update (`JAX_LOG_COMPILES=1` shows it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import pathlib
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from flax import nnx

from data_pipelines import thinker3d_data
from data_pipelines.synthetic import thinker3d as synthetic
from data_pipelines.synthetic.stand_in_features import GeometryStandInExtractor
from jaxspatial import models
from jaxspatial.models import (Precision, Projector3DConfig, Thinker3DPolicy, apply_lora,
                               latent3d, memory, model_options)
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.models.qwen2_5_vl.tokenizer import train_tokenizer
from jaxspatial.models.sharding import global_batch, local_rows
from jaxspatial.rl.objectives import PolicyLossConfig
from jaxspatial.rollout import token_table as am, episode, grammars, prompts, tiny
from jaxspatial.rollout import thinker3d as rollout3d
from jaxspatial.rollout.viewer import completions_html
from jaxspatial.train import (AdvantageConfig, Checkpointer, Experiment, ExportedPolicy,
                              OptimizerConfig, Phase, RolloutBatch, StepConfig, TrainBatch,
                              trainable)
from jaxspatial.train.thinker3d import Stage1Config, stage1_batch, stage1_terms
from recipes.common import gather_rows, my_rows, small_model_config

STAND_IN_VERSION = 2  # bump when GeometryStandInExtractor's features change
EVAL_METRICS = ("cross_entropy", "alignment", "format", "correct", "latent_block",
                "latent_sim", "latent_sim_primed", "reward")
DATA_SOURCES = (
    "3DThinker-10K (huggingface.co/datasets/jankin123/3DThinker-10K, the training JSONL; "
    "the repository's data/example.jsonl holds 99 rows), its frames from MindCube "
    "(github.com/mll-lab-nu/MindCube, resized to 480 x 640 by the feature script), VGGT "
    "features from 3DThinker's preprocessing/feature/extract_vggt_feature.py")


@dataclasses.dataclass
class Split:
  """Examples of one shape (`views` frames each): the left-padded prompts, the stage-1 layout
  (prompt, target; None without targets), and loaders of a batch's frames and target
  features (None without features). A data split is a list of them."""
  views: int
  questions: list[str]
  answer_choice: np.ndarray               # [N] int32 option index
  prompt_ids: np.ndarray                  # [N, L]
  prompt_mask: np.ndarray
  tokens: np.ndarray | None               # [N, L + T]
  attention: np.ndarray | None
  loss: np.ndarray | None
  images_of: Callable[[np.ndarray], np.ndarray]           # index -> [B, K, H, W, 3] uint8
  features_of: Callable[[np.ndarray], np.ndarray] | None  # index -> [B, K, F, C] float32
  keys: list[str]                         # the examples' names (idx, question id)
  settings: list[str]                     # per example: a category for accuracy ("" none)

  def __len__(self) -> int:
    return len(self.questions)

  def images(self, index) -> np.ndarray:
    return _each_once(self.images_of, index).astype(np.uint8, copy=False)

  def features(self, index) -> np.ndarray:
    if self.features_of is None:
      raise ValueError("thinker3d: this split has no target features")
    return _each_once(self.features_of, index).astype(np.float32, copy=False)


def _each_once(load, index) -> np.ndarray:
  """load(index), each distinct example loaded once (a GRPO group repeats its prompt)."""
  unique, inverse = np.unique(np.asarray(index), return_inverse=True)
  return np.asarray(load(unique))[inverse.reshape(-1)]


def stage1_train_batch(split: Split, index) -> TrainBatch:
  index = np.asarray(index)
  zeros = jnp.zeros(split.tokens[index].shape, jnp.float32)
  return TrainBatch(tokens=jnp.asarray(split.tokens[index]),
                    attention_mask=jnp.asarray(split.attention[index]),
                    loss_mask=jnp.asarray(split.loss[index]),
                    images=jnp.asarray(split.images(index)),
                    advantages=jnp.zeros(len(index), jnp.float32), old_logprobs=zeros,
                    ref_logprobs=zeros, features=jnp.asarray(split.features(index)))


def epoch_batches(sizes: list[int], batch: int, seed: int, stream: int,
                  epoch: int) -> list[tuple[int, np.ndarray]]:
  """One epoch's (group, example indices) batches: each group shuffled and cut into batches
  of `batch` (the last one filled from the group's start, so a group smaller than a batch
  repeats examples), all batches shuffled."""
  rng = np.random.default_rng([seed, stream, epoch])
  out = []
  for group, size in enumerate(sizes):
    count = -(-size // batch)
    order = np.resize(rng.permutation(size), count * batch)
    out += [(group, order[b * batch:(b + 1) * batch]) for b in range(count)]
  return [out[i] for i in rng.permutation(len(out))]


def batches_per_epoch(sizes: list[int], batch: int) -> int:
  return sum(-(-size // batch) for size in sizes)


@nnx.jit(static_argnames=("config",))
def _stage1_eval(policy, batch, config):
  cross_entropy, alignment, _ = stage1_terms(policy, batch, config)
  return cross_entropy, alignment


def check_assistant_header(tokenizer, prompt_ids: np.ndarray) -> None:
  """The "after_header" latent fallback reads the last prompt position as the one after
  `<|im_start|>assistant`: every prompt must end with that header and one newline token."""
  newline = tokenizer.encode("\n", add_special_tokens=False)
  header = tokenizer.decode(prompt_ids[0, -32:].tolist())
  if len(newline) != 1 or np.any(prompt_ids[:, -1] != newline[0]) or not header.endswith(
      "<|im_start|>assistant\n"):
    raise ValueError(f"thinker3d: prompts must end with '<|im_start|>assistant' and one "
                     f"newline token (the latent fallback's window starts there); the first "
                     f"ends with {header!r}")


def make_phases(c, steps: int, stage1: Stage1Config | None = None) -> list[Phase]:
  """Stage 1: SFT + alignment (`stage1`: its loss settings with the latent token ids);
  stage 2: GRPO on LoRA adapters against the LoRA-disabled base. From the config alone."""
  if c.stage == 1:
    return [Phase("sft", steps, OptimizerConfig(**c.sft.optimizer),
                  StepConfig(objective="thinker3d_stage1", options=stage1,
                             micro_batches=c.sft.micro_batches),
                  trainable(frozen=tuple(c.model.frozen)))]
  return [Phase("rl", steps, OptimizerConfig(**c.rl.optimizer),
                StepConfig(objective="grpo", temperature=c.rollout.temperature,
                           loss=PolicyLossConfig(**c.objective),
                           micro_batches=c.rl.micro_batches),
                trainable(adapters_only=True), reference="lora_disabled",
                advantage=AdvantageConfig(**c.advantage), mini_batches=c.rl.mini_batches,
                epochs=c.rl.epochs)]


def check_reference_inputs(c) -> None:
  """The reference variant's inputs, all named at once when missing: the checkpoint, the
  training JSONL, the image root, the feature folder (stage 2 also `init_from`, checked
  when it restores)."""
  d = c.data
  flags = (
      ("model.checkpoint", c.model.get("checkpoint", ""), "/path/to/Qwen2.5-VL-3B-Instruct "
       "(a Hugging Face Qwen2.5-VL folder: config.json, safetensors, tokenizer)"),
      ("data.jsonl", d.get("jsonl", ""), "/path/to/train.jsonl (3DThinker-10K rows: "
       "text_input, image_input, text_output, answer, idx)"),
      ("data.image_root", d.get("image_root", ""), "/path (the folder the rows' image_input "
       "paths, e.g. data/other_all_image_resize/..., resolve under)"),
      ("data.features", d.get("features", ""), "/path (the folder holding "
       "feature_vggt/{idx}/vggt.npz)"))
  unset = [f"--config.{name}={hint}" for name, value, hint in flags if not value]
  where = f"thinker3d stage {c.stage} (variant {c.variant!r})"
  if unset:
    raise ValueError(f"{where} trains a pretrained policy on the published data; missing: "
                     + "; ".join(unset) + f". Data: {DATA_SOURCES}. Or run the ':cpu' variant.")
  kinds = (("model.checkpoint", c.model.checkpoint, "folder"), ("data.jsonl", d.jsonl, "file"),
           ("data.image_root", d.image_root, "folder"), ("data.features", d.features, "folder"))
  if d.get("eval_jsonl", ""):
    kinds += (("data.eval_jsonl", d.eval_jsonl, "file"),)
    if d.get("eval_image_root", ""):
      kinds += (("data.eval_image_root", d.eval_image_root, "folder"),)
  absent = [f"{name} {value}: no such {kind}" for name, value, kind in kinds
            if not (pathlib.Path(value).is_dir() if kind == "folder"
                    else pathlib.Path(value).is_file())]
  if absent:
    raise FileNotFoundError(f"{where}: " + "; ".join(absent))


class Thinker3D(Experiment):
  def __init__(self, config, data: bool = True):
    c = self.c = config
    if c.variant not in ("reference", "cpu"):
      raise ValueError(f"thinker3d: variant must be 'reference' or 'cpu', got {c.variant!r}")
    if c.variant == "reference" and data:
      check_reference_inputs(c)
    elif c.variant == "reference" and not pathlib.Path(c.model.get("checkpoint", "")
                                                       or "/nonexistent").is_dir():
      raise FileNotFoundError(f"thinker3d stage {c.stage} (variant 'reference'): "
                              f"model.checkpoint {c.model.get('checkpoint', '')!r}: no such "
                              "folder (the Hugging Face Qwen2.5-VL folder the run started "
                              "from: --config.model.checkpoint=/path)")
    self.name = f"thinker3d stage {c.stage}"
    self.curve_metrics = (("sft/loss", "sft/alignment", "sft/cross_entropy") if c.stage == 1
                          else ("rl/reward", "rl/latent_sim", "rl/correct"))
    self._epochs = {}

  # -- set-up ------------------------------------------------------------------------------

  def build(self, mesh):
    """Tokenizer, policy (model + projector), grammar automaton, and both splits; stage 2
    restores stage 1's checkpoint and adds LoRA adapters (its module: the language model's
    adapters train)."""
    c = self.c
    self.mesh = mesh
    if c.variant == "cpu":
      train, test = self._synthetic_policy_and_data()
    else:
      train, test = self._published_policy_and_data()
    tok = self.tokenizer
    model = self.policy.model
    self.latent_ids = tuple(tok.convert_tokens_to_ids(t) for t in tiny.LATENT_TOKENS)
    self.automaton = am.compile_token_automaton(grammars.thinker3d(c.latents.num_latents), tok,
                                                model.config.text.vocab_size)
    self.stage1 = Stage1Config(start_token=self.latent_ids[0], pad_token=self.latent_ids[1],
                               num_latents=c.latents.num_latents, **c.loss)
    self.train, self.test = train(), test()
    if c.stage == 1:
      return self.policy
    stage1 = Checkpointer(epath.Path(c.init_from) / "checkpoints")
    if stage1.restore_params(self.policy) is None:
      first = "configs/thinker3d_stage1.py" + (":cpu" if c.variant == "cpu" else "")
      raise FileNotFoundError(f"stage 2 starts from stage 1's checkpoint: none under "
                              f"{stage1.directory}; run {first} first (or set init_from)")
    stage1.close()
    return self._adapters()  # the projector is frozen: only the adapters train

  def _adapters(self):
    """Stage 2's module: the language model with LoRA adapters."""
    c = self.c
    lora = c.model.lora
    apply_lora(self.policy.model.language_model, tuple(lora.targets), lora.rank, lora.alpha,
               lora.dropout, rngs=nnx.Rngs(c.seed + 2))
    return self.policy.model

  @classmethod
  def for_export(cls, config) -> "Thinker3D":
    """The recipe without its data checks (the reference variant's policy needs only
    `model.checkpoint`)."""
    return cls(config, data=False)

  def build_for_export(self, mesh):
    """The cpu variant: `build` (its tokenizer is trained on the synthetic task). The
    reference variant: the checkpoint's policy with the latent tokens and the projector,
    and in stage 2 the adapters (a stage-2 checkpoint holds the base weights too: stage 1's
    is not read); no data."""
    c = self.c
    if c.variant == "cpu":
      return self.build(mesh)
    self.mesh = mesh
    self._published_policy()
    return self.policy if c.stage == 1 else self._adapters()

  def exported_policy(self, module):
    """The policy's language and vision model (the 3D projector is not part of a Hugging
    Face folder: stage 2's policy samples without it), with the latent tokens in its
    tokenizer; LoRA adapters are merged by the export, the tied head's as an untied head."""
    model = module.model if isinstance(module, Thinker3DPolicy) else module
    return ExportedPolicy(model, self.tokenizer,
                          source=self.c.model.get("checkpoint", "") or None)

  def _synthetic_policy_and_data(self):
    """The cpu variant: the synthetic task (features through the cache), a tokenizer trained
    on it, a small random policy."""
    data = synthetic
    c = self.c
    extractor = GeometryStandInExtractor(grid=c.features.grid, channels=c.features.channels)
    # The cache is keyed by everything the features depend on: a changed setting never
    # reads stale features.
    settings = json.dumps([c.seed, c.scene.to_dict(), c.features.to_dict(), STAND_IN_VERSION],
                          sort_keys=True)
    cache = pathlib.Path(c.data.cache) / hashlib.sha1(settings.encode()).hexdigest()[:12]
    split_args = dict(points=c.scene.points, width=c.scene.width, height=c.scene.height,
                      hfov_deg=c.scene.hfov_deg, extractor=extractor)
    train = data.make_examples(c.data.train, c.seed * 1000 + 1, feature_root=cache / "train",
                               **split_args)
    test = data.make_examples(c.data.test, c.seed * 1000 + 2, feature_root=cache / "test",
                              **split_args)
    corpus = ([data.SYSTEM, *train.questions[:200]]
              + [latent3d.expand_output_3d(t, c.latents.num_latents)
                 for t in train.targets[:200]])
    tok = self.tokenizer = train_tokenizer(corpus * 5, vocab_size=c.model.vocab,
                                           extra_special_tokens=tiny.LATENT_TOKENS)
    model = Qwen25VL(small_model_config(c.model, tok), rngs=nnx.Rngs(c.seed),
                     **model_options(c.model))
    self.image_tokens = episode.image_tokens(model, (c.scene.height, c.scene.width))
    projector = Projector3DConfig(
        mlp_depth=c.projector.mlp_depth, mm_hidden_size=c.model.hidden,
        hidden_size=extractor.channels, latent_size=c.latents.num_latents,
        latent_tokens=c.projector.latent_tokens, fusion_input=self.image_tokens,
        fusion_output=extractor.tokens)
    self.policy = Thinker3DPolicy(model, projector, rngs=nnx.Rngs(c.seed + 1))
    self.system, self.user_text = data.SYSTEM, lambda question: question
    target_length = self._target_length(train.targets + test.targets)

    def split(examples):
      return lambda: [self._split(
          len(data.VIEWS), examples.questions, examples.targets, examples.answer_choice,
          lambda index: examples.images[index], lambda index: examples.features[index],
          [str(i) for i in range(len(examples))], [""] * len(examples), target_length)]
    return split(train), split(test)

  def _published_policy(self) -> Projector3DConfig:
    """The reference variant's policy: the checkpoint's model, its tokenizer with the
    latent tokens (the embedding grown to them), the projector. Returns its config."""
    data = thinker3d_data
    c = self.c
    processor, model = models.load_policy(c.model.checkpoint, seed=c.seed,
                                          **model_options(c.model))
    tok = self.tokenizer = getattr(processor, "tokenizer", processor)
    latent3d.add_latent_tokens(tok)
    fit_vocabulary(model, len(tok), seed=c.seed)
    frame = (data.FRAME_HEIGHT, data.FRAME_WIDTH)
    self.image_tokens = episode.image_tokens(model, frame)
    projector = Projector3DConfig(**c.projector)
    hidden = model.config.text.hidden_size
    if projector.mm_hidden_size != hidden:
      raise ValueError(f"projector.mm_hidden_size {projector.mm_hidden_size} must be the "
                       f"policy's hidden size {hidden} ({c.model.checkpoint}): set "
                       f"--config.projector.mm_hidden_size={hidden}")
    if projector.fusion_input != self.image_tokens:
      raise ValueError(f"projector.fusion_input {projector.fusion_input}: a {frame[1]} x "
                       f"{frame[0]} frame gives {self.image_tokens} vision tokens with this "
                       "checkpoint's vision config (the reference: 391)")
    if projector.latent_size != c.latents.num_latents:
      raise ValueError(f"projector.latent_size {projector.latent_size} must equal "
                       f"latents.num_latents {c.latents.num_latents}")
    self.policy = Thinker3DPolicy(model, projector, rngs=nnx.Rngs(c.seed + 1))
    return projector

  def _published_policy_and_data(self):
    """The reference variant: the checkpoint's policy with the latent tokens, the training
    JSONL (frames and features checked up front) and MindCube-Tiny held out."""
    data = thinker3d_data
    c, d = self.c, self.c.data
    rows = data.read_training_rows(d.jsonl, d.image_root)
    data.check_features(rows, d.features)
    evaluation = []
    if d.get("eval_jsonl", ""):
      evaluation = data.read_eval_rows(d.eval_jsonl, d.get("eval_image_root", "")
                                       or d.image_root, limit=d.get("eval_limit", 0))
    projector = self._published_policy()
    # One feature file read now: a cache of another shape fails here, not at step 1.
    data.load_features(rows[0], d.features, projector.fusion_output, projector.hidden_size)
    self.system, self.user_text = data.SYSTEM, data.prompt_text
    target_length = self._target_length([row.target for row in rows])

    def split(rows, with_targets: bool):
      def build():
        out = []
        for views, positions in data.group_by_views(rows).items():
          group = [rows[p] for p in positions]
          features = (lambda index, group=group: np.stack([data.load_features(
              group[i], d.features, projector.fusion_output, projector.hidden_size)
                                                           for i in index]))
          out.append(self._split(
              views, [r.question for r in group],
              [r.target for r in group] if with_targets else None,
              np.asarray([r.answer_choice for r in group], np.int32),
              lambda index, group=group: np.stack([data.load_frames(group[i].images)
                                                   for i in index]),
              features if with_targets else None, [r.key for r in group],
              [r.setting for r in group], target_length))
        return out
      return build
    return split(rows, True), split(evaluation, False)

  def _target_length(self, targets: list[str]) -> int:
    """Tokens of the longest stage-1 target: every batch pads its targets to it."""
    n = self.c.latents.num_latents
    return max(len(self.tokenizer.encode(latent3d.expand_output_3d(t, n) + "<|im_end|>",
                                         add_special_tokens=False)) for t in targets)

  def _split(self, views, questions, targets, answer_choice, images_of, features_of, keys,
             settings, target_length) -> Split:
    texts = [prompts.chat_prompt(self.system, self.user_text(q), self.image_tokens, views)
             for q in questions]
    ids, mask = prompts.left_padded(self.tokenizer, texts)
    check_assistant_header(self.tokenizer, ids)
    tokens = attention = loss = None
    if targets is not None:
      tokens, attention, loss = stage1_batch(self.tokenizer, texts, targets,
                                             self.c.latents.num_latents, target_length)
    return Split(views, list(questions), np.asarray(answer_choice, np.int32), ids, mask,
                 tokens, attention, loss, images_of, features_of, list(keys), list(settings))

  def _steps(self, configured: int, data_epochs, batch: int, name: str) -> int:
    """`configured`, or with -1 `data_epochs` passes over the training examples."""
    if configured >= 0:
      return configured
    per_epoch = batches_per_epoch([len(s) for s in self.train], batch)
    steps = math.ceil(data_epochs * per_epoch)
    if steps < 1:
      raise ValueError(f"{name} -1: {data_epochs} epochs of {per_epoch} batches is less than "
                       "one step")
    return steps

  def phases(self):
    c = self.c
    if c.stage == 1:
      steps = self._steps(c.sft.steps, c.sft.get("data_epochs", 1), c.sft.batch, "sft.steps")
    else:
      steps = self._steps(c.rl.steps, c.rl.get("data_epochs", 1), c.rl.prompts, "rl.steps")
    return make_phases(self.c, steps, self.stage1)

  def memory_estimate(self):
    c = self.c
    if c.stage == 1:
      rows, micro = c.sft.batch, c.sft.micro_batches
      length = max(s.tokens.shape[1] for s in self.train)
    else:
      rows = c.rl.prompts * c.advantage.group_size
      length = max(s.prompt_ids.shape[1] for s in self.train) + c.rollout.max_new_tokens
      micro = c.rl.micro_batches
    return memory.estimate(self.policy.model, Precision.from_config(c.model),
                           rollout_batch=rows, cache_length=length, train_batch=rows,
                           train_length=length, micro_batches=micro, remat=c.model.remat,
                           mesh=self.mesh,
                           trainable=nnx.Param if c.stage == 1 else nnx.LoRAParam)

  # -- data --------------------------------------------------------------------------------

  def rollout_config(self, temperature: float) -> rollout3d.Thinker3DRolloutConfig:
    c = self.c
    reward = c.get("reward", {})
    return rollout3d.Thinker3DRolloutConfig(
        latent_tokens=self.latent_ids, stop_tokens=(self.tokenizer.convert_tokens_to_ids(
            "<|im_end|>"),), num_latents=c.latents.num_latents,
        max_new_tokens=c.rollout.max_new_tokens, temperature=temperature,
        pad_token=self.tokenizer.pad_token_id or 0,
        cache_dtype=Precision.from_config(c.model).cache_dtype,
        token_axis_quirk=bool(reward.get("token_axis_quirk", False)),
        latent_fallback=reward.get("latent_fallback", "after_header"))

  def sample(self, split: Split, index, key, temperature: float, primed: bool = False):
    """A compiled rollout over the global batch split[index] (this process runs its rows;
    the output is global; dropout off); `primed` appends `<|latent_start|>` to the prompts (the latents
    of a policy that would not open the block itself). A split without target features
    is scored against zeros: its latent similarity means nothing."""
    index = np.asarray(index)[my_rows(len(index))]
    ids, mask = split.prompt_ids[index], split.prompt_mask[index]
    if primed:
      ids = np.concatenate([ids, np.full((len(index), 1), self.latent_ids[0], ids.dtype)], 1)
      mask = np.concatenate([mask, np.ones((len(index), 1), bool)], 1)
    run = rollout3d.compile_rollout(self.rollout_config(temperature))
    p = self.policy.projector.config
    features = (split.features(index) if split.features_of is not None else
                np.zeros((len(index), split.views, p.fusion_output, p.hidden_size), np.float32))
    inputs = global_batch((ids, mask, split.images(index), features,
                           split.answer_choice[index]), self.mesh)
    # Sampling runs without LoRA dropout (the reference's 0.05): the compiled decoding loop
    # carries no dropout RNG; the update's forward passes apply it.
    policy = nnx.view(self.policy, only=nnx.Dropout, deterministic=True,
                      raise_if_not_found=False)
    with jax.set_mesh(self.mesh):
      return run(policy, self.automaton, *inputs, key)

  def _batch_at(self, batch: int, stream: int, step: int) -> tuple[int, np.ndarray]:
    """Step `step`'s (group, global indices) of `batch` training examples."""
    sizes = [len(s) for s in self.train]
    epoch, position = divmod(step, batches_per_epoch(sizes, batch))
    if (stream, epoch) not in self._epochs:
      self._epochs = {(stream, epoch): epoch_batches(sizes, batch, self.c.seed, stream, epoch)}
    return self._epochs[(stream, epoch)][position]

  def train_batch(self, phase, step):
    group, index = self._batch_at(self.c.sft.batch, 3, step)
    return self._global(stage1_train_batch(self.train[group], index[my_rows(len(index))]))

  def _global(self, batch: TrainBatch) -> TrainBatch:
    return global_batch(jax.tree.map(np.asarray, batch), self.mesh)

  def rollout(self, phase, step, key):
    c = self.c
    group, chosen = self._batch_at(c.rl.prompts, 11, step)
    index = np.repeat(chosen, c.advantage.group_size)
    out = self.sample(self.train[group], index, key, c.rollout.temperature)
    metrics = {"reward": out.reward.mean(), "tokens": out.loss_mask.sum(),
               **{k: v.mean() for k, v in out.reward_components.items()}}
    return RolloutBatch(TrainBatch.from_completions(out), out.reward, None, metrics)

  # -- evaluation --------------------------------------------------------------------------

  def held_out(self) -> dict:
    """Held-out means. With targets: teacher-forced CE and alignment. Greedy rollouts:
    format, accuracy, latent block; with target features the latent similarity of the
    generated latents (and with the block forced open: `latent_sim_primed`) and the
    reward, without them reward = format + correct. Per setting (MindCube's among /
    around / rotation): `correct/<setting>`."""
    c = self.c
    values: dict[str, tuple[list, list]] = {}
    offset = 0
    key = jax.random.PRNGKey(0)

    def add(name, positions, value):
      kept = values.setdefault(name, ([], []))
      kept[0].extend(positions)
      kept[1].extend(local_rows(value).tolist())

    for split in self.test:
      size = len(split)
      for start in range(0, size, c.eval.batch):
        index = np.arange(start, start + c.eval.batch) % size
        mine = index[my_rows(len(index))]
        wide = np.arange(start, start + c.eval.batch)[my_rows(len(index))]
        positions = list(np.where(wide < size, wide + offset, -1))  # -1: a repeat
        if split.tokens is not None:
          with jax.set_mesh(self.mesh):
            cross_entropy, alignment = _stage1_eval(
                self.policy, self._global(stage1_train_batch(split, mine)), self.stage1)
          add("cross_entropy", positions, cross_entropy)
          add("alignment", positions, alignment)
        free = self.sample(split, index, key, 0.0)
        parts = free.reward_components
        for name in ("format", "correct", "latent_block"):
          add(name, positions, parts[name])
        if split.features_of is not None:
          primed = self.sample(split, index, key, 0.0, primed=True)
          add("latent_sim", positions, parts["latent_sim"])
          add("latent_sim_primed", positions, primed.reward_components["latent_sim"])
          add("reward", positions, free.reward)
        else:
          add("reward", positions, parts["format"] + parts["correct"])
      offset += size
    out = {name: gather_rows(positions, value) for name, (positions, value) in values.items()}
    settings = np.asarray([s for split in self.test for s in split.settings])
    metrics = {name: float(np.mean(value)) for name, value in out.items()}
    for setting in sorted(set(settings) - {""}):
      metrics[f"correct/{setting}"] = float(np.mean(out["correct"][settings == setting]))
    return metrics

  def evaluate(self, module, when, split=None):
    if split not in (None, "test"):
      raise ValueError(f"thinker3d: evaluates its held-out split, not {split!r}")
    if not self.test:
      if when in ("start", "checkpoint"):
        print("thinker3d: no held-out questions (--config.data.eval_jsonl, MindCube-Tiny): "
              "no evaluation", flush=True)
      return {}
    if when == "checkpoint":
      return {"policy": self.held_out()}
    if not self.c.evaluate or when not in ("start", "final"):
      return {}
    return {"before" if when == "start" else "after": self.held_out()}

  def report(self, results, workdir):
    after = results.get("after", results.get("policy"))
    if after is None:
      return ""
    self._completions_page(epath.Path(workdir) / "completions.html",
                           f"3DThinker stage {self.c.stage}: held-out samples (greedy)")
    before = results.get("before", {})
    names = [n for n in EVAL_METRICS if n in after]
    names += sorted(n for n in after if n.startswith("correct/"))
    lines = [f"{'held-out metric':22} | {'before':>9} | {'after':>9}"]
    lines += [f"{n:22} | {before.get(n, float('nan')):9.4f} | {after[n]:9.4f}" for n in names]
    return "\n".join(lines)

  def _completions_page(self, path, title: str) -> None:
    test = self.test[0]
    index = np.arange(min(12, len(test)))
    out = jax.tree.map(local_rows, self.sample(test, index, jax.random.PRNGKey(0), 0.0))
    index = index[my_rows(len(index))]
    if jax.process_index() != 0:
      return
    pieces, _ = am.token_bytes(self.tokenizer)
    prompt_length = test.prompt_ids.shape[1]
    piece = lambda i: pieces[i] if i < len(pieces) else b"\xef\xbf\xbd"  # past the
    # tokenizer's vocabulary (the model's is rounded up): shown as U+FFFD
    texts = [b"".join(piece(i) for i in out.tokens[b, prompt_length:prompt_length + n])
             .decode("utf-8", "replace") for b, n in enumerate(out.lengths)]
    epath.Path(path).write_text(completions_html(
        out.images, [test.questions[i] for i in index], texts, out.reward,
        out.reward_components, title))


def fit_vocabulary(model, tokens: int, seed: int = 0) -> None:
  """Grows the embedding (rounded up to 64 rows) when the tokenizer, with the latent tokens
  added, outgrows it. Qwen2.5-VL-3B's 151,936 rows already hold ids 151,665-151,667, which
  the reference's resize keeps as they are, so nothing changes there."""
  vocab = model.config.text.vocab_size
  if tokens <= vocab:
    return
  grown = (tokens + 63) // 64 * 64
  latent3d.grow_embeddings(model.language_model, grown, rngs=nnx.Rngs(seed + 3))
  model.config = dataclasses.replace(
      model.config, text=dataclasses.replace(model.config.text, vocab_size=grown))
