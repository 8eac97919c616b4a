"""Orbax checkpoints of a training run: model, optimizer, RNG and data-iterator state.

Saves are asynchronous and atomic (orbax writes a temporary directory and renames it);
`latest/` keeps the last K steps, `best/` the best one by a metric. Restoring reads onto
the shardings of the model and optimizer passed in, so a run saved on one mesh resumes
on another. A `PreemptionGuard` turns SIGTERM into a flag the loop checks to save before
exiting.
"""

from __future__ import annotations

import pathlib
import signal

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx


def _pure(state) -> dict:
  return nnx.to_pure_dict(state)


class Checkpointer:
  def __init__(self, directory, keep: int = 3, best_metric: str | None = None,
               best_mode: str = "max", async_save: bool = True):
    # Orbax reads max_to_keep=0 as "keep none": every step would be deleted right after it
    # is saved, and a killed run would silently restart from step 0.
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
      raise ValueError(f"Checkpointer: checkpoint.keep must be an integer >= 1 (the latest "
                       f"steps kept under {directory}/latest), got {keep!r}")
    self.directory = pathlib.Path(directory).absolute()
    self.best_metric = best_metric
    options = ocp.CheckpointManagerOptions(max_to_keep=keep,
                                           enable_async_checkpointing=async_save)
    self.latest = ocp.CheckpointManager(self.directory / "latest", options=options)
    self.best = None
    if best_metric:
      self.best = ocp.CheckpointManager(
          self.directory / "best", options=ocp.CheckpointManagerOptions(
              max_to_keep=1, best_fn=lambda m: m[best_metric], best_mode=best_mode,
              enable_async_checkpointing=async_save))

  def _args(self, model, optimizer, extra: dict):
    return ocp.args.Composite(
        model=ocp.args.StandardSave(_pure(nnx.state(model, nnx.Param))),
        optimizer=ocp.args.StandardSave(_pure(nnx.state(optimizer))),
        extra=ocp.args.JsonSave(extra))

  def save(self, step: int, model, optimizer, extra: dict, metrics: dict | None = None,
           force: bool = False) -> bool:
    """Saves (asynchronously) unless this step exists. `extra` is JSON: RNG key data, the
    data iterator's state, the phase. With `metrics` holding the best metric, also offers
    the step to `best/`."""
    saved = self.latest.save(step, args=self._args(model, optimizer, extra), force=force)
    if self.best is not None and metrics and self.best_metric in metrics:
      self.best.save(step, args=self._args(model, optimizer, extra),
                     metrics={k: float(v) for k, v in metrics.items()}, force=True)
    return saved

  def latest_step(self) -> int | None:
    return self.latest.latest_step()

  def restore(self, model, optimizer, step: int | None = None, best: bool = False):
    """Restores into `model` and `optimizer` (onto their current shardings). Returns
    (step, extra) or None when there is no checkpoint."""
    manager = self.best if best else self.latest
    if manager is None:
      raise ValueError("Checkpointer.restore: no best checkpoints are kept (best_metric unset)")
    step = manager.latest_step() if step is None else step
    if step is None:
      return None
    model_state = nnx.state(model, nnx.Param)
    optimizer_state = nnx.state(optimizer)
    abstract = lambda state: jax.tree.map(ocp.utils.to_shape_dtype_struct, _pure(state))
    restored = manager.restore(step, args=ocp.args.Composite(
        model=ocp.args.StandardRestore(abstract(model_state)),
        optimizer=ocp.args.StandardRestore(abstract(optimizer_state)),
        extra=ocp.args.JsonRestore()))
    nnx.replace_by_pure_dict(model_state, restored["model"])
    nnx.replace_by_pure_dict(optimizer_state, restored["optimizer"])
    nnx.update(model, model_state)
    nnx.update(optimizer, optimizer_state)
    return step, restored["extra"]

  def restore_phases(self, model, optimizer, second_optimizer, switch_step: int):
    """Restores the latest checkpoint of a run whose optimizer is replaced at `switch_step`
    (SFT, then RL with a fresh optimizer): past the switch, `second_optimizer()` builds the
    RL optimizer and its saved state is restored into it. Returns (step, extra,
    optimizer); (0, {}, optimizer) when there is no checkpoint."""
    restored = self.restore(model, optimizer)
    if restored is None:
      return 0, {}, optimizer
    step, extra = restored
    if step >= switch_step:  # the second optimizer has the same state structure
      optimizer = second_optimizer()
      self.restore(model, optimizer, step)
    return step, extra, optimizer

  def restore_params(self, model, step: int | None = None, best: bool = False) -> int | None:
    """Restores the parameters alone (another run's checkpoint, e.g. the previous stage's,
    whose optimizer differs). Returns the step, or None when there is no checkpoint."""
    manager = self.best if best else self.latest
    step = manager.latest_step() if step is None else step
    if step is None:
      return None
    model_state = nnx.state(model, nnx.Param)
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _pure(model_state))
    restored = manager.restore(step, args=ocp.args.Composite(
        model=ocp.args.StandardRestore(abstract)))
    nnx.replace_by_pure_dict(model_state, restored["model"])
    nnx.update(model, model_state)
    return step

  def save_reference(self, params: dict) -> None:
    """Saves a frozen reference policy's parameters (a pure dict) once, atomically, in
    `reference/` beside the step checkpoints (which rotate; this one must not)."""
    path = self.directory / "reference"
    if not path.exists():
      with ocp.StandardCheckpointer() as saver:
        saver.save(path, params)

  def restore_reference(self, like: dict) -> dict | None:
    """The saved reference parameters onto `like`'s shapes and shardings (None if none)."""
    path = self.directory / "reference"
    if not path.exists():
      return None
    with ocp.StandardCheckpointer() as loader:
      return loader.restore(path, jax.tree.map(ocp.utils.to_shape_dtype_struct, like))

  def wait(self) -> None:
    self.latest.wait_until_finished()
    if self.best is not None:
      self.best.wait_until_finished()

  def close(self) -> None:
    self.wait()
    self.latest.close()
    if self.best is not None:
      self.best.close()


def key_to_json(key) -> list[int]:
  return np.asarray(jax.random.key_data(key) if jax.dtypes.issubdtype(
      key.dtype, jax.dtypes.prng_key) else key).astype(np.uint32).tolist()


def key_from_json(data) -> jax.Array:
  return jax.numpy.asarray(np.asarray(data, np.uint32))


class PreemptionGuard:
  """Within `with PreemptionGuard() as guard:`, SIGTERM sets `guard.requested`."""

  def __init__(self):
    self.requested = False
    self._previous = None

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def __enter__(self):
    self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def __exit__(self, *exc):
    signal.signal(signal.SIGTERM, self._previous)
    return False
