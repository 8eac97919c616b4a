"""The papers' agents (configs/think3d_rl.py, act3d_grpo.py, peria_or_gigpo.py): teacher
trajectory SFT (optional), then GRPO or OR-GIGPO over compiled rollouts, then greedy
accuracy per question family on a split.

The policy loads from a Hugging Face Qwen2.5-VL folder (`model.checkpoint`; empty: a tiny
random policy for CPU runs) straight onto the mesh. The agent comes from the registry
(`jaxspatial.rollout.AGENTS`, by `agent.name`). Tasks come from a TFDS ArrayRecord
dataset read with grain, each process reading its own shard; the RL stream's state is
saved with every checkpoint. SFT replays teacher trajectories
(data_pipelines/synthetic/teachers.py format) through the environment; step k's batch is
a fixed function of the seed and k.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from data_pipelines.loader import (SYNTHETIC_LIMITS, scene_questions, scene_tasks,
                                   task_batches)
from data_pipelines.synthetic import teachers
from data_pipelines.synthetic.questions import FAMILIES
from jaxspatial import models
from jaxspatial.eval import summarize
from jaxspatial.models import Precision, memory, model_options, resolve_attention
from jaxspatial.models.sharding import HostRows, global_batch, local_rows
from jaxspatial.rollout import AgentRollout, episode, make_agent, tiny
from jaxspatial.rollout.contract import on_device
from jaxspatial.rollout.viewer import trajectory_html
from jaxspatial.train import (Experiment, ExportedPolicy, OptimizerConfig, Phase, RolloutBatch,
                              StepConfig, TrainBatch, trainable)
from recipes.common import grpo_phase, my_rows


def load_policy(c):
  """(tokenizer, model, chat format): a Hugging Face folder loaded onto the current mesh
  (its family from config.json, its chat format from the chat template and
  generation_config.json unless `model.chat_format` names one), or a random policy: of
  `model.shape` (a released checkpoint's, cut to `model.layers`) or the tiny one of
  `model.family`."""
  if c.model.checkpoint and c.model.get("shape", ""):
    raise ValueError(f"model.checkpoint {c.model.checkpoint!r} and model.shape "
                     f"{c.model.shape!r}: name one (a folder's weights, or a random policy of "
                     "a published shape)")
  if c.model.checkpoint:
    processor, model = models.load_policy(c.model.checkpoint, seed=c.seed,
                                          **model_options(c.model))
    if model.family != c.model.family:
      print(f"note: {c.model.checkpoint} is a {model.family} checkpoint; the recipe's paper "
            f"trained {c.model.family} (model.family)", flush=True)
    tok = getattr(processor, "tokenizer", processor)
    return tok, model, models.chat_format(c.model.chat_format, c.model.checkpoint, tok)
  tok = tiny.tokenizer()
  return (tok, tiny.model(tok, c.model.family, c.seed, shape=c.model.get("shape", ""),
                          layers=c.model.get("layers", 0), **model_options(c.model)),
          models.chat_format(c.model.chat_format))


def make_judges(c, agent_name: str):
  """(training judge, evaluation judge) of `c.judge` (`perception.judges.make_judge`): LLM
  judges through an OpenAI-compatible endpoint at `judge.url` (one endpoint for both), a
  jaxspatial policy at `judge.checkpoint` judging on device inside the rollout, or (None,
  None) for the on-device rule judge. Think3D's answers are option letters: no judge."""
  block = c.judge
  if not (block.url or block.get("checkpoint", "")) or agent_name == "think3d":
    return None, None
  from jaxspatial.perception import judges  # pylint: disable=import-outside-toplevel
  endpoint = judges.make_endpoint(block) if block.url else None
  if agent_name == "act3d":
    return (judges.make_judge(block, "act3d_training", endpoint),
            judges.make_judge(block, "act3d_eval", endpoint))
  fallback = judges.make_judge(block, "peria", endpoint)
  return fallback, fallback


def make_perception(c, tokenizer) -> tuple:
  """`c.perception.tools` (public names of `jaxspatial.perception.TOOLS`) as TextTools: the
  tools a perception server at `c.perception.url` serves, or the registry's on this host
  (OCR: PP-OCRv4; SAM 3 and GroundingDINO from the folders in `c.perception.models`, loaded
  here, so a missing folder fails now with the way to give it)."""
  block = c.perception
  names = tuple(block.tools)
  if not names:
    return ()
  from jaxspatial import perception  # pylint: disable=import-outside-toplevel
  options = dict(timeout_s=block.timeout_s, retries=block.retries)
  if block.url:
    functions = perception.remote_tools(block.url, names=names, **options)
    described = {}  # a registry tool's public arguments, for the system prompt
    for name in names:
      if name in perception.TOOLS:
        tool = perception.TOOLS[name]
        described[name] = dict(arguments=tool.arguments, optional=tool.optional)
    return tuple(perception.TextTool(name, functions[name], tokenizer, block.max_tokens,
                                     **options, **described.get(name, {})) for name in names)
  unknown = sorted(set(names) - set(perception.TOOLS))
  if unknown:
    raise ValueError(f"perception.tools: {unknown} are not perception tools; expected names "
                     f"from {list(perception.TOOLS)}")
  folders = block.get("models") or {}
  folders = folders.to_dict() if hasattr(folders, "to_dict") else dict(folders)
  selected = perception.tools.select(names, folders)
  return tuple(tool.host_tool(tokenizer, block.max_tokens, **options)
               for tool in selected.values())


def host_metrics(run, traj) -> dict:
  """The host tools' and the judge's counters so far (calls, failures, retries, latency),
  read once the rollout (which calls them) has finished; {} without host calls."""
  tools = tuple(getattr(run.agent, "perception", ()))
  if getattr(run.agent, "reconstruction", None) is not None:
    tools += (run.agent.reconstruction,)
  host_judge = run.judge if not on_device(run.judge) else None
  if not tools and host_judge is None:
    return {}
  jax.block_until_ready(traj.reward)
  out = {}
  for tool in tools:
    out.update(tool.stats())
  if host_judge is not None:  # an on-device judge has no host counters
    stats = host_judge.stats()
    out.update({f"judge/{k}": float(v) for k, v in stats.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)})
    latency = stats["endpoint"]["latency"]
    out["judge/mean_s"] = latency["total_s"] / max(latency["count"], 1)
    out["judge/failures"] = float(stats["endpoint"]["failures"])
  return out


