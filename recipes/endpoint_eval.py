"""A benchmark evaluated on an OpenAI-compatible chat endpoint with no tools (the "none"
agent; what `python -m launch.eval_benchmark` runs): each question's images as data URLs
plus its text, one request per question per seed, concurrent, through
`jaxspatial.perception.judge.ChatEndpoint` (concurrency, retries, request budget, the key
from an environment variable); the replies scored by the benchmark's protocol through
`recipes.benchmark_eval.evaluate_predictions` (setting "no_tools").

The prompt (ours; the papers' no-tool baselines give the question and images alone):
  system: SYSTEM_PROMPT (answer with the option's letter only)
  user:   [image 1, image 2, ...] then the question text as the benchmark writes it (its
          options included), then USER_SUFFIX.
Temperature 0 unless asked; seeds differ only by the request's `seed` field (OpenAI's,
vLLM's and our server's sampling seed), so at temperature 0 a deterministic server gives
every seed the same reply and the spread is 0.

Images go as the file's own bytes when they are PNG, JPEG, WebP or GIF (the MIME type read
from the bytes, not the extension); anything else PIL reads is re-encoded as PNG.

Outputs under `out_dir`: results.json and results.md (evaluate_predictions),
predictions.jsonl (one row per request: setting, seed, question_id, category, answer,
reply; rewritten after each seed so a failed run keeps the seeds it finished) and run.json
(the run's settings and the endpoint's request / token counts).
"""

from __future__ import annotations

import base64
import io
import json
import os
import pathlib
import tempfile
import time
from typing import Callable, Mapping, Sequence

from data_pipelines.protocols import protocol as named_protocol
from data_pipelines.readers import read_mindcube
from data_pipelines.readers.common import BenchmarkQuestion, check_file, read_json_rows
from jaxspatial.perception.judge import ChatEndpoint
from recipes.benchmark_eval import evaluate_predictions

SETTING = "no_tools"
SYSTEM_PROMPT = ("You answer multiple-choice questions about a scene shown in one or more "
                 "images. Look at every image, then reply with the letter of the correct "
                 "option only (for example: A).")
USER_SUFFIX = "Answer with the option's letter."

# Benchmarks whose questions are image files + a question text with its options written
# in it: name -> reader(path, image_root, check_images), one question per row.
READERS: Mapping[str, Callable[..., list[BenchmarkQuestion]]] = {
    "mindcube": read_mindcube,
    "mindcube_tiny": read_mindcube,
}

_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
          (b"GIF87a", "image/gif"), (b"GIF89a", "image/gif"))


def read_questions(benchmark: str, questions_file, image_root,
                   limit: int | None = None) -> list[BenchmarkQuestion]:
  """The benchmark's questions (the first `limit` when given), every image of those found
  on disk: a missing one is the reader's MissingImageError naming the file, row, id, field
  and the image's path (only the questions evaluated need their images)."""
  if benchmark not in READERS:
    raise ValueError(f"benchmark: expected one of {sorted(READERS)}, got {benchmark!r}")
  if limit is not None and limit < 1:
    raise ValueError(f"limit: expected a positive number of questions, got {limit}")
  questions = READERS[benchmark](questions_file, image_root=image_root, check_images=False)
  questions = questions[:limit] if limit is not None else questions
  rows = [row for row, _ in read_json_rows(questions_file)]  # one question per row
  for question, row in zip(questions, rows):
    for k, image in enumerate(question.images):
      check_file(questions_file, row, question.question_id, f"images[{k}]", image)
  return questions


def image_data_url(path) -> str:
  """A data URL of the image file: its own bytes for PNG / JPEG / GIF / WebP, else PNG."""
  data = pathlib.Path(path).read_bytes()
  mime = next((m for magic, m in _MAGIC if data.startswith(magic)), None)
  if mime is None and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
    mime = "image/webp"
  if mime is None:
    from PIL import Image  # pylint: disable=import-outside-toplevel
    try:
      with Image.open(io.BytesIO(data)) as image:
        buffer = io.BytesIO()
        image.convert("RGB").save(buffer, format="PNG")
    except Exception as error:  # pylint: disable=broad-except
      raise ValueError(f"image {path}: not an image PIL can read ({error})") from None
    data, mime = buffer.getvalue(), "image/png"
  return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


