"""Checkpointer: fingerprints, damaged steps skipped and moved aside, latest/ and best/
never colliding, failed writes surfacing in one line, kills during a save.

Every failure is reproduced by damaging real files; every resume is checked bit-exact
against what was saved (and against the run that never stopped).
"""

from __future__ import annotations

import gc
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from jaxspatial.train import fingerprint
from jaxspatial.train.checkpoint import (Checkpointer, CheckpointCorruptError, CheckpointError,
                                         CheckpointMismatchError)
from tests.train.checkpoint_worker import assert_state_equal, build, snapshot, train
from tests.conftest import xla_flags

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Orbax leaves read coroutines pending when a damaged array fails to read.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(autouse=True)
def _collect_orbax_leftovers():
  yield
  gc.collect()  # inside the test that left them, where the filter above applies


class Iterator:
  """A data iterator: get_state / set_state, as grain's."""

  def __init__(self, position=0):
    self.position = position

  def get_state(self):
    return {"position": self.position}

  def set_state(self, state):
    self.position = state["position"]


def _extra(step):
  return {"phase": "sft" if step < 3 else "grpo", "results": {"step": step}}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
  """Steps 1..3 (latest/ keeps 3, best/ holds 3 by reward) and each step's arrays."""
  directory = tmp_path_factory.mktemp("pristine")
  model, optimizer = build(0)
  checkpointer = Checkpointer(directory, keep=3, best_metric="reward")
  saved = {}
  for step in (1, 2, 3, 4):
    train(model, optimizer, step)
    saved[step] = snapshot(model, optimizer)
    if step < 4:  # step 4: what a run that never stopped holds after it
      checkpointer.save(step, model, optimizer, _extra(step), {"reward": float(step)},
                        data_iterator=Iterator(10 * step))
  checkpointer.close()
  return directory, saved


def _copy(pristine, tmp_path) -> pathlib.Path:
  directory = tmp_path / "checkpoints"
  shutil.copytree(pristine[0], directory)
  return directory


def _largest_data_file(step_dir: pathlib.Path, item: str = "model") -> pathlib.Path:
  # OCDBT keeps array bytes in <item>/ocdbt.process_*/d/* (and <item>/d/*).
  files = [p for p in (step_dir / item).rglob("*") if p.is_file() and p.parent.name == "d"]
  return max(files, key=lambda p: p.stat().st_size)


def _flip_byte(path: pathlib.Path) -> None:
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0x40
  path.write_bytes(bytes(data))


def _continue_to_3(directory, saved, model, optimizer):
  """The resumed run redoes step 3 and saves it: it equals the run that never stopped."""
  train(model, optimizer, 3)
  assert_state_equal(model, optimizer, saved[3])
  checkpointer = Checkpointer(directory, keep=3, best_metric="reward")
  checkpointer.save(3, model, optimizer, _extra(3), {"reward": 3.0})
  checkpointer.close()
  fresh, fresh_optimizer = build(9)
  assert Checkpointer(directory, keep=3).restore(fresh, fresh_optimizer)[0] == 3
  assert_state_equal(fresh, fresh_optimizer, saved[3])


# ------------------------------------------------------------------ fingerprints


def _reference(array) -> int:
  """sum_i bits[i] * (2 i + 1) mod 2^32, in numpy."""
  array = np.asarray(array)
  if array.dtype == np.bool_:
    bits = array.astype(np.uint64)
  else:
    bits = array.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[array.dtype.itemsize])
  index = np.arange(bits.size, dtype=np.uint64)
  return int(np.sum(bits.ravel().astype(np.uint64) * (2 * index + 1) % 2**32) % 2**32)