def make_reconstruction(c, agent_name: str):
  """`c.reconstruction` as a HostTool that reconstructs each Think3D task's scene from its
  input images at the rollout's start (`perception.reconstruction_tool` over the loader's
  MAX_VIEWS cameras), or None (backend "": the dataset's clouds)."""
  block = c.get("reconstruction")
  if not block or not block.backend:
    return None
  if agent_name != "think3d":
    raise ValueError(f"reconstruction.backend: only Think3D's agent reconstructs its scene, "
                     f"not {agent_name}")
  from data_pipelines.loader import MAX_VIEWS  # pylint: disable=import-outside-toplevel
  from jaxspatial import perception  # pylint: disable=import-outside-toplevel
  points = block.points or c.data.points
  reconstructor = perception.load_reconstructor(block.backend, block.checkpoint or None,
                                                block.device)
  return perception.reconstruction_tool(reconstructor.host_function(points), points,
                                        MAX_VIEWS, timeout_s=block.timeout_s,
                                        on_error=block.on_error)


def data_limits(c):
  """The padded task sizes of the config's dataset (a benchmark's are larger)."""
  if c.data.builder == "spatial_benchmark":
    from data_pipelines.builders import task_limits  # pylint: disable=import-outside-toplevel
    return task_limits(c.data.config)
  return SYNTHETIC_LIMITS


def loads_images(c, agent) -> bool:
  """Whether the tasks carry their stored views (`Task.input_images`): Think3D's first
  prompt shows them; on a benchmark PERIA's image 0 is the task's own image (ChartQA's
  chart; `envs.peria.initial_image`), on the synthetic sets a render."""
  return bool(agent.input_views) or (getattr(agent, "benchmark_images", False)
                                     and c.data.builder == "spatial_benchmark")


