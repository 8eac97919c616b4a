"""Checkpoint scenarios that need their own process (tests/train/test_checkpoint.py).

`python -m tests.train.checkpoint_worker DIR`, with 8 fake CPU devices, runs in turn:
  sharded  fingerprints do not depend on sharding; a step saved on one mesh restores
           verified onto another (DIR/sharded)
  fsize    a file-size limit makes step 3's write fail (EFBIG, as a full disk fails it):
           one CheckpointError; step 2 restores (DIR/fsize)
  kill     SIGKILL while step 3's save is in flight, leaving orbax's temporary folder
           (DIR/kill); last, since it ends the process
One process for all three: each start costs seconds of imports and compiles. Results go
to DIR/results.json as each scenario ends. Also the tiny model and update the tests share.
"""

from __future__ import annotations

import json
import os
import pathlib
import resource
import signal
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxspatial.train import OptimizerConfig, fingerprint, make_optimizer
from jaxspatial.train.checkpoint import Checkpointer, CheckpointError


def build(seed: int = 0, dtype=jnp.float32):
  """A two-layer model (a 64 x 64 kernel: its data file is mostly raw floats) and AdamW."""
  model = nnx.Sequential(
      nnx.Linear(64, 64, param_dtype=dtype, rngs=nnx.Rngs(seed)),
      nnx.Linear(64, 8, param_dtype=dtype, rngs=nnx.Rngs(seed + 1)))
  return model, make_optimizer(model, OptimizerConfig(learning_rate=1e-2, total_steps=100))


@nnx.jit
def _update(model, optimizer, x):
  loss = lambda m: jnp.mean(m(x) ** 2)
  optimizer.update(model, nnx.grad(loss)(model))


def train(model, optimizer, step: int) -> None:
  """One deterministic AdamW step (parameters and optimizer moments change)."""
  x = jax.random.normal(jax.random.key(step), (4, 64))
  _update(model, optimizer, x)


def snapshot(model, optimizer) -> dict[str, np.ndarray]:
  """Host copies of every array, by path ("model/layers/0/kernel", "optimizer/...")."""
  tree = {"model": nnx.to_pure_dict(nnx.state(model, nnx.Param)),
          "optimizer": nnx.to_pure_dict(nnx.state(optimizer))}
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {"/".join(str(getattr(k, "key", k)) for k in path): np.array(x) for path, x in flat}


def assert_state_equal(model, optimizer, expected: dict) -> None:
  got = snapshot(model, optimizer)
  assert sorted(got) == sorted(expected), (sorted(got), sorted(expected))
  for name, value in expected.items():
    np.testing.assert_array_equal(got[name], value, err_msg=name)


def _two_steps(directory: pathlib.Path):
  model, optimizer = build(0)
  checkpointer = Checkpointer(directory, keep=3)
  for step in (1, 2):
    train(model, optimizer, step)
    checkpointer.save(step, model, optimizer, {"phase": "sft"})
    checkpointer.wait()
    np.savez(directory / f"expected_{step}.npz", **snapshot(model, optimizer))
  return model, optimizer, checkpointer