def test_fingerprints_equal_a_numpy_reference_and_see_every_bit():
  rng = np.random.default_rng(0)
  host = {"f32": rng.standard_normal((33, 17)).astype(np.float32),
          "bf16": rng.standard_normal((5, 7, 3)).astype(ml_dtypes.bfloat16),
          "f16": rng.standard_normal((9,)).astype(np.float16),
          "i32": rng.integers(-2**31, 2**31 - 1, (1000,), dtype=np.int32),  # sums wrap
          "u8": rng.integers(0, 256, (6, 5), dtype=np.uint8),
          "bool": rng.random((4, 9)) > 0.5, "scalar": np.float32(-2.5)}
  got = fingerprint.fingerprints(jax.tree.map(jnp.asarray, host))
  assert got == {name: _reference(value) for name, value in host.items()}
  key = jax.random.key(7)
  assert fingerprint.fingerprints({"key": key})["key"] == _reference(jax.random.key_data(key))
  nested = fingerprint.records({"model": {"layers": {0: {"kernel": jnp.ones((2, 3))}}}})
  assert nested == {"model/layers/0/kernel": {
      "fingerprint": _reference(np.ones((2, 3), np.float32)), "shape": [2, 3],
      "dtype": "float32"}}
  # Flipping any single bit changes the fingerprint (2 i + 1 is odd: invertible mod 2^32).
  for name in ("f32", "bf16", "bool"):
    value = host[name].reshape(-1)[:12].copy()
    base = fingerprint.fingerprints({"x": jnp.asarray(value)})["x"]
    width = 1 if value.dtype == np.bool_ else value.dtype.itemsize * 8
    view = value.view(np.uint8) if value.dtype == np.bool_ else value.view(
        {2: np.uint16, 4: np.uint32}[value.dtype.itemsize])
    for i in range(value.size):
      for bit in range(width):
        flipped = view.copy()
        flipped[i] ^= flipped.dtype.type(1 << bit)
        flipped = flipped.view(value.dtype)
        assert fingerprint.fingerprints({"x": jnp.asarray(flipped)})["x"] != base, (name, i, bit)


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
  """The scenarios of tests/train/checkpoint_worker.py, run once in their own process."""
  root = tmp_path_factory.mktemp("worker")
  env = dict(os.environ, XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=8"),
             JAX_PLATFORMS="cpu")
  result = subprocess.run([sys.executable, "-m", "tests.train.checkpoint_worker", str(root)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
  results = json.loads((root / "results.json").read_text())
  return root, result, results


def _scenario(worker, name):
  root, result, results = worker
  assert name in results, (result.stdout + result.stderr)[-4000:]
  assert "failed" not in results[name], results[name]["failed"]
  return root / name, results[name]


@pytest.mark.slow
@pytest.mark.multidevice
def test_fingerprints_do_not_depend_on_sharding(worker):
  _, report = _scenario(worker, "sharded")
  assert all(report["agree"].values()), report
  # Saved sharded by rows over 8 devices, restored verified onto a 2 x 4 grid.
  assert report["restored_step"] == 1 and report["restored_sharding"] == "P('a', 'b')"


# ------------------------------------------------------------------ save and restore


def test_round_trip_with_data_iterator_and_optimizer_by_phase(pristine, tmp_path):
  directory, saved = _copy(pristine, tmp_path), pristine[1]
  assert (directory / "latest/3/data/process_0-of-1.json").exists()
  model, optimizer = build(9)
  iterator = Iterator()
  assert Checkpointer(directory).restore(model, optimizer, data_iterator=iterator) == (
      3, _extra(3))  # the integrity record is not part of `extra`
  assert iterator.position == 30
  assert_state_equal(model, optimizer, saved[3])

  seen = []

  def optimizer_for(extra):
    seen.append(extra)
    return build(11)[1]

  model, _ = build(9)
  step, extra, rebuilt = Checkpointer(directory).restore_latest(model, optimizer_for)
  assert (step, extra, seen) == (3, _extra(3), [_extra(3)])
  assert_state_equal(model, rebuilt, saved[3])
  model, first = build(9)
  second = build(12)[1]
  step, _, chosen = Checkpointer(directory).restore_phases(model, first, lambda: second, 3)
  assert step == 3 and chosen is second
  assert_state_equal(model, second, saved[3])
  # An older step on request, with its iterator state; bytes states too.
  model, optimizer = build(9)
  assert Checkpointer(directory).restore(model, optimizer, step=2, data_iterator=iterator)[0] == 2
  assert iterator.position == 20
  assert_state_equal(model, optimizer, saved[2])

  class Bytes:
    state = b"\x00\xffgrain"

    def get_state(self):
      return self.state

    def set_state(self, state):
      self.state = state

  checkpointer = Checkpointer(directory / "bytes")
  checkpointer.save(1, model, optimizer, {}, data_iterator=Bytes())
  checkpointer.close()
  restored = Bytes()
  restored.state = b""
  Checkpointer(directory / "bytes").restore(*build(9), data_iterator=restored)
  assert restored.state == b"\x00\xffgrain"
  # Per-process states of another world size are a mismatch, not damage: nothing moves.
  data = directory / "bytes/latest/1/data"
  (data / "process_0-of-1.json").rename(data / "process_0-of-2.json")
  with pytest.raises(CheckpointMismatchError, match="saved by 2 processes; this run has 1"):
    Checkpointer(directory / "bytes").restore(*build(9), data_iterator=restored)
  assert (directory / "bytes/latest/1").is_dir()


def test_bit_flip_is_caught_and_the_run_resumes_from_the_step_before(pristine, tmp_path, capsys):
  directory, saved = _copy(pristine, tmp_path), pristine[1]
  _flip_byte(_largest_data_file(directory / "latest/3"))
  # Orbax alone reads the flipped step back without an error: the original failure.
  model, optimizer = build(9)
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct,
                        nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  raw = ocp.CheckpointManager(directory / "latest").restore(
      3, args=ocp.args.Composite(model=ocp.args.StandardRestore(target)))["model"]
  assert not np.array_equal(raw["layers"][0]["kernel"], saved[3]["model/layers/0/kernel"])

  iterator = Iterator()
  assert Checkpointer(directory).restore(model, optimizer, data_iterator=iterator) == (
      2, _extra(2))
  assert iterator.position == 20
  assert_state_equal(model, optimizer, saved[2])
  err = capsys.readouterr().err
  assert "checkpoint step 3 skipped: fingerprint mismatch in model/layers/0/kernel" in err
  assert (directory / "latest/corrupt.3.0/model").is_dir()  # moved aside, not deleted
  assert (directory / "best/superseded.3.0").is_dir()  # best/ held step 3 too
  _continue_to_3(directory, saved, model, optimizer)


def _truncate(step):
  path = _largest_data_file(step)
  path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])


