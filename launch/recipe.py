"""Trains one of the papers' agents from its config: trajectory SFT (optional), then GRPO or
OR-GIGPO over compiled rollouts, then greedy accuracy per question family on a split.

    python -m launch.train --config configs/think3d_rl.py:cpu        (this machine)
    python -m launch.train --config configs/act3d_grpo.py \\
        --config.model.checkpoint=/ckpt/qwen2.5-vl --config.data.data_dir=/data

Configs with `recipe = "agent"` come here from `launch.train` (see configs/think3d_rl.py,
act3d_grpo.py, peria_or_gigpo.py). The policy loads from a Hugging Face Qwen2.5-VL folder
(`model.checkpoint`; empty: a tiny random policy for CPU runs) straight onto the mesh.
Tasks come from a TFDS ArrayRecord dataset read with grain, each process reading its own
shard; SFT replays teacher trajectories (data_pipelines/synthetic/teachers.py format)
through the environment. Checkpoints hold parameters, optimizer, step and phase; each
process's data-iterator state is saved beside them (data_state/), so a resumed run reads
the same batches. SIGTERM saves and exits.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from data_pipelines.loader import decode_text, scene_tasks, task_batches
from data_pipelines.synthetic import teachers
from data_pipelines.synthetic.questions import FAMILIES
from jaxspatial.envs import act3d, peria, think3d
from jaxspatial.models import Precision, memory, model_options, resolve_attention, sharding
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.rl.objectives import PolicyLossConfig
from jaxspatial.rl.rewards.papers import Act3DRewardConfig, Think3DRewardConfig
from jaxspatial.rollout import (agents, automaton as am, episode, observation, peria_agent,
                                prompts, tiny)
from jaxspatial.rollout.viewer import trajectory_html
from jaxspatial.train import (AdvantageConfig, Checkpointer, MetricWriter, OptimizerConfig,
                              PreemptionGuard, ReferencePolicy, StepConfig, TrainBatch,
                              global_batch, grpo, initialize_from_env, make_optimizer,
                              train_step, trainable)
from jaxspatial.train.plots import line_chart

SYSTEMS = {"think3d": prompts.THINK3D_SYSTEM, "act3d": prompts.ACT3D_SYSTEM,
           "peria": prompts.PERIA_SYSTEM}
CORRECT = {"think3d": "correct", "act3d": "judge", "peria": "correct"}  # the accuracy component


@dataclasses.dataclass
class RecipeJob:
  config: object
  mesh: object
  tokenizer: object
  model: Qwen25VL
  agent: object
  automaton: am.TokenAutomaton
  template: observation.ObservationTemplate
  rollout_config: episode.RolloutConfig
  image_tokens: int


def needs_views(c) -> bool:
  """Think3D's prompt holds the dataset's input views; the other agents start from a render."""
  return c.agent.name == "think3d"


def make_agent(c):
  a, turns = c.agent, c.rollout.max_turns
  if a.name == "think3d":
    return agents.Think3DAgent(think3d.Think3DParams(width=a.width, height=a.height,
                                                     max_rounds=turns - 1,
                                                     num_prompt_images=a.input_views),
                               Think3DRewardConfig(**c.reward.get("weights", {})),
                               views=a.views)
  if a.name == "act3d":
    return agents.Act3DAgent(act3d.Act3DParams(width=a.width, height=a.height,
                                               hfov_deg=a.hfov_deg, max_interactions=turns - 1),
                             Act3DRewardConfig(**c.reward.get("weights", {})))
  if a.name == "peria":
    return agents.PeriaAgent(peria.PeriaParams(width=a.width, height=a.height,
                                               hfov_deg=a.hfov_deg, max_images=a.max_images,
                                               max_turns=turns))
  raise ValueError(f"config agent.name: expected one of {sorted(SYSTEMS)}, got {a.name!r}")


def load_policy(c, mesh):
  """(tokenizer, model): a Hugging Face folder loaded onto the mesh, or a tiny random policy."""
  with jax.set_mesh(mesh):
    if c.model.checkpoint:
      from jaxspatial.models.qwen2_5_vl.tokenizer import load_processor  # pylint: disable=import-outside-toplevel
      processor = load_processor(c.model.checkpoint)
      tok = getattr(processor, "tokenizer", processor)
      return tok, Qwen25VL.from_pretrained(c.model.checkpoint, seed=c.seed,
                                           **model_options(c.model))
    tok = tiny.tokenizer()
    return tok, Qwen25VL(tiny.model_config(tok), rngs=nnx.Rngs(c.seed), **model_options(c.model))


def data_source(c, split: str):
  """A split of the task dataset: the synthetic builder (built on first use when
  `data.build`), or any prepared TFDS dataset with its features, by name."""
  d = c.data
  if d.builder == "synthetic_spatial":
    from data_pipelines.builders import SyntheticSpatial  # pylint: disable=import-outside-toplevel
    builder = SyntheticSpatial(data_dir=d.data_dir, config=d.config)
    if not builder.is_prepared():
      if not d.build:
        raise FileNotFoundError(f"synthetic_spatial/{d.config} is not prepared under "
                                f"{d.data_dir}: run python -m launch.build_data --config "
                                f"{d.config} --data-dir {d.data_dir}")
      if jax.process_index() == 0:
        builder.download_and_prepare()
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      multihost_utils.sync_global_devices("synthetic_spatial prepared")
      builder = SyntheticSpatial(data_dir=d.data_dir, config=d.config)
    return builder.as_data_source()[split]
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  return tfds.data_source(f"{d.builder}/{d.config}" if d.config else d.builder,
                          data_dir=d.data_dir, split=split)


def build(c) -> RecipeJob:
  devices = jax.device_count()
  mesh = sharding.make_mesh(devices if c.mesh.data == -1 else c.mesh.data, c.mesh.fsdp,
                            c.mesh.tensor)
  tok, model = load_policy(c, mesh)
  agent = make_agent(c)
  automaton = am.compile_token_automaton(agent.grammar, tok, model.config.text.vocab_size)
  n_image = episode.image_tokens(model, agent.image_size)
  template = observation.compile_template(tok, agent.observation, n_image)
  eos = tok.convert_tokens_to_ids("<|im_end|>")
  config = episode.RolloutConfig(
      max_turns=c.rollout.max_turns, max_turn_tokens=c.rollout.max_turn_tokens,
      temperature=c.rollout.temperature, top_p=c.rollout.top_p,
      constrained=c.rollout.constrained, eos_tokens=(eos,),
      pad_token=tok.pad_token_id if tok.pad_token_id is not None else 0,
      repetition_penalty=c.rollout.repetition_penalty,
      cache_dtype=Precision.from_config(c.model).cache_dtype)
  return RecipeJob(c, mesh, tok, model, agent, automaton, template, config, n_image)


def prompt_arrays(job: RecipeJob, tasks) -> tuple[np.ndarray, np.ndarray]:
  """The first prompts of a batch of tasks, left-padded to `data.prompt_tokens`. Think3D's
  holds the task's input views (the first `agent.input_views`; a task's padding views are
  masked)."""
  name = job.config.agent.name
  length = job.config.data.prompt_tokens
  if name == "think3d":
    views = job.agent.params.num_prompt_images
    users = [decode_text(q) for q in tasks.question_ids]
    return prompts.left_padded_views(job.tokenizer, SYSTEMS[name], users, job.image_tokens,
                                     views, np.minimum(tasks.num_input_cameras, views), length)
  texts = []
  for row in range(len(tasks.question_ids)):
    question = decode_text(tasks.question_ids[row])
    if name == "act3d":
      question = prompts.act3d_user_text(question, tasks.scene_min[row], tasks.scene_max[row])
    if name == "peria":  # "Observation 0:" before the image, as PERIA's pipeline sends it
      texts.append(prompts.peria_prompt(SYSTEMS[name], question, job.image_tokens))
    else:
      texts.append(prompts.chat_prompt(SYSTEMS[name], question, job.image_tokens))
  return prompts.left_padded(job.tokenizer, texts, length)


def rollout(job: RecipeJob, tasks, key, config=None, forced=None):
  """Compiled rollouts of this process's tasks, as one global batch over ('data', 'fsdp')."""
  ids, mask = prompt_arrays(job, tasks)
  inputs = global_batch((tasks, ids, mask) if forced is None else (tasks, ids, mask, forced),
                        job.mesh)
  run = episode.compile_rollout(job.agent, job.template, config or job.rollout_config)
  with jax.set_mesh(job.mesh):
    return run(job.model, job.automaton, *inputs[:3], key,
               None if forced is None else inputs[3])


