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
the rollout key. A policy's tool episodes run every seed of a question in one rollout (its
prompt prefilled once for them all), each row sampling with its own key, the seed and the
question id folded in (`question_key`): a question's episode is the same in any batch, any
selection of questions and a resumed run.

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

import collections
import dataclasses
import html
import json
import pathlib
import sys
import threading
import time
import zlib
from typing import Iterator, Sequence

import jax
import numpy as np
import tqdm

from data_pipelines.builders import (load_benchmark, question_index, stored_text,
                                     task_limits)
from data_pipelines.loader import MAX_VIEWS, scene_questions, scene_tasks
from data_pipelines.protocols import Protocol, protocol as named_protocol
from data_pipelines.readers.common import BenchmarkQuestion
from jaxspatial.envs import decode_text
from jaxspatial.eval import metrics
from jaxspatial.eval.prediction_log import PredictionLog
from jaxspatial.eval.report import write_text_atomically
from jaxspatial.perception.judge import EndpointError
from jaxspatial.geometry import bucket_size
from jaxspatial.rollout.api_agent import png_bytes
from jaxspatial.rollout import viewer
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


def _question(benchmark: str, q: dict, record: int, scene_id: str) -> BenchmarkQuestion:
  order = q.get("order")
  return BenchmarkQuestion(
      benchmark=benchmark, question_id=q["question_id"], question=q["question"],
      answer=q["answer"], answers=tuple(q.get("answers") or (q["answer_text"],)),
      options=tuple(q["options"]), category=q["category"], scene_id=scene_id,
      meta={"record": record, "order": order if isinstance(order, int) else None})


def stored_questions(source, benchmark: str) -> list[BenchmarkQuestion]:
  """The prepared split's questions as BenchmarkQuestions (record order), for the
  protocol's columns and metrics. `meta`: record (its index) and order (its place in the
  question file; None for a benchmark prepared without it)."""
  limits = task_limits(DATASETS.get(benchmark, benchmark))
  out = []
  for index in range(len(source)):
    example = source[index]
    out += [_question(benchmark, q, index, stored_text(example["scene_id"]))
            for q in scene_questions(example, index, limits)]
  return out


def benchmark_questions(benchmark: str, data_dir, split: str) -> list[BenchmarkQuestion]:
  """The split's questions: from the build's question index (no record read), else from
  the records with their views left encoded (a benchmark prepared before the index)."""
  dataset = DATASETS.get(benchmark, benchmark)
  light = load_benchmark(dataset, data_dir, split, images=False)
  index = question_index(dataset, data_dir, split)
  if index is None or len(index) != len(light):
    return stored_questions(light, benchmark)
  return [_question(benchmark, q, entry["record"], entry["scene_id"])
          for entry in index for q in entry["questions"]]


def file_order(questions: list[BenchmarkQuestion]) -> list[BenchmarkQuestion] | None:
  """The questions in their question file's order; None when the benchmark was prepared
  without it (before `order` was stored)."""
  if any(q.meta.get("order") is None for q in questions):
    return None
  return sorted(questions, key=lambda q: q.meta["order"])


def read_ids(path) -> list[str]:
  """An `--ids` file's question ids: one per line (blank lines and # comments skipped), or a
  JSON list of strings."""
  text = pathlib.Path(path).read_text(encoding="utf-8")
  if text.lstrip().startswith("["):
    ids = json.loads(text)
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
      raise ValueError(f"{path}: expected a JSON list of question ids (strings)")
    return ids
  return [line.strip() for line in text.splitlines()
          if line.strip() and not line.lstrip().startswith("#")]


def choose_questions(questions: list[BenchmarkQuestion], benchmark: str, split: str,
                     limit: int | None = None, ids: Sequence[str] | None = None
                     ) -> list[BenchmarkQuestion]:
  """What a run evaluates, in the question file's order: every question, the first `limit`,
  or those `ids` names (in its order; an id the split lacks is an error naming it)."""
  if limit is not None and limit < 1:
    raise ValueError(f"limit: expected a positive number of questions, got {limit}")
  ordered = file_order(questions)
  if ids is not None:
    by_id = {q.question_id: q for q in questions}
    unknown = [i for i in ids if i not in by_id]
    if unknown:
      raise ValueError(f"ids: {len(unknown)} of {len(ids)} ids are no question of {benchmark} "
                       f"split {split!r} (after its protocol's selection), first {unknown[:5]}")
    chosen = [by_id[i] for i in dict.fromkeys(ids)]
  elif limit is not None and ordered is None:
    raise ValueError(f"{benchmark} was prepared before question order was stored, so its "
                     f"first {limit} questions are unknown: prepare it again (launch."
                     "build_benchmark) or name the questions with --ids FILE")
  else:
    chosen = ordered if ordered is not None else questions
  return chosen[:limit] if limit is not None else chosen


