"""The rollout part: compiled Act3D episodes of a Qwen2.5-VL-3B-shaped random policy
(compile s, tokens and episodes per second, component shares, a profiler trace) and the
host loop; the train part's methods come from `train.TrainPart`."""

from __future__ import annotations

import dataclasses
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks.device_suite.core import (QWEN_3B_VOCAB, Clock, Report, Sizes, error_text,
                                          first_cost, log, memory_bytes, peak_memory_bytes)
from benchmarks.device_suite.train import TrainPart
from benchmarks.device_suite.worker import Job, Worker, abstract
from benchmarks.timing import timed_first
from jaxspatial.envs import act3d
from jaxspatial.models.qwen2_5_vl.config import TextConfig, VisionConfig
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.models.qwen2_5_vl.preprocess import batch_vision_inputs
from jaxspatial.train import OptimizerConfig, make_optimizer


# jaxspatial.rollout (and data_pipelines.synthetic.episodes, through it) is imported where
# it is used: importing it starts the XLA backend (module-level jnp constants in
# rollout/episode.py), and main() sets the platform and the backend's flags first.
FILLER = " the chair is left of the table"


def padded_turns(tok, scripts, turn_tokens: int) -> list[list[str]]:
  """The scripted turns with their thinking padded to nearly `turn_tokens` tokens, so every
  turn decodes its whole budget (the policy still runs on every forced token)."""
  length = lambda text: len(tok.encode(text, add_special_tokens=False))
  word = length(FILLER)
  cache = {}

  def pad(turn: str) -> str:
    if turn not in cache:
      head, tail = turn.split("</think>", 1)
      make = lambda n: head + FILLER * n + "</think>" + tail
      count = max(0, (turn_tokens - 2 - length(turn)) // word)
      while count and length(make(count)) > turn_tokens - 2:
        count -= 1
      cache[turn] = make(count)
    return cache[turn]
  return [[pad(turn) for turn in episode_turns] for episode_turns in scripts]


def policy_config(tok, name: str):
  """The tiny policy, or Qwen2.5-VL-3B's text and vision shapes (vocabulary 151936), with
  the tiny tokenizer's special token ids (all below 151936)."""
  from jaxspatial.rollout import tiny  # pylint: disable=import-outside-toplevel
  config = tiny.model_config(tok)
  if name == "tiny":
    return config
  return dataclasses.replace(config, text=TextConfig(vocab_size=QWEN_3B_VOCAB),
                             vision=VisionConfig())


def build_policy(config, param_dtype, remat: bool, shapes_only: bool = False):
  """bf16 compute over `param_dtype` weights, attention "auto" (cuDNN on a GPU)."""
  build = lambda: Qwen25VL(config, rngs=nnx.Rngs(0), dtype=jnp.bfloat16,
                           param_dtype=param_dtype, attention="auto", remat=remat)
  return nnx.eval_shape(build) if shapes_only else build()


def rollout_copy(model):
  """The trainer's weights cast to bf16: what a rollout worker holds, half the bytes a
  decode step reads (remat is off: nothing is differentiated in a rollout)."""
  graphdef, _ = nnx.split(build_policy(model.config, jnp.bfloat16, remat=False,
                                       shapes_only=True))
  cast = jax.jit(lambda state: jax.tree.map(
      lambda x: x.astype(jnp.bfloat16) if jnp.issubdtype(x.dtype, jnp.floating) else x, state))
  return nnx.merge(graphdef, cast(nnx.state(model)))


def parameter_count(model) -> int:
  return int(sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))))


