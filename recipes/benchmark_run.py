"""A prepared benchmark (`launch.build_benchmark`) evaluated with the papers' protocols: what
`python -m launch.eval --benchmark NAME` runs.

    run_benchmark("mindcube_tiny", data_dir, out_dir, backend, agent=agent, seeds=3)

Settings, side by side: "no_tools" (the model answers from the question's input views, one
request or one generation per question) and, with an agent, "tools" (the agent's episodes:
Think3D's view tool, Act3D's camera moves, PERIA's image tools, or SpatialClaw's code steps
in a per-episode kernel: an agent with `host_loop` runs its own episodes,
`agent.episodes(backend, tasks, questions, seed, spec)`, on the batch's real rows). Each
runs once per seed; the protocol (data_pipelines.protocols: columns, metrics, overall)
scores every answer and `benchmark_eval.evaluate_predictions` aggregates over seeds
(mean, spread, n) and the tools - no_tools difference.

Backends (`EndpointBackend`, `PolicyBackend`): an OpenAI-compatible chat endpoint (images
as data URLs; `perception.ChatEndpoint`: concurrency, retries, a request budget, the key
from an environment variable; tool episodes through `rollout.api_agent.api_rollout`) or a
jaxspatial policy (no-tools generation through `serving.Engine` under jit; tool episodes as
compiled rollouts through `rollout.AgentRollout`). The seed is the request's `seed` field /
the rollout key.

The no-tools prompt (ours; the papers' baselines give the question and images alone): a
system prompt asking for the option's letter, a short phrase (open questions: Act3D's 1-5
words) or a number (VSI-Bench's numeric types), the views, then the question as the
benchmark writes it.

Outputs under `out_dir`: results.json and results.md (the paper's layout: rows = settings,
columns = its categories, the failed items per setting and category), predictions.jsonl
(every answer: setting, seed, question_id, category, reference, prediction, score, error:
why the item failed, None if it did not; a failed item scores 0), episodes.html (the first `episodes` questions of
seed 0: views, turns and answers of each setting, the views as PNG files beside it) and
run.json (the run's settings, backend and request counts).
"""

from __future__ import annotations

import dataclasses
import html
import json
import pathlib
import sys
import time
from typing import Iterator, Sequence

import jax
import numpy as np
import tqdm

from data_pipelines.builders import load_benchmark, task_limits
from data_pipelines.loader import MAX_VIEWS, scene_questions, scene_tasks
from data_pipelines.protocols import Protocol, protocol as named_protocol
from data_pipelines.readers.common import BenchmarkQuestion
from jaxspatial.envs import decode_text
from jaxspatial.eval.report import write_text_atomically
from jaxspatial.geometry import bucket_size
from jaxspatial.rollout.episode import ANSWER_BYTES
from recipes.benchmark_eval import evaluate_predictions

# A protocol evaluated on another benchmark's tasks (Think3D's VSI-Bench-tiny: VSI-Bench's
# four multiple-choice types).
DATASETS = {"vsibench_tiny": "vsibench"}

LETTER_PROMPT = ("You answer multiple-choice questions about a scene shown in one or more "
                 "images. Look at every image, then reply with the letter of the correct "
                 "option only (for example: A).")
PHRASE_PROMPT = ("You answer questions about a scene shown in one or more images. Look at "
                 "every image, then reply with a short phrase of 1-5 words only.")
NUMBER_PROMPT = ("You answer questions about a scene shown in one or more images. Look at "
                 "every image, then reply with a single number only.")


def system_prompt(spec: Protocol, question: BenchmarkQuestion) -> str:
  if question.options:
    return LETTER_PROMPT
  return NUMBER_PROMPT if spec.metric(question) == "mra" else PHRASE_PROMPT


def _text(value) -> str:
  if isinstance(value, np.ndarray) and value.ndim == 0:
    value = value[()]
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def stored_questions(source, benchmark: str) -> list[BenchmarkQuestion]:
  """The prepared split's questions as BenchmarkQuestions (record order), for the
  protocol's columns and metrics."""
  out = []
  for index in range(len(source)):
    example = source[index]
    for q in scene_questions(example, index, task_limits(DATASETS.get(benchmark, benchmark))):
      out.append(BenchmarkQuestion(
          benchmark=benchmark, question_id=q["question_id"], question=q["question"],
          answer=q["answer"], answers=tuple(q.get("answers") or (q["answer_text"],)),
          options=tuple(q["options"]), category=q["category"],
          scene_id=_text(example["scene_id"])))
  return out