def _tamper_extra(step):
  # Still valid JSON: only the integrity record can tell.
  path = step / "extra/metadata"
  path.write_text(path.read_text().replace('"grpo"', '"grpx"'))


DAMAGE = {
    "truncated array file": (_truncate, "cannot be read"),
    "optimizer item deleted": (lambda s: shutil.rmtree(s / "optimizer"), "cannot be read"),
    "item metadata garbage": (lambda s: (s / "model/_METADATA").write_text("garbage{"),
                              "cannot be read"),
    "extra item garbage": (lambda s: (s / "extra/metadata").write_text("{garbage"),
                           "cannot be read"),
    "extra edited": (_tamper_extra, "fingerprint mismatch in extra"),
    "empty step folder": (lambda s: (shutil.rmtree(s), s.mkdir()), "cannot be read"),
    # Orbax's step metadata is bookkeeping: the arrays still verify, so step 3 is used.
    "step metadata garbage": (lambda s: (s / "_CHECKPOINT_METADATA").write_text("garbage{"),
                              None),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_latest_step_is_skipped(pristine, tmp_path, capsys, damage):
  directory, saved = _copy(pristine, tmp_path), pristine[1]
  corrupt, reason = DAMAGE[damage]
  corrupt(directory / "latest/3")
  model, optimizer = build(9)
  checkpointer = Checkpointer(directory, keep=3, best_metric="reward")
  step, extra = checkpointer.restore(model, optimizer)
  err = capsys.readouterr().err
  if reason is None:
    assert step == 3 and extra == _extra(3)
    assert_state_equal(model, optimizer, saved[3])
    assert "skipped" not in err
    return
  assert (step, extra) == (2, _extra(2))
  assert_state_equal(model, optimizer, saved[2])
  lines = [line for line in err.splitlines() if "skipped" in line]
  assert len(lines) == 1 and lines[0].startswith(f"checkpoint step 3 skipped: {reason}"), err
  assert checkpointer.latest.all_steps() == [1, 2]
  assert (directory / "latest/corrupt.3.0").is_dir()
  if damage == "truncated array file":  # the others continue alike (see the bit flip)
    _continue_to_3(directory, saved, model, optimizer)


def test_requested_steps_and_params_never_fall_back(pristine, tmp_path):
  directory, saved = _copy(pristine, tmp_path), pristine[1]
  _flip_byte(_largest_data_file(directory / "latest/3"))
  _flip_byte(_largest_data_file(directory / "best/3"))
  model, optimizer = build(9)
  untouched = snapshot(model, optimizer)
  checkpointer = Checkpointer(directory, keep=3, best_metric="reward")
  mismatch = r"checkpoint step 3 under .*: fingerprint mismatch in model/layers/0/kernel"
  with pytest.raises(CheckpointCorruptError, match=mismatch):
    checkpointer.restore(model, optimizer, step=3)
  with pytest.raises(CheckpointCorruptError, match=mismatch):
    checkpointer.restore(model, optimizer, best=True)
  with pytest.raises(CheckpointCorruptError, match=mismatch):
    checkpointer.restore_params(model)  # evaluation, or stage 2 starting from stage 1
  assert_state_equal(model, optimizer, untouched)
  assert not list(directory.glob("*/corrupt.*")) and not list(directory.glob("*/superseded.*"))
  assert checkpointer.restore_params(model, step=2) == 2
  np.testing.assert_array_equal(model.layers[0].kernel[...], saved[2]["model/layers/0/kernel"])


def test_every_step_damaged_raises_naming_them(pristine, tmp_path, capsys):
  directory = _copy(pristine, tmp_path)
  for step in (1, 2, 3):
    _flip_byte(_largest_data_file(directory / f"latest/{step}", "optimizer"))
  model, optimizer = build(9)
  untouched = snapshot(model, optimizer)
  with pytest.raises(CheckpointCorruptError) as raised:
    Checkpointer(directory).restore(model, optimizer)
  message = str(raised.value)
  for step in (3, 2, 1):
    assert f"step {step} (fingerprint mismatch in optimizer/" in message or (
        f"step {step} (cannot be read" in message), message
  assert len(capsys.readouterr().err.strip().splitlines()) == 3  # one line per step
  assert sorted(p.name for p in (directory / "latest").iterdir()) == [
      "corrupt.1.0", "corrupt.2.0", "corrupt.3.0"]
  assert_state_equal(model, optimizer, untouched)
  # A rerun finds nothing left to resume: it refuses to start over at step 0 unasked.
  with pytest.raises(CheckpointCorruptError, match=(
      r"every step was moved aside as damaged \(corrupt.1.0, corrupt.2.0, corrupt.3.0\).*"
      r"--config.checkpoint.restart_from_zero=True")):
    Checkpointer(directory).restore(model, optimizer)
  assert Checkpointer(directory, restart_from_zero=True).restore(model, optimizer) is None


def test_moved_aside_folders_beyond_keep_aside_are_deleted_newest_kept(pristine, tmp_path):
  directory = _copy(pristine, tmp_path)
  for name in ("latest/corrupt.1.0", "latest/corrupt.1.1", "latest/corrupt.2.0",
               "best/superseded.3.0", "best/superseded.3.1"):
    (directory / name).mkdir()
    (directory / name / "model").write_text("a whole step")
  checkpointer = Checkpointer(directory)
  kept, deleted = checkpointer.prune_aside(2)
  assert sorted(f"{f.parent.name}/{f.name}" for f in deleted) == ["latest/corrupt.1.0"]
  assert sorted(f"{f.parent.name}/{f.name}" for f in kept) == [
      "best/superseded.3.0", "best/superseded.3.1", "latest/corrupt.1.1", "latest/corrupt.2.0"]
  assert not (directory / "latest/corrupt.1.0").exists()
  assert checkpointer.steps() == [1, 2, 3]  # the run's own steps are untouched
  checkpointer.prune_aside(0)
  assert checkpointer.aside_folders() == [] and checkpointer.steps() == [1, 2, 3]
  with pytest.raises(ValueError, match="keep_aside must be an integer >= 0, got -1"):
    checkpointer.prune_aside(-1)


@pytest.mark.parametrize("how", ["corrupted", "deleted by hand"])
def test_best_step_ahead_of_the_resume_cannot_crash_the_run(pristine, tmp_path, how):
  # The probe's crash loop: latest/3 (which best/ also holds) is bad; the run resumes from
  # step 2, redoes step 3 and saves it to best/ again: StepAlreadyExistsError, every restart.
  directory, saved = _copy(pristine, tmp_path), pristine[1]
  if how == "corrupted":
    _truncate(directory / "latest/3")
  else:
    shutil.rmtree(directory / "latest/3")
  model, optimizer = build(9)
  checkpointer = Checkpointer(directory, keep=3, best_metric="reward")
  assert checkpointer.restore(model, optimizer)[0] == 2
  assert checkpointer.best.all_steps() == []
  for step in (3, 4):
    train(model, optimizer, step)
    checkpointer.save(step, model, optimizer, _extra(step), {"reward": float(step)})
  checkpointer.close()
  assert_state_equal(model, optimizer, saved[4])
  fresh, fresh_optimizer = build(9)
  checkpointer = Checkpointer(directory, keep=3, best_metric="reward")
  assert checkpointer.restore(fresh, fresh_optimizer)[0] == 4
  assert_state_equal(fresh, fresh_optimizer, saved[4])
  assert checkpointer.best.all_steps() == [4]
  assert (directory / "best/superseded.3.0").is_dir()
  # A step best/ already holds (here: saved again without a restore) is moved aside too.
  shutil.move(directory / "latest/4", directory / "latest/by-hand.4")
  checkpointer.latest.reload()
  checkpointer.save(4, fresh, fresh_optimizer, _extra(4), {"reward": 4.0})
  checkpointer.close()
  assert (directory / "best/superseded.4.0").is_dir()
  assert Checkpointer(directory, best_metric="reward").restore(fresh, fresh_optimizer,
                                                               best=True)[0] == 4


def test_damaged_best_metrics_do_not_stop_the_run(pristine, tmp_path, capsys):
  # Orbax reads best/'s metrics when a manager starts: garbage there raised before a resume.
  directory, saved = _copy(pristine, tmp_path), pristine[1]
  (directory / "best/3/metrics/metrics").write_text("{garbage")
  checkpointer = Checkpointer(directory, keep=3, best_metric="reward")
  assert "checkpoint best/ step 3 skipped: its metrics cannot be read" in capsys.readouterr().err
  assert checkpointer.best.all_steps() == [] and (directory / "best/corrupt.3.0").is_dir()
  model, optimizer = build(9)
  assert checkpointer.restore(model, optimizer)[0] == 3
  assert_state_equal(model, optimizer, saved[3])


# ------------------------------------------------------------------ failed and killed saves


def _expected(directory, step):
  with np.load(directory / f"expected_{step}.npz") as data:
    return dict(data)


@pytest.mark.multidevice
def test_failed_write_surfaces_at_once_in_one_line(worker):
  directory, report = _scenario(worker, "fsize")  # a file-size limit: writes fail (EFBIG)
  error = report["error"]
  assert re.fullmatch(r"checkpoint step 3: could not be written to \S+/latest: File too large "
                      r"\(the latest intact step is 2\)", error), error
  # Orbax's tracebacks (the probe counted 1,500 lines) are cut to their message lines.
  stderr = worker[1].stderr
  during = stderr.split("=== fsize: saving step 3 ===")[1].split("=== fsize: done ===")[0]
  assert len(during.splitlines()) < 100, during[-3000:]
  assert report["restored_step"] == 2
  # The steps written before the limit restore exactly; the run goes on.
  model, optimizer = build(9)
  assert Checkpointer(directory).restore(model, optimizer)[0] == 2
  assert_state_equal(model, optimizer, _expected(directory, 2))
  checkpointer = Checkpointer(directory)
  train(model, optimizer, 3)
  checkpointer.save(3, model, optimizer, {})
  checkpointer.close()
  assert Checkpointer(directory).restore(*build(9))[0] == 3


def _mount_tmpfs(path, size):
  path.mkdir()
  try:
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, timeout=30)
  except (OSError, subprocess.TimeoutExpired):
    return False
  return done.returncode == 0