def local(array) -> np.ndarray:
  """This process's rows of a global array (all of them on one host)."""
  shards = sorted(array.addressable_shards, key=lambda s: s.index[0].start or 0)
  rows, seen = [], set()
  for shard in shards:
    start = shard.index[0].start or 0
    if start not in seen:
      seen.add(start)
      rows.append(np.asarray(shard.data))
  return np.concatenate(rows)


def episode_rewards(job: RecipeJob, traj) -> jax.Array:
  """The agent's reward; PERIA's comes from the model text (R_rep and R_format need it)."""
  if job.config.agent.name != "peria":
    return traj.reward
  rewards = peria_agent.text_rewards(local(traj.tokens), local(traj.loss_mask),
                                     local(traj.turn_active).sum(-1),
                                     local(traj.reward_components["correct"]), job.tokenizer)
  return global_batch(rewards, job.mesh)


def _stack(items):
  return jax.tree.map(lambda *x: np.stack(x), *items)


class TeacherData:
  """Teacher trajectories matched to their tasks; step k's batch is a fixed function of the
  seed and k (a resumed run replays the same batches)."""

  def __init__(self, job: RecipeJob, source, path):
    self.job, self.source, self.path = job, source, path
    records = teachers.read_trajectories(path)
    scenes = {int(source[i]["scene_seed"]): i for i in range(len(source))}
    missing = [r for r in records if r["scene_seed"] not in scenes]
    if missing:
      raise ValueError(f"{path}: {len(missing)} trajectories name scenes not in the split, "
                       f"e.g. scene_seed {missing[0]['scene_seed']}")
    self.records = [(scenes[r["scene_seed"]], r["question"], r["turns"]) for r in records]
    rows = np.arange(len(self.records))
    self.rows = rows[jax.process_index()::jax.process_count()]

  def batch(self, step: int, size: int) -> TrainBatch:
    job, c = self.job, self.job.config
    per_epoch = len(self.rows) // size
    if per_epoch == 0:
      raise ValueError(f"SFT: {len(self.rows)} trajectories on this process, fewer than the "
                       f"batch {size}")
    epoch, position = divmod(step, per_epoch)
    order = np.random.default_rng([c.seed, 5, epoch]).permutation(self.rows)
    chosen = [self.records[i] for i in order[position * size:(position + 1) * size]]
    tasks = []
    for scene, question, _ in chosen:
      found = scene_tasks(self.source[scene], points=c.data.points,
                          input_images=needs_views(c))
      if question >= len(found):
        raise ValueError(f"SFT: scene {scene} has {len(found)} questions, no question "
                         f"{question}")
      tasks.append(found[question][0])
    forced = episode.forced_tokens(job.tokenizer, [t for _, _, t in chosen], job.rollout_config)
    traj = rollout(job, _stack(tasks), jax.random.PRNGKey(step), forced=forced)
    names = [f"{self.path}: scene {int(self.source[scene]['scene_seed'])} question {question}"
             for scene, question, _ in chosen]
    episode.check_replay(jax.tree.map(local, traj), forced, names, job.tokenizer)
    return TrainBatch.from_trajectory(traj)


