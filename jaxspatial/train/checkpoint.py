"""Orbax checkpoints of a training run: model, optimizer, extra JSON, data-iterator state.

What a `Checkpointer` guarantees:
- Saves are asynchronous and atomic (orbax writes `<step>.orbax-checkpoint-tmp` and renames
  it); `latest/` keeps the last K steps, `best/` the best one by a metric.
- Every step carries, inside its own `extra` item, the exact fingerprints
  (`train.fingerprint`) of the model and optimizer arrays it holds, so integrity travels
  atomically with the step; restores check them on device.
- A failed write (full disk, quota) raises one `CheckpointError` naming the step and the
  cause at the next `check()`, `save()` or `wait()`; earlier steps stay intact. Orbax's
  own error logs keep their message lines, not their tracebacks (a filter on "absl").
- A latest restore takes the newest step that reads back bit-exact: a damaged step is moved
  aside (`latest/corrupt.<step>.<n>`) with one line saying why, and the next older one is
  tried. `best/` steps past the restored one (a future the run redoes) move to
  `best/superseded.<step>.<n>`, so saving them again cannot collide. `prune_aside(K)` keeps
  the newest K moved-aside folders of each kind (the trainer: `checkpoint.keep_aside`, said
  at start). A latest/ whose every step was moved aside refuses to start from step 0 unless
  `restart_from_zero`.
- An explicitly requested step, a best restore and `restore_params` never fall back: a
  damaged step raises `CheckpointCorruptError`.
- Restores read onto the shardings of the model and optimizer passed in, so a run saved on
  one mesh resumes on another. Each process's data-iterator state rides in the step.
A `PreemptionGuard` turns SIGTERM into a flag the loop checks to save before exiting.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import os
import re
import signal
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx
from orbax.checkpoint.checkpoint_manager import StepAlreadyExistsError

from jaxspatial.errors import CheckpointCorruptError, CheckpointError, CheckpointMismatchError
from jaxspatial.train import fingerprint

_INTEGRITY = "_integrity"  # reserved key of the `extra` item
_VERSION = 1


class _Unusable(Exception):
  """A step that cannot be restored bit-exact; `reason` is one line."""

  def __init__(self, reason: str):
    super().__init__(reason)
    self.reason = reason


def _pure(state) -> dict:
  return nnx.to_pure_dict(state)


def _say(message: str) -> None:
  if jax.process_index() == 0:
    print(message, file=sys.stderr, flush=True)


def _aside_key(name: str) -> tuple[int, int] | None:
  """(step, n) of a moved-aside folder's name (corrupt.<step>.<n>, superseded.<step>.<n>)."""
  match = re.fullmatch(r"(?:corrupt|superseded)\.(\d+)\.(\d+)", name)
  return None if match is None else (int(match[1]), int(match[2]))


def _canonical(value) -> str:
  # Through a JSON round trip first: the `extra` item comes back with string keys and
  # lists, and its hash must be the one computed before saving.
  return json.dumps(json.loads(json.dumps(value)), sort_keys=True, separators=(",", ":"))


def _sha256(value) -> str:
  return hashlib.sha256(_canonical(value).encode()).hexdigest()


def _first_line(error: BaseException, limit: int = 200) -> str:
  text = str(error).strip().splitlines()
  line = text[0] if text else ""
  line = f"{type(error).__name__}: {line}" if line else type(error).__name__
  return line if len(line) <= limit else line[:limit - 3] + "..."