def _max_points(benchmark: str, data_dir, split: str, indices: Sequence[int]) -> int:
  """The clouds' padded size over the records `indices` (their views left encoded)."""
  light = load_benchmark(DATASETS.get(benchmark, benchmark), data_dir, split, images=False)
  return bucket_size(max(len(light[i]["xyz"]) for i in indices))


def task_stream(source, benchmark: str, questions: Sequence[BenchmarkQuestion], batch: int,
                points: int) -> Iterator[tuple[object, list[str], int]]:
  """(tasks [batch] padded by repeating the last real row, their question ids, real rows)
  over `questions` (meta["record"]: their records, each decoded once, in record order)."""
  limits = task_limits(DATASETS.get(benchmark, benchmark))
  wanted: dict[int, set[str]] = {}
  for q in questions:
    wanted.setdefault(q.meta["record"], set()).add(q.question_id)
  pending: list = []

  def flush():
    real = len(pending)
    rows = [task for task, _ in pending] + [pending[-1][0]] * (batch - real)
    tasks = jax.tree.map(lambda *x: np.stack(x), *rows)
    return tasks, [stored_text(meta["question_id"]) for _, meta in pending], real

  for index in sorted(wanted):
    found = set()
    for task, meta in scene_tasks(source[index], points=points, input_images=True,
                                  limits=limits):
      if stored_text(meta["question_id"]) in wanted[index]:
        found.add(stored_text(meta["question_id"]))
        pending.append((task, meta))
        if len(pending) == batch:
          yield flush()
          pending = []
    if found != wanted[index]:
      raise ValueError(f"{benchmark}: record {index} does not hold the questions "
                       f"{sorted(wanted[index] - found)[:3]} its question index says it does: "
                       "the index is stale; prepare the benchmark again (launch.build_benchmark)")
  if pending:
    yield flush()


def question_views(tasks, row: int) -> np.ndarray:
  """The question's input views [V, H, W, 3] (the scene's cameras: one image set each)."""
  views = int(np.asarray(tasks.num_input_cameras)[row])
  return np.asarray(tasks.input_images)[row, :min(views, MAX_VIEWS)]


@dataclasses.dataclass
class Episode:
  """One question's answer in one setting and seed (what predictions.jsonl and
  episodes.html hold): the backend's `requests`, the `tokens` its replies reported (None:
  not reported), the `seconds` it took (an episode batch's: the batch's) and `error`: why
  it failed for good (None if it did not)."""
  question_id: str
  prediction: str
  views: Sequence  # the images the model saw, [H, W, 3] arrays or their PNG bytes
  turns: list[str]
  requests: int = 0
  error: str | None = None
  tokens: int | None = None
  seconds: float = 0.0


EPISODES_LEGEND = (
    "Per question: its text, options and reference answer; per setting the prediction (the "
    "model's final answer), the parsed answer (what the benchmark's scorer read from it) "
    "and its score beside the views the model saw, numbered as the question counts images "
    "(input views first, then those its tool calls returned); then the model's turns.")


def parsed_prediction(spec: Protocol | None, question: BenchmarkQuestion,
                      row: dict) -> tuple[str | None, str]:
  """(what the protocol's scorer read from a row's prediction, a note on how it was
  read): the option letter, the number or the extracted answer text."""
  if row.get("error"):
    return None, "(the item failed: scored 0)"
  if row.get("verdict") is not None:
    return metrics.prediction_answer(row["prediction"]), "(the judge's verdict)"
  if spec is None:
    return metrics.prediction_answer(row["prediction"]), "(no protocol: the answer text)"
  metric = spec.metric(question)
  if metric == "accuracy":
    return metrics.predicted_letter(row["prediction"], spec.letter_rule, spec.extract,
                                    len(question.options) or 5), ""
  if metric == "mra":
    value = metrics.parse_number(row["prediction"], spec.number_rule, spec.extract)
    return None if value is None else f"{value:g}", ""
  return (row["prediction"] if spec.extract == "reply"
          else metrics.prediction_answer(row["prediction"])), ""


