"""The one training loop: an `Experiment`'s phases on a mesh, with checkpoints, resume,
preemption, non-finite refusal, metrics, progress and the final evaluation and report; one
run per work directory (`workdir_lock.hold_workdir`).

    results = Trainer(config, experiment).run()

The trainer owns: the mesh (`config.mesh`), building the policy under it, the optimizer
of each phase, the KL reference, restoring across phases, checkpoints (model, optimizer,
step, phase, results, the config, and each process's data-iterator state, all in one
Orbax step, with fingerprints checked at restore), metrics (process 0; step k's are read
while step k + 1 runs), a progress bar per phase (its ETA the phase's), the charts of the
whole run (curve.png / curve.svg drawn from metrics.jsonl by train/plots.py), SIGTERM and
the report. It reads these config keys: seed, workdir, resume, mesh, model (the dtype
policy), checkpoint.every / checkpoint.keep / checkpoint.keep_aside /
checkpoint.restart_from_zero, log_every, resume_overrides and faults (tests:
kill_after_step, sigterm_after_step, nan_at_step).

A resumed run continues exactly: every step's data and key derive from the seed, the
step and the data iterator's state. Resuming refuses a config that differs in anything
that changes the run (names listed; `resume_overrides` lists keys allowed to differ, or
"*"); a used work directory without `resume` is refused. SIGTERM saves, then raises
`Preempted` (a SystemExit with status 143, which schedulers requeue on).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time

import jax
import numpy as np
from etils import epath
from tqdm import tqdm

from jaxspatial.models import Precision, sharding
from jaxspatial.train import grpo
from jaxspatial.train.checkpoint import Checkpointer, PreemptionGuard
from jaxspatial.train.distributed import initialize_from_env
from jaxspatial.train.experiment import Experiment, Phase
from jaxspatial.train.metrics import MetricWriter
from jaxspatial.train.optim import make_optimizer
from jaxspatial.train.plots import training_curves
from jaxspatial.train.reference import ReferencePolicy
from jaxspatial.train.steps import train_step
from jaxspatial.train.workdir_lock import hold_workdir

PREEMPTED_STATUS = 143  # 128 + SIGTERM: a failure to SLURM (--requeue) and to Kubernetes

# Keys whose change does not change what a resumed run computes (the run's own folder,
# logging, the checkpoint cadence, evaluation, fault injection). What the run reads (the
# data folder and its build, the model folder that supplies the tokenizer and processor)
# and the mesh are reported like any other change: allow them with resume_overrides.
RESUME_SAFE = ("workdir", "resume", "resume_overrides", "log_every", "snapshot_every",
               "checkpoint.every", "checkpoint.keep", "checkpoint.keep_aside",
               "checkpoint.restart_from_zero", "faults", "eval", "evaluate",
               "rl.share_prompts")  # the same samples either way (float32 rounding apart)


class Preempted(SystemExit):
  """SIGTERM: the step was saved; exits with PREEMPTED_STATUS so the job is requeued."""

  def __init__(self, step: int):
    super().__init__(PREEMPTED_STATUS)
    self.step = step

  def __str__(self) -> str:
    return f"SIGTERM: saved step {self.step}; exiting with status {PREEMPTED_STATUS}"


def flat_config(config) -> dict:
  """{"a.b": value} of a ConfigDict / dict, values as JSON gives them back."""
  tree = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  out = {}

  def walk(prefix, node):
    if isinstance(node, dict):
      for key, value in node.items():
        walk(f"{prefix}{key}.", value)
    else:
      out[prefix[:-1]] = node

  walk("", json.loads(json.dumps(tree, default=str)))
  return out


def config_changes(saved: dict, current: dict, allowed=()) -> list[str]:
  """The run-changing differences between two flat configs, as "key: saved -> now"."""
  if "*" in allowed:
    return []
  skip = tuple(RESUME_SAFE) + tuple(allowed)
  changes = []
  for key in sorted(set(saved) | set(current)):
    if any(key == s or key.startswith(s + ".") for s in skip):
      continue
    before, now = saved.get(key, "<absent>"), current.get(key, "<absent>")
    if before != now:
      changes.append(f"{key}: {before!r} -> {now!r}")
  return changes


@dataclasses.dataclass
class _Pending:
  """A dispatched step whose metrics are not read yet."""
  step: int
  phase: Phase
  metrics: dict
  started: float


def rl_step(experiment: Experiment, phase: Phase, step: int, key, module, optimizer, mesh,
            reference=None, config=None, timings: dict | None = None) -> dict:
  """One RL step: the experiment's episodes and rewards, advantages (`phase.advantage`),
  old / reference log-probabilities, `epochs x mini_batches` updates. GRPO, OR-GIGPO and
  3DThinker stage 2 all take it. With `timings`, each part's seconds are recorded there
  (waiting for the device after each)."""
  started = time.perf_counter()
  out = experiment.rollout(phase, step, key)
  if timings is not None:
    jax.block_until_ready(out.batch)
    timings["rollout"] = time.perf_counter() - started
  advantages = grpo.advantages(out.trajectory, out.rewards, phase.advantage)
  old = out.trajectory.logprobs if phase.old_logprobs == "rollout" else None
  metrics = grpo.update(module, optimizer, out.batch.replace(advantages=advantages),
                        config or phase.step, mesh, reference, phase.mini_batches,
                        phase.epochs, timings=timings, old_logprobs=old)
  return {**metrics, **out.metrics}


class Trainer:
  def __init__(self, config, experiment: Experiment):
    self.config = config
    self.experiment = experiment
    self.workdir = epath.Path(config.workdir)
    faults = config.get("faults", {}) or {}
    self.kill_after_step = int(faults.get("kill_after_step", -1))
    self.nan_at_step = int(faults.get("nan_at_step", -1))
    self.sigterm_after_step = int(faults.get("sigterm_after_step", -1))
    self.mesh = None
    self.module = None

  # -- set-up ------------------------------------------------------------------------------

  def _check_workdir(self, checkpointer: Checkpointer) -> None:
    if self.config.get("resume", True):
      return
    used = [name for name, exists in (
        ("checkpoints", checkpointer.latest_step() is not None),
        ("metrics.jsonl", (self.workdir / "metrics.jsonl").exists())) if exists]
    if used:
      raise ValueError(f"{self.workdir}: holds another run's {' and '.join(used)}, and "
                       "resume is False; pass --config.resume=True to continue it, or choose "
                       "an empty --config.workdir")

  def _make_mesh(self):
    return mesh_from_config(self.config.mesh)

  def _optimizer(self, phase: Phase):
    return make_optimizer(self.module, phase.optimizer_config(), phase.trainable,
                          mesh=self.mesh)

  def _reference(self, phase: Phase, checkpointer: Checkpointer):
    if not phase.is_rl or phase.step.loss.beta <= 0:
      return None
    if phase.reference == "frozen":
      with jax.set_mesh(self.mesh):
        return ReferencePolicy.frozen_for_run(self.module, checkpointer)
    if phase.reference == "lora_disabled":
      return ReferencePolicy.create("lora_disabled", self.module)
    raise ValueError(f"Phase {phase.name!r}: beta {phase.step.loss.beta} > 0 needs a "
                     f"reference ('frozen' or 'lora_disabled'), got {phase.reference!r}")

  # -- evaluation of a saved run -----------------------------------------------------------

  def restore(self, checkpoint: str | None = None, step: int | None = None,
              best: bool = False, for_export: bool = False) -> int:
    """Builds the experiment's module on the config's mesh (`build`, or `build_for_export`)
    and restores a run's saved parameters into it, verified (`launch.eval`,
    `launch.export`): the run in `checkpoint` (a work directory; default: this config's),
    its latest step, step `step`, or its best step. The folder and the step are checked
    before anything is built: a missing one raises FileNotFoundError naming the path and the
    steps there. Returns the step restored."""
    initialize_from_env()
    root = epath.Path(checkpoint or self.workdir)
    directory = root / "checkpoints"
    kind = "best" if best else "latest"
    if not (directory / kind).is_dir():
      if not root.exists():
        why = f"{root} does not exist"
      elif not directory.is_dir():
        why = (f"{root} holds no checkpoints/ folder (expected a training run's work "
               "directory)")
      else:
        why = f"{directory / kind} does not exist" + (
            " (best steps are kept by RL reward: a run without an RL phase has none)"
            if best else "")
      raise FileNotFoundError(f"no {kind} checkpoint: {why}")
    checkpointer = Checkpointer(directory, keep=self.config.checkpoint.keep,
                                best_metric="reward")
    try:
      steps = checkpointer.steps(best)
      if not steps:
        raise FileNotFoundError(f"no {kind} checkpoint under {directory}: "
                                f"{directory / kind} holds no step")
      if step is not None and step not in steps:
        raise FileNotFoundError(f"checkpoint step {step} is not under {directory / kind} "
                                f"(steps there: {', '.join(map(str, steps))})")
      self.mesh = self._make_mesh()
      build = self.experiment.build_for_export if for_export else self.experiment.build
      with jax.set_mesh(self.mesh):
        self.module = build(self.mesh)
        restored = checkpointer.restore_params(self.module, step=step, best=best)
    finally:
      checkpointer.close()
    return restored

  def evaluate(self, checkpoint: str | None = None, split: str | None = None,
               best: bool = False) -> dict:
    """The experiment's evaluation of a run's saved policy (default: this workdir's latest
    step; `best`: the best one), on `split` (default: the config's)."""
    step = self.restore(checkpoint, best=best)
    directory = epath.Path(checkpoint or self.workdir) / "checkpoints"
    results = self.experiment.evaluate(self.module, "checkpoint", split)
    if jax.process_index() == 0:
      print(f"{directory}: step {step}" + (f", split {split}" if split else ""))
      text = self.experiment.report(results, self.workdir)
      if text:
        print(text)
    return {"step": step, **results}

  # -- the loop ----------------------------------------------------------------------------

  def run(self) -> dict:
    """Trains the experiment's phases in the config's workdir, held for this run
    (`hold_workdir`: a second run on it stops naming this one); returns the results."""
    initialize_from_env()
    with hold_workdir(self.workdir):
      return self._run()

  def _run(self) -> dict:
    c, experiment = self.config, self.experiment
    self.workdir.mkdir(parents=True, exist_ok=True)
    checkpointer = Checkpointer(self.workdir / "checkpoints", keep=c.checkpoint.keep,
                                best_metric="reward",
                                restart_from_zero=c.checkpoint.get("restart_from_zero", False))
    self._check_workdir(checkpointer)
    self.mesh = self._make_mesh()
    with jax.set_mesh(self.mesh):
      self.module = experiment.build(self.mesh)
    phases = [p for p in experiment.phases() if p.steps > 0]
    bounds = np.cumsum([0] + [p.steps for p in phases]).tolist()
    total = bounds[-1]
    names = [p.name for p in phases]
    if len(set(names)) != len(names):
      raise ValueError(f"{experiment.name}: phase names must differ, got {names}")
    if total:
      Precision.from_config(c.model).check_trainable(experiment.name)
    primary = jax.process_index() == 0
    estimate = experiment.memory_estimate()
    if primary and estimate is not None:
      print(estimate.table(), flush=True)

    def phase_index(step: int) -> int:
      return next((i for i in range(len(phases)) if step < bounds[i + 1]), len(phases) - 1)

    def phase_of(extra: dict) -> Phase:
      name = extra.get("phase")
      return phases[names.index(name)] if name in names else phases[-1]

    step, results, optimizer = 0, {}, None
    flat = flat_config(c)
    if c.get("resume", True) and phases:
      restored = checkpointer.restore_latest(self.module, lambda e: self._optimizer(
          phase_of(e)), experiment.data_iterator)
      if restored is not None:
        step, extra, optimizer = restored
        changes = config_changes(extra.get("config", {}), flat,
                                 tuple(c.get("resume_overrides", ())))
        if changes:
          checkpointer.close()
          raise ValueError(f"{self.workdir}: resuming step {step} with a config that "
                           f"changes the run ({len(changes)}): " + "; ".join(changes)
                           + ". Use another workdir, or allow them with "
                           "--config.resume_overrides='(\"key\", ...)'")
        results = extra.get("results", {})
        if primary:
          print(f"resumed from step {step} ({extra.get('phase')})", flush=True)
    _prune_aside(checkpointer, c.checkpoint.get("keep_aside", 2), primary)
    writer = MetricWriter(self.workdir, resume_step=step) if primary else None
    reference = None
    index = phase_index(step) if phases else 0
    if phases:
      if optimizer is None:
        optimizer = self._optimizer(phases[index])
      experiment.prepare(phases[index], self.module)
      reference = self._reference(phases[index], checkpointer)
    if step == 0:
      results.update(experiment.evaluate(self.module, "start"))
    key = jax.random.PRNGKey(c.seed)

    def phase_bar(index: int, step: int) -> tqdm:
      """Phase `index`'s own bar: one phase's ETA, not a blend of SFT and RL step times."""
      if not phases:
        return tqdm(total=0, disable=True)
      return tqdm(total=phases[index].steps, initial=step - bounds[index],
                  desc=f"{experiment.name} · {phases[index].name}", dynamic_ncols=True,
                  disable=not primary)

    bar = phase_bar(index, step)
    pending: _Pending | None = None

    def save(step, phase_name, metrics=None, force=False):
      if writer:
        writer.flush()  # a remote metrics.jsonl holds every row up to the saved step
      extra = {"phase": phase_name, "results": results, "seed": c.seed, "config": flat}
      checkpointer.save(step, self.module, optimizer, extra, metrics, force=force,
                        data_iterator=experiment.data_iterator)

    def finish(p: _Pending) -> dict:
      values = {f"{p.phase.name}/{k}": float(v) for k, v in jax.device_get(p.metrics).items()}
      if not values[f"{p.phase.name}/finite"]:
        checkpointer.wait()
        latest = checkpointer.latest_step()
        raise FloatingPointError(
            f"step {p.step}: the loss or a gradient is not finite (loss "
            f"{values.get(p.phase.name + '/loss')}); the update was not applied and nothing "
            f"was saved; the last checkpoint (step {latest}) is intact")
      if p.phase.is_rl and f"{p.phase.name}/tokens" in values:
        values[f"{p.phase.name}/tokens_per_s"] = values[f"{p.phase.name}/tokens"] / max(
            time.perf_counter() - p.started, 1e-9)
      if writer:
        writer.write(p.step, values)
      bar.update(1)
      if p.step % c.log_every == 0 or p.step in bounds:  # and each phase's last step
        bar.set_postfix({k.split("/")[-1]: f"{v:.3g}" for k, v in values.items()
                         if k.split("/")[-1] in ("loss", "reward", "accuracy", "kl",
                                                 "tokens_per_s")})
      return values

    with PreemptionGuard() as guard:
      while step < total:
        phase = phases[index]
        k = step - bounds[index]
        started = time.perf_counter()
        config = phase.step
        if step + 1 == self.nan_at_step:
          config = dataclasses.replace(config, inject_nan=True)
        if phase.is_rl:
          metrics = rl_step(experiment, phase, k, jax.random.fold_in(key, k), self.module,
                            optimizer, self.mesh, reference, config)
        else:
          batch = experiment.train_batch(phase, k)
          with jax.set_mesh(self.mesh):
            metrics = train_step(self.module, optimizer, batch, config)
        step += 1
        if step == self.sigterm_after_step:  # a real signal, through the real handler
          os.kill(os.getpid(), signal.SIGTERM)
        if pending is not None:
          finish(pending)
        pending = _Pending(step, phase, metrics, started)
        phase_end = step == bounds[index + 1]
        periodic = step % c.checkpoint.every == 0
        if phase.is_rl or phase_end or periodic or guard.requested or (
            step == self.kill_after_step):
          values = finish(pending)
          pending = None
        if phase_end and step < total:  # next phase: evaluate, new optimizer, reference
          bar.close()
          results.update(experiment.evaluate(self.module, phase.name))
          index += 1
          bar = phase_bar(index, step)
          optimizer = self._optimizer(phases[index])
          experiment.prepare(phases[index], self.module)
          reference = self._reference(phases[index], checkpointer)
          save(step, phases[index].name, force=True)
        elif periodic or guard.requested:
          reward = values.get(f"{phase.name}/reward") if phase.is_rl else None
          save(step, phase.name, None if reward is None else {"reward": reward},
               force=guard.requested)
        checkpointer.check()
        if guard.requested:
          checkpointer.close()
          if writer:
            writer.close()
          bar.close()
          print(Preempted(step), flush=True)
          raise Preempted(step)
        if step == self.kill_after_step:
          checkpointer.wait()
          os.kill(os.getpid(), signal.SIGKILL)
    if pending is not None:
      finish(pending)
    bar.close()
    results.update(experiment.evaluate(self.module, "final"))
    checkpointer.wait()
    if phases and checkpointer.latest_step() != step:
      save(step, "done", force=True)
    checkpointer.close()
    if writer:
      writer.close()
    if primary:
      (self.workdir / "results.json").write_text(json.dumps(results, indent=2))
      charts = training_curves(self.workdir / "metrics.jsonl", experiment.curve_metrics,
                               title=f"{experiment.name}: training") if total else []
      text = experiment.report(results, self.workdir)
      if text:
        print(text)
      print(f"outputs: {self.workdir} (results.json, "
            + "".join(f"{chart.name}, " for chart in charts) + "metrics.jsonl, checkpoints/)",
            flush=True)
    return results


def _prune_aside(checkpointer: Checkpointer, keep: int, primary: bool) -> None:
  """Keeps the newest `keep` damaged / superseded step folders of each kind; says so."""
  kept, deleted = checkpointer.prune_aside(keep)
  if primary and (kept or deleted):
    print(f"checkpoints: {len(kept)} moved-aside step folder(s) kept ("
          + ", ".join(f"{f.parent.name}/{f.name}" for f in kept) + ")"
          + (f", {len(deleted)} older deleted" if deleted else "")
          + f" (checkpoint.keep_aside={keep})", flush=True)


def mesh_from_config(m):
  """The ('data', 'fsdp', 'tensor') mesh of a config's `mesh` block; data -1: the rest."""
  data = jax.device_count() // (m.fsdp * m.tensor) if m.data == -1 else m.data
  return sharding.make_mesh(data, m.fsdp, m.tensor)

