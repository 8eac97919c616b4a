"""The models `recipes.benchmark_run` evaluates: an OpenAI-compatible chat endpoint or a
jaxspatial policy folder. Both answer a batch of tasks without tools (`answers`) and run the
agent's episodes (the endpoint's `episodes`, one seed a call; the policy's
`grouped_episodes`, every seed in one compiled rollout), returning `Episode`s per task row.

- EndpointBackend: `perception.ChatEndpoint` (concurrency, retries, a request budget, the
  key from an environment variable); the question's views as PNG data URLs; the seed as the
  request's `seed`; episodes through `rollout.api_agent.api_rollout` (the agent's prompts,
  host-parsed replies, the same environments).
- PolicyBackend: a Hugging Face policy folder (`models.load_policy`); no-tools answers
  through `serving.PromptBuilder` + `serving.Engine` (the chat template, images resized as
  the processor does, generation under jit, one program per bucket); episodes as compiled
  rollouts (`rollout.AgentRollout`), every seed of a question in one (its prompt prefilled
  once), each row keyed by the seed and its question's id (`rules.row_keys`).

SpatialClaw (`SpatialClawAgent`, configs/spatialclaw.py) runs on the host instead: its
episodes are `jaxspatial.agents.loop` episodes, each with its own kernel, over the task's
input views; the model is the backend's (`chat_model(seed)`: the endpoint with the seed in
its requests, or the policy's engine behind a batcher seeded with it).
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxspatial.envs import decode_text
from jaxspatial.perception.judge import ChatEndpoint, strip_reasoning
from jaxspatial.rollout.api_agent import api_rollout, png_bytes, png_data_url
from recipes.benchmark_run import Episode, question_views


def _messages(system: str, views, question: str) -> list[dict]:
  parts = [{"type": "image_url", "image_url": {"url": png_data_url(view)}} for view in views]
  parts.append({"type": "text", "text": question})
  return [{"role": "system", "content": system}, {"role": "user", "content": parts}]


def _turns(reply) -> list[str]:
  """What the page shows of a reply: the reasoning the server returned apart, then it."""
  reasoning = getattr(reply, "reasoning", None)
  return [f"<think>{reasoning}</think>", str(reply)] if reasoning else [str(reply)]


def _check_geometry(agent, source) -> None:
  """Think3D's view tool renders the scene's cloud: a benchmark built without clouds needs
  online reconstruction (the agent's `reconstruction`)."""
  if getattr(agent, "name", "") != "think3d" or getattr(agent, "reconstruction", None):
    return
  for index in range(len(source)):
    if len(source[index]["xyz"]) == 0:
      raise ValueError("think3d: the benchmark was built without point clouds (geometry "
                       "'none'): build it with --caches (Think3D's cache files, "
                       "launch.reconstruct_scenes) or reconstruct online with "
                       "--config.reconstruction.backend=pi3 "
                       "--config.reconstruction.checkpoint=DIR")


class EndpointBackend:
  """An OpenAI-compatible chat model."""

  def __init__(self, endpoint: ChatEndpoint, temperature: float = 0.0,
               answer_tokens: int = 64, turn_tokens: int = 1024):
    self.endpoint = endpoint
    self.temperature, self.answer_tokens, self.turn_tokens = (temperature, answer_tokens,
                                                              turn_tokens)
    self.name = endpoint.model

  def describe(self) -> dict:
    return {"kind": "endpoint", "url": self.endpoint.base_url, "model": self.endpoint.model,
            "temperature": self.temperature, "answer_tokens": self.answer_tokens,
            "turn_tokens": self.turn_tokens, "requests": self.endpoint.stats()}

  def check_agent(self, agent, source) -> None:
    _check_geometry(agent, source)

  def _seeded(self, seed: int):
    base = dict(self.endpoint.extra_body)
    self.endpoint.extra_body = {**base, "seed": int(seed)}
    return base

  def answers(self, tasks, prompts: list[str], seed: int,
              on_done: Callable[[int, Episode], None] | None = None,
              row_ids=None) -> list[Episode]:
    """One request per prompt (the first len(prompts) rows of tasks); `on_done(row,
    episode)` as each reply (or failure) arrives. Every request carries `seed` (the server
    samples each request on its own; `row_ids` are not sent)."""
    del row_ids
    rows = len(prompts)
    views = [question_views(tasks, r) for r in range(rows)]
    # Each view encoded once: the request's data URL and the page's file.
    pngs = [[png_bytes(view) for view in views[r]] for r in range(rows)]
    questions = [decode_text(np.asarray(tasks.question_ids)[r]) for r in range(rows)]
    requests = [{"messages": _messages(prompts[r], pngs[r], questions[r]),
                 "temperature": self.temperature, "max_tokens": self.answer_tokens}
                for r in range(rows)]

    def episode(row: int, reply) -> Episode:
      # A request that failed for good is that question's failure, not the batch's.
      if isinstance(reply, Exception):
        return Episode("", "", pngs[row], [], requests=1, error=str(reply))
      return Episode("", strip_reasoning(reply).strip(), pngs[row], _turns(reply),
                     requests=1, tokens=reply.usage.get("total_tokens"),
                     seconds=reply.seconds)

    def done(row: int, reply) -> None:
      if on_done is not None:
        on_done(row, episode(row, reply))

    base = self._seeded(seed)
    try:  # complete_each returns when the batch is done: the seed never changes under one
      replies = self.endpoint.complete_each(requests, on_done=done)
    finally:
      self.endpoint.extra_body = base
    return [episode(r, reply) for r, reply in enumerate(replies)]

  @contextlib.contextmanager
  def chat_model(self, seed: int):
    """The endpoint as a host loop's chat model, the seed in every request meanwhile."""
    from jaxspatial.agents.backends import EndpointChat  # pylint: disable=import-outside-toplevel
    base = self._seeded(seed)
    try:
      yield EndpointChat(self.endpoint)
    finally:
      self.endpoint.extra_body = base

  def episodes(self, agent, tasks, seed: int, real: int | None = None,
               on_done: Callable[[int, Episode], None] | None = None) -> list[Episode]:
    """The agent's episodes of the first `real` rows (padding rows would send requests);
    `on_done(row, episode)` for each when the batch ends."""
    if real is not None:
      tasks = jax.tree.map(lambda x: np.asarray(x)[:real], tasks)
    start = time.perf_counter()
    base = self._seeded(seed)
    try:
      records = api_rollout(self.endpoint, agent, tasks, jax.random.PRNGKey(seed),
                            max_tokens=self.turn_tokens, temperature=self.temperature,
                            on_error="end")
    finally:
      self.endpoint.extra_body = base
    seconds = time.perf_counter() - start
    out = [Episode("", r["answer"].strip(), r["views"], r["turns"], r["requests"], r["error"],
                   seconds=seconds) for r in records]
    return _report(out, on_done)


def _report(episodes: list[Episode], on_done) -> list[Episode]:
  if on_done is not None:
    for row, episode in enumerate(episodes):
      on_done(row, episode)
  return episodes


class PolicyBackend:
  """A jaxspatial policy folder evaluated on this machine's devices."""

  def __init__(self, folder, temperature: float = 0.0, answer_tokens: int = 64,
               rollout: dict | None = None, max_batch: int = 8, dtype: str = "float32",
               chat_format: str = "auto"):
    # pylint: disable=import-outside-toplevel
    import pathlib
    from jaxspatial.serving.local import load_local
    self.folder = pathlib.Path(folder)
    # One scheduler for the no-tools answers and the SpatialClaw episodes: `max_batch`
    # decode slots, continuously refilled.
    local = load_local(self.folder, dtype, chat_format, slots=max_batch)
    self.model, self.tokenizer, self.chat = local.model, local.tokenizer, local.chat
    self.engine, self.builder, self.scheduler = local.engine, local.builder, local.scheduler
    self.temperature, self.answer_tokens = temperature, answer_tokens
    self.rollout_settings = dict(rollout or {})
    self.runs: dict = {}
    self.name = self.folder.name

  def describe(self) -> dict:
    return {"kind": "checkpoint", "folder": str(self.folder), "temperature": self.temperature,
            "answer_tokens": self.answer_tokens,
            "programs": self.scheduler.stats()["programs"]}

  def check_agent(self, agent, source) -> None:
    _check_geometry(agent, source)

  def answers(self, tasks, prompts: list[str], seed: int,
              on_done: Callable[[int, Episode], None] | None = None,
              row_ids=None) -> list[Episode]:
    """Generations for the prompts, all submitted to the scheduler at once; `on_done(row,
    episode)` for each as it ends. Row r samples with seed `seed` and `row_ids[r]` (default
    r) folded in: give a stable id per question and its answer does not depend on what ran
    beside it, nor on its place in the batch."""
    # pylint: disable=import-outside-toplevel
    from jaxspatial.serving.engine import Sampling
    from jaxspatial.serving.protocol import local_request
    rows = len(prompts)
    views = [question_views(tasks, r) for r in range(rows)]
    built = []
    for r in range(rows):
      question = decode_text(np.asarray(tasks.question_ids)[r])
      content = [{"type": "image", "image": view} for view in views[r]]
      content.append({"type": "text", "text": question})
      request = local_request(self.name, [{"role": "system", "content": prompts[r]},
                                          {"role": "user", "content": content}])
      built.append(self.builder.build(request))
    sampling = Sampling(temperature=self.temperature)
    began = time.perf_counter()
    ids = range(rows) if row_ids is None else row_ids
    futures = [self.scheduler.submit(prompt, self.answer_tokens, sampling,
                                     seed=(seed * 1_000_003 + i) % (1 << 31))
               for i, prompt in zip(ids, built)]
    out = []
    for r, future in enumerate(futures):
      reply = future.result()
      episode = Episode("", strip_reasoning(reply.text).strip(), views[r], [reply.text],
                        requests=1)
      episode.seconds = time.perf_counter() - began
      out.append(episode)
      if on_done is not None:
        on_done(r, episode)
    return out

  @contextlib.contextmanager
  def chat_model(self, seed: int):
    """The policy as a host loop's chat model on this backend's scheduler (concurrent
    episodes decode together, each step reusing its episode's slot), its requests' sampling
    seeded from `seed`."""
    from jaxspatial.agents.backends import PolicyChat  # pylint: disable=import-outside-toplevel
    chat = PolicyChat.from_scheduler(self.scheduler, self.builder, self.name, seed=seed)
    try:
      yield chat
    finally:
      chat.close()

  def grouped_episodes(self, agent, tasks, seeds, row_ids,
                       on_done: Callable[[int, int, Episode], None] | None = None
                       ) -> list[list[Episode]]:
    """Every seed's episodes of the batch in one compiled rollout: each task repeated once
    per seed, its prompt prefilled once for them all (the rollout's `group`); the row of
    task r and seed s samples with key fold_in(PRNGKey(s), row_ids[r]) (`rules.row_keys`),
    so its episode is the same in any batch and beside any seeds (the whole padded batch
    runs: one shape, one program). Returns [seed][row]; `on_done(seed, row, episode)` for
    each when the batch ends."""
    # pylint: disable=import-outside-toplevel
    from jaxspatial.rollout import rules
    from jaxspatial.rollout.runner import AgentRollout
    from jaxspatial.rollout.viewer import turn_texts
    if agent.name not in self.runs:
      self.runs[agent.name] = AgentRollout.create(agent, self.tokenizer, self.model,
                                                  chat=self.chat, **self.rollout_settings)
    run = self.runs[agent.name]
    group = len(seeds)
    keys = np.stack([np.asarray(rules.row_keys(seed, row_ids)) for seed in seeds], 1)
    repeated = jax.tree.map(lambda x: np.repeat(np.asarray(x), group, axis=0), tasks)
    start = time.perf_counter()
    traj = run(self.model, repeated, jnp.asarray(keys.reshape(-1, 2)),
               temperature=self.temperature, evaluation=True, group=group)
    answers = np.asarray(traj.answer)
    images = np.asarray(traj.images)
    given = np.asarray(traj.image_given)
    texts = turn_texts(traj, self.tokenizer)
    seconds = time.perf_counter() - start
    out = [[None] * len(row_ids) for _ in seeds]
    for b in range(answers.shape[0]):
      row, s = divmod(b, group)
      answer = bytes(answers[b][answers[b] >= 0].astype(np.uint8)).decode("utf-8", "replace")
      out[s][row] = Episode("", answer.strip(), images[b][given[b].astype(bool)], texts[b],
                            requests=len(texts[b]), seconds=seconds)
    if on_done is not None:
      for s, seed in enumerate(seeds):
        for row, episode in enumerate(out[s]):
          on_done(seed, row, episode)
    return out


class SpatialClawAgent:
  """SpatialClaw on a benchmark's tasks (configs/spatialclaw.py): `episodes` runs one loop
  episode per question (its input views as the frames, a video's when the question's
  source is a video file; Metadata: frame count and size, question, options, answer
  format) and returns them as `Episode`s: the prediction is the accepted ReturnAnswer value
  as text, the views the images the model saw, the turns the plan, each reply and each
  feedback.

  reconstruction: {"backend": "da3" | "pi3" | "vggt" (a ModelGeometry from `checkpoint`,
  its folder checked here: a missing one stops the run at once) | "stored" (or ""; the
  benchmark's stored clouds) | "none", "checkpoint", "device", "pi3_pixels"}."""

  name = "spatialclaw"
  host_loop = True  # run_benchmark calls `episodes(backend, tasks, questions, seed, spec)`
  video_suffixes = (".mp4", ".avi", ".mov", ".mkv", ".webm")
  video_benchmarks = ("vsibench", "vsibench_tiny")  # frames sampled from a video

  def __init__(self, loop, reconstruction: dict | None = None, sam3: str = "",
               device: str = "cpu"):
    # pylint: disable-next=import-outside-toplevel
    from jaxspatial.agents.scene_geometry import PI3_PIXELS, ModelGeometry
    self.loop = loop
    self.reconstruction = dict(reconstruction or {})
    self.sam3, self.device = sam3, device
    backend = self.reconstruction.get("backend") or "stored"
    self.model_geometry = None
    if backend not in ("stored", "none"):
      block = self.reconstruction
      pixels = block.get("pi3_pixels", PI3_PIXELS)
      self.model_geometry = ModelGeometry(backend, block.get("checkpoint") or None,
                                          block.get("device", "cpu"),
                                          pi3_pixels=int(pixels) if pixels else None)
    self.geometry_source = "model" if self.model_geometry is not None else backend

  @classmethod
  def from_config(cls, config) -> "SpatialClawAgent":
    # pylint: disable=import-outside-toplevel
    from jaxspatial.agents.kernel import Limits
    from jaxspatial.agents.loop import LoopConfig
    from jaxspatial.agents.tools import ToolLimits
    settings = {k: v for k, v in dict(config.agent).items() if k != "name"}
    limits = ToolLimits(image_long_edge=settings.get("image_long_edge", 768),
                        **dict(config.get("tools", {})))
    loop = LoopConfig(kernel_limits=Limits(**dict(config.get("kernel", {}))),
                      tool_limits=limits, **settings)
    reconstruction = dict(config.get("reconstruction") or {})
    perception = config.get("perception") or {}
    sam3 = (perception.get("models") or {}).get("sam3", "") or ""
    return cls(loop, reconstruction, sam3, perception.get("device", "cpu"))

  def _geometry(self, tasks, row: int, views: int):
    # pylint: disable=import-outside-toplevel
    from jaxspatial.agents.scene_geometry import CloudGeometry
    if self.model_geometry is not None:
      return self.model_geometry
    if self.geometry_source == "none":
      return None
    cloud = jax.tree.map(lambda x: np.asarray(x)[row], tasks.cloud)
    if not np.asarray(cloud.valid).any():
      return None
    cameras = jax.tree.map(lambda x: np.asarray(x)[row][:views], tasks.input_cameras)
    return CloudGeometry(cloud, cameras)

  def inputs(self, tasks, questions, spec=None) -> list:
    """One loop input per question (the rows of `tasks` in order)."""
    # pylint: disable=import-outside-toplevel
    from jaxspatial.agents.loop import EpisodeInput
    from jaxspatial.agents.segmenters import SAM3Segmenter
    segmenter = SAM3Segmenter(self.sam3, device=self.device) if self.sam3 else None
    out = []
    for row, question in enumerate(questions):
      frames = np.ascontiguousarray(question_views(tasks, row), np.uint8)
      kind = "number" if spec is not None and spec.metric(question) == "mra" else "text"
      video = (getattr(question, "benchmark", "") in self.video_benchmarks
               or any(str(p).lower().endswith(self.video_suffixes) for p in question.images))
      out.append(EpisodeInput(frames, question.question, tuple(question.options), kind,
                              question_id=question.question_id, video=video,
                              geometry=self._geometry(tasks, row, len(frames)),
                              segmenter=segmenter))
    return out

  def episodes(self, backend, tasks, questions, seed: int, spec=None,
               on_done: Callable[[int, Episode], None] | None = None) -> list[Episode]:
    """The questions' episodes (`questions`: the BenchmarkQuestions of the batch's real
    rows, in order) with the backend's model, `loop.concurrency` at a time;
    `on_done(row, episode)` as each ends."""
    from jaxspatial.agents.loop import run_episodes  # pylint: disable=import-outside-toplevel
    inputs = self.inputs(tasks, questions, spec)

    def episode(r) -> Episode:
      return Episode(r.question_id, r.prediction.strip(), list(r.views), list(r.turns),
                     requests=r.requests, error=r.error, seconds=r.seconds)

    def done(row: int, result) -> None:
      if on_done is not None:
        on_done(row, episode(result))

    with backend.chat_model(seed) as chat:
      results = run_episodes(chat, inputs, self.loop, on_done=done)
    return [episode(r) for r in results]


def evaluation_turns(config) -> int:
  """The turns of a benchmark evaluation's episodes: `eval.max_turns` (Think3D: K = 3 views
  then the answer), else the training rollout's."""
  return int(config.get("eval", {}).get("max_turns", 0) or config.rollout.max_turns)


def evaluation_rollout(config) -> dict:
  """The config's rollout settings for a policy backend's benchmark episodes."""
  rollout = dict(config.get("rollout", {}))
  return {**rollout, "max_turns": evaluation_turns(config)} if rollout else rollout


def benchmark_agent(config, backend):
  """The tool agent of a paper config (its `agent`, `evaluation_turns`, `reward` blocks)
  with the config's online reconstruction (Think3D on benchmarks without clouds: VSI-Bench's
  sampled frames) and perception tools (PERIA; they need a policy's tokenizer, so a policy
  backend). SpatialClaw's config (agent.name "spatialclaw") gives a `SpatialClawAgent`."""
  # pylint: disable=import-outside-toplevel
  if config.agent.get("name") == "spatialclaw":
    return SpatialClawAgent.from_config(config)
  from jaxspatial.rollout.registry import make_agent
  from recipes.agents import make_perception, make_reconstruction
  agent = make_agent(config.agent, evaluation_turns(config), config.reward.get("weights", {}))
  reconstruction = make_reconstruction(config, agent.name)
  if reconstruction is not None:
    agent = agent.with_reconstruction(reconstruction)
  if tuple(config.perception.tools):
    if not isinstance(backend, PolicyBackend):
      raise ValueError("perception.tools: an endpoint's episodes run without host perception "
                       "tools (their results are tokenised for a policy); evaluate a "
                       "--checkpoint, or drop --config.perception.tools")
    if agent.name != "peria":
      raise ValueError(f"perception.tools: only PERIA's agent calls perception tools, not "
                       f"{agent.name}")
    agent = agent.with_perception(make_perception(config, backend.tokenizer))
  return agent
