"""Trains a policy: trajectory SFT on a scripted explorer, then GRPO over compiled rollouts,
then evaluation on the test split against answering from the first view.

    python -m launch.train --config configs/demo.py [--config.key=value ...]

Checkpoints (orbax, asynchronous) hold the parameters, the optimizer, the step, the phase
and the evaluations so far; a run restarts from its last checkpoint and continues exactly
(every step's data and RNG derive from the seed and the step). SIGTERM saves and exits.
"""

from __future__ import annotations

# Before anything starts the XLA backend (it reads XLA_FLAGS once).
from jaxspatial import xla_workarounds

xla_workarounds.apply()
# pylint: disable=wrong-import-position

import dataclasses
import json
import os
import pathlib
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, logging
from flax import nnx
from ml_collections import config_flags
from tqdm import tqdm

from data_pipelines.synthetic import look_around
from jaxspatial.envs import act3d
from jaxspatial.models import Precision, memory, model_options, sharding
from jaxspatial.models.qwen2_5_vl.config import Qwen25VLConfig, TextConfig, VisionConfig
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.models.qwen2_5_vl.tokenizer import train_tokenizer
from jaxspatial.rl.advantages import group_normalize
from jaxspatial.rl.objectives import PolicyLossConfig
from jaxspatial.rollout import agents, automaton as am, episode, observation, prompts, tiny
from jaxspatial.rollout.viewer import trajectory_html
from jaxspatial.train import (Checkpointer, MetricWriter, OptimizerConfig, PreemptionGuard,
                              ReferencePolicy, StepConfig, TrainBatch, grpo, initialize_from_env,
                              make_optimizer, shard_batch, train_step)
from jaxspatial.train.plots import line_chart

DEMO_SYSTEM = ("Answer with one colour word. To look around, call render_view_tool with "
               "turn_left or turn_right.")
PHASES = ("sft", "grpo", "done")


@dataclasses.dataclass
class Job:
  config: object
  mesh: object
  tokenizer: object
  model: Qwen25VL
  agent: agents.Act3DAgent
  automaton: am.TokenAutomaton
  template: observation.ObservationTemplate
  rollout_config: episode.RolloutConfig
  train: tuple      # (tasks, questions, prompt ids, prompt mask)
  test: tuple