def _max_points(source) -> int:
  return bucket_size(max(len(source[i]["xyz"]) for i in range(len(source))))


def task_stream(source, benchmark: str, ids: set[str], batch: int,
                points: int) -> Iterator[tuple[object, list[str], int]]:
  """(tasks [batch] padded by repeating the last real row, their question ids, real rows)
  over the questions in `ids`, in record order."""
  limits = task_limits(DATASETS.get(benchmark, benchmark))
  pending: list = []

  def flush():
    real = len(pending)
    rows = [task for task, _ in pending] + [pending[-1][0]] * (batch - real)
    tasks = jax.tree.map(lambda *x: np.stack(x), *rows)
    return tasks, [_text(meta["question_id"]) for _, meta in pending], real

  for index in range(len(source)):
    for task, meta in scene_tasks(source[index], points=points, input_images=True,
                                  limits=limits):
      if _text(meta["question_id"]) in ids:
        pending.append((task, meta))
        if len(pending) == batch:
          yield flush()
          pending = []
  if pending:
    yield flush()


def question_views(tasks, row: int) -> np.ndarray:
  """The question's input views [V, H, W, 3] (the scene's cameras: one image set each)."""
  views = int(np.asarray(tasks.num_input_cameras)[row])
  return np.asarray(tasks.input_images)[row, :min(views, MAX_VIEWS)]


@dataclasses.dataclass
class Episode:
  """One question's answer in one setting and seed (what predictions.jsonl and
  episodes.html hold)."""
  question_id: str
  prediction: str
  views: np.ndarray
  turns: list[str]
  requests: int = 0
  error: str | None = None


def episodes_html(questions: dict[str, BenchmarkQuestion], episodes: dict[str, list[Episode]],
                  scores: dict[str, dict[str, float]], folder: pathlib.Path,
                  title: str) -> str:
  """The page: per question its category, reference answer and, per setting, the views
  the model saw (PNG files under folder/views), its turns, answer and score."""
  from PIL import Image  # pylint: disable=import-outside-toplevel
  views_dir = folder / "views"
  views_dir.mkdir(parents=True, exist_ok=True)
  parts = [f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>",
           "<style>body{font-family:sans-serif;margin:1em} .q{border-top:2px solid #888;"
           "margin-top:1em} .s{display:flex;gap:1em;flex-wrap:wrap} pre{white-space:pre-wrap;"
           "max-width:60em} img{width:192px;margin:2px} .ok{color:#070} .bad{color:#b00}"
           "</style>", f"<h1>{html.escape(title)}</h1>"]
  by_setting = {s: {e.question_id: e for e in runs} for s, runs in episodes.items()}
  order = list(dict.fromkeys(e.question_id for runs in episodes.values() for e in runs))
  for number, qid in enumerate(order):
    q = questions[qid]
    parts.append(f"<div class=q><h3>{html.escape(qid)} [{html.escape(q.category)}]</h3>"
                 f"<pre>{html.escape(q.question)}</pre><p>reference: "
                 f"<b>{html.escape(' | '.join(q.answers or (q.answer,)))}</b></p>")
    for setting, found in by_setting.items():
      episode = found.get(qid)
      if episode is None:
        continue
      score = scores[setting].get(qid, 0.0)
      images = []
      for k, view in enumerate(episode.views):
        name = f"{number:05d}_{setting}_{k}.png"
        Image.fromarray(np.asarray(view, np.uint8)).save(views_dir / name)
        images.append(f"<img src='views/{name}' alt='view {k}'>")
      turns = "".join(f"<pre>{html.escape(t)}</pre>" for t in episode.turns)
      mark = "ok" if score >= 0.5 else "bad"
      parts.append(f"<h4>{html.escape(setting)}: <span class={mark}>"
                   f"{html.escape(episode.prediction)!s} (score {score:.2f})</span>"
                   + (f" error: {html.escape(episode.error)}" if episode.error else "")
                   + f"</h4><div class=s>{''.join(images)}</div>{turns}")
    parts.append("</div>")
  return "\n".join(parts)


