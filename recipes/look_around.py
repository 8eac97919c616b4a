"""The main job (configs/demo.py): trajectory SFT on a scripted explorer, then GRPO over
compiled Act3D rollouts, then test accuracy against answering from the first view.

The task (data_pipelines/synthetic/look_around.py): one coloured box in front of, left of
or right of the camera; "what colour is the box on your left?" needs one turn to see it.
Step k's SFT batch and GRPO prompts are fixed functions of the seed and k.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from flax import nnx

from data_pipelines.synthetic import look_around
from jaxspatial.envs import act3d
from jaxspatial.models import Precision, memory, model_options
from jaxspatial.models.sharding import global_batch, local_rows
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.models.qwen2_5_vl.tokenizer import train_tokenizer
from jaxspatial.rollout import AgentRollout, agents, prompts, tiny
from jaxspatial.rollout.viewer import trajectory_html
from jaxspatial.train import (Experiment, ExportedPolicy, OptimizerConfig, Phase, RolloutBatch,
                              StepConfig, TrainBatch)
from jaxspatial.eval import summarize
from recipes.common import gather_rows, grpo_phase, my_rows, small_model_config

SYSTEM = ("Answer with one colour word. To look around, call render_view_tool with "
          "turn_left or turn_right.")


@dataclasses.dataclass
class Split:
  tasks: object
  questions: list
  prompt_ids: np.ndarray
  prompt_mask: np.ndarray

  def take(self, index) -> "Split":
    index = np.asarray(index)
    return Split(jax.tree.map(lambda x: x[index], self.tasks),
                 [self.questions[i] for i in index], self.prompt_ids[index],
                 self.prompt_mask[index])


def make_phases(c) -> list[Phase]:
  """SFT on the scripted explorer's trajectories, then GRPO, from the config alone."""
  return [
      Phase("sft", c.sft.steps, OptimizerConfig(**c.sft.optimizer),
            StepConfig(objective="sft", micro_batches=c.sft.micro_batches)),
      grpo_phase(c, c.rl.steps)]


