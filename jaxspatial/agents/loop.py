"""SpatialClaw's agent loop: plan, then code steps run in a per-episode `Kernel`, each
followed by a feedback turn, until an answer is accepted or the step limit.

    config = LoopConfig()                               # spatialclaw.md section 7
    result = run_episode(model, EpisodeInput(frames, question, options), config)
    results = run_episodes(model, inputs, config)       # `concurrency` episodes at a time

1. Plan (when `planning`): a separate text-only conversation (prompts.plan_messages: frame
   metadata, question, tool list) asking for task analysis, information needs, a
   computation plan, a JSON verification checklist and fallbacks. Its reply is read by
   schema.parse_plan and put into the main history's first turn with a transition line.
   A failed planning request or an unreadable plan is not fatal (`plan_error`), and
   planning does not count as a step.
2. Step: the model writes Purpose / Reasoning / Next Goal / Code (schema.parse_step; in the
   react mode one JSON call, schema.parse_structured, translated to code). A reply
   that does not parse is a failed step: the parser's message is its feedback.
3. The cell runs in the episode's own kernel (`kernel.Kernel`: the frames as
   InputImages, Metadata, the host tools of tools.EpisodeTools as `tools.<Name>` and
   `vlm.<name>`).
4. Feedback (feedback.feedback_text) is the next user turn, with the images the cell
   showed attached after its text (resized to `image_long_edge`, at most
   `max_images_per_step`).
5. An answer (ReturnAnswer's side channel) is checked against the question's format
   (schema.check_answer: an option letter, a number, or text); a refused one costs an
   attempt, and after `max_answer_attempts` attempts the last one is accepted as it is.
   At the step limit without an accepted answer, the last refused answer (if any) is
   the prediction, marked forced.

History: failed steps before the latest one are condensed (the code cut after the line that
raised, marked); an unparseable reply is cut to its start (2,000 characters) at once.
When the images in the history pass `max_context_images`, the oldest shown images (never
the frames of the first turn) are replaced by their labels.

Frames shown (`frames_shown`, 32; the kernel holds every frame): a video's frames
(`EpisodeInput.video`) sampled uniformly, separate images the first 32, as the paper
(`frame_selection="paper"`); `frame_selection="uniform"` spreads any input evenly.

Modes (`MODES`, the paper's ablations): full; react (the paper's structured-invocation
executor: one named call per step, translated to code; "structured" is its old name);
single_pass (one step, no planning); no_utilities (Project / Annotate / MaskStats off);
no_perception (Reconstruct, render, SAM3, OCR off); no_tools (no host tools: NumPy /
SciPy on the frames); blind (no frame shown to the model, and the images its code shows
are listed but not attached; the kernel still holds every frame); reflection (every
`reflection_every` steps the model reviews its progress in a reply without code, which
does not count as a step).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from jaxspatial.agents import feedback as fb
from jaxspatial.agents import prompts
from jaxspatial.agents import schema
from jaxspatial.agents.tools import GROUPS, EpisodeTools, ToolLimits, resize_long_edge

MODES = ("full", "react", "structured", "single_pass", "no_utilities", "no_perception",
         "no_tools", "blind", "reflection")
MODE_ALIASES = {"structured": "react"}   # an older name of the same mode
FRAME_SELECTIONS = ("paper", "uniform")


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """SpatialClaw's settings (defaults: spatialclaw.md section 7)."""
  mode: str = "full"
  max_steps: int = 30
  max_answer_attempts: int = 5
  image_long_edge: int = 768
  frames_shown: int = 32              # frames given to the model; 0 = blind
  frame_selection: str = "paper"      # "paper": videos uniformly, images the first ones;
                                      # "uniform": every input uniformly
  temperature: float = 0.6
  max_tokens: int = 8192              # per step reply
  plan_max_tokens: int = 8192
  concurrency: int = 8                # episodes at a time
  planning: bool = True
  reflection: bool = False
  reflection_every: int = 5
  checklist_every: int = 5            # the full checklist every this many steps
  max_images_per_step: int = 16
  max_context_images: int = 96
  kernel_limits: Any = None           # kernel.Limits; None: the kernel's defaults
  tool_limits: ToolLimits = ToolLimits()

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(f"LoopConfig.mode: expected one of {MODES}, got {self.mode!r}")
    if self.frame_selection not in FRAME_SELECTIONS:
      raise ValueError(f"LoopConfig.frame_selection: expected one of {FRAME_SELECTIONS}, "
                       f"got {self.frame_selection!r}")
    for name in ("max_steps", "max_answer_attempts", "concurrency", "reflection_every",
                 "checklist_every", "max_tokens", "plan_max_tokens", "image_long_edge"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"LoopConfig.{name}: expected an int >= 1, got {value!r}")
    for name in ("frames_shown", "max_images_per_step", "max_context_images"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"LoopConfig.{name}: expected an int >= 0, got {value!r}")
    if not 0.0 <= float(self.temperature) <= 2.0:
      raise ValueError(f"LoopConfig.temperature: expected [0, 2], got {self.temperature}")

  def settings(self) -> dict:
    """What the mode changes: planning, max_steps, structured, groups, frames_shown,
    reflection, attach (whether shown images are attached)."""
    out = {"planning": self.planning, "max_steps": self.max_steps, "structured": False,
           "groups": tuple(GROUPS), "frames_shown": self.frames_shown,
           "reflection": self.reflection, "attach": True}
    mode = MODE_ALIASES.get(self.mode, self.mode)
    if mode == "react":
      out["structured"] = True
    elif mode == "single_pass":
      out.update(planning=False, max_steps=1)
    elif mode == "no_utilities":
      out["groups"] = ("perception", "vlm")
    elif mode == "no_perception":
      out["groups"] = ("vlm", "utilities")
    elif mode == "no_tools":
      out["groups"] = ()
    elif mode == "blind":
      out.update(frames_shown=0, attach=False)
    elif mode == "reflection":
      out["reflection"] = True
    return out