def _question_protocol(question: BenchmarkQuestion) -> Protocol | None:
  try:
    return named_protocol(question.benchmark)
  except ValueError:  # a benchmark without a protocol of its own name
    return None


def episodes_html(questions: dict[str, BenchmarkQuestion], rows: Sequence[dict],
                  title: str, spec: Protocol | None = None) -> str:
  """The page: per question its category, text, options and reference answer and, per
  setting, the prediction, the parsed answer (`parsed_prediction` under `spec`, default
  the question's benchmark's protocol) and its score beside the views the model saw (PNG
  files under views/, named in each row's "views"), then its turns. `rows`:
  predictions.jsonl rows, in the page's order."""
  parts = viewer.page_head(title, EPISODES_LEGEND)
  by_question: dict[str, list[dict]] = {}
  for row in rows:
    by_question.setdefault(row["question_id"], []).append(row)
  for qid, found in by_question.items():
    q = questions[qid]
    parts.append(f"<div class=q><h3>{html.escape(qid)} [{html.escape(q.category)}]</h3>"
                 + viewer.facts(viewer.question_facts(q.question, q.options,
                                                      q.answers or (q.answer,))))
    # The input views: the question's images, else what its no-tools answer was shown.
    inputs = len(q.images) or min((len(r.get("views", ())) for r in found
                                   if r["setting"] == "no_tools"), default=0)
    for row in found:
      figures = "".join(
          viewer.view_figure(f"views/{name}", k + 1,
                             "" if not inputs else "input" if k < inputs else "from a tool")
          for k, name in enumerate(row.get("views", ())))
      parsed, note = parsed_prediction(spec or _question_protocol(q), q, row)
      score = f"(score {row['score']:.2f}) {note}".strip()
      fields = [("prediction", "Prediction", viewer.text_block(row["prediction"], "text")),
                ("parsed", "Parsed answer",
                 viewer.parsed_answer(parsed, row["score"] >= 0.5, score))]
      if row.get("error"):
        fields.append(("error", "Error", viewer.text_block(row["error"], "text")))
      turns = "".join(f"<div class=turn><div><b>Turn {t + 1}</b><pre class=text>"
                      f"{html.escape(text)}</pre></div></div>"
                      for t, text in enumerate(row.get("turns", ())))
      parts.append(f"<section class=episode><h4>{html.escape(row['setting'])}</h4>"
                   f"<div class=summary>{viewer.facts(fields)}<div class=views>{figures}"
                   f"</div></div>{turns}</section>")
    parts.append("</div>")
  return "\n".join(parts)


def save_views(views, folder: pathlib.Path, stem: str) -> list[str]:
  """The views (images [H, W, 3] or their PNG bytes) as PNG files
  folder/views/<stem>_<k>.png; their names."""
  (folder / "views").mkdir(parents=True, exist_ok=True)
  names = []
  for k, view in enumerate(views):
    names.append(f"{stem}_{k}.png")
    (folder / "views" / names[-1]).write_bytes(view if isinstance(view, bytes)
                                               else png_bytes(view))
  return names


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


def judge_verdict(judge, tasks, row: int, text: str, question: BenchmarkQuestion) -> bool:
  """The judge's verdict on one answer text against the question's references: an
  LLMJudge on the question's strings (`judge_case`), another judge through the rollout's
  host-judge signature (the task row's byte ids)."""
  if hasattr(judge, "judge_texts"):
    case, references = judge_case(question)
    return bool(judge.judge_texts([case], [text], [references])[0])
  answer = np.full((1, ANSWER_BYTES), -1, np.int32)
  data = np.frombuffer(text.encode("utf-8")[:ANSWER_BYTES], np.uint8)
  answer[0, :len(data)] = data
  return bool(np.asarray(judge(np.asarray(tasks.question_ids)[row:row + 1], answer,
                               np.asarray(tasks.answer_ids)[row:row + 1])).reshape(-1)[0])


def resume_key(benchmark: str, split: str, backend, agent, spec: Protocol, judge) -> dict:
  """What makes recorded answers valid for a rerun (`PredictionLog`): the benchmark, the
  model and its sampling, the agent, the scoring rules and the judge; not the endpoint's
  address, the seeds or the question selection (more seeds or questions extend a run)."""
  described = {k: v for k, v in backend.describe().items()
               if k not in ("requests", "programs", "url")}
  return {"benchmark": benchmark, "split": split, "backend": described,
          "agent": getattr(agent, "name", None),
          "scoring": {"letter_rule": spec.letter_rule, "number_rule": spec.number_rule,
                      "inclusive": spec.inclusive, "extract": spec.extract},
          "judge": None if judge is None else getattr(judge, "describe", lambda: repr(judge))()}