def model_config(c, tok) -> Qwen25VLConfig:
  """A small Qwen2.5-VL-shaped policy from `c.model` (width, layers, vision tower) with the
  tokenizer's vocabulary and special ids."""
  m = c.model
  vocab = (len(tok) + 63) // 64 * 64
  text = TextConfig(vocab_size=vocab, hidden_size=m.hidden, intermediate_size=m.intermediate,
                    num_hidden_layers=m.layers, num_attention_heads=m.heads,
                    num_key_value_heads=m.kv_heads, mrope_section=(2, 3, 3) if
                    m.hidden // m.heads == 16 else (4, 6, 6), tie_word_embeddings=True)
  vision = VisionConfig(depth=m.vision_depth, hidden_size=m.vision_hidden,
                        intermediate_size=2 * m.vision_hidden, num_heads=2,
                        out_hidden_size=m.hidden, fullatt_block_indexes=(m.vision_depth - 1,))
  return tiny.model_config(tok, Qwen25VLConfig(text=text, vision=vision))


def _split(job_parts, c, split: str):
  tok, n_image = job_parts
  count = c.data.train_tasks if split == "train" else c.data.test_tasks
  seed = c.seed * 1000 + (1 if split == "train" else 2)
  tasks, questions = look_around.make_tasks(count, seed, c.scene.points, c.scene.width,
                                            c.scene.height, c.scene.hfov_deg)
  texts = [prompts.chat_prompt(DEMO_SYSTEM, q.question, n_image) for q in questions]
  ids, mask = prompts.left_padded(tok, texts)
  return tasks, questions, ids, mask


def build(c) -> Job:
  devices = jax.device_count()
  data = devices if c.mesh.data == -1 else c.mesh.data
  mesh = sharding.make_mesh(data, c.mesh.fsdp, c.mesh.tensor)
  corpus = ([prompts.chat_prompt(DEMO_SYSTEM, look_around.LookQuestion(s, k).question, 0)
             for s in look_around.SIDES for k in look_around.COLOURS] * 10
            + [t for q in [look_around.LookQuestion(s, k) for s in look_around.SIDES
                           for k in look_around.COLOURS]
               for t in look_around.expert_turns(q, np.random.default_rng(0))] * 10
            + tiny.example_turns(100))
  tok = train_tokenizer(corpus, vocab_size=c.model.vocab, extra_special_tokens=tiny.LATENT_TOKENS)
  with jax.set_mesh(mesh):
    model = Qwen25VL(model_config(c, tok), rngs=nnx.Rngs(c.seed), **model_options(c.model))
  params = act3d.Act3DParams(width=c.scene.width, height=c.scene.height,
                             hfov_deg=c.scene.hfov_deg, turn_step_deg=c.scene.turn_step_deg,
                             grounding_min_pixels=5, max_interactions=c.rollout.max_turns - 1)
  agent = agents.Act3DAgent(params)
  automaton = am.compile_token_automaton(agent.grammar, tok, model.config.text.vocab_size)
  n_image = episode.image_tokens(model, agent.image_size)
  template = observation.compile_template(tok, agent.observation, n_image)
  rollout_config = episode.RolloutConfig(
      max_turns=c.rollout.max_turns, max_turn_tokens=c.rollout.max_turn_tokens,
      temperature=c.rollout.temperature, eos_tokens=(tok.convert_tokens_to_ids("<|im_end|>"),),
      pad_token=tok.pad_token_id or 0, cache_dtype=Precision.from_config(c.model).cache_dtype)
  return Job(c, mesh, tok, model, agent, automaton, template, rollout_config,
             _split((tok, n_image), c, "train"), _split((tok, n_image), c, "test"))


def _take(split, index):
  tasks, questions, ids, mask = split
  index = np.asarray(index)
  return (jax.tree.map(lambda x: x[index], tasks), [questions[i] for i in index], ids[index],
          mask[index])


def _rollout(job: Job, tasks, ids, mask, key, config=None, forced=None):
  config = config or job.rollout_config
  run = episode.compile_rollout(job.agent, job.template, config)
  with jax.set_mesh(job.mesh):
    return run(job.model, job.automaton, tasks, jnp.asarray(ids), jnp.asarray(mask), key,
               None if forced is None else jnp.asarray(forced))


def sft_dataset(job: Job) -> TrainBatch:
  """The scripted explorer's trajectories (forced rollouts: the exact layout and views)."""
  c = job.config
  rng = np.random.default_rng([c.seed, 7])
  count = c.data.sft_trajectories
  index = rng.choice(len(job.train[1]), count, replace=count > len(job.train[1]))
  parts = []
  chunk = c.sft.batch
  for start in range(0, count, chunk):
    tasks, questions, ids, mask = _take(job.train, index[start:start + chunk])
    scripts = [look_around.expert_turns(q, rng) for q in questions]
    forced = episode.forced_tokens(job.tokenizer, scripts, job.rollout_config)
    traj = _rollout(job, tasks, ids, mask, jax.random.PRNGKey(start), forced=forced)
    parts.append(jax.device_get(TrainBatch.from_trajectory(traj)))
  return jax.tree.map(lambda *x: np.concatenate(x), *parts)


def evaluate(job: Job, first_view_only: bool = False) -> dict:
  """Greedy test accuracy per side, on exploration questions (left + right), and overall,
  with standard errors. `first_view_only` forces an answer in the first turn."""
  c = job.config
  config = dataclasses.replace(job.rollout_config, temperature=0.0)
  tasks_all, questions_all, _, _ = job.test
  correct, sides = [], []
  for start in range(0, len(questions_all), c.eval.batch):
    index = np.arange(start, min(start + c.eval.batch, len(questions_all)))
    if len(index) < c.eval.batch:  # keep one compiled shape: pad with repeats, drop after
      index = np.concatenate([index, np.full(c.eval.batch - len(index), index[-1])])
    tasks, questions, ids, mask = _take(job.test, index)
    forced = None
    if first_view_only:
      forced = episode.forced_tokens(job.tokenizer, [[look_around.first_view_prefix()]] * len(
          index), config)
    traj = jax.device_get(_rollout(job, tasks, ids, mask, jax.random.PRNGKey(0), config,
                                   forced))
    keep = len(questions_all) - start
    correct += list(np.asarray(traj.reward_components["judge"])[:keep] > 0)
    sides += [q.side for q in questions[:keep]]
  correct, sides = np.asarray(correct, float), np.asarray(sides)
  out = {}
  groups = {s: sides == s for s in look_around.SIDES}
  groups["explore"] = sides != "front"
  groups["all"] = np.ones(len(sides), bool)
  for name, where in groups.items():
    p, n = correct[where].mean(), where.sum()
    out[name] = {"accuracy": float(p), "se": float(np.sqrt(p * (1 - p) / max(n, 1))),
                 "n": int(n)}
  return out


def _grpo_batch(job: Job, step: int, model_key):
  c = job.config
  rng = np.random.default_rng([c.seed, 11, step])
  prompts_index = rng.choice(len(job.train[1]), c.grpo.prompts, replace=False)
  index = np.repeat(prompts_index, c.grpo.group)
  tasks, questions, ids, mask = _take(job.train, index)
  traj = _rollout(job, tasks, ids, mask, jax.random.fold_in(model_key, step))
  rewards = traj.reward
  advantages = group_normalize(rewards.reshape(c.grpo.prompts, c.grpo.group)).reshape(-1)
  batch = TrainBatch.from_trajectory(traj, advantages)
  explore = np.asarray([q.needs_exploration for q in questions])
  judge = np.asarray(traj.reward_components["judge"])
  moved = np.asarray(traj.reward_components["interactions"]) > 0
  metrics = {"reward": float(jnp.mean(rewards)), "accuracy": float(judge.mean()),
             "accuracy/explore": float(judge[explore].mean()) if explore.any() else 0.0,
             "explore_rate": float(moved[explore].mean()) if explore.any() else 0.0,
             "tokens": float(jnp.sum(traj.loss_mask))}
  return batch, traj, metrics


def _save_results(job: Job, results: dict) -> None:
  workdir = pathlib.Path(job.config.workdir)
  (workdir / "results.json").write_text(json.dumps(results, indent=2))


def _table(results: dict, names: dict | None = None) -> str:
  names = {"first_view": "first view only (SFT policy)", "sft": "SFT policy",
           "grpo": "SFT + GRPO policy", **(names or {})}
  rows = [(names[k], results.get(k)) for k in ("first_view", "sft", "grpo")]
  lines = [f"{'policy':30} | {'front':>13} | {'left':>13} | {'right':>13} | "
           f"{'explore (L+R)':>13} | {'all':>13}"]
  for name, r in rows:
    if r is None:
      continue
    cells = [f"{r[k]['accuracy']:.3f}±{r[k]['se']:.3f}" for k in
             ("front", "left", "right", "explore", "all")]
    lines.append(f"{name:30} | " + " | ".join(f"{x:>13}" for x in cells))
  return "\n".join(lines)


def run(c) -> dict:
  if c.get("recipe") == "thinker3d":  # 3DThinker's two stages have their own loop
    from launch import thinker3d  # pylint: disable=import-outside-toplevel
    return thinker3d.run(c)
  if c.get("recipe") == "agent":  # the papers' agents on a task dataset (launch/recipe.py)
    from launch import recipe  # pylint: disable=import-outside-toplevel
    return recipe.run(c)
  initialize_from_env()
  workdir = pathlib.Path(c.workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  job = build(c)
  total = c.sft.steps + c.grpo.steps
  Precision.from_config(c.model).check_trainable("demo")
  if jax.process_index() == 0:
    episodes = c.grpo.prompts * c.grpo.group
    slots = episode.capacity(job.train[2].shape[1], job.template, job.rollout_config)
    print(memory.estimate(job.model, Precision.from_config(c.model), rollout_batch=episodes,
                          cache_length=slots, train_batch=episodes, train_length=slots,
                          micro_batches=c.grpo.micro_batches, remat=c.model.remat,
                          mesh=job.mesh).table(), flush=True)
  sft_opt = OptimizerConfig(learning_rate=c.sft.learning_rate, warmup_steps=c.sft.warmup,
                            total_steps=c.sft.steps, clip_norm=1.0)
  grpo_opt = OptimizerConfig(learning_rate=c.grpo.learning_rate, warmup_steps=c.grpo.warmup,
                             total_steps=c.grpo.steps * c.grpo.updates_per_batch,
                             clip_norm=1.0)
  with jax.set_mesh(job.mesh):
    optimizer = make_optimizer(job.model, sft_opt)
  checkpointer = Checkpointer(workdir / "checkpoints", keep=c.checkpoint.keep,
                              best_metric="reward")
  writer = MetricWriter(workdir)
  step, results = 0, {}
  if c.resume:
    step, extra, optimizer = checkpointer.restore_phases(
        job.model, optimizer, lambda: make_optimizer(job.model, grpo_opt, mesh=job.mesh),
        c.sft.steps)
    results = extra.get("results", {})
    if step:
      print(f"resumed from step {step} ({extra.get('phase')})")
  reference = None  # the KL term's reference: the SFT policy, frozen (only when beta > 0)

  def start_reference():
    nonlocal reference
    if c.grpo.beta > 0:
      reference = ReferencePolicy.frozen_for_run(job.model, checkpointer)

  if step >= c.sft.steps:
    start_reference()
  model_key = jax.random.PRNGKey(c.seed)
  sft_config = StepConfig(objective="sft", micro_batches=c.sft.micro_batches)
  grpo_config = StepConfig(
      objective="grpo", temperature=c.rollout.temperature, micro_batches=c.grpo.micro_batches,
      loss=PolicyLossConfig(epsilon_low=c.grpo.epsilon, epsilon_high=c.grpo.epsilon,
                            beta=c.grpo.beta, aggregation="sequence-mean-token-mean"))
  dataset = sft_dataset(job) if step < c.sft.steps else None
  curve = {"reward": ([], []), "accuracy": ([], [])}
  bar = tqdm(total=total, initial=step, desc="train", dynamic_ncols=True)

  def save(step, phase, metrics=None, force=False):
    extra = {"phase": phase, "results": results, "seed": c.seed}
    checkpointer.save(step, job.model, optimizer, extra, metrics, force=force)

  with PreemptionGuard() as guard:
    while step < total:
      started = time.perf_counter()
      if step < c.sft.steps:
        rng = np.random.default_rng([c.seed, 3, step])
        index = rng.choice(dataset.batch_size, c.sft.batch, replace=False)
        batch = shard_batch(jax.tree.map(lambda x: jnp.asarray(x[index]), dataset), job.mesh)
        with jax.set_mesh(job.mesh):
          metrics = train_step(job.model, optimizer, batch, sft_config)
        metrics = {f"sft/{k}": float(v) for k, v in metrics.items()}
        loss, finite = metrics["sft/loss"], metrics["sft/finite"]
      else:
        g_step = step - c.sft.steps
        batch, traj, rollout_metrics = _grpo_batch(job, g_step, model_key)
        if step + 1 == c.inject_nan_step:  # fault injection for tests (1-based, as logged)
          batch = batch.replace(advantages=jnp.full_like(batch.advantages, jnp.nan))
        step_metrics = grpo.update(job.model, optimizer, batch, grpo_config, job.mesh,
                                   reference, epochs=c.grpo.updates_per_batch)
        metrics = {f"grpo/{k}": float(v) for k, v in {**step_metrics, **rollout_metrics}.items()}
        metrics["grpo/tokens_per_s"] = rollout_metrics["tokens"] / (
            time.perf_counter() - started)
        loss, finite = metrics["grpo/loss"], metrics["grpo/finite"]
        curve["reward"][0].append(step)
        curve["reward"][1].append(rollout_metrics["reward"])
        curve["accuracy"][0].append(step)
        curve["accuracy"][1].append(rollout_metrics["accuracy"])
        if c.snapshot_every and g_step % c.snapshot_every == 0:
          (workdir / f"rollouts_train_{step:05d}.html").write_text(trajectory_html(
              jax.device_get(traj), job.tokenizer, job.automaton.grammar,
              title=f"training rollouts, step {step}"))
      if not finite:
        checkpointer.wait()
        raise FloatingPointError(f"step {step + 1}: the loss or a gradient is not finite "
                                 f"(loss {loss}); the update was not applied and nothing was "
                                 "saved; the last checkpoint is intact")
      step += 1
      writer.write(step, metrics)
      bar.update(1)
      if step % c.log_every == 0 or step == total:
        shown = {k.split("/")[-1]: v for k, v in metrics.items()
                 if k.split("/")[-1] in ("loss", "reward", "accuracy", "kl", "tokens_per_s")}
        bar.set_postfix({k: f"{v:.3g}" for k, v in shown.items()})
      if step == c.sft.steps:  # end of SFT: evaluate, switch optimizers
        if c.evaluate:
          results["sft"] = evaluate(job)
          results["first_view"] = evaluate(job, first_view_only=True)
        dataset = None
        with jax.set_mesh(job.mesh):
          optimizer = make_optimizer(job.model, grpo_opt)
        start_reference()
        save(step, "grpo", force=True)
      elif step % c.checkpoint.every == 0 or guard.requested:
        phase = "sft" if step < c.sft.steps else "grpo"
        save(step, phase, {"reward": metrics["grpo/reward"]} if phase == "grpo" else None)
      if guard.requested:
        checkpointer.wait()
        print(f"SIGTERM: saved step {step}; exiting")
        return results
      if step == c.kill_after_step:
        checkpointer.wait()
        os.kill(os.getpid(), signal.SIGKILL)
  bar.close()
  if c.evaluate:
    results["grpo"] = evaluate(job)
  checkpointer.wait()
  if checkpointer.latest_step() != step:
    save(step, "done", force=True)
  checkpointer.close()
  writer.close()
  _save_results(job, results)
  if curve["reward"][0]:
    window = 10
    smooth = lambda y: np.convolve(y, np.ones(window) / window, "valid") if len(y) >= window else y
    xs = curve["reward"][0][window - 1:] if len(curve["reward"][0]) >= window else curve["reward"][0]
    line_chart({"reward (10-step mean)": (xs, smooth(np.asarray(curve["reward"][1]))),
                "accuracy (10-step mean)": (xs, smooth(np.asarray(curve["accuracy"][1]))),
                "reward": curve["reward"]},
               workdir / "reward_curve.png",
               title="GRPO training rollouts (temperature 1): reward and accuracy")
  if c.evaluate:
    tasks, questions, ids, mask = _take(job.test, np.arange(min(16, len(job.test[1]))))
    traj = _rollout(job, tasks, ids, mask, jax.random.PRNGKey(1),
                    dataclasses.replace(job.rollout_config, temperature=0.0))
    (workdir / "rollouts.html").write_text(trajectory_html(
        jax.device_get(traj), job.tokenizer, job.automaton.grammar,
        title="test episodes (greedy), after SFT + GRPO"))
    print(_table(results))
  print(f"outputs: {workdir.resolve()} (results.json, reward_curve.png, rollouts.html)")
  return results


def main(argv) -> None:
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  run(_CONFIG.value)


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", "configs/demo.py", "the training config")
  app.run(main)