def judge_case(question: BenchmarkQuestion) -> tuple[str, list[str]]:
  """(the question as the judge reads it, its references): a multiple-choice question with
  its options listed and the right option as "B. text" (HR-Bench's judge case)."""
  if not question.options:
    return question.question, list(question.answers or (question.answer,))
  letters = "ABCDEFGHIJ"
  listed = [o if o[:2] == f"{letters[k]}." else f"{letters[k]}. {o}"
            for k, o in enumerate(question.options)]
  text = question.question if all(o in question.question for o in listed) else (
      question.question + "\n" + "\n".join(listed))
  right = letters.find(question.answer.strip().upper())
  return text, [listed[right] if 0 <= right < len(listed) else question.answer]


def judge_verdicts(judge, tasks, texts: Sequence[str],
                   questions: Sequence[BenchmarkQuestion] = ()) -> np.ndarray:
  """bool [len(texts)]: the judge's verdict on each row's answer text against the task's
  reference answers: an LLMJudge on the questions' strings (`judge_case`), another judge
  through the rollout's host-judge signature (byte ids of the tasks)."""
  if questions and hasattr(judge, "judge_texts"):
    cases = [judge_case(q) for q in questions]
    return np.asarray(judge.judge_texts([c[0] for c in cases], list(texts),
                                        [c[1] for c in cases]), bool)
  answers = np.full((len(texts), ANSWER_BYTES), -1, np.int32)
  for row, text in enumerate(texts):
    data = np.frombuffer(text.encode("utf-8")[:ANSWER_BYTES], np.uint8)
    answers[row, :len(data)] = data
  rows = len(texts)
  return np.asarray(judge(np.asarray(tasks.question_ids)[:rows], answers,
                          np.asarray(tasks.answer_ids)[:rows]), bool).reshape(rows)