@dataclasses.dataclass
class EpisodeInput:
  """One task: frames uint8 [N, H, W, 3], the question and its options; `kind` "letter"
  (options given), "number" or "text"; `video`: the frames are a video's, in time order
  (which frames the model is shown: LoopConfig.frame_selection); geometry / segmenter /
  ocr for the host tools (tools.DepthGeometry, ..., None); `metadata`: extra JSON-able
  Metadata entries."""
  frames: np.ndarray
  question: str
  options: tuple = ()
  kind: str = "text"
  question_id: str = ""
  video: bool = False
  geometry: Any = None
  segmenter: Any = None
  ocr: Any = None
  metadata: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class StepRecord:
  number: int
  reply: str
  step: schema.Step | None          # None: the reply did not parse
  status: str                       # kernel status, or "format"
  feedback: str
  error: str | None = None
  failing_line: int | None = None
  image_labels: tuple = ()
  tool_calls: dict = dataclasses.field(default_factory=dict)
  queries: tuple = ()
  seconds: float = 0.0


@dataclasses.dataclass
class EpisodeResult:
  prediction: str                   # the accepted (or forced) answer's text; "" without one
  answer: Any = None                # the raw ReturnAnswer value
  forced: bool = False
  stop: str = "max_steps"           # "answer", "max_steps" or "error"
  plan: schema.Plan | None = None
  plan_error: str | None = None
  steps: list = dataclasses.field(default_factory=list)
  reflections: list = dataclasses.field(default_factory=list)
  views: list = dataclasses.field(default_factory=list)   # images the model saw
  turns: list = dataclasses.field(default_factory=list)   # plan, replies and feedback
  requests: int = 0
  error: str | None = None
  seconds: float = 0.0
  question_id: str = ""


def sample_frames(count: int, shown: int) -> list[int]:
  """Up to `shown` frame indices spread evenly over `count` frames (all when fewer)."""
  if shown <= 0 or count <= 0:
    return []
  if count <= shown:
    return list(range(count))
  return sorted({int(round(x)) for x in np.linspace(0, count - 1, shown)})


def frames_to_show(count: int, shown: int, video: bool, selection: str = "paper") -> list[int]:
  """The frames the model is shown: with "paper" a video's `count` frames sampled
  uniformly to `shown`, separate images cut to the first `shown`; with "uniform" any
  input sampled uniformly."""
  if selection == "paper" and not video:
    return list(range(min(max(shown, 0), count)))
  return sample_frames(count, shown)


def _text_part(text: str) -> dict:
  return {"type": "text", "text": text}


def _image_part(image: np.ndarray, label: str, shown: bool) -> dict:
  return {"type": "image", "image": image, "label": label, "shown": shown}