def evaluate(job: RecipeJob, split: str | None = None) -> dict:
  """Greedy accuracy per question family (and overall) on up to `eval.tasks` tasks of the
  split, with standard errors, summed over processes."""
  c = job.config
  config = dataclasses.replace(job.rollout_config, temperature=0.0)
  source = data_source(c, split or c.data.eval_split)
  if c.eval.batch % jax.process_count():
    raise ValueError(f"eval.batch {c.eval.batch} does not split over {jax.process_count()} "
                     "processes")
  per_process = c.eval.batch // jax.process_count()
  batches = task_batches(source, per_process, shuffle=False, drop_remainder=False,
                         shard=(jax.process_index(), jax.process_count()), points=c.data.points,
                         input_images=needs_views(c))
  counts = np.zeros((len(FAMILIES), 2))  # [correct, total] per family
  seen = 0
  for tasks, meta in batches:
    if seen >= c.eval.tasks // jax.process_count():
      break
    real = len(meta["family"])
    if real < per_process:  # one compiled shape: pad with repeats, drop after
      take = np.minimum(np.arange(per_process), real - 1)
      tasks = jax.tree.map(lambda x: x[take], tasks)
    traj = rollout(job, tasks, jax.random.PRNGKey(0), config)
    correct = local(traj.reward_components[CORRECT[c.agent.name]])[:real] > 0
    np.add.at(counts, (meta["family"], 0), correct)
    np.add.at(counts, (meta["family"], 1), 1)
    seen += real
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  counts = np.asarray(multihost_utils.process_allgather(counts)).reshape(-1, len(FAMILIES), 2).sum(0)
  out = {}
  rows = {name: counts[i] for i, name in enumerate(FAMILIES) if counts[i, 1] > 0}
  rows["all"] = counts.sum(0)
  for name, (right, total) in rows.items():
    p = right / max(total, 1)
    out[name] = {"accuracy": float(p), "se": float(np.sqrt(p * (1 - p) / max(total, 1))),
                 "n": int(total)}
  return out