def _failures(rows: Sequence[dict], settings, items: int, spec: Protocol,
              by_id: dict[str, BenchmarkQuestion]) -> dict:
  counts = {s: {} for s in settings}
  for row in rows:
    column = spec.column(by_id[row["question_id"]])
    if row.get("error") and column is not None:
      counts[row["setting"]][column] = counts[row["setting"]].get(column, 0) + 1
  return {s: {"items": items, "failed": sum(c.values()),
              "categories": {k: c[k] for k in spec.columns if k in c}}
          for s, c in counts.items()}


def scored_value(row: dict):
  """What the protocol scores for a recorded row: 0 for a failed item (counted wrong, as
  the papers count a question without an answer), the judge's verdict where it judged,
  else the prediction's text."""
  if row.get("error"):
    return 0.0
  return float(row["verdict"]) if row.get("verdict") is not None else row["prediction"]


def results_from_rows(questions: list[BenchmarkQuestion], rows: Sequence[dict],
                      settings: Sequence[str], seeds: Sequence[int], spec: Protocol,
                      out: pathlib.Path, title: str) -> dict:
  """results.json / results.md from the recorded rows. Every item recorded: the run's
  results. Otherwise (an interrupted run) the partial results over the questions every
  started (setting, seed) has answered, marked "partial" in results.json and results.md."""
  by_id = {q.question_id: q for q in questions}
  found: dict = {}
  for row in rows:
    if row["setting"] in settings and int(row["seed"]) in seeds and row["question_id"] in by_id:
      found.setdefault(row["setting"], {}).setdefault(int(row["seed"]), {})[
          row["question_id"]] = row
  items = len(questions) * len(seeds)
  done = sum(len(run) for runs in found.values() for run in runs.values())
  partial = done < items * len(settings)
  kept = questions
  if partial:
    answered = [set(run) for runs in found.values() for run in runs.values()]
    kept = [q for q in questions if all(q.question_id in a for a in answered)]
    if not answered or not kept:
      return {}
  predictions = {s: {seed: {q.question_id: scored_value(runs[seed][q.question_id])
                            for q in kept} for seed in seeds if seed in runs}
                 for s, runs in found.items()}
  kept_ids = {q.question_id for q in kept}
  kept_rows = [r for runs in found.values() for run in runs.values() for r in run.values()
               if r["question_id"] in kept_ids]
  failures = _failures(kept_rows, list(found), len(kept) * len(seeds), spec, by_id)
  meta = {"failures": failures}
  if partial:
    title += f" (partial: {done} of {items * len(settings)} items recorded)"
  document = evaluate_predictions(kept, predictions, spec, out, title=title, **meta)
  if partial:
    document["partial"] = {"recorded": done, "items": items * len(settings),
                           "questions": len(kept)}
    write_text_atomically(out / "results.json", json.dumps(document, indent=2) + "\n")
  return document


