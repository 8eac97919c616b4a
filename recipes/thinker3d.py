"""3DThinker on the synthetic three-view task (data_pipelines/synthetic/thinker3d.py).

    python -m launch.train --config configs/thinker3d_stage1.py:cpu   # SFT + latent alignment
    python -m launch.train --config configs/thinker3d_stage2.py:cpu   # GRPO from stage 1

Stage 1 trains the policy and the 3D projector (vision tower frozen) on
`0.1 CE + 0.0005 alignment`; stage 2 restores it, adds LoRA adapters to the language model
(its linear layers and LM head, as `model.lora.targets` lists) and runs GRPO (format +
answer + latent-similarity rewards, computed inside the compiled rollout) with the KL
term against the LoRA-disabled base; the projector stays frozen. Both evaluate the
held-out split before and after (teacher-forced losses, and greedy rollouts: format,
accuracy, latent similarity of the generated latents, reward) and write results.json,
curve.png, completions.html and checkpoints.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from flax import nnx

from data_pipelines.synthetic import thinker3d as data
from data_pipelines.synthetic.stand_in_features import GeometryStandInExtractor
from jaxspatial.models import (Precision, Projector3DConfig, Thinker3DPolicy, apply_lora,
                               latent3d, memory, model_options)
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.models.sharding import global_batch, local_rows
from jaxspatial.models.qwen2_5_vl.tokenizer import train_tokenizer
from jaxspatial.rl.objectives import PolicyLossConfig
from jaxspatial.rollout import automaton as am, episode, grammars, prompts, tiny
from jaxspatial.rollout import thinker3d as rollout3d
from jaxspatial.rollout.viewer import completions_html
from jaxspatial.train import (AdvantageConfig, Checkpointer, Experiment, OptimizerConfig, Phase,
                              RolloutBatch, StepConfig, TrainBatch, trainable)
from jaxspatial.train.thinker3d import Stage1Config, stage1_batch, stage1_terms
from recipes.common import gather_rows, my_rows, small_model_config

STAND_IN_VERSION = 2  # bump when GeometryStandInExtractor's features change
EVAL_METRICS = ("cross_entropy", "alignment", "format", "correct", "latent_sim",
                "latent_sim_primed", "reward")


@dataclasses.dataclass
class Split:
  examples: data.Thinker3DExamples
  prompt_ids: np.ndarray      # [N, L]
  prompt_mask: np.ndarray
  tokens: np.ndarray          # [N, L + T] stage-1 layout (prompt, target)
  attention: np.ndarray
  loss: np.ndarray


def stage1_train_batch(split: Split, index) -> TrainBatch:
  index = np.asarray(index)
  zeros = jnp.zeros(split.tokens[index].shape, jnp.float32)
  return TrainBatch(tokens=jnp.asarray(split.tokens[index]),
                    attention_mask=jnp.asarray(split.attention[index]),
                    loss_mask=jnp.asarray(split.loss[index]),
                    images=jnp.asarray(split.examples.images[index]),
                    advantages=jnp.zeros(len(index), jnp.float32), old_logprobs=zeros,
                    ref_logprobs=zeros, features=jnp.asarray(split.examples.features[index]))


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


class Thinker3D(Experiment):
  def __init__(self, config):
    c = self.c = config
    if c.variant != "cpu":
      raise ValueError(
          f"thinker3d: variant {c.variant!r} holds the published settings (Qwen2.5-VL-3B, "
          "VGGT features of the 3DThinker data), which cannot be loaded here; this recipe "
          "trains the synthetic three-view task: pass the config as configs/<stage>.py:cpu")
    self.name = f"thinker3d stage {c.stage}"
    self.curve_metrics = (("sft/loss", "sft/alignment", "sft/cross_entropy") if c.stage == 1
                          else ("rl/reward", "rl/latent_sim", "rl/correct"))

  # -- set-up ------------------------------------------------------------------------------

  def build(self, mesh):
    """Tokenizer, policy (model + projector), grammar automaton, and both splits; stage 2
    restores stage 1's checkpoint and adds LoRA adapters (its module: the language model's
    adapters train)."""
    c = self.c
    self.mesh = mesh
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
    self.latent_ids = tuple(tok.convert_tokens_to_ids(t) for t in tiny.LATENT_TOKENS)
    model = Qwen25VL(small_model_config(c.model, tok), rngs=nnx.Rngs(c.seed),
                     **model_options(c.model))
    self.image_tokens = episode.image_tokens(model, (c.scene.height, c.scene.width))
    projector = Projector3DConfig(
        mlp_depth=c.projector.mlp_depth, mm_hidden_size=c.model.hidden,
        hidden_size=extractor.channels, latent_size=c.latents.num_latents,
        latent_tokens=c.projector.latent_tokens, fusion_input=self.image_tokens,
        fusion_output=extractor.tokens)
    self.policy = Thinker3DPolicy(model, projector, rngs=nnx.Rngs(c.seed + 1))
    self.automaton = am.compile_token_automaton(grammars.thinker3d(c.latents.num_latents), tok,
                                                model.config.text.vocab_size)
    self.stage1 = Stage1Config(start_token=self.latent_ids[0], pad_token=self.latent_ids[1],
                               num_latents=c.latents.num_latents, **c.loss)
    self.train, self.test = self._split(train), self._split(test)
    if c.stage == 1:
      return self.policy
    stage1 = Checkpointer(epath.Path(c.init_from) / "checkpoints")
    if stage1.restore_params(self.policy) is None:
      raise FileNotFoundError(f"stage 2 starts from stage 1's checkpoint: none under "
                              f"{stage1.directory}; run configs/thinker3d_stage1.py:cpu first "
                              "(or set init_from)")
    stage1.close()
    lora = c.model.lora
    apply_lora(self.policy.model.language_model, tuple(lora.targets), lora.rank, lora.alpha,
               lora.dropout, rngs=nnx.Rngs(c.seed + 2))
    return self.policy.model  # the projector is frozen: only the adapters train

  def _split(self, examples) -> Split:
    texts = [prompts.chat_prompt(data.SYSTEM, q, self.image_tokens, len(data.VIEWS))
             for q in examples.questions]
    ids, mask = prompts.left_padded(self.tokenizer, texts)
    check_assistant_header(self.tokenizer, ids)
    tokens, attention, loss = stage1_batch(self.tokenizer, texts, examples.targets,
                                           self.c.latents.num_latents)
    return Split(examples, ids, mask, tokens, attention, loss)

  def phases(self):
    steps = self.c.sft.steps if self.c.stage == 1 else self.c.rl.steps
    return make_phases(self.c, steps, self.stage1)

  def memory_estimate(self):
    c = self.c
    if c.stage == 1:
      rows, length, micro = c.sft.batch, self.train.tokens.shape[1], c.sft.micro_batches
    else:
      rows = c.rl.prompts * c.advantage.group_size
      length = self.train.prompt_ids.shape[1] + c.rollout.max_new_tokens
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
    the output is global); `primed` appends `<|latent_start|>` to the prompts (the latents
    of a policy that would not open the block itself)."""
    index = np.asarray(index)[my_rows(len(index))]
    ids, mask = split.prompt_ids[index], split.prompt_mask[index]
    if primed:
      ids = np.concatenate([ids, np.full((len(index), 1), self.latent_ids[0], ids.dtype)], 1)
      mask = np.concatenate([mask, np.ones((len(index), 1), bool)], 1)
    run = rollout3d.compile_rollout(self.rollout_config(temperature))
    examples = split.examples
    inputs = global_batch((ids, mask, examples.images[index], examples.features[index],
                           examples.answer_choice[index]), self.mesh)
    with jax.set_mesh(self.mesh):
      return run(self.policy, self.automaton, *inputs, key)

  def train_batch(self, phase, step):
    rng = np.random.default_rng([self.c.seed, 3, step])
    index = rng.choice(len(self.train.examples), self.c.sft.batch, replace=False)
    return self._global(stage1_train_batch(self.train, index[my_rows(len(index))]))

  def _global(self, batch: TrainBatch) -> TrainBatch:
    return global_batch(jax.tree.map(np.asarray, batch), self.mesh)

  def rollout(self, phase, step, key):
    c = self.c
    rng = np.random.default_rng([c.seed, 11, step])
    chosen = rng.choice(len(self.train.examples), c.rl.prompts, replace=False)
    index = np.repeat(chosen, c.advantage.group_size)
    out = self.sample(self.train, index, key, c.rollout.temperature)
    metrics = {"reward": out.reward.mean(), "tokens": out.loss_mask.sum(),
               **{k: v.mean() for k, v in out.reward_components.items()}}
    return RolloutBatch(TrainBatch.from_completions(out), out.reward, None, metrics)

  # -- evaluation --------------------------------------------------------------------------

  def held_out(self) -> dict:
    """Held-out means: teacher-forced CE and alignment; greedy rollouts: format, accuracy,
    latent similarity (generated latents, the block forced open in `latent_sim_primed`)
    and reward."""
    c, test = self.c, self.test
    positions, sums = [], {}
    for start in range(0, len(test.examples), c.eval.batch):
      index = np.arange(start, start + c.eval.batch) % len(test.examples)
      mine = index[my_rows(len(index))]
      wide = np.arange(start, start + c.eval.batch)[my_rows(len(index))]
      positions += list(np.where(wide < len(test.examples), wide, -1))  # -1: a repeat
      with jax.set_mesh(self.mesh):
        cross_entropy, alignment = _stage1_eval(
            self.policy, self._global(stage1_train_batch(test, mine)), self.stage1)
      free = self.sample(test, index, jax.random.PRNGKey(0), 0.0)
      primed = self.sample(test, index, jax.random.PRNGKey(0), 0.0, primed=True)
      values = {"cross_entropy": cross_entropy, "alignment": alignment,
                "reward": free.reward, **free.reward_components,
                "latent_sim_primed": primed.reward_components["latent_sim"]}
      for name, value in values.items():
        sums.setdefault(name, []).extend(local_rows(value).tolist())
    return {name: float(np.mean(gather_rows(positions, value))) for name, value in
            sums.items()}

  def evaluate(self, module, when, split=None):
    if split not in (None, "test"):
      raise ValueError(f"thinker3d: evaluates its held-out split, not {split!r}")
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
    lines = [f"{'held-out metric':22} | {'before':>9} | {'after':>9}"]
    lines += [f"{n:22} | {before.get(n, float('nan')):9.4f} | {after[n]:9.4f}"
              for n in EVAL_METRICS]
    return "\n".join(lines)

  def _completions_page(self, path, title: str) -> None:
    test = self.test
    index = np.arange(min(12, len(test.examples)))
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
        out.images, [test.examples.questions[i] for i in index], texts, out.reward,
        out.reward_components, title))