class LookAround(Experiment):
  name = "demo"
  curve_metrics = ("rl/reward", "rl/accuracy")

  def __init__(self, config):
    self.c = config
    self.dataset = None  # the SFT trajectories, made when the SFT phase starts

  # -- set-up ------------------------------------------------------------------------------

  def build_for_export(self, mesh):
    """The tokenizer (trained on the templates, as `build` trains it) and the policy."""
    c = self.c
    self.mesh = mesh
    questions = [look_around.LookQuestion(s, k) for s in look_around.SIDES
                 for k in look_around.COLOURS]
    corpus = ([prompts.chat_prompt(SYSTEM, q.question, 0) for q in questions] * 10
              + [t for q in questions
                 for t in look_around.expert_turns(q, np.random.default_rng(0))] * 10
              + tiny.example_turns(100))
    self.tokenizer = train_tokenizer(corpus, vocab_size=c.model.vocab,
                                     extra_special_tokens=tiny.LATENT_TOKENS)
    self.model = Qwen25VL(small_model_config(c.model, self.tokenizer), rngs=nnx.Rngs(c.seed),
                          **model_options(c.model))
    return self.model

  def exported_policy(self, module):
    """The Qwen2.5-VL-shaped policy with the tokenizer trained here; prompts in Qwen's
    layout, replies opened bare and ended by <|im_end|> (the rollouts' stop)."""
    return ExportedPolicy(module, self.tokenizer)

  def build(self, mesh):
    c = self.c
    self.build_for_export(mesh)
    s = c.scene
    agent = agents.Act3DAgent(act3d.Act3DParams(
        width=s.width, height=s.height, hfov_deg=s.hfov_deg, turn_step_deg=s.turn_step_deg,
        splat_radius=s.splat_radius, grounding_min_pixels=5,
        max_interactions=c.rollout.max_turns - 1))
    self.run = AgentRollout.create(agent, self.tokenizer, self.model,
                                   cache_dtype=Precision.from_config(c.model).cache_dtype,
                                   **c.rollout)
    self.train = self._split("train")
    self.test = self._split("test")
    return self.model

  def _split(self, name: str) -> Split:
    c = self.c
    count = c.data.train_tasks if name == "train" else c.data.test_tasks
    seed = c.seed * 1000 + (1 if name == "train" else 2)
    tasks, questions = look_around.make_tasks(count, seed, c.scene.points, c.scene.width,
                                              c.scene.height, c.scene.hfov_deg)
    texts = [prompts.chat_prompt(SYSTEM, q.question, self.run.image_tokens) for q in questions]
    ids, mask = prompts.left_padded(self.tokenizer, texts)
    return Split(tasks, questions, ids, mask)

  def phases(self):
    return make_phases(self.c)

  def memory_estimate(self):
    c = self.c
    episodes = c.rl.prompts * c.advantage.group_size
    slots = self.run.capacity(self.train.prompt_ids.shape[1])
    return memory.estimate(self.model, Precision.from_config(c.model), rollout_batch=episodes,
                           cache_length=slots, train_batch=episodes, train_length=slots,
                           micro_batches=c.rl.micro_batches, remat=c.model.remat,
                           mesh=self.mesh)

  # -- data --------------------------------------------------------------------------------

  def _rollout(self, split: Split, key, temperature=None, forced=None, replay=False,
               group=1):
    """Compiled rollouts of the global batch `split`: this process runs its rows, the
    trajectory is global (rows over ('data', 'fsdp')); `group`: consecutive rows repeat
    one question (prefilled once)."""
    rows = my_rows(len(split.questions))
    mine = split.take(rows)
    return self.run(self.model, mine.tasks, key, prompt_ids=mine.prompt_ids,
                    prompt_mask=mine.prompt_mask, temperature=temperature, mesh=self.mesh,
                    forced=None if forced is None else np.asarray(forced)[rows],
                    replay=replay, group=group)

  def prepare(self, phase, module):
    if phase.name == "sft" and self.dataset is None:
      self.dataset = self._sft_dataset()
    if phase.name != "sft":
      self.dataset = None

  def _sft_dataset(self) -> TrainBatch:
    """The scripted explorer's trajectories (forced rollouts: the exact layout and views);
    each process keeps its rows of each chunk."""
    c = self.c
    rng = np.random.default_rng([c.seed, 7])
    count = c.data.sft_trajectories
    index = rng.choice(len(self.train.questions), count,
                       replace=count > len(self.train.questions))
    parts = []
    for start in range(0, count, c.sft.batch):
      split = self.train.take(index[start:start + c.sft.batch])
      scripts = [look_around.expert_turns(q, rng) for q in split.questions]
      traj = self._rollout(split, jax.random.PRNGKey(start), forced=self.run.forced(scripts),
                           replay=True)
      parts.append(jax.tree.map(local_rows, TrainBatch.from_trajectory(traj)))
    return jax.tree.map(lambda *x: np.concatenate(x), *parts)

  def train_batch(self, phase, step):
    """Step k's batch: `sft.batch` rows drawn from the (per-process) trajectories."""
    count = jax.process_count()
    rng = np.random.default_rng([self.c.seed, 3, step] + ([jax.process_index()]
                                                          if count > 1 else []))
    index = rng.choice(self.dataset.batch_size, self.c.sft.batch // count, replace=False)
    return global_batch(jax.tree.map(lambda x: x[index], self.dataset), self.mesh)

  def rollout(self, phase, step, key):
    c = self.c
    rng = np.random.default_rng([c.seed, 11, step])
    chosen = rng.choice(len(self.train.questions), c.rl.prompts, replace=False)
    split = self.train.take(np.repeat(chosen, c.advantage.group_size))
    traj = self._rollout(split, key, group=c.advantage.group_size if c.rl.share_prompts else 1)
    explore = np.asarray([q.needs_exploration for q in split.questions])
    mask = global_batch(explore[my_rows(len(explore))].astype(np.float32), self.mesh)
    judge = traj.reward_components["judge"]
    moved = (traj.reward_components["interactions"] > 0).astype(jnp.float32)
    explored = max(float(explore.sum()), 1.0)
    metrics = {"reward": jnp.mean(traj.reward), "accuracy": jnp.mean(judge),
               "accuracy/explore": jnp.sum(judge * mask) / explored,
               "explore_rate": jnp.sum(moved * mask) / explored,
               "tokens": jnp.sum(traj.loss_mask)}
    if c.snapshot_every and step % c.snapshot_every == 0:
      self._page(traj, f"rollouts_train_{c.sft.steps + step:05d}.html",
                 f"training rollouts, step {c.sft.steps + step}", split=split)
    return RolloutBatch(TrainBatch.from_trajectory(traj), traj.reward, traj, metrics)

  def _page(self, traj, name: str, title: str, split: Split | None = None,
            forced=None) -> None:
    """An HTML page of process 0's episodes; `split` (the rollout's global batch) gives
    each its question and reference, `forced` (the rollout's forced ids) marks what was
    forced."""
    rows = jax.tree.map(local_rows, traj)
    if jax.process_index() == 0:
      context = {}
      if split is not None:
        mine = split.take(my_rows(len(split.questions)))
        context = dict(questions=[q.question for q in mine.questions], tasks=mine.tasks)
      if forced is not None:
        context["forced"] = np.asarray(forced)[my_rows(len(forced))]
      (epath.Path(self.c.workdir) / name).write_text(trajectory_html(
          rows, self.tokenizer, self.run.automaton.grammar, title=title, **context))

  # -- evaluation --------------------------------------------------------------------------

  def accuracy(self, first_view_only: bool = False) -> dict:
    """Greedy test accuracy per side, on exploration questions (left + right, pooled) and
    overall, with standard errors (`jaxspatial.eval.summarize`). `first_view_only` forces an answer in the first turn."""
    batch, test = self.c.eval.batch, self.test
    positions, correct = [], []
    for start in range(0, len(test.questions), batch):
      index = np.arange(start, min(start + batch, len(test.questions)))
      real = len(index)
      if real < batch:  # one compiled shape: pad with repeats, dropped by position
        index = np.concatenate([index, np.full(batch - real, index[-1])])
      forced = None
      if first_view_only:
        forced = self.run.forced([[look_around.first_view_prefix()]] * len(index))
      traj = self._rollout(test.take(index), jax.random.PRNGKey(0), 0.0, forced)
      rows = my_rows(len(index))
      positions += list(np.where(rows < real, index[rows], -1))
      correct += list(local_rows(traj.reward_components["judge"]) > 0)
    correct = gather_rows(positions, correct) > 0
    sides = [q.side for q in test.questions]
    return summarize(correct.astype(np.float64), sides, columns=look_around.SIDES,
                     pooled={"explore": [s for s in look_around.SIDES if s != "front"]})

  def evaluate(self, module, when, split=None):
    if split not in (None, "test"):
      raise ValueError(f"demo: evaluates its test split, not {split!r}")
    if when == "checkpoint":
      return {"policy": self.accuracy(), "first_view": self.accuracy(first_view_only=True)}
    if not self.c.evaluate:
      return {}
    if when == "sft":
      return {"sft": self.accuracy(), "first_view": self.accuracy(first_view_only=True)}
    if when == "final":
      return {"grpo": self.accuracy()}
    return {}

  def report(self, results, workdir):
    if "grpo" in results or "policy" in results:
      split = self.test.take(np.arange(min(16, len(self.test.questions))))
      traj = self._rollout(split, jax.random.PRNGKey(1), 0.0)
      self._page(traj, "rollouts.html", "test episodes (greedy), after SFT + GRPO",
                 split=split)
    return table(results)


def table(results: dict) -> str:
  names = {"first_view": "first view only (SFT policy)", "sft": "SFT policy",
           "grpo": "SFT + GRPO policy", "policy": "policy at the checkpoint"}
  lines = [f"{'policy':30} | {'front':>13} | {'left':>13} | {'right':>13} | "
           f"{'explore (L+R)':>13} | {'all':>13}"]
  for key in ("first_view", "sft", "grpo", "policy"):
    r = results.get(key)
    if r is None:
      continue
    cells = [f"{e['accuracy']:.3f}±{e['se']:.3f}" for e in
             [r["categories"][k] for k in ("front", "left", "right", "explore")] + [r["overall"]]]
    lines.append(f"{names[key]:30} | " + " | ".join(f"{x:>13}" for x in cells))
  return "\n".join(lines) if len(lines) > 1 else ""
