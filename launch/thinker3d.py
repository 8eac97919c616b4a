"""3DThinker on the synthetic three-view task (data_pipelines/synthetic/thinker3d.py).

    python -m launch.train --config configs/thinker3d_stage1.py:cpu   # SFT + latent alignment
    python -m launch.train --config configs/thinker3d_stage2.py:cpu   # GRPO from stage 1

Stage 1 trains the policy and the 3D projector (vision tower frozen) on
`0.1 CE + 0.0005 alignment`; stage 2 restores it, adds LoRA adapters to the language model
(its linear layers and LM head, as `c.optimizer.lora_targets` lists) and runs GRPO
(format + answer + latent-similarity rewards, computed inside the compiled rollout) with
the KL term against the LoRA-disabled base; the projector stays frozen.
Both evaluate the held-out split before and after (teacher-forced losses, and greedy
rollouts: format, accuracy, latent similarity of the generated latents, reward) and
write metrics.jsonl, results.json, a curve PNG, completions.html and checkpoints.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from data_pipelines.synthetic import thinker3d as data
from jaxspatial.models import (GeometryStandInExtractor, Projector3DConfig, Thinker3DPolicy,
                               Precision, apply_lora, latent3d, memory, model_options,
                               sharding)
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.models.qwen2_5_vl.tokenizer import train_tokenizer
from jaxspatial.rl.advantages import group_normalize
from jaxspatial.rl.objectives import PolicyLossConfig
from jaxspatial.rollout import automaton as am, episode, grammars, prompts, tiny
from jaxspatial.rollout import thinker3d as rollout3d
from jaxspatial.rollout.viewer import completions_html
from jaxspatial.train import (Checkpointer, MetricWriter, OptimizerConfig, PreemptionGuard,
                              ReferencePolicy, StepConfig, TrainBatch, batch_logprobs,
                              initialize_from_env, make_optimizer, shard_batch, train_step,
                              trainable)
from jaxspatial.train.plots import line_chart
from jaxspatial.train.thinker3d import Stage1Config, stage1_batch, stage1_terms


STAND_IN_VERSION = 2  # bump when GeometryStandInExtractor's features change


@dataclasses.dataclass
class Split:
  examples: data.Thinker3DExamples
  prompt_ids: np.ndarray      # [N, L]
  prompt_mask: np.ndarray
  tokens: np.ndarray          # [N, L + T] stage-1 layout (prompt, target)
  attention: np.ndarray
  loss: np.ndarray


@dataclasses.dataclass
class Job:
  config: object
  mesh: object
  tokenizer: object
  policy: Thinker3DPolicy
  automaton: am.TokenAutomaton
  latent_ids: tuple[int, int, int]
  stage1: Stage1Config
  train: Split
  test: Split


def _check(c) -> None:
  if c.variant != "cpu":
    raise ValueError(
        f"launch.thinker3d: variant {c.variant!r} holds the published settings (Qwen2.5-VL-3B, "
        "VGGT features of the 3DThinker data), which cannot be loaded here; this loop trains "
        "the synthetic three-view task: pass the config as configs/<stage>.py:cpu")


def build(c) -> Job:
  """Tokenizer, policy (model + projector), grammar automaton, and both splits."""
  from launch.train import model_config  # pylint: disable=import-outside-toplevel
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
            + [latent3d.expand_output_3d(t, c.latents.num_latents) for t in train.targets[:200]])
  tok = train_tokenizer(corpus * 5, vocab_size=c.model.vocab,
                        extra_special_tokens=tiny.LATENT_TOKENS)
  latent_ids = tuple(tok.convert_tokens_to_ids(t) for t in tiny.LATENT_TOKENS)
  devices = jax.device_count()
  mesh = sharding.make_mesh(devices if c.mesh.data == -1 else c.mesh.data, c.mesh.fsdp,
                            c.mesh.tensor)
  with jax.set_mesh(mesh):  # parameters are created sharded by the logical rules
    model = Qwen25VL(model_config(c, tok), rngs=nnx.Rngs(c.seed), **model_options(c.model))
  image_tokens = episode.image_tokens(model, (c.scene.height, c.scene.width))
  projector = Projector3DConfig(
      mlp_depth=c.projector.mlp_depth, mm_hidden_size=c.model.hidden,
      hidden_size=extractor.channels, latent_size=c.latents.num_latents,
      latent_tokens=c.projector.latent_tokens, fusion_input=image_tokens,
      fusion_output=extractor.tokens)
  with jax.set_mesh(mesh):
    policy = Thinker3DPolicy(model, projector, rngs=nnx.Rngs(c.seed + 1))
  automaton = am.compile_token_automaton(grammars.thinker3d(c.latents.num_latents), tok,
                                         model.config.text.vocab_size)

  def split(examples):
    texts = [prompts.chat_prompt(data.SYSTEM, q, image_tokens, len(data.VIEWS))
             for q in examples.questions]
    ids, mask = prompts.left_padded(tok, texts)
    check_assistant_header(tok, ids)
    tokens, attention, loss = stage1_batch(tok, texts, examples.targets, c.latents.num_latents)
    return Split(examples, ids, mask, tokens, attention, loss)

  stage1 = Stage1Config(start_token=latent_ids[0], pad_token=latent_ids[1],
                        num_latents=c.latents.num_latents, **c.loss)
  return Job(c, mesh, tok, policy, automaton, latent_ids, stage1, split(train), split(test))


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


def rollout_config(job: Job, temperature: float) -> rollout3d.Thinker3DRolloutConfig:
  c = job.config
  reward = c.get("reward", {})
  return rollout3d.Thinker3DRolloutConfig(
      latent_tokens=job.latent_ids, stop_tokens=(job.tokenizer.convert_tokens_to_ids(
          "<|im_end|>"),), num_latents=c.latents.num_latents,
      max_new_tokens=c.rollout.max_new_tokens, temperature=temperature,
      pad_token=job.tokenizer.pad_token_id or 0,
      cache_dtype=Precision.from_config(c.model).cache_dtype,
      token_axis_quirk=bool(reward.get("token_axis_quirk", False)),
      latent_fallback=reward.get("latent_fallback", "after_header"))


def optimizer_config(o, total_steps: int) -> OptimizerConfig:
  """Either stage's optimizer from `c.optimizer` (clipping at 1, transformers' default)."""
  return OptimizerConfig(
      learning_rate=o.learning_rate, warmup_steps=o.warmup_steps, total_steps=total_steps,
      weight_decay=o.get("weight_decay", 0.0), decay=o.get("decay", "cosine"),
      final_fraction=o.get("final_fraction", 0.1),
      weight_decay_mask=o.get("weight_decay_mask", "all"), clip_norm=1.0)


def check_assistant_header(tokenizer, prompt_ids: np.ndarray) -> None:
  """The "after_header" latent fallback reads the last prompt position as the one after
  `<|im_start|>assistant`: every prompt must end with that header and one newline token."""
  newline = tokenizer.encode("\n", add_special_tokens=False)
  header = tokenizer.decode(prompt_ids[0, -32:].tolist())
  if len(newline) != 1 or np.any(prompt_ids[:, -1] != newline[0]) or not header.endswith(
      "<|im_start|>assistant\n"):
    raise ValueError(f"launch.thinker3d: prompts must end with '<|im_start|>assistant' and "
                     f"one newline token (the latent fallback's window starts there); the "
                     f"first ends with {header!r}")


def sample(job: Job, split: Split, index, key, temperature: float, primed: bool = False):
  """A compiled rollout over split[index]; `primed` appends `<|latent_start|>` to the
  prompts (the latents of a policy that would not open the block itself)."""
  index = np.asarray(index)
  ids, mask = split.prompt_ids[index], split.prompt_mask[index]
  if primed:
    ids = np.concatenate([ids, np.full((len(index), 1), job.latent_ids[0], ids.dtype)], 1)
    mask = np.concatenate([mask, np.ones((len(index), 1), bool)], 1)
  run = rollout3d.compile_rollout(rollout_config(job, temperature))
  examples = split.examples
  return run(job.policy, job.automaton, jnp.asarray(ids), jnp.asarray(mask),
             jnp.asarray(examples.images[index]), jnp.asarray(examples.features[index]),
             jnp.asarray(examples.answer_choice[index]), key)


def evaluate(job: Job) -> dict:
  """Held-out means: teacher-forced CE and alignment; greedy rollouts: format, accuracy,
  latent similarity (generated latents, the block forced open in `latent_sim_primed`) and
  reward."""
  c, test = job.config, job.test
  sums: dict[str, list] = {}
  for start in range(0, len(test.examples), c.eval.batch):
    index = np.arange(start, start + c.eval.batch) % len(test.examples)
    keep = min(c.eval.batch, len(test.examples) - start)
    cross_entropy, alignment = _stage1_eval(job.policy, stage1_train_batch(test, index),
                                            job.stage1)
    free = sample(job, test, index, jax.random.PRNGKey(0), 0.0)
    primed = sample(job, test, index, jax.random.PRNGKey(0), 0.0, primed=True)
    values = {"cross_entropy": cross_entropy, "alignment": alignment,
              "reward": free.reward, **free.reward_components,
              "latent_sim_primed": primed.reward_components["latent_sim"]}
    for name, value in values.items():
      sums.setdefault(name, []).extend(np.asarray(value)[:keep].tolist())
  return {k: float(np.mean(v)) for k, v in sums.items()}


def _completions_page(job: Job, path, title: str) -> None:
  test = job.test
  index = np.arange(min(12, len(test.examples)))
  out = jax.device_get(sample(job, test, index, jax.random.PRNGKey(0), 0.0))
  pieces, _ = am.token_bytes(job.tokenizer)
  prompt_length = test.prompt_ids.shape[1]
  texts = [b"".join(pieces[i] for i in out.tokens[b, prompt_length:prompt_length + n]).decode(
      "utf-8", "replace") for b, n in enumerate(out.lengths)]
  pathlib.Path(path).write_text(completions_html(
      out.images, [test.examples.questions[i] for i in index], texts, out.reward,
      out.reward_components, title))


def _table(before: dict, after: dict, names: tuple[str, ...]) -> str:
  lines = [f"{'held-out metric':22} | {'before':>9} | {'after':>9}"]
  lines += [f"{n:22} | {before[n]:9.4f} | {after[n]:9.4f}" for n in names]
  return "\n".join(lines)


def _curve(path, series: dict, title: str) -> None:
  window = 10
  out = {}
  for name, (xs, ys) in series.items():
    if len(ys) >= window:
      out[f"{name} ({window}-step mean)"] = (xs[window - 1:], np.convolve(
          ys, np.ones(window) / window, "valid"))
    else:
      out[name] = (xs, ys)
  line_chart(out, path, title=title)


def _train_loop(c, job, workdir, checkpointer, model, optimizer, step, results, one_step,
                curve_names):
  """The shared loop: steps, metrics, progress, checkpoints, SIGTERM, NaN refusal."""
  writer = MetricWriter(workdir)
  curve = {name: ([], []) for name in curve_names}
  bar = tqdm(total=c.steps, initial=step, desc=f"thinker3d stage {c.stage}", dynamic_ncols=True)
  with PreemptionGuard() as guard:
    while step < c.steps:
      metrics = one_step(step)
      if not metrics["finite"]:
        checkpointer.wait()
        raise FloatingPointError(f"step {step + 1}: the loss or a gradient is not finite "
                                 f"(loss {metrics['loss']}); nothing was saved")
      step += 1
      writer.write(step, metrics)
      for name in curve_names:
        curve[name][0].append(step)
        curve[name][1].append(metrics[name])
      bar.update(1)
      if step % c.log_every == 0:
        bar.set_postfix({k: f"{metrics[k]:.3g}" for k in curve_names})
      if step % c.checkpoint.every == 0 or guard.requested:
        checkpointer.save(step, model, optimizer, {"results": results, "seed": c.seed})
      if guard.requested:
        checkpointer.wait()
        print(f"SIGTERM: saved step {step}; exiting")
        writer.close()
        return step, False
  bar.close()
  writer.close()
  if curve[curve_names[0]][0]:
    _curve(workdir / "curve.png", curve, f"3DThinker stage {c.stage} (training batches)")
  return step, True


def _finish(c, job, checkpointer, model, optimizer, step, results, finished) -> None:
  """Evaluates a finished run and saves its last step (unless a periodic save has it)."""
  if finished and c.evaluate:
    results["after"] = evaluate(job)
  checkpointer.wait()
  if finished and checkpointer.latest_step() != step:
    checkpointer.save(step, model, optimizer, {"results": results, "seed": c.seed}, force=True)
  checkpointer.close()


def run_stage1(c, job: Job, workdir: pathlib.Path) -> dict:
  policy = job.policy
  optimizer = make_optimizer(policy, optimizer_config(c.optimizer, c.steps),
                             wrt=trainable(frozen=("visual",) if c.freeze_vision else ()))
  checkpointer = Checkpointer(workdir / "checkpoints", keep=c.checkpoint.keep)
  restored = checkpointer.restore(policy, optimizer) if c.resume else None
  step, results = (0, {}) if restored is None else (restored[0], restored[1]["results"])
  if "before" not in results and c.evaluate:
    results["before"] = evaluate(job)
  config = StepConfig(objective="thinker3d_stage1", stage1=job.stage1,
                      micro_batches=c.micro_batches)

  def one_step(step):
    rng = np.random.default_rng([c.seed, 3, step])
    index = rng.choice(len(job.train.examples), c.batch, replace=False)
    batch = shard_batch(stage1_train_batch(job.train, index), job.mesh)
    metrics = train_step(policy, optimizer, batch, config)
    return {k: float(v) for k, v in metrics.items()}

  step, finished = _train_loop(c, job, workdir, checkpointer, policy, optimizer, step,
                               results, one_step, ("loss", "alignment", "cross_entropy"))
  _finish(c, job, checkpointer, policy, optimizer, step, results, finished)
  return results


def run_stage2(c, job: Job, workdir: pathlib.Path) -> dict:
  policy = job.policy
  stage1 = Checkpointer(pathlib.Path(c.init_from) / "checkpoints")
  if stage1.restore_params(policy) is None:
    raise FileNotFoundError(f"stage 2 starts from stage 1's checkpoint: none under "
                            f"{stage1.directory}; run configs/thinker3d_stage1.py:cpu first "
                            "(or set init_from)")
  stage1.close()
  lora = c.optimizer
  apply_lora(policy.model.language_model, tuple(lora.lora_targets), lora.lora_rank,
             lora.lora_alpha, lora.lora_dropout, rngs=nnx.Rngs(c.seed + 2))
  model = policy.model  # the projector is frozen: only the adapters train
  optimizer = make_optimizer(model, optimizer_config(lora, c.steps),
                             wrt=trainable(adapters_only=True))
  reference = ReferencePolicy.create("lora_disabled", model) if c.objective.beta > 0 else None
  checkpointer = Checkpointer(workdir / "checkpoints", keep=c.checkpoint.keep)
  restored = checkpointer.restore(model, optimizer) if c.resume else None
  step, results = (0, {}) if restored is None else (restored[0], restored[1]["results"])
  if "before" not in results and c.evaluate:
    results["before"] = evaluate(job)
  config = StepConfig(objective="grpo", temperature=c.rollout.temperature,
                      loss=PolicyLossConfig(**c.objective), micro_batches=c.micro_batches)
  key = jax.random.PRNGKey(c.seed)

  def one_step(step):
    started = time.perf_counter()
    rng = np.random.default_rng([c.seed, 11, step])
    chosen = rng.choice(len(job.train.examples), c.prompts, replace=False)
    index = np.repeat(chosen, c.advantage.group_size)
    out = sample(job, job.train, index, jax.random.fold_in(key, step), c.rollout.temperature)
    advantages = group_normalize(out.reward.reshape(c.prompts, c.advantage.group_size),
                                 ddof=c.advantage.ddof, eps=c.advantage.eps).reshape(-1)
    batch = TrainBatch.from_completions(out, advantages)
    batch = batch.replace(old_logprobs=batch_logprobs(model, batch, c.rollout.temperature))
    if reference is not None:
      batch = batch.replace(ref_logprobs=reference.logprobs(model, batch,
                                                            c.rollout.temperature))
    metrics = train_step(model, optimizer, batch, config)
    metrics = {k: float(v) for k, v in metrics.items()}
    metrics.update({"reward": float(out.reward.mean()),
                    **{k: float(v.mean()) for k, v in out.reward_components.items()},
                    "tokens_per_s": float(out.loss_mask.sum()) / (time.perf_counter() - started)})
    return metrics

  step, finished = _train_loop(c, job, workdir, checkpointer, model, optimizer, step, results,
                               one_step, ("reward", "latent_sim", "correct"))
  _finish(c, job, checkpointer, model, optimizer, step, results, finished)
  return results


def run(c) -> dict:
  _check(c)
  initialize_from_env()
  workdir = pathlib.Path(c.workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  job = build(c)
  Precision.from_config(c.model).check_trainable(f"thinker3d stage {c.stage}")
  if jax.process_index() == 0:
    rows = c.batch if c.stage == 1 else c.prompts * c.advantage.group_size
    length = job.train.tokens.shape[1] if c.stage == 1 else (job.train.prompt_ids.shape[1]
                                                             + c.rollout.max_new_tokens)
    print(memory.estimate(job.policy.model, Precision.from_config(c.model), rollout_batch=rows,
                          cache_length=length, train_batch=rows, train_length=length,
                          micro_batches=c.micro_batches, remat=c.model.remat, mesh=job.mesh,
                          trainable=nnx.Param if c.stage == 1 else nnx.LoRAParam).table(),
          flush=True)
  with jax.set_mesh(job.mesh):  # one mesh for rollouts and updates
    results = (run_stage1 if c.stage == 1 else run_stage2)(c, job, workdir)
    (workdir / "results.json").write_text(json.dumps(results, indent=2))
    if "after" in results:
      _completions_page(job, workdir / "completions.html",
                        f"3DThinker stage {c.stage}: held-out samples (greedy)")
      print(_table(results["before"], results["after"],
                   ("cross_entropy", "alignment", "format", "correct", "latent_sim",
                    "latent_sim_primed", "reward")))
  print(f"outputs: {workdir.resolve()} (results.json, curve.png, completions.html, "
        "metrics.jsonl, checkpoints/)")
  return results