class _Conversation:
  """The main history: the system prompt, the first user turn, then (reply, feedback)
  pairs, rendered per request with condensing and the image budget."""

  def __init__(self, system: str, first: list[dict], max_images: int):
    self.system, self.first, self.max_images = system, first, max_images
    self.turns: list[dict] = []  # {"role", "parts" or "text", "failed": (step, line, err)}

  def add_reply(self, text: str, condensed: str | None, always: bool = False) -> None:
    """`condensed`: the form kept once a later step exists (`always`: from now on)."""
    self.turns.append({"role": "assistant", "text": condensed if always else text,
                       "condensed": condensed})

  def add_user(self, parts: list[dict]) -> None:
    self.turns.append({"role": "user", "parts": parts})

  def messages(self) -> list[dict]:
    # The latest reply stays whole (the model fixes it next); earlier failures condense.
    latest = max((k for k, t in enumerate(self.turns) if t["role"] == "assistant"),
                 default=-1)
    shown_images = sum(1 for t in self.turns if t["role"] == "user" for p in t["parts"]
                       if p["type"] == "image")
    first_images = sum(1 for p in self.first if p["type"] == "image")
    drop = max(0, shown_images + first_images - self.max_images)
    out = [{"role": "system", "content": self.system},
           {"role": "user", "content": [_plain(p) for p in self.first]}]
    for k, turn in enumerate(self.turns):
      if turn["role"] == "assistant":
        text = turn["text"]
        if turn["condensed"] is not None and k != latest:
          text = turn["condensed"]
        out.append({"role": "assistant", "content": text})
        continue
      parts = []
      for part in turn["parts"]:
        if part["type"] == "image" and drop > 0:
          drop -= 1
          parts.append(_text_part(f"[image omitted from the history: {part['label']}]"))
        else:
          parts.append(_plain(part))
      out.append({"role": "user", "content": parts})
    return out


def _plain(part: dict) -> dict:
  if part["type"] == "image":
    return {"type": "image", "image": part["image"]}
  return part


class _Counter:
  def __init__(self):
    self.value = 0
    self._lock = threading.Lock()

  def add(self, n: int = 1) -> None:
    with self._lock:
      self.value += n


def _kernel_classes():
  from jaxspatial.agents.kernel import Kernel, Limits  # pylint: disable=import-outside-toplevel
  return Kernel, Limits


def _first_turn(task: EpisodeInput, shown: list[int], long_edge: int) -> list[dict]:
  parts = []
  for index in shown:
    parts.append(_text_part(f"Frame {index}:"))
    parts.append(_image_part(resize_long_edge(np.asarray(task.frames[index], np.uint8),
                                              long_edge), f"frame {index}", False))
  count, height, width = task.frames.shape[:3]
  parts.append(_text_part(prompts.task_text(task.question, task.options, task.kind, shown,
                                            count, height, width)))
  return parts


def _plan_block(plan: schema.Plan) -> str:
  lines = [prompts.PLAN_INTRO, "", plan.text]
  if plan.checklist:
    lines += ["", "Checklist items (number them when you mark them verified):"]
    lines += [f"{k}. [{item.priority}] {item.description}"
              for k, item in enumerate(plan.checklist, 1)]
  lines += ["", prompts.TRANSITION]
  return "\n".join(lines)


def _ask(model, conversation, config, requests, result) -> str | None:
  """The model's next reply (capped at MAX_REPLY_CHARS), or None with the episode ended as
  an error when the request fails."""
  try:
    requests.add()
    reply = model.chat(conversation.messages(), temperature=config.temperature,
                       max_tokens=config.max_tokens)
  except Exception as error:  # pylint: disable=broad-except
    result.error = f"{type(error).__name__}: {str(error)[:500]}"
    result.stop = "error"
    return None
  return schema.cap(reply)