def question_messages(question: BenchmarkQuestion, urls: dict | None = None) -> list[dict]:
  """The chat messages of one question (`urls` caches data URLs by image path)."""
  urls = {} if urls is None else urls
  parts = []
  for image in question.images:
    if image not in urls:
      urls[image] = image_data_url(image)
    parts.append({"type": "image_url", "image_url": {"url": urls[image]}})
  parts.append({"type": "text", "text": f"{question.question}\n{USER_SUFFIX}"})
  return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": parts}]


def _write_atomic(path: pathlib.Path, text: str) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
  try:
    with os.fdopen(handle, "w") as f:
      f.write(text)
    os.replace(temporary, path)
  except BaseException:
    os.unlink(temporary)
    raise


def evaluate_endpoint(questions: Sequence[BenchmarkQuestion], endpoint: ChatEndpoint,
                      benchmark: str, out_dir, seeds: Sequence[int] = (0, 1, 2),
                      temperature: float = 0.0, max_tokens: int = 32,
                      title: str | None = None) -> dict:
  """Asks `endpoint` every question once per seed and writes the results to `out_dir`;
  returns the results document. The seeds run one after another, each a concurrent batch
  of every question (`complete_many`; the first request that fails for good stops the run
  after the seeds already written to predictions.jsonl)."""
  spec = named_protocol(benchmark)
  selected = spec.select(questions)
  if not selected:
    raise ValueError(f"{benchmark}: no question to evaluate (of {len(questions)} read)")
  if not seeds or len(set(seeds)) != len(seeds):
    raise ValueError(f"seeds: expected distinct seeds, got {list(seeds)}")
  out = pathlib.Path(out_dir)
  urls: dict = {}
  messages = [question_messages(q, urls) for q in selected]
  base_extra = dict(endpoint.extra_body)
  predictions: dict = {SETTING: {}}
  rows: list[str] = []
  start = time.perf_counter()
  try:
    for seed in seeds:
      # complete_many returns only when the whole batch is done, so the seed field is
      # never changed under a request in flight.
      endpoint.extra_body = {**base_extra, "seed": int(seed)}
      replies = endpoint.complete_many([
          {"messages": m, "temperature": temperature, "max_tokens": max_tokens}
          for m in messages])
      predictions[SETTING][int(seed)] = {q.question_id: r for q, r in zip(selected, replies)}
      rows += [json.dumps({"setting": SETTING, "seed": int(seed), "question_id": q.question_id,
                           "category": spec.category(q), "answer": q.answer, "reply": r})
               for q, r in zip(selected, replies)]
      _write_atomic(out / "predictions.jsonl", "".join(row + "\n" for row in rows))
  finally:
    endpoint.extra_body = base_extra
  document = evaluate_predictions(selected, predictions, spec, out,
                                  title=title or f"{benchmark}: {endpoint.model} (no tools)")
  run = {"benchmark": benchmark, "model": endpoint.model, "endpoint": endpoint.base_url,
         "setting": SETTING, "seeds": [int(s) for s in seeds], "questions": len(selected),
         "temperature": temperature, "max_tokens": max_tokens, "system_prompt": SYSTEM_PROMPT,
         "user_suffix": USER_SUFFIX, "seconds": round(time.perf_counter() - start, 3),
         "requests": endpoint.stats()}
  _write_atomic(out / "run.json", json.dumps(run, indent=2) + "\n")
  return document


def run_endpoint_eval(benchmark: str, questions_file, image_root, endpoint_url: str,
                      model: str, out_dir, seeds: int = 3, concurrency: int = 16,
                      limit: int | None = None, temperature: float = 0.0,
                      max_tokens: int = 32, api_key_env: str | None = "OPENAI_API_KEY",
                      timeout_s: float = 120.0, retries: int = 3,
                      max_requests: int | None = None) -> dict:
  """What `launch.eval_benchmark` calls: read, ask, score, write."""
  if seeds < 1:
    raise ValueError(f"seeds: expected at least 1, got {seeds}")
  questions = read_questions(benchmark, questions_file, image_root, limit)
  endpoint = ChatEndpoint(endpoint_url, model, api_key_env=api_key_env or None,
                          timeout_s=timeout_s, retries=retries, concurrency=concurrency,
                          max_requests=max_requests)
  return evaluate_endpoint(questions, endpoint, benchmark, out_dir, seeds=range(seeds),
                           temperature=temperature, max_tokens=max_tokens)