def run_benchmark(benchmark: str, data_dir, out_dir, backend, *, agent=None,
                  seeds: Sequence[int] = (0, 1, 2), split: str = "test",
                  limit: int | None = None, ids: Sequence[str] | None = None,
                  batch: int = 16, settings=None, episodes: int = 50,
                  title: str | None = None, judge=None, rules: dict | None = None,
                  progress: bool = True) -> dict:
  """Evaluates `backend` on the prepared benchmark; returns the results document.

  Questions: the protocol's selection in the question file's order, the first `limit` of
  them, or the `ids` named (`choose_questions`); only the records holding them are read.
  Every finished item is appended to predictions.jsonl at once (`PredictionLog`); a rerun
  with the same `out_dir` and settings skips what is recorded. results.json / results.md
  are written from predictions.jsonl at the end and, when interrupted (KeyboardInterrupt,
  SystemExit), as partial results before re-raising.
  `rules` (letter_rule, number_rule, inclusive, extract) replace the protocol's official
  scoring rules by a named option (`data_pipelines.protocols.protocol`). `progress`: a bar
  per setting on stderr (done / total, running accuracy, failures, ETA).
  `settings` defaults to ("no_tools", "tools") with an agent, ("no_tools",) without.
  `judge` (an `LLMJudge`, e.g. Act3D's evaluation judge): open questions (the protocol's
  exact-match metric), or every question of a judge-scored protocol (HR-Bench), score its
  verdict; a judge request that fails for good fails its item (named, counted)."""
  spec = named_protocol(benchmark, **(rules or {}))
  dataset = DATASETS.get(benchmark, benchmark)
  catalogue = spec.select(benchmark_questions(benchmark, data_dir, split))
  questions = choose_questions(catalogue, benchmark, split, limit, ids)
  if not questions:
    raise ValueError(f"{benchmark}: no question to evaluate in split {split!r}")
  if not seeds or len(set(seeds)) != len(seeds):
    raise ValueError(f"seeds: expected distinct seeds, got {list(seeds)}")
  seeds = [int(s) for s in seeds]
  settings = tuple(settings or (("no_tools", "tools") if agent is not None else ("no_tools",)))
  if "tools" in settings and agent is None:
    raise ValueError("setting 'tools' needs an agent (--agent think3d|act3d|peria|spatialclaw)")
  by_id = {q.question_id: q for q in questions}
  if len(by_id) != len(questions):
    records = collections.defaultdict(list)
    for q in questions:
      records[q.question_id].append(q.meta["record"])
    named = [f"{i!r} (records {r})" for i, r in records.items() if len(r) > 1]
    raise ValueError(f"{benchmark}: question ids repeat in split {split!r} of {data_dir}: "
                     f"{', '.join(named[:5])}{' ...' if len(named) > 5 else ''}; the build "
                     "refuses repeats now: rebuild it with launch.build_benchmark")
  source = load_benchmark(dataset, data_dir, split)
  points = _max_points(benchmark, data_dir, split, sorted({q.meta["record"] for q in questions}))
  out = pathlib.Path(out_dir)
  key = resume_key(benchmark, split, backend, agent, spec, judge)
  log = PredictionLog.open(out / "predictions.jsonl", out / "run.json", key)
  name = title or f"{benchmark}: {backend.name}" + (f" ({agent.name})" if agent else "")
  place = {q.question_id: k for k, q in enumerate(questions)}
  run = {"benchmark": benchmark, "split": split, "agent": getattr(agent, "name", None),
         "settings": list(settings), "seeds": seeds, "questions": len(questions),
         "resume_key": key}
  write_text_atomically(out / "run.json", json.dumps({**run, "backend": backend.describe()},
                                                     indent=2) + "\n")
  start = time.perf_counter()
  resumed = len(log.rows())
  if progress:
    print(f"{benchmark} ({split}): {len(questions)} of {len(catalogue)} questions x "
          f"{len(seeds)} seeds x {', '.join(settings)}; {name}"
          + (f"; resuming: {resumed} items recorded in {out}/predictions.jsonl"
             if resumed else ""), file=sys.stderr, flush=True)
  try:
    for setting in settings:
      if setting == "tools":
        backend.check_agent(agent, source)
      _run_setting(setting, seeds, questions, by_id, place, source, benchmark, batch,
                   points, backend, agent, spec, judge, log, out, episodes, progress)
  except (KeyboardInterrupt, SystemExit):
    # The log stays open: requests in flight still record their answers as they end.
    results_from_rows(questions, log.rows(), settings, seeds, spec, out, name)
    raise
  log.close()
  rows = [r for r in log.rows() if r["setting"] in settings and r["seed"] in seeds
          and r["question_id"] in by_id]
  rows.sort(key=lambda r: (settings.index(r["setting"]), seeds.index(r["seed"]),
                           place[r["question_id"]]))
  # The finished file in order: settings, seeds, then the question file's order.
  write_text_atomically(out / "predictions.jsonl",
                        "".join(json.dumps(r, allow_nan=False) + "\n" for r in rows))
  document = results_from_rows(questions, rows, settings, seeds, spec, out, name)
  shown = [r for r in rows if r["seed"] == seeds[0] and place[r["question_id"]] < episodes]
  shown.sort(key=lambda r: place[r["question_id"]])
  write_text_atomically(out / "episodes.html", episodes_html(by_id, shown, name, spec))
  run.update(backend=backend.describe(),
             judge=None if judge is None else type(judge).__name__,
             # Verdict counts (unreadable ones score 0 like incorrect: reported apart).
             judge_stats=judge.stats() if hasattr(judge, "stats") else None,
             scoring=key["scoring"], resumed_items=resumed,
             seconds=round(time.perf_counter() - start, 3))
  write_text_atomically(out / "run.json", json.dumps(run, indent=2) + "\n")
  return document


