"""The recipes part: one RL step of each agent recipe on its paper's policy family and size
(`jaxspatial.train.rl_step` on the recipe as `launch.train` builds it), each recipe in its
own process (a clean peak-memory count; an out-of-memory costs that row only).

Per recipe: the rollout (compiled episodes and their rewards) with each group's prompt
prefilled once (`rl.share_prompts`) against every row prefilling its own copy, interleaved
(`benchmarks.rl_setup.rollout_pairs`); whole steps (rollout, rewards, advantages, old and
reference log-probabilities, the update); the update's token slots per second and its MFU;
the process's peak device memory against the recipe's own estimate
(`Experiment.memory_estimate`, what `launch.train` prints before compiling).

Full sizes (`Sizes.full`): the papers' policies as random weights of their released shapes
(`model.shape`: Act3D Qwen3.5-9B, Think3D-RL Qwen3-VL-4B, PERIA Qwen3-VL-8B; 3DThinker's
Qwen2.5-VL-3B is the rollout and train parts' policy), float32 master weights, bf16
compute and cache, remat, attention "auto". A policy's decoder keeps its published layer
count when the float32 weights, gradients and AdamW moments (16 bytes a parameter) fit in
`recipe_memory_fraction` (0.7) of the device's memory, else the most layers that do (the
row says which: the widths, vocabulary and vision tower stay the paper's; on one 80 GB
device of 80 GiB: Act3D's 9B keeps 4 of 32 layers, its embedding and untied LM head alone
2B parameters; PERIA's 8B 10 of 36; Think3D's 4B 29 of 36; of 141 GiB: 16, 24 and 36; a
device reports somewhat less, what XLA's allocator may use), updated in micro-batches of
`recipe_micro_rows` rows. Episodes: the `cpu`
variants' synthetic rooms, views and turn budgets (the tiny dataset's 96 x 72 views: the
papers' 640 x 480 renders have 44x the pixels), `recipe_prompts` x 8 of them. A
random policy of the published vocabulary rarely stops a turn early: each turn decodes its
whole budget, the worst case. Smoke (`Sizes.smoke`): the `cpu` variants' tiny policies, on
the CPU.

MFU: 6 N T model FLOPs of the update (N: the text decoder's matmul parameters, the LM
head included and the input embedding left out; T: the token slots it ran on), over its
seconds and the device's peak bf16 FLOP/s; the vision tower and attention's quadratic term
are left out, so it is a lower bound.
"""

from __future__ import annotations

import functools
import importlib
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from benchmarks.device_suite.core import (REPO, Clock, Report, Sizes, error_text, log,
                                          peak_flops, peak_memory_bytes)

# recipe -> the released policy its paper trained
PAPER_POLICIES = {"act3d_grpo": "Qwen3.5-9B", "think3d_rl": "Qwen3-VL-4B",
                  "peria_or_gigpo": "Qwen3-VL-8B"}
BYTES_PER_TRAINED_PARAMETER = 16  # float32 weight, gradient and AdamW's two moments


@functools.lru_cache(maxsize=None)
def layer_parameters(shape: str) -> tuple[float, float, int, int]:
  """(parameters outside the decoder layers, parameters a layer, the layer pattern's
  period, the fewest layers a policy of `shape` takes), from two abstract models (nothing
  is allocated)."""
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from jaxspatial.models import memory, shapes  # pylint: disable=import-outside-toplevel
  from jaxspatial.models.policy import policy_class  # pylint: disable=import-outside-toplevel
  config = shapes.published_config(shape)
  cls = policy_class(shapes.published_family(shape))
  count = lambda n: memory.parameter_count(nnx.eval_shape(
      lambda: cls(shapes.with_layers(config, n), rngs=nnx.Rngs(0))))
  period = 4 if hasattr(config.text, "layer_types") else 1  # Qwen3.5: 3 linear + 1 full
  low = max(period, len(getattr(config.vision, "deepstack_visual_indexes", ())))
  low = math.ceil(low / period) * period
  per_layer = (count(2 * low) - count(low)) / low
  return count(low) - low * per_layer, per_layer, period, low