def table(results: dict) -> str:
  names = [k for k in FAMILIES + ("all",) if any(k in r for r in results.values())]
  lines = [f"{'policy':14} | " + " | ".join(f"{n:>19}" for n in names)]
  for label, r in results.items():
    cells = [f"{r[n]['accuracy']:.3f}±{r[n]['se']:.3f} ({r[n]['n']})" if n in r else "-"
             for n in names]
    lines.append(f"{label:14} | " + " | ".join(f"{x:>19}" for x in cells))
  return "\n".join(lines)


def _data_state_path(workdir, step):
  return pathlib.Path(workdir) / "checkpoints" / "data_state" / f"{step}.process{jax.process_index()}.json"


def rl_steps(c, source) -> int:
  """`grpo.steps`, or with -1 `grpo.data_epochs` passes over the split's tasks (the papers
  count RL in epochs: Think3D-RL one epoch of its 977 prompts)."""
  if c.grpo.steps >= 0:
    return c.grpo.steps
  tasks = sum(len(json.loads(source[i]["questions"])) for i in range(len(source)))
  steps = int(c.grpo.data_epochs * tasks) // c.grpo.prompts
  if steps < 1:
    raise ValueError(f"grpo.steps -1: {c.grpo.data_epochs} epochs of {tasks} tasks at "
                     f"{c.grpo.prompts} prompts a step is less than one step")
  return steps


def _optimizer_config(o, total: int) -> OptimizerConfig:
  return OptimizerConfig(learning_rate=o.learning_rate, total_steps=total,
                         warmup_steps=int(round(o.warmup_ratio * total)),
                         clip_norm=o.clip_norm, weight_decay=o.weight_decay, decay=o.decay,
                         final_fraction=o.final_fraction,
                         weight_decay_mask=o.weight_decay_mask)


def memory_estimate(c, job: RecipeJob, wrt, training: bool = True) -> memory.MemoryEstimate:
  """The job's device memory before anything compiles: a GRPO step's rollout batch and
  update (SFT batches are no larger on the papers' settings)."""
  slots = episode.capacity(c.data.prompt_tokens, job.template, job.rollout_config)
  episodes = c.grpo.prompts * c.advantage.group_size
  options = model_options(c.model)
  fused = resolve_attention(options["attention"], options["dtype"]) != "einsum"
  return memory.estimate(job.model, Precision.from_config(c.model), rollout_batch=episodes,
                         cache_length=slots, train_batch=episodes // c.grpo.mini_batches,
                         train_length=slots, micro_batches=c.grpo.micro_batches,
                         remat=options["remat"], fused_attention=fused, trainable=wrt,
                         training=training, mesh=job.mesh)