def _run_setting(setting, seeds, questions, by_id, place, source, benchmark, batch, points,
                 backend, agent, spec, judge, log, out, episodes, progress) -> None:
  """One setting's items over the seeds: those not yet recorded, batch by batch, each
  recorded (scored, judged) the moment its backend reports it done."""
  total = len(questions) * len(seeds)
  lock = threading.Lock()
  state = {"scores": [], "failed": 0}
  for seed in seeds:
    for row in log.recorded(setting, seed).values():
      if row["question_id"] in by_id:
        state["scores"].append(row["score"])
        state["failed"] += bool(row.get("error"))
  # One bar per setting: done / total over its seeds, running accuracy, failures, ETA.
  bar = tqdm.tqdm(total=total, initial=len(state["scores"]), desc=f"{benchmark} {setting}",
                  unit="q", dynamic_ncols=True, file=sys.stderr, disable=not progress)

  def record(seed: int, tasks, row: int, qid: str, episode: Episode) -> None:
    q = by_id[qid]
    error, verdict = episode.error, None
    if judge is not None and spec.judged(q) and not error:
      try:
        verdict = judge_verdict(judge, tasks, row, episode.prediction, q)
      except EndpointError as failure:  # the judge endpoint's, named by its role
        error = str(failure)
    entry = {"setting": setting, "seed": seed, "question_id": qid,
             "category": spec.category(q), "reference": q.answer,
             "prediction": episode.prediction, "score": 0.0, "error": error,
             "verdict": verdict, "requests": episode.requests, "tokens": episode.tokens,
             "seconds": round(float(episode.seconds), 3)}
    entry["score"] = float(spec.score(q, scored_value(entry)))
    if seed == seeds[0] and place[qid] < episodes:
      entry["views"] = save_views(episode.views, out, f"{place[qid]:05d}_{setting}")
      entry["turns"] = list(episode.turns)
    log.append(entry)
    with lock:
      state["scores"].append(entry["score"])
      state["failed"] += bool(error)
      bar.update(1)
      bar.set_postfix(acc=f"{np.mean(state['scores']):.3f}", failed=state["failed"])

  if setting == "tools" and hasattr(backend, "grouped_episodes") and not getattr(
      agent, "host_loop", False):
    # Compiled rollouts: every seed of a question in one program, its prompt prefilled
    # once; a question's rows sample with keys from its id, whatever batch they run in.
    done = {seed: log.recorded(setting, seed) for seed in seeds}
    pending = [q for q in questions if any(q.question_id not in done[s] for s in seeds)]
    per_call = max(1, batch // len(seeds))
    for tasks, ids, real in task_stream(source, benchmark, pending, per_call, points):
      def on_seed_done(seed: int, row: int, episode: Episode, tasks=tasks, ids=ids,
                       real=real) -> None:
        if row < real and ids[row] not in done[seed]:
          record(seed, tasks, row, ids[row], episode)
      backend.grouped_episodes(agent, tasks, seeds, [question_key(i) for i in ids],
                               on_done=on_seed_done)
    bar.close()
    return
  for seed in seeds:
    done = log.recorded(setting, seed)
    pending = [q for q in questions if q.question_id not in done]
    for tasks, ids, real in task_stream(source, benchmark, pending, batch, points):
      def on_done(row: int, episode: Episode, tasks=tasks, ids=ids, real=real,
                  seed=seed) -> None:
        if row < real:  # padding rows repeat the last real one
          record(seed, tasks, row, ids[row], episode)
      if setting == "tools" and getattr(agent, "host_loop", False):
        # SpatialClaw: host-loop episodes of the real rows only (no padding rows).
        agent.episodes(backend, tasks, [by_id[i] for i in ids], seed, spec, on_done=on_done)
      elif setting == "tools":
        backend.episodes(agent, tasks, seed, real=real, on_done=on_done)
      else:
        prompts = [system_prompt(spec, by_id[i]) for i in ids]
        backend.answers(tasks, prompts, seed, on_done=on_done,
                        row_ids=[question_key(i) for i in ids])
  bar.close()


def question_key(question_id: str) -> int:
  """A question's sampling id (`rules.row_keys`): stable across runs, selections and
  batches."""
  return zlib.crc32(question_id.encode("utf-8")) & 0x7FFFFFFF


def question_text(tasks, row: int) -> str:
  return decode_text(np.asarray(tasks.question_ids)[row])