def fsize(directory: pathlib.Path) -> dict:
  model, optimizer, checkpointer = _two_steps(directory)
  # Past this limit a write fails with EFBIG ("File too large") instead of killing us.
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  unlimited = resource.getrlimit(resource.RLIMIT_FSIZE)
  resource.setrlimit(resource.RLIMIT_FSIZE, (1024, unlimited[1]))
  train(model, optimizer, 3)
  out = {}
  print("=== fsize: saving step 3 ===", file=sys.stderr, flush=True)
  try:
    checkpointer.save(3, model, optimizer, {"phase": "sft"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the trainer calls check() every step
      checkpointer.check()
      time.sleep(0.02)
  except CheckpointError as error:
    out["error"] = str(error)
  print("=== fsize: done ===", file=sys.stderr, flush=True)
  resource.setrlimit(resource.RLIMIT_FSIZE, unlimited)
  restored = Checkpointer(directory, keep=3).restore(*build(7))
  out["restored_step"] = None if restored is None else restored[0]
  return out


def kill(directory: pathlib.Path) -> dict:
  model, optimizer, checkpointer = _two_steps(directory)
  from orbax.checkpoint._src.path import atomicity  # pylint: disable=import-outside-toplevel

  async def die(self, *args, **kwargs):  # the items are written; nothing renamed yet
    del self, args, kwargs
    os.kill(os.getpid(), signal.SIGKILL)

  atomicity.AtomicRenameTemporaryPath.finalize = die
  train(model, optimizer, 3)
  checkpointer.save(3, model, optimizer, {"phase": "sft"})
  checkpointer.wait()
  return {"survived": True}


def sharded(directory: pathlib.Path) -> dict:
  assert jax.device_count() == 8, jax.devices()
  rng = np.random.default_rng(0)
  host = {"f32": rng.standard_normal((16, 12)).astype(np.float32),
          "bf16": rng.standard_normal((8, 16)).astype(jnp.bfloat16),
          "i32": rng.integers(-2**31, 2**31 - 1, (24,), dtype=np.int32),
          "bool": rng.random((8, 4)) > 0.5}
  expected = fingerprint.fingerprints(jax.device_put(host, jax.devices()[0]))
  auto = jax.sharding.AxisType.Auto
  line = jax.make_mesh((8,), ("x",), axis_types=(auto,))
  grid = jax.make_mesh((2, 4), ("a", "b"), axis_types=(auto, auto))
  layouts = {"rows over 8": lambda x: NamedSharding(line, P("x")),
             "columns over 4": lambda x: NamedSharding(grid, P(None, "b") if x.ndim > 1 else
                                                       P("b")),
             "2 x 4 grid": lambda x: NamedSharding(grid, P("a", "b") if x.ndim > 1 else
                                                   P(("a", "b"))),
             "replicated": lambda x: NamedSharding(grid, P())}
  agree = {}
  for name, layout in layouts.items():
    placed = {k: jax.device_put(v, layout(v)) for k, v in host.items()}
    agree[name] = fingerprint.fingerprints(placed) == expected

  # Save with parameters sharded by rows over 8 devices, restore onto a 2 x 4 grid.
  def place(model, sharding_of):
    state = nnx.state(model, nnx.Param)
    values = jax.tree.map(lambda x: jax.device_put(x, sharding_of(x)), nnx.to_pure_dict(state))
    nnx.replace_by_pure_dict(state, values)
    nnx.update(model, state)

  model, optimizer = build(0)
  train(model, optimizer, 1)
  place(model, lambda x: NamedSharding(line, P("x")))  # the optimizer stays on device 0
  saved = snapshot(model, optimizer)
  checkpointer = Checkpointer(directory, keep=2)
  checkpointer.save(1, model, optimizer, {"phase": "sft"})
  checkpointer.close()
  fresh, fresh_optimizer = build(5)
  place(fresh, layouts["2 x 4 grid"])
  step, _ = Checkpointer(directory, keep=2).restore(fresh, fresh_optimizer)
  assert_state_equal(fresh, fresh_optimizer, saved)
  kernel = fresh.layers[0].kernel[...]
  return {"agree": agree, "restored_step": step,
          "restored_sharding": str(kernel.sharding.spec), "expected": expected}


def main(argv) -> int:
  root = pathlib.Path(argv[1])
  results = {}
  for name, scenario in (("sharded", sharded), ("fsize", fsize), ("kill", kill)):
    (root / name).mkdir()
    try:
      results[name] = scenario(root / name)
    except Exception:  # pylint: disable=broad-exception-caught
      results[name] = {"failed": traceback.format_exc()}
    (root / "results.json").write_text(json.dumps(results))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