def test_full_disk_surfaces_in_one_line(tmp_path):
  disk = tmp_path / "disk"
  if not _mount_tmpfs(disk, "4m"):
    pytest.skip("cannot mount a tmpfs here (needs root); the file-size-limit test covers it")
  try:
    model, optimizer = build(0)
    checkpointer = Checkpointer(disk, keep=3)
    for step in (1, 2):
      train(model, optimizer, step)
      checkpointer.save(step, model, optimizer, {})
      checkpointer.wait()
    expected = snapshot(model, optimizer)
    # Fill the disk to the last byte, unbuffered: a buffered file's close would flush the
    # bytes that did not fit and raise ENOSPC again.
    filler = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
      while os.write(filler, b"\0" * 65536):
        pass
    except OSError:
      pass
    finally:
      os.close(filler)
    train(model, optimizer, 3)
    with pytest.raises(CheckpointError) as raised:
      checkpointer.save(3, model, optimizer, {})
      checkpointer.wait()
    message = str(raised.value)
    assert message.startswith("checkpoint step 3: could not be written to ") and (
        "No space left on device (the latest intact step is 2)" in message), message
    assert "\n" not in message and raised.value.__suppress_context__
    fresh, fresh_optimizer = build(9)
    assert Checkpointer(disk).restore(fresh, fresh_optimizer)[0] == 2
    assert_state_equal(fresh, fresh_optimizer, expected)
    (disk / "filler").unlink()
    checkpointer.save(3, model, optimizer, {})  # the failure was reported once
    checkpointer.close()
    assert Checkpointer(disk).restore(fresh, fresh_optimizer)[0] == 3
    assert_state_equal(fresh, fresh_optimizer, snapshot(model, optimizer))
  finally:
    subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=30)