def build_command(c, agent) -> str:
  """The command that prepares the config's dataset, with what its source folder holds."""
  d = c.data
  if d.builder == "synthetic_spatial":
    return (f"python -m launch.build_data --config {d.config} --data_dir {d.data_dir} (or "
            "--config.data.build=True)")
  if d.builder != "spatial_benchmark":
    return f"prepare the TFDS dataset {d.builder}/{d.config} under {d.data_dir}"
  from data_pipelines.builders.spatial_benchmark import SPLITS  # pylint: disable=import-outside-toplevel
  command = (f"python -m launch.build_benchmark --benchmark {d.config} --source DIR "
             f"--data_dir {d.data_dir}")
  if loads_images(c, agent):
    command += f" --width {c.agent.width} --height {c.agent.height}"
  if agent.name == "think3d" and not (c.get("reconstruction") or {}).get("backend", ""):
    from data_pipelines import scene_caches  # pylint: disable=import-outside-toplevel
    command += (" --caches CACHES (Think3D's point clouds of every image set, with "
                "manifest.json" + (
                    f": python -m launch.reconstruct_scenes --benchmark {d.config} --questions "
                    "QUESTIONS --root DIR --out CACHES --backend pi3 --checkpoint PI3)"
                    if d.config in scene_caches.BENCHMARKS else ")"))
  wanted = [f for split in dict.fromkeys((d.train_split, d.eval_split))
            for f in SPLITS.get(d.config, {}).get(split, ())]
  wanted += [_SOURCE_FILES[d.config]] if d.config in _SOURCE_FILES else []
  return command + (f"; DIR holds {', '.join(wanted)}" if wanted else "")


# What a benchmark's source folder holds besides its question files.
_SOURCE_FILES = {"mindcube": "the images the rows name", "mindcube_tiny": "the images the "
                 "rows name", "scanqa": "scans/<scene_id>/ (ScanNet v2's layout)",
                 "sqa3d": "scans/<scene_id>/ (ScanNet v2's layout)",
                 "chartqa": "the charts under <split>/png/"}


def check_inputs(c, agent, data: bool = True) -> None:
  """What the run reads, all named at once before anything loads: the policy folder (the
  reference variant needs one), the prepared dataset and its splits, the teacher
  trajectories SFT replays (`data` False: the policy folder alone, as an export reads).
  Unset flags raise ValueError, absent files FileNotFoundError, each naming the flag or the
  command that makes it."""
  where = f"{c.name} (variant {c.get('variant', 'reference')!r})"
  unset, absent = [], []
  checkpoint = c.model.checkpoint
  if not checkpoint and c.get("variant") == "reference" and not c.model.get("shape", ""):
    unset.append(f"--config.model.checkpoint=/path/to/hf_folder (a Hugging Face "
                 f"{c.model.family} folder: config.json, safetensors, tokenizer)")
  elif checkpoint:
    folder = epath.Path(checkpoint)
    if not folder.is_dir():
      absent.append(f"model.checkpoint {checkpoint}: no such folder")
    elif not (folder / "config.json").is_file():
      absent.append(f"model.checkpoint {checkpoint}: no config.json (expected a Hugging "
                    "Face model folder)")
  if data and c.sft.steps > 0 and c.sft.trajectories != "scripted":
    if not c.sft.trajectories:
      unset.append("--config.sft.trajectories=/path/to/trajectories.jsonl (teacher "
                   "trajectories: JSON lines of model turns, by question_id on a benchmark; "
                   "data_pipelines/synthetic/teachers.py) or --config.sft.steps=0")
    elif not epath.Path(c.sft.trajectories).is_file():
      absent.append(f"sft.trajectories {c.sft.trajectories}: no such file")
  d = c.data
  if data and d.builder == "spatial_benchmark":
    from data_pipelines.builders import SpatialBenchmark, task_limits  # pylint: disable=import-outside-toplevel
    task_limits(d.config)  # a known benchmark name
    builder = SpatialBenchmark(data_dir=str(d.data_dir), config=d.config)
    splits = (d.train_split,) + ((d.eval_split,) if c.eval.tasks else ())
    if not builder.is_prepared():
      absent.append(f"data: benchmark {d.config} is not prepared under {d.data_dir}: run "
                    + build_command(c, agent))
    else:
      built = sorted(builder.info.splits.keys())
      lacking = [s for s in dict.fromkeys(splits) if s not in built]
      if lacking:
        absent.append(f"data: benchmark {d.config} under {d.data_dir} has splits {built}, "
                      f"not {lacking}: rebuild it with {build_command(c, agent)}")
  if unset and not data:
    raise ValueError(f"{where}: its policy is a pretrained one; missing: " + "; ".join(unset))
  if unset:
    raise ValueError(f"{where} trains a pretrained policy on the published data; missing: "
                     + "; ".join(unset) + "; or run the ':cpu' variant"
                     + ("" if not absent else ". Also: " + "; ".join(absent)))
  if absent:
    raise FileNotFoundError(f"{where}: " + "; ".join(absent))