class RolloutBench(TrainPart):
  """The rollout and the GRPO step: pieces built and programs compiled on the worker, then
  measured by the main thread one size at a time."""

  def __init__(self, sizes: Sizes, out: pathlib.Path, clock: Clock, report: Report,
               worker: Worker):
    self.sizes, self.out, self.clock, self.report, self.worker = sizes, out, clock, report, worker
    self.entry = report.part("rollout")
    self.rows = self.entry.setdefault("rows", [])
    self.skipped = self.entry.setdefault("skipped", [])
    self.trajectories = {}
    self.compiled = {}
    self.setup = worker.submit("rollout set-up", self._setup)
    first = sizes.rollout_batches[0]
    self.compiled[first] = worker.submit(f"rollout batch {first}",
                                         lambda: self._compile_rollout(first))
    self.train_compiled = worker.submit("train step", self._compile_train)
    self.logprobs_compiled = worker.submit("log-probabilities", self._compile_logprobs)
    for batch in sizes.rollout_batches[1:2]:
      self.compiled[batch] = worker.submit(f"rollout batch {batch}",
                                           lambda b=batch: self._compile_rollout(b))

  # -- set-up and compiles (worker thread) ------------------------------------------------

  def _setup(self) -> dict:
    from data_pipelines.synthetic import episodes  # pylint: disable=import-outside-toplevel
    # pylint: disable-next=import-outside-toplevel
    from jaxspatial.rollout import agents, token_table as am, episode, observation, tiny
    sizes = self.sizes
    begin = time.perf_counter()
    self.tok = tiny.tokenizer()
    config = policy_config(self.tok, sizes.rollout_policy)
    model = build_policy(config, jnp.float32, remat=True)   # the trainer's master weights
    self.policy = rollout_copy(model)
    self.text_parameters = parameter_count(model.language_model)
    parameters = parameter_count(model)
    optimizer = make_optimizer(model, OptimizerConfig(learning_rate=1e-6, total_steps=10))
    self.train_graphdef, self.train_state = nnx.split((model, optimizer))
    self.train_state_shapes = abstract(self.train_state)
    del model, optimizer  # the state's buffers are donated to the step
    self.policy_graphdef, self.policy_state = nnx.split(self.policy)
    self.agent = agents.Act3DAgent(act3d.Act3DParams(
        width=sizes.rollout_width, height=sizes.rollout_height, grounding_min_pixels=5,
        max_interactions=sizes.rollout_turns - 1))
    self.automaton = am.compile_token_automaton(self.agent.grammar, self.tok,
                                                config.text.vocab_size)
    self.n_image = episode.image_tokens(self.policy, self.agent.image_size)
    self.template = observation.compile_template(self.tok, self.agent.observation,
                                                 self.n_image)
    self.eos = self.tok.convert_tokens_to_ids("<|im_end|>")
    self.config = episode.RolloutConfig(
        max_turns=sizes.rollout_turns, max_turn_tokens=sizes.rollout_turn_tokens,
        temperature=1.0, eos_tokens=(self.eos,), pad_token=self.tok.pad_token_id or 0,
        cache_dtype="bfloat16")
    largest = max(sizes.rollout_batches + (sizes.rollout_host_batch,))
    self.tasks, questions = episodes.act3d_tasks(largest, seed=1, points=sizes.rollout_points)
    self.ids, self.mask = episodes.act3d_prompts(self.tok, questions, self.n_image)
    self.short_scripts = tiny.scripted_act3d_turns(largest, sizes.rollout_turns)
    self.scripts = padded_turns(self.tok, self.short_scripts, sizes.rollout_turn_tokens)
    self.forced = episode.forced_tokens(self.tok, self.scripts, self.config)
    self.key = jax.random.PRNGKey(0)
    agent, template, config = self.agent, self.template, self.config
    graphdef = self.policy_graphdef

    # The program compile_rollout jits (episode.rollout), as a pure function of the
    # weights so that it compiles ahead of time (as launch/profile_rollout does).
    def program(state, automaton, tasks, ids, mask, key, forced):
      return episode.rollout(nnx.merge(graphdef, state), agent, automaton, template, tasks,
                             ids, mask, key, config, None, forced)
    self.program = jax.jit(program)
    return dict(policy=sizes.rollout_policy, parameters=parameters,
                text_parameters=self.text_parameters,
                weights="float32 master weights (trainer); the rollout holds a bf16 cast",
                compute_dtype="bfloat16", cache_dtype="bfloat16", attention="auto",
                view=[sizes.rollout_width, sizes.rollout_height],
                vision_tokens_per_view=self.n_image, turns=sizes.rollout_turns,
                turn_tokens=sizes.rollout_turn_tokens, prompt_length=int(self.ids.shape[1]),
                forced_turn_tokens=[len(self.tok.encode(t, add_special_tokens=False))
                                    for t in self.scripts[0]],
                points=sizes.rollout_points, setup_s=time.perf_counter() - begin)

  def _inputs(self, batch: int):
    """(tasks, prompt ids, prompt mask, forced tokens) of the first `batch` episodes."""
    return (jax.tree.map(lambda x: x[:batch], self.tasks), self.ids[:batch],
            self.mask[:batch], self.forced[:batch])

  def _device_inputs(self, batch: int):
    tasks, ids, mask, forced = self._inputs(batch)
    return jax.device_put((tasks, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(forced)))

  def _rollout_args(self, batch: int):
    tasks, ids, mask, forced = self._device_inputs(batch)
    return self.policy_state, self.automaton, tasks, ids, mask, self.key, forced

  def _compile_rollout(self, batch: int):
    """(the executable, the Trajectory's shapes)."""
    self.setup.result()
    lowered = self.program.lower(*self._rollout_args(batch))
    return lowered.compile(), lowered.out_info

  # -- measurements (main thread) ---------------------------------------------------------

  def wait(self, job: Job, reserve_s: float | None = None):
    """(the job's result, seconds waited), waiting at most until `reserve_s` before the
    budget ends (None: as long as it takes; the watchdog ends the run at the deadline)."""
    begin = time.perf_counter()
    timeout = (None if self.worker.serial or reserve_s is None
               else max(self.clock.left() - reserve_s, 1.0))
    return job.result(timeout=timeout), time.perf_counter() - begin

  def first_size(self, entry: dict) -> None:
    """The first batch size: throughput, a profiler trace, the component shares."""
    entry.update(self.setup.result())
    self.report.save()
    self.measure(self.sizes.rollout_batches[0], trace=True, components=True)

  def measure(self, batch: int, trace: bool, components: bool,
              reserve_s: float | None = None) -> dict:
    row = {"batch": batch}
    self.rows.append(row)
    job = self.compiled[batch]
    (compiled, _), waited = self.wait(job, reserve_s)
    row.update(compile_s=job.seconds, waited_for_compile_s=waited,
               compiled_in_background=not self.worker.serial)
    args = self._device_inputs(batch)
    last = {}

    def call():
      last["trajectory"] = compiled(self.policy_state, self.automaton, args[0], args[1],
                                    args[2], self.key, args[3])
      return last["trajectory"]
    first, run_s = timed_first(call, self.sizes.rollout_repeats)
    traj = last["trajectory"]
    tokens = float(np.asarray(traj.loss_mask).sum())
    row.update(first_call_s=first, run_s=run_s, generated_tokens=tokens,
               generated_tokens_per_s=tokens / run_s, episodes_per_s=batch / run_s,
               sequence_slots=int(traj.tokens.shape[1]),
               all_turns_played=bool(np.asarray(traj.turn_active).all()),
               peak_memory_bytes=peak_memory_bytes())
    row["cost_analysis_flops_loop_bodies_once"] = first_cost(compiled).get("flops")
    row["memory_analysis_bytes"] = memory_bytes(compiled)
    self.trajectories[batch] = traj
    self._host_ratio()
    self.report.save()
    if trace:  # the profiler needs CUPTI on a GPU: a failure costs this row's trace only
      trace_dir = self.out / "trace"
      begin = time.perf_counter()
      try:
        with jax.profiler.trace(str(trace_dir)):
          jax.block_until_ready(call())
        row.update(trace_dir=str(trace_dir), traced_run_s=time.perf_counter() - begin)
      except Exception as exc:  # pylint: disable=broad-except
        row["trace_error"] = error_text(exc, 1500)
      self.report.save()
    if components:
      row.update(self.component_shares(traj, args[0], run_s))
      self.report.save()
    return row

  def component_shares(self, traj, tasks, run_s: float) -> dict:
    """The vision encoder on the B x T views the tokens hold and the B x (N + T) renders
    (through `agent.reset`: a render and the grounding count each), separately jitted."""
    vision_config = self.policy.config.vision
    shown_BxTxHxWx3 = traj.images[:, :-1]

    @nnx.jit
    def encode(visual, images):
      pixels, grids, _ = batch_vision_inputs(vision_config, images)
      return visual(pixels, grids)

    batch = shown_BxTxHxWx3.shape[0]
    vision_first, vision_s = timed_first(lambda: encode(self.policy.visual, shown_BxTxHxWx3),
                                         self.sizes.rollout_repeats)
    keys = jax.random.split(self.key, batch)
    reset = jax.jit(jax.vmap(lambda key, task: self.agent.reset(key, task)[0]))
    render_first, render_one_s = timed_first(lambda: reset(keys, tasks),
                                             self.sizes.rollout_repeats)
    renders = traj.images.shape[1]
    render_s = renders * render_one_s
    rest = max(run_s - vision_s - render_s, 0.0)
    return {"share_method": "separately jitted components on the same shapes (the vision "
                            "encoder on B x T views; B x (N + T) renders via agent.reset); "
                            "decode = the rest (prefill, decode steps, observation appends, "
                            "parsing); the profiler trace is written, not parsed",
            "vision_s": vision_s, "vision_views": int(batch * shown_BxTxHxWx3.shape[1]),
            "vision_compile_s": max(vision_first - vision_s, 0.0),
            "render_s": render_s, "renders": int(batch * renders),
            "render_compile_s": max(render_first - render_one_s, 0.0),
            "vision_share": vision_s / run_s, "render_share": render_s / run_s,
            "decode_share": rest / run_s}

  def host_baseline(self, batch: int) -> None:
    """`host_loop.host_rollout` on the same episodes. Its warm-up (the compiles) plays one
    short scripted call, then an EOS ends each episode; the timed run plays them whole."""
    from jaxspatial.rollout import episode, host_loop  # pylint: disable=import-outside-toplevel
    tasks, ids, mask, forced = self._inputs(batch)
    warmup = episode.forced_tokens(self.tok, [t[:1] for t in self.short_scripts[:batch]],
                                   self.config)
    if self.sizes.rollout_turns > 1:
      warmup[:, 1, 0] = self.eos
    play = lambda f: host_loop.host_rollout(self.policy, self.agent, self.tok, self.template,
                                            tasks, ids, mask, self.key, self.config,
                                            jnp.asarray(f))["reward"]
    begin = time.perf_counter()
    play(warmup)
    warmup_s = time.perf_counter() - begin
    begin = time.perf_counter()
    play(forced)
    host_s = time.perf_counter() - begin
    self.entry["host_loop"] = {"batch": batch, "warmup_s": warmup_s, "run_s": host_s,
                               "episodes_per_s": batch / host_s}
    self._host_ratio()

  def _host_ratio(self) -> None:
    host = self.entry.get("host_loop")
    row = host and next((r for r in self.rows if r["batch"] == host["batch"] and "run_s" in r),
                        None)
    if row:
      host["generated_tokens_per_s"] = row["generated_tokens"] / host["run_s"]
      host["compiled_speedup"] = host["run_s"] / row["run_s"]

  def later_sizes(self, entry: dict) -> None:
    """The second batch size, the host loop (full runs: once the worker is idle, so that no
    compile shares its cores), then the third size, each while the budget allows."""
    del entry
    base = next((r for r in self.rows if "run_s" in r), None)
    if base is None:
      raise RuntimeError("the first rollout size did not run")
    runs = self.sizes.rollout_repeats + 2
    cost = lambda batch: runs * base["run_s"] * batch / base["batch"] + 10
    plan = [("compiled", b) for b in self.sizes.rollout_batches[1:2]]
    plan.append(("host", self.sizes.rollout_host_batch))
    plan += [("compiled", b) for b in self.sizes.rollout_batches[2:]]
    for kind, batch in plan:
      if kind == "compiled" and batch not in self.compiled:
        self.compiled[batch] = self.worker.submit(f"rollout batch {batch}",
                                                  lambda b=batch: self._compile_rollout(b))
      # host: its compiles (~ the compiled program's) and ~30 ms a token, pessimistic;
      # serial compiles add the program's compile to a size's cost
      estimate = (base["compile_s"] + 0.03 * self.sizes.rollout_turns
                  * self.sizes.rollout_turn_tokens + 20 if kind == "host" else
                  cost(batch) + (base["compile_s"] if self.worker.serial else 0.0))
      if estimate > self.clock.left():
        self._skip(kind, batch, f"budget: estimated {estimate:.0f} s, "
                                f"{self.clock.left():.0f} s left")
        continue
      log(self.clock, f"rollout: {kind} batch {batch}")
      try:
        if kind == "host":
          if not self.worker.wait_idle(self.clock.left() - estimate):
            self._skip(kind, batch, "budget: the compile worker stayed busy")
            continue
          self.host_baseline(batch)
        else:
          self.measure(batch, trace=False, components=False, reserve_s=cost(batch))
      except TimeoutError as exc:
        self.rows[:] = [r for r in self.rows if r.get("batch") != batch or "run_s" in r]
        self._skip(kind, batch, f"budget: {exc}")
      except Exception as exc:  # pylint: disable=broad-except
        self.entry.setdefault("row_errors", []).append(
            {"kind": kind, "batch": batch, "error": error_text(exc)})
      self.report.save()

  def _skip(self, kind: str, batch: int, reason: str) -> None:
    self.skipped.append({"kind": kind, "batch": batch, "reason": reason})
    self.report.save()
    log(self.clock, f"rollout: skipped {kind} batch {batch} ({reason})")