def _os_cause(error: BaseException) -> str | None:
  """The operating system's words for a failed write ("No space left on device"), if any."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.strerror:
      return error.strerror
    # TensorStore reports OS errors inside its message: "... [os_error_code='28']".
    match = re.search(r"os_error_code='?(\d+)", str(error)) or re.search(
        r"\[Errno (\d+)\]", str(error))
    if match:
      return os.strerror(int(match.group(1)))
    error = error.__cause__ or error.__context__
  return None


class _QuietOrbaxTracebacks(logging.Filter):
  """Keeps orbax's one-line error messages, drops their tracebacks.

  One failed background write logs the same exception from several threads, hundreds of
  traceback lines that bury the step; `CheckpointError` reports it in one line.
  """

  def filter(self, record: logging.LogRecord) -> bool:
    if record.exc_info and "orbax" in (record.pathname or ""):
      record.exc_info = None
      record.exc_text = None
    return True


_QUIET = _QuietOrbaxTracebacks()


def _agree(ok: bool) -> bool:
  """True when `ok` holds on every process (a step is used only if all could read it)."""
  if jax.process_count() == 1:
    return ok
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  flags = multihost_utils.process_allgather(np.asarray(int(ok), np.int32))
  return bool(np.all(np.asarray(flags)))


def _read_on_every_process(read):
  """`read()`, or _Unusable on every process when it fails on any (a mismatch of what was
  passed in propagates as itself)."""
  try:
    value = read()
  except CheckpointMismatchError:
    raise
  except Exception as error:  # pylint: disable=broad-exception-caught
    value, ok, cause = None, False, _first_line(error)
  else:
    ok, cause = True, None
  if not _agree(ok):
    raise _Unusable(f"cannot be read: {cause or 'unreadable on another process'}")
  return value


def _sync(name: str) -> None:
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    multihost_utils.sync_global_devices(name)


# Each process's data-iterator state, one file per process inside the step's `data` item
# (as grain's CheckpointHandler lays it out, but for any object with get_state / set_state:
# grain's handler needs a grain iterator and starts its prefetch on restore). The state is
# taken when `save` is called, not when the write runs.
class _DataStateHandler(ocp.CheckpointHandler):
  """Writes and reads `process_<i>-of-<n>.json` (state and its SHA-256)."""

  @staticmethod
  def _path(directory):
    return epath.Path(directory) / f"process_{jax.process_index()}-of-{jax.process_count()}.json"

  def save(self, directory, args: "_DataSave"):
    path = self._path(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(args.payload)

  def restore(self, directory, args: "_DataRestore" = None):
    del args
    path = self._path(directory)
    if not path.exists():
      present = sorted(p.name for p in epath.Path(directory).iterdir())
      counts = {m.group(1) for name in present
                if (m := re.fullmatch(r"process_\d+-of-(\d+)\.json", name))}
      if counts and str(jax.process_count()) not in counts:  # not damage: another world size
        raise CheckpointMismatchError(
            f"the data-iterator state was saved by {'/'.join(sorted(counts))} processes; "
            f"this run has {jax.process_count()}")
      raise FileNotFoundError(f"{path.name} is missing from the data item (holds {present})")
    record = json.loads(path.read_text())
    if _sha256(record["state"]) != record["sha256"]:
      raise ValueError(f"{path.name}: the data-iterator state does not match its SHA-256")
    state = record["state"]
    return base64.b64decode(state["bytes"]) if "bytes" in state else state["json"]

  def metadata(self, directory):
    del directory

  def finalize(self, directory):
    del directory

  def close(self):
    pass


@ocp.args.register_with_handler(_DataStateHandler, for_save=True)
@dataclasses.dataclass
class _DataSave(ocp.args.CheckpointArgs):
  payload: str


@ocp.args.register_with_handler(_DataStateHandler, for_restore=True)
@dataclasses.dataclass
class _DataRestore(ocp.args.CheckpointArgs):
  pass


def _data_payload(data_iterator) -> str:
  state = data_iterator.get_state()
  if isinstance(state, (bytes, bytearray)):
    state = {"bytes": base64.b64encode(bytes(state)).decode()}
  else:
    state = {"json": state}
  return json.dumps({"state": state, "sha256": _sha256(state)})


class _FolderSteps:
  """The finished steps of a folder no manager of ours reads (what `_move_aside` needs)."""

  def __init__(self, directory: epath.Path):
    self.directory = directory

  def all_steps(self) -> list[int]:
    if not self.directory.exists():
      return []
    return sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit())

  def reload(self) -> None:
    pass


def _metrics_readable(step_dir: epath.Path) -> bool:
  path = step_dir / "metrics" / "metrics"
  try:
    if path.exists():
      json.loads(path.read_text())
  except (OSError, ValueError):
    return False
  return True


def _abstract(pure: dict) -> dict:
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, pure)


def _saved_dtype(entry: dict):
  try:
    return jnp.dtype(entry["dtype"])
  except TypeError:  # e.g. PRNG key dtypes: restored as the target's
    return None


class Checkpointer:
  def __init__(self, directory, keep: int = 3, best_metric: str | None = None,
               best_mode: str = "max", async_save: bool = True,
               restart_from_zero: bool = False):
    # Orbax reads max_to_keep=0 as "keep none": every step would be deleted right after it
    # is saved, and a killed run would silently restart from step 0.
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
      raise ValueError(f"Checkpointer: checkpoint.keep must be an integer >= 1 (the latest "
                       f"steps kept under {directory}/latest), got {keep!r}")
    if _QUIET not in logging.getLogger("absl").filters:
      logging.getLogger("absl").addFilter(_QUIET)
    # epath: a gs:// work directory (TPU pods) stays remote; a local one is made absolute
    path = epath.Path(directory)
    self.directory = path if "://" in str(directory) else epath.Path(path.absolute())
    self.best_metric = best_metric
    # A latest/ whose every step was moved aside as damaged: start again at step 0 only when
    # asked (a silent restart would retrain what the damaged steps held).
    self.restart_from_zero = restart_from_zero
    options = ocp.CheckpointManagerOptions(max_to_keep=keep,
                                           enable_async_checkpointing=async_save)
    self.latest = ocp.CheckpointManager(self.directory / "latest", options=options)
    self._last_saved = {}  # manager directory -> the step it was last asked to save
    self.best = None
    if best_metric:
      self.best = self._open_best(ocp.CheckpointManagerOptions(
          max_to_keep=1, best_fn=lambda m: m[best_metric], best_mode=best_mode,
          enable_async_checkpointing=async_save))

  def _open_best(self, options):
    directory = epath.Path(self.directory) / "best"
    try:
      return ocp.CheckpointManager(directory, options=options)
    except Exception:  # pylint: disable=broad-exception-caught
      # Orbax reads every best step's metrics when it starts: one damaged metrics file
      # would stop the run before it could resume. Move such steps aside and start again.
      folder = _FolderSteps(directory)
      bad = [step for step in folder.all_steps() if not _metrics_readable(directory / str(step))]
      if not bad:
        raise
      for step in bad:
        target = self._move_aside(folder, step, "corrupt")
        _say(f"checkpoint best/ step {step} skipped: its metrics cannot be read (moved to "
             f"best/{target.name})")
      return ocp.CheckpointManager(directory, options=options)

  def _managers(self):
    return [m for m in (self.latest, self.best) if m is not None]

  # ---------------------------------------------------------------- writing

  @staticmethod
  def _finalizer(manager):
    # Orbax keeps a background save's error on its finalize thread until someone joins it.
    ref = getattr(manager, "_finalize_thread", None)
    return ref.get() if ref is not None else None

  def _failure(self, manager, step, error: BaseException) -> CheckpointError:
    """One error for a failed step, after letting the failed save wind down."""
    # A failure echoes: the commit thread and each metadata write raise the same cause
    # again, some after the finalize thread died. Wait for all of them and drain them, so
    # the failure is reported once and the next save starts clean.
    writer = getattr(manager, "_checkpointer", None)  # orbax's AsyncCheckpointer
    for _ in range(16):
      try:
        manager.wait_until_finished()
        if hasattr(writer, "wait_until_finished"):
          writer.wait_until_finished()
        manager.check_for_errors()
        break
      except Exception:  # pylint: disable=broad-exception-caught
        continue
    manager.reload()  # the failed step never got its final name: it is not a step
    intact = manager.latest_step()
    where = f"the latest intact step is {intact}" if intact is not None else "no earlier step"
    cause = _os_cause(error) or _first_line(error)
    return CheckpointError(f"checkpoint step {step}: could not be written to "
                           f"{manager.directory}: {cause} ({where})")

  def _join(self, manager) -> None:
    """Waits for `manager`'s save in flight; raises `CheckpointError` if it failed."""
    thread = self._finalizer(manager)
    step = thread.step() if thread is not None else self._last_saved.get(str(manager.directory))
    try:
      manager.wait_until_finished()
      manager.check_for_errors()  # safe only now: the background has taken its errors
    except Exception as error:  # pylint: disable=broad-exception-caught
      raise self._failure(manager, step, error) from None

  def check(self) -> None:
    """Raises `CheckpointError` if a save has failed (non-blocking: a save still being
    written is checked by a later call)."""
    for manager in self._managers():
      thread = self._finalizer(manager)
      # While the background save runs, its errors are its own: taking them from here
      # would let it go on to delete older steps after a failed write.
      if thread is None or not thread.is_alive():
        self._join(manager)

  def save(self, step: int, model, optimizer, extra: dict, metrics: dict | None = None,
           force: bool = False, data_iterator=None) -> bool:
    """Saves (asynchronously) unless this step exists. `extra` is JSON (the phase, results);
    `data_iterator` (get_state / set_state) is saved per process. With `metrics` holding the
    best metric, also offers the step to `best/`. Raises `CheckpointError` first if an
    earlier save failed."""
    self.check()
    if _INTEGRITY in extra:
      raise ValueError(f"Checkpointer.save: extra key {_INTEGRITY!r} is reserved")
    to_best = self.best is not None and metrics and self.best_metric in metrics
    if not (force or self.latest.should_save(step) or to_best):
      return False
    model_pure = _pure(nnx.state(model, nnx.Param))
    optimizer_pure = _pure(nnx.state(optimizer))
    items = ["model", "optimizer", "extra"] + (["data"] if data_iterator is not None else [])
    # Fingerprints finish on device before orbax's copy starts: the caller may donate the
    # buffers as soon as save() returns.
    integrity = {"version": _VERSION, "items": items, "extra_sha256": _sha256(extra),
                 "fingerprints": fingerprint.records({"model": model_pure,
                                                      "optimizer": optimizer_pure})}
    integrity["sha256"] = _sha256(integrity)
    args = {"model": ocp.args.StandardSave(model_pure),
            "optimizer": ocp.args.StandardSave(optimizer_pure),
            "extra": ocp.args.JsonSave({**extra, _INTEGRITY: integrity})}
    if data_iterator is not None:
      args["data"] = _DataSave(_data_payload(data_iterator))
    saved = self._save(self.latest, step, args, force=force)
    if to_best:
      self._join(self.best)
      if step in self.best.all_steps():  # an older timeline's step: the run redid it
        self._move_aside(self.best, step, "superseded")
      self._save(self.best, step, args, force=True,
                 metrics={k: float(v) for k, v in metrics.items()})
    return saved

  def _save(self, manager, step, args, force, metrics=None) -> bool:
    self._join(manager)  # orbax waits for the previous save anyway; its failure is its own
    self._last_saved[str(manager.directory)] = step
    try:
      return manager.save(step, args=ocp.args.Composite(**args), force=force, metrics=metrics)
    except StepAlreadyExistsError:
      raise
    except Exception as error:  # pylint: disable=broad-exception-caught
      if _os_cause(error) is None:
        raise
      raise self._failure(manager, step, error) from None

  def latest_step(self) -> int | None:
    return self.latest.latest_step()

  def steps(self, best: bool = False) -> list[int]:
    """The saved steps of latest/ (or best/), oldest first."""
    return sorted(self._manager(best).all_steps())

  def aside_folders(self) -> list[epath.Path]:
    """The step folders moved aside under latest/ and best/ (corrupt.<step>.<n>,
    superseded.<step>.<n>), oldest step first."""
    out = []
    for name in ("latest", "best"):
      folder = epath.Path(self.directory) / name
      if folder.is_dir():
        out += [f for f in folder.iterdir() if _aside_key(f.name) is not None]
    return sorted(out, key=lambda f: (_aside_key(f.name), f.parent.name))

  def prune_aside(self, keep: int) -> tuple[list[epath.Path], list[epath.Path]]:
    """Deletes all but the newest `keep` moved-aside folders of each kind in each of
    latest/ and best/ (each is a whole step: parameters and optimizer). Returns (kept,
    deleted)."""
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 0:
      raise ValueError(f"Checkpointer: checkpoint.keep_aside must be an integer >= 0, got "
                       f"{keep!r}")
    groups = {}
    for folder in self.aside_folders():
      groups.setdefault((folder.parent.name, folder.name.split(".")[0]), []).append(folder)
    kept, deleted = [], []
    for folders in groups.values():
      cut = len(folders) - keep
      deleted += folders[:max(cut, 0)]
      kept += folders[max(cut, 0):]
    _sync("checkpoint_prune_aside")
    if jax.process_index() == 0:
      for folder in deleted:
        folder.rmtree()
    _sync("checkpoint_pruned_aside")
    return kept, deleted

  # ---------------------------------------------------------------- reading

  def _move_aside(self, manager, step: int, kind: str) -> epath.Path:
    """Renames a step folder out of orbax's sight (nothing is deleted) and reloads."""
    source = manager.directory / str(step)
    _sync(f"checkpoint_move_{kind}_{step}")  # every process is past its reads of the step
    n = 0
    while (target := manager.directory / f"{kind}.{step}.{n}").exists():
      n += 1
    if jax.process_index() == 0 and source.exists():
      source.rename(target)
    _sync(f"checkpoint_moved_{kind}_{step}")
    manager.reload()
    return target

  def _read_extra(self, manager, step):
    extra = manager.restore(step, args=ocp.args.Composite(extra=ocp.args.JsonRestore()))["extra"]
    if not isinstance(extra, dict):
      raise ValueError(f"the extra item holds {type(extra).__name__}, not a JSON object")
    return extra

  def _restore_step(self, manager, step: int, model, optimizer_for=None, data_iterator=None):
    """Restores `step` into `model` (and the optimizer `optimizer_for(step, extra)` builds)
    once every array reads back with its recorded fingerprint. Returns (extra, optimizer).
    Raises _Unusable for a damaged step, CheckpointMismatchError for a structure mismatch;
    nothing is modified unless the step verifies."""
    extra = _read_on_every_process(lambda: self._read_extra(manager, step))
    integrity = extra.pop(_INTEGRITY, None)
    if integrity is not None:
      if not isinstance(integrity, dict) or _sha256(
          {k: v for k, v in integrity.items() if k != "sha256"}) != integrity.get("sha256"):
        raise _Unusable("fingerprint mismatch in its integrity record")
      if _sha256(extra) != integrity["extra_sha256"]:
        raise _Unusable("fingerprint mismatch in extra")
    optimizer = optimizer_for(step, extra) if optimizer_for is not None else None
    targets = {"model": _pure(nnx.state(model, nnx.Param))}
    if optimizer is not None:
      targets["optimizer"] = _pure(nnx.state(optimizer))
    abstract = {name: _abstract(pure) for name, pure in targets.items()}
    recorded = None
    if integrity is not None:
      recorded = {p: r for p, r in integrity["fingerprints"].items()
                  if p.split("/", 1)[0] in targets}
      self._check_structure(manager, step, recorded, abstract)
      abstract = self._as_saved(abstract, recorded)
    items = integrity["items"] if integrity is not None else ["model", "optimizer", "extra"]
    args = {name: ocp.args.StandardRestore(tree) for name, tree in abstract.items()}
    with_data = data_iterator is not None and "data" in items
    if with_data:
      args["data"] = _DataRestore()
    try:
      restored = _read_on_every_process(
          lambda: manager.restore(step, args=ocp.args.Composite(**args)))
    except CheckpointMismatchError as error:
      raise CheckpointMismatchError(f"checkpoint step {step} under {manager.directory}: "
                                    f"{error}") from None
    if recorded is not None:
      actual = fingerprint.records({name: restored[name] for name in targets})
      wrong = fingerprint.first_mismatch(recorded, actual)
      if wrong is not None:
        raise _Unusable(f"fingerprint mismatch in {wrong}")
    # Verified: now (and only now) the model, optimizer and iterator change.
    for name, owner in (("model", model), ("optimizer", optimizer)):
      if name not in targets:
        continue
      values = jax.tree.map(lambda x, like: x if x.dtype == like.dtype else x.astype(like.dtype),
                            restored[name], targets[name])
      state = nnx.state(owner, nnx.Param) if name == "model" else nnx.state(owner)
      nnx.replace_by_pure_dict(state, values)
      nnx.update(owner, state)
    if data_iterator is not None:
      if with_data:
        data_iterator.set_state(restored["data"])
      else:
        _say(f"checkpoint step {step} holds no data-iterator state: the iterator is left as is")
    if integrity is None:
      _say(f"checkpoint step {step} under {manager.directory} has no fingerprints (written "
           "before they were recorded): restored unverified")
    return extra, optimizer

  @staticmethod
  def _check_structure(manager, step, recorded: dict, abstract: dict) -> None:
    expected = {p: tuple(r["shape"]) for p, r in recorded.items()}
    actual = {fingerprint.path_str(path): tuple(x.shape)
              for path, x in jax.tree_util.tree_flatten_with_path(abstract)[0]}
    if expected == actual:
      return
    missing = sorted(set(expected) - set(actual))
    unknown = sorted(set(actual) - set(expected))
    shapes = sorted(p for p in set(expected) & set(actual) if expected[p] != actual[p])
    detail = (f"{missing[0]} is saved but not in the target" if missing else
              f"{unknown[0]} is in the target but not saved" if unknown else
              f"{shapes[0]} is saved as {list(expected[shapes[0]])}, the target is "
              f"{list(actual[shapes[0]])}")
    raise CheckpointMismatchError(
        f"checkpoint step {step} under {manager.directory} does not match the "
        f"{'/'.join(abstract)} given: {detail}")

  @staticmethod
  def _as_saved(abstract: dict, recorded: dict) -> dict:
    # Read each array in its saved dtype (fingerprints are of those bits); cast afterwards.
    def one(path, x):
      dtype = _saved_dtype(recorded[fingerprint.path_str(path)])
      if dtype is None or dtype == x.dtype:
        return x
      return jax.ShapeDtypeStruct(x.shape, dtype, sharding=x.sharding)
    return jax.tree_util.tree_map_with_path(one, abstract)

  def _retire_best_after(self, step: int) -> None:
    # Also without a best manager here: best/ may have been written by the training job.
    manager = self.best or _FolderSteps(epath.Path(self.directory) / "best")
    for later in [s for s in manager.all_steps() if s > step]:
      target = self._move_aside(manager, later, "superseded")
      _say(f"checkpoint best/ step {later} is past the restored step {step}: moved to "
           f"{target.name} (the run redoes it)")

  def _restore_latest(self, model, optimizer_for, data_iterator=None):
    self.wait()
    skipped = []
    for step in sorted(self.latest.all_steps(), reverse=True):
      try:
        extra, optimizer = self._restore_step(self.latest, step, model, optimizer_for,
                                              data_iterator)
      except _Unusable as bad:
        target = self._move_aside(self.latest, step, "corrupt")
        _say(f"checkpoint step {step} skipped: {bad.reason} (moved to latest/{target.name})")
        skipped.append(f"step {step} ({bad.reason})")
        continue
      self._retire_best_after(step)
      return step, extra, optimizer
    if skipped:
      raise CheckpointCorruptError(
          f"no checkpoint under {self.latest.directory} reads back intact: "
          f"{'; '.join(skipped)}; they were moved aside (corrupt.<step>.<n>), not deleted")
    damaged = [f.name for f in self.aside_folders() if f.parent.name == "latest"
               and f.name.startswith("corrupt.")]
    if damaged and not self.restart_from_zero:
      raise CheckpointCorruptError(
          f"{self.latest.directory}: every step was moved aside as damaged ("
          f"{', '.join(damaged)}) and none is left to resume; to start the run again from "
          "step 0, pass --config.checkpoint.restart_from_zero=True")
    self._retire_best_after(0)
    return None

  def restore_latest(self, model, optimizer_for, data_iterator=None):
    """Restores the newest intact latest/ step: `optimizer_for(extra)` builds the optimizer
    that step was saved with (its `extra` is read first). Damaged steps are moved aside and
    older ones tried. Returns (step, extra, optimizer), or None when there is none."""
    return self._restore_latest(model, lambda step, extra: optimizer_for(extra), data_iterator)

  def restore(self, model, optimizer, step: int | None = None, best: bool = False,
              data_iterator=None):
    """Restores into `model` and `optimizer` (onto their current shardings). Without `step`
    and `best`: the newest intact step (see `restore_latest`). Returns (step, extra) or None
    when there is no checkpoint; a requested step that is damaged raises."""
    if step is None and not best:
      restored = self._restore_latest(model, lambda s, e: optimizer, data_iterator)
      return None if restored is None else restored[:2]
    manager = self._manager(best)
    step = manager.latest_step() if step is None else step
    if step is None:
      return None
    self.wait()
    extra, _ = self._restore_or_raise(manager, step, model, lambda s, e: optimizer,
                                      data_iterator)
    return step, extra

  def _manager(self, best: bool):
    if best and self.best is None:
      raise ValueError("Checkpointer.restore: no best checkpoints are kept (best_metric unset)")
    return self.best if best else self.latest

  def _restore_or_raise(self, manager, step, model, optimizer_for=None, data_iterator=None):
    if step not in manager.all_steps():
      raise FileNotFoundError(f"checkpoint step {step} is not under {manager.directory} "
                              f"(steps: {list(manager.all_steps())})")
    try:
      return self._restore_step(manager, step, model, optimizer_for, data_iterator)
    except _Unusable as bad:
      raise CheckpointCorruptError(
          f"checkpoint step {step} under {manager.directory}: {bad.reason}") from None

  def restore_phases(self, model, optimizer, second_optimizer, switch_step: int,
                     data_iterator=None):
    """Restores the latest intact checkpoint of a run whose optimizer is replaced at
    `switch_step` (SFT, then RL with a fresh optimizer): past the switch, `second_optimizer()`
    builds the optimizer its saved state goes into. Returns (step, extra, optimizer);
    (0, {}, optimizer) when there is no checkpoint."""
    restored = self._restore_latest(
        model, lambda step, extra: second_optimizer() if step >= switch_step else optimizer,
        data_iterator)
    return (0, {}, optimizer) if restored is None else restored

  def restore_params(self, model, step: int | None = None, best: bool = False) -> int | None:
    """Restores the parameters alone (another run's checkpoint, e.g. the previous stage's,
    whose optimizer differs), verified against their fingerprints; a damaged step raises
    (no fallback, nothing moved). Returns the step, or None when there is no checkpoint."""
    manager = self._manager(best)
    step = manager.latest_step() if step is None else step
    if step is None:
      return None
    self.wait()
    self._restore_or_raise(manager, step, model)
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
    """Blocks until saves finish; raises `CheckpointError` if one failed."""
    for manager in self._managers():
      self._join(manager)

  def close(self) -> None:
    try:
      self.wait()
    finally:
      for manager in self._managers():
        manager.close()


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