def data_source(c, split: str):
  """A split of the task dataset: the synthetic builder (built on first use when
  `data.build`), a benchmark `launch.build_benchmark` prepared (`data.builder`
  "spatial_benchmark", `data.config` its name), or any prepared TFDS dataset with its
  features, by name."""
  d = c.data
  if d.builder == "spatial_benchmark":
    from data_pipelines.builders import load_benchmark  # pylint: disable=import-outside-toplevel
    return load_benchmark(d.config, d.data_dir, split)
  if d.builder == "synthetic_spatial":
    from data_pipelines.builders import SyntheticSpatial  # pylint: disable=import-outside-toplevel
    builder = SyntheticSpatial(data_dir=d.data_dir, config=d.config)
    if not builder.is_prepared():
      if not d.build:
        raise FileNotFoundError(f"synthetic_spatial/{d.config} is not prepared under "
                                f"{d.data_dir}: run python -m launch.build_data --config "
                                f"{d.config} --data_dir {d.data_dir}")
      if jax.process_index() == 0:
        builder.download_and_prepare()
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      multihost_utils.sync_global_devices("synthetic_spatial prepared")
      builder = SyntheticSpatial(data_dir=d.data_dir, config=d.config)
    return builder.as_data_source()[split]
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  return tfds.data_source(f"{d.builder}/{d.config}" if d.config else d.builder,
                          data_dir=d.data_dir, split=split)


def rl_steps(c, source) -> int:
  """`rl.steps`, or with -1 `rl.data_epochs` passes over the split's tasks (the papers
  count RL in epochs: Think3D-RL one epoch of its 977 prompts)."""
  if c.rl.steps >= 0:
    return c.rl.steps
  tasks = sum(len(json.loads(source[i]["questions"])) for i in range(len(source)))
  steps = int(c.rl.data_epochs * tasks) // c.rl.prompts
  if steps < 1:
    raise ValueError(f"rl.steps -1: {c.rl.data_epochs} epochs of {tasks} tasks at "
                     f"{c.rl.prompts} prompts a step is less than one step")
  return steps


def _stack(items):
  return jax.tree.map(lambda *x: np.stack(x), *items)


def table(results: dict) -> str:
  """One row per evaluation (`jaxspatial.eval.summarize` documents), one column per family."""
  found = [k for r in results.values() for k in r["categories"]]
  names = [k for k in FAMILIES if k in found] + sorted(
      set(found) - set(FAMILIES)) + ["all"]
  lines = [f"{'policy':14} | " + " | ".join(f"{n:>19}" for n in names)]
  for label, r in results.items():
    entries = {**r["categories"], "all": r["overall"]}
    cells = [f"{e['accuracy']:.3f}±{e['se']:.3f} ({e['n']})" if (e := entries.get(n)) else "-"
             for n in names]
    lines.append(f"{label:14} | " + " | ".join(f"{x:>19}" for x in cells))
  return "\n".join(lines)


def make_phases(c, rl_step_count: int) -> list[Phase]:
  """SFT on teacher trajectories, then GRPO / OR-GIGPO, from the config alone."""
  wrt = trainable(frozen=tuple(c.model.frozen))  # e.g. the vision tower ("visual")
  return [
      Phase("sft", c.sft.steps, OptimizerConfig(**c.sft.optimizer),
            StepConfig(objective="sft", micro_batches=c.sft.micro_batches), wrt),
      grpo_phase(c, rl_step_count, wrt)]


