"""launch.eval_benchmark on the real MindCube-Tiny question file against a scripted
OpenAI-compatible server whose answers are known: per-category accuracy, n and std against
an independent computation, the images each request carried, the request seeds, and a
missing image named."""

import base64
import collections
import hashlib
import io
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from data_pipelines.readers import MissingImageError
from jaxspatial.perception.judge import ChatEndpoint, JudgeError
from recipes import endpoint_eval
from tests.perception.chat_server import ChatServer

REPO = pathlib.Path(__file__).resolve().parents[2]
# The shared data beside the checkout (as tests/data_pipelines/test_readers.py finds it).
QUESTIONS = REPO.parent / "shared" / "data" / "benchmarks" / "mindcube_tiny_questions.jsonl"
SEEDS = 3
LETTERS = "ABCDEF"

pytestmark = pytest.mark.skipif(not QUESTIONS.exists(), reason="no MindCube-Tiny file")


def _rows():
  return [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]


def _write_images(root: pathlib.Path, rows) -> dict:
  """Tiny images at every path the rows name (MindCube's layout: paths relative to the
  image root), each a distinct colour; PNG bytes for one half, JPEG for the other,
  whatever the extension. Returns {relative path: the bytes written}."""
  written = {}
  for row in rows:
    for relative in row["images"]:
      if relative in written:
        continue
      digest = hashlib.sha256(relative.encode()).digest()
      image = Image.new("RGB", (4, 3), tuple(digest[:3]))
      buffer = io.BytesIO()
      image.save(buffer, format="PNG" if digest[3] % 2 else "JPEG")
      path = root / relative
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_bytes(buffer.getvalue())
      written[relative] = buffer.getvalue()
  return written


def _correct(question_id: str, seed: int) -> bool:
  """The script: whether the server answers this question right under this seed."""
  value = int(hashlib.sha256(question_id.encode()).hexdigest(), 16)
  return (value + seed) % 3 != 0 if value % 2 == 0 else (value + seed) % 4 == 0