def run_benchmark(benchmark: str, data_dir, out_dir, backend, *, agent=None,
                  seeds: Sequence[int] = (0, 1, 2), split: str = "test",
                  limit: int | None = None, batch: int = 16, settings=None,
                  episodes: int = 50, title: str | None = None, judge=None,
                  rules: dict | None = None, progress: bool = True) -> dict:
  """Evaluates `backend` on the prepared benchmark; returns the results document.
  `rules` (letter_rule, number_rule, inclusive, extract) replace the protocol's official
  scoring rules by a named option (`data_pipelines.protocols.protocol`). `progress`: a bar
  per setting on stderr (done / total, running accuracy, failures, ETA).
  `settings` defaults to ("no_tools", "tools") with an agent, ("no_tools",) without.
  `judge` (an `LLMJudge`, e.g. Act3D's evaluation judge): open questions (the protocol's
  exact-match metric), or every question of a judge-scored protocol (HR-Bench), score its
  verdict."""
  spec = named_protocol(benchmark, **(rules or {}))
  source = load_benchmark(DATASETS.get(benchmark, benchmark), data_dir, split)
  questions = spec.select(stored_questions(source, benchmark))
  if limit is not None:
    if limit < 1:
      raise ValueError(f"limit: expected a positive number of questions, got {limit}")
    questions = questions[:limit]
  if not questions:
    raise ValueError(f"{benchmark}: no question to evaluate in split {split!r}")
  if not seeds or len(set(seeds)) != len(seeds):
    raise ValueError(f"seeds: expected distinct seeds, got {list(seeds)}")
  settings = tuple(settings or (("no_tools", "tools") if agent is not None else ("no_tools",)))
  if "tools" in settings and agent is None:
    raise ValueError("setting 'tools' needs an agent (--agent think3d|act3d|peria|spatialclaw)")
  by_id = {q.question_id: q for q in questions}
  if len(by_id) != len(questions):
    raise ValueError(f"{benchmark}: question ids repeat in split {split!r}")
  points = _max_points(source)
  out = pathlib.Path(out_dir)
  predictions: dict = {s: {} for s in settings}
  judged: dict = {}  # (setting, seed, question id) -> the judge's verdict
  errors: dict = {}  # (setting, seed, question id) -> why the item failed (scored 0)
  failures = {s: {c: 0 for c in spec.columns} for s in settings}
  shown: dict[str, list[Episode]] = {}
  rows: list[str] = []
  start = time.perf_counter()
  scored: dict = {}  # (setting, seed, question id) -> (what is scored, its score)
  for setting in settings:
    if setting == "tools":
      backend.check_agent(agent, source)
    # One bar per setting: done / total over its seeds, running accuracy, failures, ETA.
    bar = tqdm.tqdm(total=len(questions) * len(seeds), desc=f"{benchmark} {setting}",
                    unit="q", dynamic_ncols=True, file=sys.stderr, disable=not progress)
    setting_scores: list[float] = []
    for seed in seeds:
      answers: dict[str, str] = {}
      kept: list[Episode] = []
      for tasks, ids, real in task_stream(source, benchmark, set(by_id), batch, points):
        if setting == "tools" and getattr(agent, "host_loop", False):
          # SpatialClaw: host-loop episodes of the real rows only (no padding rows).
          results = agent.episodes(backend, tasks, [by_id[i] for i in ids], seed, spec)
        elif setting == "tools":
          results = backend.episodes(agent, tasks, seed)
        else:
          prompts = [system_prompt(spec, by_id[i]) for i in ids]
          results = backend.answers(tasks, prompts, seed)
        verdicts = None
        if judge is not None and any(spec.judged(by_id[i]) for i in ids):
          verdicts = judge_verdicts(judge, tasks, [e.prediction for e in results[:real]],
                                    [by_id[i] for i in ids])
        for k, (qid, episode) in enumerate(zip(ids, results[:real])):
          episode.question_id = qid
          answers[qid] = episode.prediction
          if episode.error:
            errors[(setting, int(seed), qid)] = episode.error
            column = spec.column(by_id[qid])
            if column is not None:
              failures[setting][column] += 1
          if verdicts is not None and spec.judged(by_id[qid]):
            judged[(setting, int(seed), qid)] = float(verdicts[k])
          if seed == seeds[0] and len(kept) < episodes:
            kept.append(episode)
          # A failed item (its request or episode failed for good) counts wrong, as the
          # papers count a question without an answer.
          key = (setting, int(seed), qid)
          value = 0.0 if key in errors else judged.get(key, episode.prediction)
          scored[key] = (value, spec.score(by_id[qid], value))
          setting_scores.append(scored[key][1])
        bar.update(real)
        bar.set_postfix(acc=f"{np.mean(setting_scores):.3f}",
                        failed=sum(failures[setting].values()))
      predictions[setting][int(seed)] = {
          qid: scored[(setting, int(seed), qid)][0] for qid in answers}
      for qid, text in answers.items():
        q = by_id[qid]
        rows.append(json.dumps({"setting": setting, "seed": int(seed), "question_id": qid,
                                "category": spec.category(q), "reference": q.answer,
                                "prediction": text,
                                "score": float(scored[(setting, int(seed), qid)][1]),
                                "error": errors.get((setting, int(seed), qid))}))
      write_text_atomically(out / "predictions.jsonl", "".join(r + "\n" for r in rows))
      if seed == seeds[0]:
        shown[setting] = kept
    bar.close()
  name = title or f"{benchmark}: {backend.name}" + (f" ({agent.name})" if agent else "")
  items = len(questions) * len(seeds)
  document = evaluate_predictions(questions, predictions, spec, out, title=name, failures={
      s: {"items": items, "failed": sum(counts.values()),
          "categories": {c: n for c, n in counts.items() if n}}
      for s, counts in failures.items()})
  scores = {}
  for row in map(json.loads, rows):
    if row["seed"] == int(seeds[0]):
      scores.setdefault(row["setting"], {})[row["question_id"]] = row["score"]
  write_text_atomically(out / "episodes.html", episodes_html(by_id, shown, scores, out, name))
  run = {"benchmark": benchmark, "split": split, "backend": backend.describe(),
         "agent": getattr(agent, "name", None), "settings": list(settings),
         "seeds": [int(s) for s in seeds], "questions": len(questions),
         "judge": None if judge is None else type(judge).__name__,
         # Verdict counts (unreadable ones score 0 like incorrect: reported apart).
         "judge_stats": judge.stats() if hasattr(judge, "stats") else None,
         "scoring": {"letter_rule": spec.letter_rule, "number_rule": spec.number_rule,
                     "inclusive": spec.inclusive, "extract": spec.extract},
         "seconds": round(time.perf_counter() - start, 3)}
  write_text_atomically(out / "run.json", json.dumps(run, indent=2) + "\n")
  return document


def question_text(tasks, row: int) -> str:
  return decode_text(np.asarray(tasks.question_ids)[row])