def fitting_layers(shape: str, budget_bytes: float) -> int:
  """The most decoder layers (the published count at most) whose float32 weights,
  gradients and AdamW moments fit in `budget_bytes`."""
  from jaxspatial.models import shapes  # pylint: disable=import-outside-toplevel
  fixed, per_layer, period, low = layer_parameters(shape)
  layers = int((budget_bytes / BYTES_PER_TRAINED_PARAMETER - fixed) // per_layer)
  layers = min(shapes.published_config(shape).text.num_hidden_layers,
               layers // period * period)
  if layers < low:
    raise MemoryError(f"{shape}: {low} decoder layers need "
                      f"{(fixed + low * per_layer) * BYTES_PER_TRAINED_PARAMETER / 2**30:.1f} "
                      f"GiB of weights, gradients and AdamW moments; the budget is "
                      f"{budget_bytes / 2**30:.1f} GiB")
  return layers


def recipe_config(name: str, sizes: Sizes, data_dir: str, device_bytes: int | None):
  """The recipe's `cpu` variant with the suite's sizes: on full sizes the paper's policy
  shape (its layers fitted to the device), bf16 compute over float32 weights, remat."""
  c = importlib.import_module(f"configs.{name}").get_config("cpu")
  c.workdir = tempfile.mkdtemp(prefix=f"device_suite_{name}_")
  c.data.data_dir = data_dir
  c.snapshot_every = 0
  c.rl.prompts = sizes.recipe_prompts
  if sizes.recipe_policy == "paper":
    shape = PAPER_POLICIES[name]
    if device_bytes is None:
      raise RuntimeError("the device reports no memory size: cannot fit the paper's policy")
    layers = fitting_layers(shape, sizes.recipe_memory_fraction * device_bytes)
    c.model.update(shape=shape, layers=layers, dtype="bfloat16", param_dtype="float32",
                   cache_dtype="bfloat16", remat=True, attention="auto")
    # micro-batches of recipe_micro_rows rows: the float32 logits of a published
    # vocabulary (3 x rows x length x 248,320 x 4 bytes) are the update's largest buffer
    rows = c.rl.prompts * c.advantage.group_size // c.rl.mini_batches
    if sizes.recipe_micro_rows:
      c.rl.micro_batches = (rows // sizes.recipe_micro_rows
                            if rows % sizes.recipe_micro_rows == 0 else rows)
  return c


def matmul_parameters(model) -> int:
  """The text decoder's parameters a token's forward multiplies by: all of them but the
  input embedding table, with the LM head (the table again when tied)."""
  from jaxspatial.models import memory  # pylint: disable=import-outside-toplevel
  text = model.config.text
  table = text.vocab_size * text.hidden_size
  return memory.parameter_count(model.language_model) - table + (
      table if text.tie_word_embeddings else 0)


def measure_recipe(name: str, sizes: Sizes, data_dir: str) -> dict:
  """One recipe's row (runs in the child process)."""
  import jax  # pylint: disable=import-outside-toplevel
  from benchmarks.rl_setup import rl_phase, rollout_pairs  # pylint: disable=import-outside-toplevel
  from jaxspatial.models import memory  # pylint: disable=import-outside-toplevel
  from jaxspatial.train import rl_step  # pylint: disable=import-outside-toplevel
  device_bytes, kind = memory.device_memory()
  started = time.perf_counter()
  c = recipe_config(name, sizes, data_dir, device_bytes)
  experiment, mesh, module, phase, optimizer, reference = rl_phase(c)
  text = module.config.text
  row = dict(recipe=name, family=module.family, micro_batches=c.rl.micro_batches,
             policy=c.model.shape or f"tiny {module.family}",
             layers=text.num_hidden_layers,
             published_layers=_published_layers(c.model.shape),
             parameters=memory.parameter_count(module),
             episodes=c.rl.prompts * c.advantage.group_size,
             precision=f"{c.model.dtype} compute, {c.model.param_dtype} weights, "
                       f"{c.model.cache_dtype} cache, remat {bool(c.model.remat)}",
             setup_s=time.perf_counter() - started)
  estimate = experiment.memory_estimate()
  row.update(estimate_bytes=estimate.total, estimate_fits=estimate.fits,
             device_bytes=device_bytes)
  key = jax.random.PRNGKey(0)
  steps = []
  for step in range(sizes.recipe_steps + 1):  # step 0 compiles the rollout and the update
    timings = {}
    begin = time.perf_counter()
    metrics = rl_step(experiment, phase, step, jax.random.fold_in(key, step), module,
                      optimizer, mesh, reference, timings=timings)
    jax.block_until_ready(metrics)
    timings["step"] = time.perf_counter() - begin
    steps.append(timings)
  row["first_step_s"] = steps[0]["step"]
  timed = steps[1:]
  median = lambda k: sorted(t[k] for t in timed)[len(timed) // 2]
  slots = timed[0]["update_token_slots"]
  row.update(step_s=median("step"), rollout_in_step_s=median("rollout"),
             logprobs_s=median("logprobs"), update_s=median("update"),
             update_token_slots=slots, update_tokens_per_s=slots / median("update"))
  flops = 6 * matmul_parameters(module) * slots
  peak = peak_flops(kind)
  row.update(update_model_flops=flops,
             mfu=(flops / median("update") / peak) if peak else None)
  pairs = rollout_pairs(experiment, c, module, mesh, key, sizes.recipe_pairs)
  episodes = row["episodes"]
  row.update(rollout_shared_s=pairs["shared"], rollout_per_row_s=pairs["per row"],
             sharing_speedup=pairs["speed-up"],
             episodes_per_s_shared=episodes / pairs["shared"],
             episodes_per_s_per_row=episodes / pairs["per row"],
             rollout_first_call_s=pairs["first"])
  row["peak_memory_bytes"] = peak_memory_bytes()
  if row["peak_memory_bytes"]:
    row["peak_over_estimate"] = row["peak_memory_bytes"] / estimate.total
  return row


def _published_layers(shape: str) -> int | None:
  from jaxspatial.models import shapes  # pylint: disable=import-outside-toplevel
  return shapes.published_config(shape).text.num_hidden_layers if shape else None


def recipe_child(name: str, out: str, smoke: bool) -> None:
  """The child process: one recipe's row (or its error) written to `out` as JSON."""
  sizes = Sizes.smoke() if smoke else Sizes.full()
  data_dir = str(pathlib.Path(out).parent / "recipe_data")
  try:
    row = measure_recipe(name, sizes, data_dir)
  except Exception as exc:  # pylint: disable=broad-except
    row = {"recipe": name, "error": f"{type(exc).__name__}: {exc}"[:500] + "\n"
                                    + error_text(exc)}
  pathlib.Path(out).write_text(json.dumps(row, indent=1, default=str))


def child_environment() -> dict:
  """The child's: it may preallocate the device's memory, but for what this process holds
  (a GPU context: the parent runs without preallocation when the recipes part is asked)."""
  env = dict(os.environ)
  if env.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None) is not None:
    env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "0.88"
  return env


def recipes_part(entry: dict, sizes: Sizes, clock: Clock, report: Report, smoke: bool,
                 out: pathlib.Path) -> None:
  """Each recipe of `sizes.recipes` in a child process while the budget allows
  (`recipe_row_s` left to start one; the child is stopped at the deadline's margin)."""
  rows = entry.setdefault("rows", [])
  skipped = entry.setdefault("skipped", [])
  for name in sizes.recipes:
    if clock.left() < sizes.recipe_row_s:
      skipped.append(f"{name}: out of budget ({clock.left():.0f} s left, a row needs "
                     f"{sizes.recipe_row_s:.0f})")
      report.save()
      continue
    log(clock, f"recipes: {name}")
    result = out / f"recipe_{name}.json"
    result.unlink(missing_ok=True)
    command = [sys.executable, "-m", "benchmarks.device_suite", "--recipe-child", name,
               "--out", str(result)] + (["--smoke"] if smoke else [])
    begin = time.perf_counter()
    try:
      done = subprocess.run(command, cwd=REPO, env=child_environment(), capture_output=True,
                            text=True, timeout=max(clock.left(), 10.0))
      row = (json.loads(result.read_text()) if result.exists() else
             {"recipe": name, "error": f"the child exited {done.returncode} without a row: "
                                       f"{(done.stdout + done.stderr)[-2000:]}"})
    except subprocess.TimeoutExpired:
      row = {"recipe": name, "error": f"out of budget: stopped after "
                                      f"{time.perf_counter() - begin:.0f} s"}
    row["wall_s"] = time.perf_counter() - begin
    rows.append(row)
    report.save()
    log(clock, f"recipes: {name} " + ("error: " + row["error"].split("\n")[0]
                                      if "error" in row else "done"))
  errors = [r["recipe"] for r in rows if "error" in r]
  if errors:
    entry["error"] = f"recipes with an error: {', '.join(errors)} (see their rows)"