def _run(*args: str) -> subprocess.CompletedProcess:
  """python -m launch.eval_benchmark ARGS from the repository root (launch modules are
  run as commands, never imported)."""
  return subprocess.run([sys.executable, "-m", "launch.eval_benchmark", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=120, check=False)


def _options(question: str) -> int:
  return max(k + 1 for k, letter in enumerate(LETTERS) if f" {letter}. " in question)


def test_eval_benchmark_reproduces_scripted_accuracy(tmp_path):
  rows = _rows()
  root = tmp_path / "images"
  written = _write_images(root, rows)
  by_bytes = {data: relative for relative, data in written.items()}
  assert len(by_bytes) == len(written)  # each image identifiable by its bytes
  by_case = {(row["question"], tuple(row["images"])): row for row in rows}
  assert len(by_case) == len(rows)

  def reply_fn(body):
    parts = body["messages"][1]["content"]
    images = []
    for part in parts[:-1]:
      url = part["image_url"]["url"]
      header, data = url.split(",", 1)
      raw = base64.b64decode(data)
      kind = "png" if raw.startswith(b"\x89PNG") else "jpeg"
      assert header == f"data:image/{kind};base64"
      images.append(by_bytes[raw])
    text = parts[-1]["text"]
    assert text.endswith("\n" + endpoint_eval.USER_SUFFIX)
    row = by_case[(text[:-len(endpoint_eval.USER_SUFFIX) - 1], tuple(images))]
    answer, seed = row["gt_answer"], body["seed"]
    if _correct(row["id"], seed):
      return answer
    wrong = [c for c in LETTERS[:_options(row["question"])] if c != answer]
    return wrong[seed % len(wrong)]

  out = tmp_path / "out"
  with ChatServer() as server:
    server.reply_fn = reply_fn
    done = _run("--benchmark", "mindcube_tiny", "--questions", str(QUESTIONS), "--image-root",
                str(root), "--endpoint", server.base_url, "--model", "scripted", "--seeds",
                str(SEEDS), "--concurrency", "16", "--out", str(out), "--api-key-env",
                "JAXSPATIAL_TEST_UNSET_KEY")
    requests = list(server.requests)
  assert done.returncode == 0, done.stderr[-2000:]
  assert str(out / "results.json") in done.stdout

  # every request: the system prompt, the question's images in order, temperature 0, a seed
  assert len(requests) == len(rows) * SEEDS
  seen = collections.Counter()
  for request in requests:
    body = request["body"]
    assert body["model"] == "scripted" and body["temperature"] == 0.0
    assert body["messages"][0] == {"role": "system", "content": endpoint_eval.SYSTEM_PROMPT}
    assert "Authorization" not in request["headers"]
    seen[body["seed"]] += 1
  assert seen == {seed: len(rows) for seed in range(SEEDS)}

  # the independent computation: per seed, per setting (the id's prefix), the mean
  per_seed = collections.defaultdict(lambda: collections.defaultdict(list))
  for row in rows:
    for seed in range(SEEDS):
      per_seed[row["id"].split("_")[0]][seed].append(float(_correct(row["id"], seed)))
  results = json.loads((out / "results.json").read_text())
  assert results["benchmark"] == "mindcube_tiny" and results["primary"] == "no_tools"
  assert list(results["categories"]) == ["rotation", "around", "among"]
  for category, seeds in per_seed.items():
    values = [np.mean(seeds[s]) for s in range(SEEDS)]
    entry = results["categories"][category]
    assert entry["n"] == len(seeds[0]) == {"among": 600, "around": 250, "rotation": 200}[category]
    assert entry["accuracy"] == pytest.approx(np.mean(values), abs=1e-12)
    assert entry["std"] == pytest.approx(np.std(values, ddof=1), abs=1e-12)
    assert entry["std"] > 0
  everything = [np.mean([_correct(r["id"], s) for r in rows]) for s in range(SEEDS)]
  assert results["overall"]["n"] == len(rows)
  assert results["overall"]["accuracy"] == pytest.approx(np.mean(everything), abs=1e-12)
  assert results["overall"]["std"] == pytest.approx(np.std(everything, ddof=1), abs=1e-12)
  assert "Rotation" in (out / "results.md").read_text()

  # predictions.jsonl: every raw reply, one row per question per seed
  replies = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
  assert len(replies) == len(rows) * SEEDS
  answers = {row["id"]: row["gt_answer"] for row in rows}
  for reply in replies:
    assert (reply["reply"] == answers[reply["question_id"]]) == _correct(
        reply["question_id"], reply["seed"])
  run = json.loads((out / "run.json").read_text())
  assert run["requests"]["sent"] == len(rows) * SEEDS and run["questions"] == len(rows)


def test_limit_and_missing_image(tmp_path):
  rows = _rows()
  root = tmp_path / "images"
  _write_images(root, rows[:5])
  with ChatServer() as server:
    server.reply_fn = lambda body: "A"
    done = _run("--benchmark", "mindcube_tiny", "--questions", str(QUESTIONS), "--image-root",
                str(root), "--endpoint", server.base_url, "--model", "m", "--seeds", "1",
                "--limit", "5", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(server.requests) == 5
  results = json.loads((tmp_path / "out" / "results.json").read_text())
  assert results["overall"]["n"] == 5 and results["overall"]["std"] == 0.0
  assert results["overall"]["accuracy"] == np.mean([r["gt_answer"] == "A" for r in rows[:5]])

  # one image gone: the command fails before any request, naming the file, row, id and
  # the image's path
  gone = rows[0]["images"][1]
  (root / gone).unlink()
  with ChatServer() as server:
    done = _run("--benchmark", "mindcube_tiny", "--questions", str(QUESTIONS), "--image-root",
                str(root), "--endpoint", server.base_url, "--model", "m", "--limit", "5",
                "--out", str(tmp_path / "out2"))
    assert not server.requests
  assert done.returncode == 2, done.stderr
  assert f"{QUESTIONS}: row 1 (id {rows[0]['id']!r}), field 'images'" in done.stderr
  assert f"image not found: {root / gone}" in done.stderr
  assert not (tmp_path / "out2").exists()
  with pytest.raises(MissingImageError, match=gone) as caught:
    endpoint_eval.read_questions("mindcube_tiny", QUESTIONS, root, limit=5)
  assert caught.value.image == str(root / gone) and caught.value.row == 1


def test_image_data_url_keeps_bytes_and_reencodes_others(tmp_path):
  png = io.BytesIO()
  Image.new("RGB", (2, 2), (1, 2, 3)).save(png, format="PNG")
  (tmp_path / "a.jpg").write_bytes(png.getvalue())
  url = endpoint_eval.image_data_url(tmp_path / "a.jpg")
  assert url == "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
  bmp = io.BytesIO()
  Image.new("RGB", (2, 2), (9, 8, 7)).save(bmp, format="BMP")
  (tmp_path / "b.bmp").write_bytes(bmp.getvalue())
  header, data = endpoint_eval.image_data_url(tmp_path / "b.bmp").split(",", 1)
  assert header == "data:image/png;base64"
  assert Image.open(io.BytesIO(base64.b64decode(data))).getpixel((1, 1)) == (9, 8, 7)
  (tmp_path / "c.png").write_bytes(b"not an image")
  with pytest.raises(ValueError, match="c.png"):
    endpoint_eval.image_data_url(tmp_path / "c.png")


def test_failed_request_keeps_the_finished_seeds(tmp_path):
  rows = _rows()[:4]
  root = tmp_path / "images"
  _write_images(root, rows)
  questions = endpoint_eval.read_questions("mindcube_tiny", QUESTIONS, root, limit=4)

  def reply_fn(body):
    if body["seed"] == 1:
      raise RuntimeError("scripted failure")  # the server drops the connection
    return "B"

  with ChatServer() as server:
    server.reply_fn = reply_fn
    endpoint = ChatEndpoint(server.base_url, "m", api_key_env=None, retries=0,
                                          concurrency=2)
    with pytest.raises(JudgeError):
      endpoint_eval.evaluate_endpoint(questions, endpoint, "mindcube_tiny", tmp_path / "out",
                                      seeds=(0, 1))
  assert endpoint.extra_body == {}
  kept = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text()
          .splitlines()]
  assert [(r["seed"], r["question_id"], r["reply"]) for r in kept] == [
      (0, row["id"], "B") for row in rows]
  assert not (tmp_path / "out" / "results.json").exists()