class TeacherData:
  """Teacher trajectories matched to their tasks; step k's batch is a fixed function of the
  seed and k (a resumed run replays the same batches)."""

  def __init__(self, recipe: "AgentRecipe", source, path):
    self.recipe, self.source, self.path = recipe, source, path
    scenes, counts = {}, {}  # scene_seed: its index in the source, its number of questions
    ids = {}  # a benchmark's question ids: (scene_seed, question index)
    # A recipe's dataset sizes; without one (the pairing alone), the synthetic set's.
    limits = data_limits(recipe.c) if recipe is not None else SYNTHETIC_LIMITS
    for i in range(len(source)):
      example = source[i]
      seed = int(example["scene_seed"])
      questions = scene_questions(example, limits=limits)
      scenes[seed], counts[seed] = i, len(questions)
      ids.update({q["question_id"]: (seed, k) for k, q in enumerate(questions)
                  if isinstance(q.get("question_id"), str)})
    # Each record's scene is in the split and 0 <= question < its count (else the file's
    # line and field are named).
    records = teachers.read_trajectories(path, question_counts=counts,
                                         question_ids=ids or None)
    self.records = [(scenes[r["scene_seed"]], r["question"], r["turns"]) for r in records]
    rows = np.arange(len(self.records))
    self.rows = rows[jax.process_index()::jax.process_count()]

  def batch(self, step: int, size: int) -> TrainBatch:
    recipe, c = self.recipe, self.recipe.c
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
                          input_images=recipe.input_images, limits=data_limits(c))
      if question >= len(found):
        raise ValueError(f"SFT: scene {scene} has {len(found)} questions, no question "
                         f"{question}")
      tasks.append(found[question][0])
    forced = recipe.run.forced([t for _, _, t in chosen])
    # A replay's reward is unused: no judge requests (an LLM judge would bill every one).
    traj = recipe.run(recipe.model, _stack(tasks), jax.random.PRNGKey(step), forced=forced,
                      judged=False, mesh=recipe.mesh, replay=True)
    names = [f"{self.path}: scene {int(self.source[scene]['scene_seed'])} question {question}"
             for scene, question, _ in chosen]
    episode.check_replay(HostRows(traj), forced, names, recipe.tokenizer)
    return TrainBatch.from_trajectory(traj)