def run_episode(model, task: EpisodeInput, config: LoopConfig = LoopConfig(), *,
                kernel_factory: Callable | None = None) -> EpisodeResult:
  """One SpatialClaw episode (see the module doc). `model`: a backends.ChatModel;
  `kernel_factory(frames, metadata, tools, limits)`: the kernel (default: kernel.Kernel).
  A model request that fails for good ends the episode with `error` set."""
  start = time.perf_counter()
  settings = config.settings()
  frames = np.asarray(task.frames)
  if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or not len(frames):
    raise ValueError(f"run_episode: frames must be uint8 [N, H, W, 3] with N >= 1, got "
                     f"{frames.dtype} {frames.shape}")
  options = tuple(str(o) for o in task.options)
  kind = "letter" if options else task.kind
  requests = _Counter()
  result = EpisodeResult("", question_id=task.question_id)

  def ask(question: str, images: list, thinking: bool = False) -> str:
    """A sub-question's reply as written (vlm.ask_with_thinking splits off the thinking)."""
    parts = [_image_part(image, "", False) for image in images] + [_text_part(question)]
    system = prompts.SUB_QUERY_THINKING_SYSTEM if thinking else prompts.SUB_QUERY_SYSTEM
    limits = config.tool_limits
    requests.add()
    reply = model.chat([{"role": "system", "content": system},
                        {"role": "user", "content": [_plain(p) for p in parts]}],
                       temperature=config.temperature,
                       max_tokens=limits.vlm_thinking_max_tokens if thinking
                       else limits.vlm_max_tokens)
    return schema.cap(reply).strip()

  tools = EpisodeTools(frames, geometry=task.geometry, segmenter=task.segmenter, ocr=task.ocr,
                       ask=ask if "vlm" in settings["groups"] else None,
                       groups=settings["groups"], limits=config.tool_limits)
  names = tools.names()
  shown = frames_to_show(len(frames), settings["frames_shown"], bool(task.video),
                         config.frame_selection)
  count, height, width = frames.shape[:3]
  metadata = {"question": task.question, "options": list(options),
              "answer_format": kind, "num_frames": int(count), "height": int(height),
              "width": int(width), "video": bool(task.video), "frames_shown": shown,
              "tools": names,
              **{k: v for k, v in task.metadata.items() if isinstance(k, str)}}

  # 1. the plan
  if settings["planning"]:
    try:
      requests.add()
      reply = model.chat(prompts.plan_messages(task.question, options, kind, count, height,
                                               width, names),
                         temperature=config.temperature, max_tokens=config.plan_max_tokens)
      plan = schema.parse_plan(reply)
      if not plan.text:
        result.plan_error = "the plan was empty"
      else:
        result.plan = plan
        result.turns.append("[plan]\n" + plan.text)
    except Exception as error:  # pylint: disable=broad-except
      result.plan_error = f"{type(error).__name__}: {str(error)[:300]}"
  checklist = result.plan.checklist if result.plan else ()

  system = prompts.system_prompt(names, max_steps=settings["max_steps"],
                                 structured=settings["structured"],
                                 cell_timeout_s=getattr(config.kernel_limits,
                                                        "cell_timeout_s", 600.0))
  first = _first_turn(task, shown, config.image_long_edge)
  if result.plan is not None:
    first.append(_text_part(_plan_block(result.plan)))
  result.views.extend(p["image"] for p in first if p["type"] == "image")
  conversation = _Conversation(system, first, config.max_context_images)

  Kernel, Limits = _kernel_classes()  # pylint: disable=invalid-name
  factory = kernel_factory or (lambda f, m, t, l: Kernel(f, m, tools=t, limits=l))
  limits = config.kernel_limits if config.kernel_limits is not None else Limits()
  verified: set[int] = set()
  attempts = 0
  last_refused: tuple[Any, str] | None = None
  max_steps = settings["max_steps"]
  try:
    kernel = factory(frames, metadata, tools.mapping(), limits)
  except Exception as error:  # pylint: disable=broad-except
    result.error = f"the kernel did not start: {type(error).__name__}: {str(error)[:300]}"
    result.stop, result.requests = "error", requests.value
    result.seconds = time.perf_counter() - start
    return result
  with kernel:
    for number in range(1, max_steps + 1):
      reply = _ask(model, conversation, config, requests, result)
      if reply is None:
        break
      result.turns.append(reply)
      try:
        if settings["structured"]:
          step = schema.parse_structured(reply, names, number)
        else:
          step = schema.parse_step(reply)
      except schema.StepFormatError as error:
        step, format_error = None, str(error)
      else:
        format_error = None
      tools.take_queries()
      record = StepRecord(number, reply, step, "format", "")
      answer_note = None
      labels: list[str] = []
      attached: list[dict] = []
      dropped = 0
      if step is not None:
        verified.update(i for i in step.verified if i <= len(checklist))
        cell = kernel.run_cell(step.code)
        record.status, record.error = cell.status, cell.error
        record.failing_line, record.seconds = cell.failing_line, float(cell.seconds)
        record.tool_calls = dict(cell.tool_calls or {})
        queries = tools.take_queries()
        record.queries = tuple(queries)
        attempts += int(cell.answer_attempts or 0)
        if cell.answer is not None or cell.answer_attempts:
          answer_note, accepted = _judge_answer(cell.answer, options, kind, attempts,
                                                config.max_answer_attempts)
          if accepted:
            result.prediction, result.answer = answer_note.value, cell.answer
            result.forced, result.stop = answer_note.forced, "answer"
          else:
            last_refused = (cell.answer, schema.answer_text(cell.answer) or "")
        for k, (label, image) in enumerate(cell.images or ()):
          label = str(label) if label is not None else f"image {k + 1}"
          labels.append(label)
          if len(attached) >= config.max_images_per_step:
            dropped += 1
            continue
          attached.append(_image_part(resize_long_edge(np.asarray(image, np.uint8),
                                                       config.image_long_edge), label, True))
        full = (number == 1 or answer_note is not None
                or number % config.checklist_every == 0)
        record.feedback = fb.feedback_text(
            number, status=cell.status, seconds=float(cell.seconds), stdout=cell.stdout or "",
            stderr=cell.stderr or "", error=cell.error, failing_line=cell.failing_line,
            code=step.code, queries=queries, variables=list(cell.variables or ()),
            answer=answer_note, image_labels=labels, images_dropped=dropped,
            images_hidden=not settings["attach"], tool_calls=record.tool_calls,
            checklist=checklist, verified=verified, full_checklist=full,
            steps_left=max_steps - number,
            timeout_s=getattr(limits, "cell_timeout_s", None))
      else:
        record.error = format_error
        record.feedback = fb.feedback_text(
            number, status="format", format_error=format_error, checklist=checklist,
            verified=verified, full_checklist=number == 1, steps_left=max_steps - number)
      record.image_labels = tuple(labels)
      result.steps.append(record)
      result.turns.append(record.feedback)
      failed = step is None or record.status != "ok"
      condensed = None
      if step is None:
        condensed = fb.condensed_reply(schema.strip_think(reply))
      elif failed:
        condensed = fb.condensed_step(step, record.failing_line, record.error)
      # Earlier turns' thinking is not sent again (as chat templates drop it).
      # An unparseable reply is condensed at once (the parser's message says what to fix).
      conversation.add_reply(schema.strip_think(reply), condensed, always=step is None)
      parts = [_text_part(record.feedback)]
      if settings["attach"]:
        parts += attached
        result.views.extend(p["image"] for p in attached)
      if result.stop == "answer":
        conversation.add_user(parts)
        break
      if number == max_steps:
        conversation.add_user(parts)
        break
      if settings["reflection"] and number % config.reflection_every == 0:
        parts.append(_text_part(prompts.REFLECTION))
        conversation.add_user(parts)
        thought = _ask(model, conversation, config, requests, result)
        if thought is None:
          break
        result.reflections.append(thought)
        result.turns.append("[reflection]\n" + thought)
        conversation.add_reply(schema.strip_think(schema.cap(thought)), None)
        conversation.add_user([_text_part(prompts.CONTINUE)])
      else:
        conversation.add_user(parts)
  if result.stop != "answer" and last_refused is not None:
    result.answer, result.prediction, result.forced = last_refused[0], last_refused[1], True
  result.requests = requests.value
  result.seconds = time.perf_counter() - start
  return result