def run(c) -> dict:
  initialize_from_env()
  if not c.model.checkpoint and c.get("variant") == "reference":
    raise ValueError(f"{c.name}: the reference variant trains a pretrained policy: give "
                     "--config.model.checkpoint=/path/to/hf_folder (and the dataset: "
                     "--config.data.data_dir), or run the ':cpu' variant")
  workdir = pathlib.Path(c.workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  job = build(c)
  train_source = data_source(c, c.data.train_split)
  if c.agent.name == "think3d":  # its views use the dataset cameras' intrinsics as given
    view = tuple(np.asarray(train_source[0]["images"][0]).shape[:2])
    if view != (c.agent.height, c.agent.width):
      raise ValueError(f"think3d renders with the dataset's camera intrinsics, made for "
                       f"{view[1]}x{view[0]} views: set agent.width / agent.height to those "
                       f"(got {c.agent.width}x{c.agent.height})")
  group = c.advantage.group_size
  for name, rows in (("grpo.prompts", c.grpo.prompts), ("sft.batch", c.sft.batch)):
    if rows % jax.process_count():
      raise ValueError(f"{name} {rows} does not split over {jax.process_count()} processes")
  grpo_steps = rl_steps(c, train_source)
  updates = grpo_steps * c.grpo.epochs * c.grpo.mini_batches
  sft_opt = _optimizer_config(c.sft, max(c.sft.steps, 1))
  grpo_opt = _optimizer_config(c.grpo, max(updates, 1))
  wrt = trainable(frozen=tuple(c.model.frozen))  # e.g. the vision tower ("visual")
  if c.sft.steps or grpo_steps:
    Precision.from_config(c.model).check_trainable(c.name)
  if jax.process_index() == 0:
    print(memory_estimate(c, job, wrt).table(), flush=True)
  with jax.set_mesh(job.mesh):
    optimizer = make_optimizer(job.model, sft_opt if c.sft.steps else grpo_opt, wrt)
  checkpointer = Checkpointer(workdir / "checkpoints", keep=c.checkpoint.keep,
                              best_metric="reward")
  writer = MetricWriter(workdir) if jax.process_index() == 0 else None
  step, results = 0, {}
  if c.resume:
    step, extra, optimizer = checkpointer.restore_phases(
        job.model, optimizer, lambda: make_optimizer(job.model, grpo_opt, wrt, mesh=job.mesh),
        c.sft.steps)
    results = extra.get("results", {})
    if step:
      print(f"resumed from step {step} ({extra.get('phase')})")
  total = c.sft.steps + grpo_steps
  beta = c.objective.beta
  reference = (ReferencePolicy.frozen_for_run(job.model, checkpointer)
               if beta > 0 and step >= c.sft.steps else None)
  prompts_local = c.grpo.prompts // jax.process_count()
  stream = iter(task_batches(train_source, prompts_local, seed=c.seed, num_epochs=None,
                             shard=(jax.process_index(), jax.process_count()),
                             points=c.data.points, input_images=needs_views(c)))
  if step > c.sft.steps:
    stream.set_state(json.loads(_data_state_path(workdir, step).read_text()))
  teacher = None
  if step < c.sft.steps:
    path = c.sft.trajectories
    if path == "scripted":
      path = workdir / f"teacher_{c.agent.name}.jsonl"
      if jax.process_index() == 0 and not path.exists():
        teachers.write_scripted(train_source, c.agent.name, path, c.seed)
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      multihost_utils.sync_global_devices("teacher trajectories written")
    teacher = TeacherData(job, train_source, path)
  sft_config = StepConfig(objective="sft", micro_batches=c.sft.micro_batches)
  grpo_config = StepConfig(objective="grpo", temperature=c.rollout.temperature,
                           micro_batches=c.grpo.micro_batches,
                           loss=PolicyLossConfig(**c.objective))
  advantage_config = AdvantageConfig(**c.advantage)
  key = jax.random.PRNGKey(c.seed)
  curve = ([], [], [])
  bar = tqdm(total=total, initial=step, desc=c.name, dynamic_ncols=True,
             disable=jax.process_index() != 0)

  def save(phase, metrics=None, force=False):
    if step > c.sft.steps:
      path = _data_state_path(workdir, step)
      path.parent.mkdir(parents=True, exist_ok=True)
      tmp = path.with_suffix(".tmp")
      tmp.write_text(json.dumps(stream.get_state()))
      tmp.replace(path)
      kept = set(checkpointer.latest.all_steps()) | {step}
      for old in path.parent.glob(f"*.process{jax.process_index()}.json"):
        if int(old.name.split(".")[0]) not in kept:  # its checkpoint rotated out
          old.unlink(missing_ok=True)
    checkpointer.save(step, job.model, optimizer, {"phase": phase, "results": results,
                                                   "seed": c.seed}, metrics, force=force)

  with PreemptionGuard() as guard:
    while step < total:
      started = time.perf_counter()
      if step < c.sft.steps:
        batch = teacher.batch(step, c.sft.batch // jax.process_count())
        with jax.set_mesh(job.mesh):
          metrics = train_step(job.model, optimizer, batch, sft_config)
        metrics = {f"sft/{k}": float(v) for k, v in metrics.items()}
        finite = metrics["sft/finite"]
      else:
        tasks, _ = next(stream)
        tasks = jax.tree.map(lambda x: np.repeat(x, group, axis=0), tasks)
        traj = rollout(job, tasks, jax.random.fold_in(key, step))
        rewards = episode_rewards(job, traj)
        advantages = grpo.advantages(traj, rewards, advantage_config)
        batch = TrainBatch.from_trajectory(traj, advantages)
        step_metrics = grpo.update(job.model, optimizer, batch, grpo_config, job.mesh,
                                   reference, c.grpo.mini_batches, c.grpo.epochs)
        rollout_metrics = traj.metrics()
        rollout_metrics["reward"] = jnp.mean(rewards)
        rollout_metrics["accuracy"] = jnp.mean(traj.reward_components[CORRECT[c.agent.name]])
        tokens = float(jnp.sum(traj.loss_mask))
        metrics = {f"grpo/{k}": float(v) for k, v in {**step_metrics, **rollout_metrics}.items()}
        metrics["grpo/tokens_per_s"] = tokens / (time.perf_counter() - started)
        finite = metrics["grpo/finite"]
        for series, name in zip(curve, ("step", "grpo/reward", "grpo/accuracy")):
          series.append(step + 1 if name == "step" else metrics[name])
        if c.snapshot_every and (step - c.sft.steps) % c.snapshot_every == 0 and (
            jax.process_index() == 0):
          rows = jax.tree.map(local, traj)
          (workdir / f"rollouts_train_{step + 1:05d}.html").write_text(trajectory_html(
              rows, job.tokenizer, job.automaton.grammar, title=f"{c.name} step {step + 1}"))
      if not finite:
        checkpointer.wait()
        raise FloatingPointError(f"step {step + 1}: the loss or a gradient is not finite; the "
                                 "update was not applied and nothing was saved")
      step += 1
      if writer:
        writer.write(step, metrics)
      bar.update(1)
      if step % c.log_every == 0 or step == total:
        bar.set_postfix({k.split("/")[-1]: f"{v:.3g}" for k, v in metrics.items()
                         if k.split("/")[-1] in ("loss", "reward", "accuracy", "kl",
                                                 "tokens_per_s")})
      if step == c.sft.steps:  # SFT done: evaluate, switch to the GRPO optimizer
        if c.eval.tasks:
          results["sft"] = evaluate(job)
        with jax.set_mesh(job.mesh):
          optimizer = make_optimizer(job.model, grpo_opt, wrt)
        if beta > 0:
          reference = ReferencePolicy.frozen_for_run(job.model, checkpointer)
        save("grpo", force=True)
      elif step % c.checkpoint.every == 0 or guard.requested:
        phase = "sft" if step < c.sft.steps else "grpo"
        save(phase, {"reward": metrics["grpo/reward"]} if phase == "grpo" else None)
      if guard.requested:
        checkpointer.wait()
        print(f"SIGTERM: saved step {step}; exiting")
        return results
  bar.close()
  if c.eval.tasks:
    results["final"] = evaluate(job)
  checkpointer.wait()
  if checkpointer.latest_step() != step:
    save("done", force=True)
  checkpointer.close()
  if writer:
    writer.close()
  if jax.process_index() == 0:
    (workdir / "results.json").write_text(json.dumps(results, indent=2))
    if curve[0]:
      line_chart({"reward": (curve[0], curve[1]), "accuracy": (curve[0], curve[2])},
                 workdir / "reward_curve.png", title=f"{c.name}: training rollouts")
    if results:
      print(table(results))
  return results