class AgentRecipe(Experiment):
  curve_metrics = ("rl/reward", "rl/accuracy")

  def __init__(self, config, data: bool = True):
    c = self.c = config
    self.name = c.name
    self.agent = make_agent(c.agent, c.rollout.max_turns, c.reward.get("weights", {}))
    check_inputs(c, self.agent, data)
    self.input_images = loads_images(c, self.agent)
    for name, rows in (("rl.prompts", c.rl.prompts), ("sft.batch", c.sft.batch),
                       ("eval.batch", c.eval.batch)):
      if rows % jax.process_count():
        raise ValueError(f"{name} {rows} does not split over {jax.process_count()} processes")
    self.teacher = None
    self.data_iterator = None

  @classmethod
  def for_export(cls, config) -> "AgentRecipe":
    """The recipe without its data checks: an export reads the policy alone."""
    return cls(config, data=False)

  def build(self, mesh):
    self.build_policy(mesh)
    self.build_data()
    return self.model

  def build_for_export(self, mesh):
    """The tokenizer, the policy and its chat format (no rollout, tools, judges or data)."""
    self.mesh = mesh
    self.tokenizer, self.model, self.chat = load_policy(self.c)
    return self.model

  def exported_policy(self, module):
    """The policy (loaded from `model.checkpoint`, whose processor, chat template and
    generation config carry over, or the tiny random one) with its tokenizer and chat
    format."""
    return ExportedPolicy(module, self.tokenizer, self.chat, self.c.model.checkpoint or None)

  def build_policy(self, mesh) -> None:
    """The tokenizer, the policy (under the current mesh) and the agent's rollout."""
    c = self.c
    self.mesh = mesh
    self.tokenizer, self.model, chat = load_policy(c)
    self.chat = chat
    tools = make_perception(c, self.tokenizer)
    if tools:
      if self.agent.name != "peria":
        raise ValueError(f"perception.tools: only PERIA's agent calls perception tools, not "
                         f"{self.agent.name}")
      self.agent = self.agent.with_perception(tools)
    reconstruction = make_reconstruction(c, self.agent.name)
    if reconstruction is not None:
      self.agent = self.agent.with_reconstruction(reconstruction)
    judge, eval_judge = make_judges(c, self.agent.name)
    self.run = AgentRollout.create(self.agent, self.tokenizer, self.model, chat=chat,
                                   judge=judge, eval_judge=eval_judge,
                                   prompt_tokens=c.data.prompt_tokens,
                                   cache_dtype=Precision.from_config(c.model).cache_dtype,
                                   **c.rollout)

  def build_data(self) -> None:
    """The training split and this process's RL task stream (its state is checkpointed)."""
    c = self.c
    self.train_source = data_source(c, c.data.train_split)
    first = self.train_source[0]
    if self.input_images:
      # Think3D renders with the dataset cameras' intrinsics and shows the stored views;
      # PERIA's image list starts with the stored view.
      view = tuple(np.asarray(first["images"][0]).shape[:2])
      if view != (c.agent.height, c.agent.width):
        why = ("renders with the dataset's camera intrinsics" if self.agent.input_views else
               "starts its image list from the dataset's stored views")
        raise ValueError(f"{self.agent.name} {why}, made for {view[1]}x{view[0]} views: set "
                         f"--config.agent.width={view[1]} --config.agent.height={view[0]} "
                         f"(got {c.agent.width}x{c.agent.height}), or rebuild the data at "
                         f"that size: {build_command(c, self.agent)}")
    if (self.agent.name == "think3d" and self.agent.reconstruction is None
        and len(first["xyz"]) == 0):
      raise ValueError(f"think3d renders views of the scene's point cloud, but "
                       f"{c.data.config} was built without clouds (geometry 'none'): "
                       f"{build_command(c, self.agent)}; or reconstruct each scene online "
                       "(--config.reconstruction.backend=pi3 "
                       "--config.reconstruction.checkpoint=PI3)")
    self.data_iterator = iter(task_batches(
        self.train_source, c.rl.prompts // jax.process_count(), seed=c.seed, num_epochs=None,
        shard=(jax.process_index(), jax.process_count()), points=c.data.points,
        input_images=self.input_images, limits=data_limits(c)))

  def phases(self):
    return make_phases(self.c, rl_steps(self.c, self.train_source))

  def memory_estimate(self):
    """A GRPO step's rollout batch and update (SFT batches are no larger on the papers'
    settings)."""
    c = self.c
    episodes = c.rl.prompts * c.advantage.group_size
    options = model_options(c.model)
    fused = resolve_attention(options["attention"], options["dtype"]) != "einsum"
    trains = c.sft.steps or c.rl.steps
    return memory.estimate(self.model, Precision.from_config(c.model), rollout_batch=episodes,
                           cache_length=self.run.capacity(),
                           train_batch=episodes // c.rl.mini_batches,
                           train_length=self.run.capacity(), micro_batches=c.rl.micro_batches,
                           remat=options["remat"], fused_attention=fused,
                           trainable=trainable(frozen=tuple(c.model.frozen)),
                           training=bool(trains), mesh=self.mesh)

  def prepare(self, phase, module):
    if phase.name == "sft" and self.teacher is None:
      self.teacher = TeacherData(self, self.train_source, self._teacher_path())

  def _teacher_path(self):
    path = self.c.sft.trajectories
    if path == "scripted":
      path = epath.Path(self.c.workdir) / f"teacher_{self.agent.name}.jsonl"
      if jax.process_index() == 0 and not path.exists():
        teachers.write_scripted(self.train_source, self.agent.name, path, self.c.seed)
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      multihost_utils.sync_global_devices("teacher trajectories written")
    return path

  def train_batch(self, phase, step):
    return self.teacher.batch(step, self.c.sft.batch // jax.process_count())

  def rewards(self, traj, tasks) -> jax.Array:
    """The agent's reward: the device's, or a host reward from the text (PERIA: the public
    reward manager's, its R_correct from `tasks`' references, this process's rows)."""
    host = self.agent.host_rewards(HostRows(traj), self.tokenizer, tasks)
    return traj.reward if host is None else global_batch(host, self.mesh)

  def rollout(self, phase, step, key):
    c = self.c
    tasks, _ = next(self.data_iterator)
    tasks = jax.tree.map(lambda x: np.repeat(x, c.advantage.group_size, axis=0), tasks)
    traj = self.run(self.model, tasks, key, mesh=self.mesh,
                    group=c.advantage.group_size if c.rl.share_prompts else 1)
    rewards = self.rewards(traj, tasks)
    metrics = dict(traj.metrics())
    metrics.update(reward=jnp.mean(rewards), tokens=jnp.sum(traj.loss_mask),
                   accuracy=jnp.mean(traj.reward_components[self.agent.accuracy_key]))
    metrics.update(host_metrics(self.run, traj))
    if c.snapshot_every and step % c.snapshot_every == 0 and jax.process_index() == 0:
      number = c.sft.steps + step + 1
      (epath.Path(c.workdir) / f"rollouts_train_{number:05d}.html").write_text(
          trajectory_html(jax.tree.map(local_rows, traj), self.tokenizer,
                          self.run.automaton.grammar, title=f"{c.name} step {number}",
                          tasks=jax.tree.map(lambda x: x[my_rows(len(x))], tasks)))
    return RolloutBatch(TrainBatch.from_trajectory(traj), rewards, traj, metrics)

  def accuracy(self, split: str) -> dict:
    """Greedy accuracy per question family (and overall) on up to `eval.tasks` tasks of the
    split, with standard errors, summed over processes."""
    c = self.c
    source = data_source(c, split)
    per_process = c.eval.batch // jax.process_count()
    batches = task_batches(source, per_process, shuffle=False, drop_remainder=False,
                           shard=(jax.process_index(), jax.process_count()),
                           points=c.data.points, input_images=self.input_images,
                           limits=data_limits(c))
    # Categories: the synthetic families, or a benchmark's raw categories (strings).
    names = list(FAMILIES) if c.data.builder != "spatial_benchmark" else sorted({
        q["category"] for i in range(len(source))
        for q in scene_questions(source[i], limits=data_limits(c))})
    counts = np.zeros((len(names), 2))  # [correct, total] per category
    seen = 0
    for tasks, meta in batches:
      if seen >= c.eval.tasks // jax.process_count():
        break
      family = (meta["family"] if "family" in meta else
                np.asarray([names.index(str(k)) for k in meta["category"]]))
      real = len(family)
      if real < per_process:  # one compiled shape: pad with repeats, drop after
        take = np.minimum(np.arange(per_process), real - 1)
        tasks = jax.tree.map(lambda x: x[take], tasks)
      traj = self.run(self.model, tasks, jax.random.PRNGKey(0), temperature=0.0,
                      mesh=self.mesh, evaluation=True)
      correct = local_rows(traj.reward_components[self.agent.accuracy_key])[:real] > 0
      np.add.at(counts, (family, 0), correct)
      np.add.at(counts, (family, 1), 1)
      seen += real
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    counts = np.asarray(multihost_utils.process_allgather(counts)).reshape(
        -1, len(names), 2).sum(0)
    # Right-or-wrong answers: the counts are the scores (jaxspatial.eval.summarize's input).
    right, total = counts.astype(np.int64).T
    scores = np.concatenate([np.repeat([1.0, 0.0], [r, t - r]) for r, t in zip(right, total)])
    return summarize(scores, np.repeat(names, total),
                     columns=[n for n, t in zip(names, total) if t > 0])

  def evaluate(self, module, when, split=None):
    c = self.c
    if when == "checkpoint":
      return {"policy": self.accuracy(split or c.data.eval_split)}
    if not c.eval.tasks or when not in ("sft", "final"):
      return {}
    return {when: self.accuracy(c.data.eval_split)}

  def report(self, results, workdir):
    return table(results) if results else ""