@pytest.mark.multidevice
def test_kill_during_save_resumes_from_the_last_finished_step(worker):
  root, result, results = worker  # SIGKILL before step 3's folder is renamed
  assert result.returncode == -9 and "kill" not in results, (
      results.get("kill"), (result.stdout + result.stderr)[-4000:])
  tmp_path = root / "kill"
  assert (tmp_path / "latest/3.orbax-checkpoint-tmp/model.orbax-checkpoint-tmp").is_dir()
  model, optimizer = build(9)
  checkpointer = Checkpointer(tmp_path)
  assert checkpointer.restore(model, optimizer)[0] == 2
  assert checkpointer.latest.all_steps() == [1, 2]
  assert_state_equal(model, optimizer, _expected(tmp_path, 2))
  train(model, optimizer, 3)
  checkpointer.save(3, model, optimizer, {})
  checkpointer.close()
  assert sorted(p.name for p in (tmp_path / "latest").iterdir()) == ["1", "2", "3"]
  fresh, fresh_optimizer = build(9)
  assert Checkpointer(tmp_path).restore(fresh, fresh_optimizer)[0] == 3
  assert_state_equal(fresh, fresh_optimizer, snapshot(model, optimizer))


# ------------------------------------------------------------------ old and other checkpoints


def test_checkpoint_without_fingerprints_restores_with_a_warning(tmp_path, capsys):
  model, optimizer = build(0)
  train(model, optimizer, 1)
  manager = ocp.CheckpointManager(tmp_path / "latest")  # the layout written before
  manager.save(5, args=ocp.args.Composite(
      model=ocp.args.StandardSave(nnx.to_pure_dict(nnx.state(model, nnx.Param))),
      optimizer=ocp.args.StandardSave(nnx.to_pure_dict(nnx.state(optimizer))),
      extra=ocp.args.JsonSave({"phase": "sft"})))
  manager.close()
  fresh, fresh_optimizer = build(9)
  assert Checkpointer(tmp_path).restore(fresh, fresh_optimizer) == (5, {"phase": "sft"})
  assert_state_equal(fresh, fresh_optimizer, snapshot(model, optimizer))
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "checkpoint step 5" in err[0] and "no fingerprints" in err[0]