def _judge_answer(value, options, kind, attempts: int,
                  max_attempts: int) -> tuple[fb.AnswerNote, bool]:
  text, reason = schema.check_answer(value, options, kind)
  if text is not None:
    return fb.AnswerNote(text, True, attempts=attempts, max_attempts=max_attempts), True
  if attempts >= max_attempts:
    forced = schema.answer_text(value)
    forced = forced if forced is not None else repr(value)[:200]
    return fb.AnswerNote(forced, True, reason, attempts, max_attempts, forced=True), True
  return fb.AnswerNote(schema.answer_text(value) or "", False, reason, attempts,
                       max_attempts), False


def run_episodes(model, tasks: Sequence[EpisodeInput], config: LoopConfig = LoopConfig(), *,
                 kernel_factory: Callable | None = None,
                 on_done: Callable[[int, EpisodeResult], None] | None = None
                 ) -> list[EpisodeResult]:
  """Episodes of `tasks`, `config.concurrency` at a time (threads; each its own kernel),
  in order. An episode that raises is returned with `error` set. `on_done(index, result)`
  runs in the worker thread as each episode ends (an evaluation records it at once)."""
  def one(index: int, task: EpisodeInput) -> EpisodeResult:
    try:
      result = run_episode(model, task, config, kernel_factory=kernel_factory)
    except Exception as error:  # pylint: disable=broad-except
      result = EpisodeResult("", stop="error", error=f"{type(error).__name__}: "
                             f"{str(error)[:500]}", question_id=task.question_id)
    if on_done is not None:
      on_done(index, result)
    return result

  if not tasks:
    return []
  workers = min(config.concurrency, len(tasks))
  with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="spatialclaw") as pool:
    return list(pool.map(one, range(len(tasks)), tasks))