def test_a_different_model_raises_and_moves_nothing(pristine, tmp_path):
  directory = _copy(pristine, tmp_path)
  wider = nnx.Sequential(nnx.Linear(64, 32, rngs=nnx.Rngs(0)), nnx.Linear(32, 8, rngs=nnx.Rngs(1)))
  with pytest.raises(CheckpointMismatchError,
                     match=r"checkpoint step 3 .* does not match the model/optimizer given: "
                           r"model/layers/0/bias is saved as \[64\], the target is \[32\]"):
    Checkpointer(directory).restore(wider, build(0)[1])
  model, _ = build(0)
  sgd = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
  with pytest.raises(CheckpointMismatchError, match="optimizer/opt_state"):
    Checkpointer(directory).restore(model, sgd)
  assert sorted(p.name for p in (directory / "latest").iterdir()) == ["1", "2", "3"]


def test_restore_params_verifies_then_casts_to_the_model_dtype(pristine, tmp_path):
  directory, saved = _copy(pristine, tmp_path), pristine[1]
  model, _ = build(9, dtype=jnp.bfloat16)  # e.g. an evaluation job's bf16 parameters
  assert Checkpointer(directory).restore_params(model) == 3
  kernel = model.layers[0].kernel[...]
  assert kernel.dtype == jnp.bfloat16
  np.testing.assert_array_equal(
      kernel, saved[3]["model/layers/0/kernel"].astype(ml_dtypes.bfloat16))
