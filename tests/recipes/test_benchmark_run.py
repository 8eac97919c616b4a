"""launch.build_benchmark + launch.eval --benchmark end to end on the real MindCube-Tiny file
(images written by the test in MindCube's layout): a scripted OpenAI-compatible server whose
answers are known (per question and seed) gives per-category accuracy, n and spread that the
test computes independently; with Think3D's agent the tools setting runs the agent's
episodes (a view-tool call, then the answer) beside no_tools; and a tiny policy folder is
evaluated on device (no tools and compiled Think3D rollouts)."""

import base64
import collections
import hashlib
import io
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from data_pipelines.caches import write_think3d_cache
from data_pipelines.readers.mindcube import read_mindcube
from data_pipelines.scene_caches import cache_name
from jaxspatial.geometry import PointCloud
from jaxspatial.rollout.agents import Think3DAgent
from recipes import benchmark_run
from tests.eval import official_scorers
from tests.perception.chat_server import ChatServer
from tests.rollout import test_viewer as pages

REPO = pathlib.Path(__file__).resolve().parents[2]
QUESTIONS = REPO.parent / "shared" / "data" / "benchmarks" / "mindcube_tiny_questions.jsonl"
SEEDS = 3
LETTERS = "ABCDEF"
COUNTS = {"among": 600, "around": 250, "rotation": 200}

pytestmark = pytest.mark.skipif(not QUESTIONS.exists(), reason="no MindCube-Tiny file")


def _rows():
  return [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]


def _write_images(root: pathlib.Path, rows) -> None:
  for row in rows:
    for relative in row["images"]:
      path = root / relative
      if path.exists():
        continue
      digest = hashlib.sha256(relative.encode()).digest()
      path.parent.mkdir(parents=True, exist_ok=True)
      buffer = io.BytesIO()
      Image.new("RGB", (8, 6), tuple(digest[:3])).save(buffer, format="JPEG")
      path.write_bytes(buffer.getvalue())


def _colour(relative: str) -> np.ndarray:
  return np.asarray(list(hashlib.sha256(relative.encode()).digest()[:3]), np.int64)


def _centre(url: str) -> np.ndarray:
  """The centre pixel of a data-URL image."""
  image = np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
                     .convert("RGB"))
  return image[image.shape[0] // 2, image.shape[1] // 2].astype(np.int64)


def _correct(question_id: str, seed: int) -> bool:
  value = int(hashlib.sha256(question_id.encode()).hexdigest(), 16)
  return (value + seed) % 3 != 0 if value % 2 == 0 else (value + seed) % 4 == 0


def _chatty(row, seed: int) -> str:
  """The scripted model's reply to (row, seed): the letter it means (right or wrong by
  `_correct`) in one of the chatty forms real API models write."""
  answer = row["gt_answer"]
  options = max(k + 1 for k, c in enumerate(LETTERS) if f" {c}. " in row["question"])
  wrong = [c for c in LETTERS[:options] if c != answer]
  meant = answer if _correct(row["id"], seed) else wrong[seed % len(wrong)]
  rng = np.random.default_rng(int(hashlib.sha256(row["id"].encode()).hexdigest()[:8], 16)
                              + seed)
  return official_scorers.chatty_replies(rng, meant, LETTERS[:options])


def _run(module: str, *args: str, timeout: int = 600,
         env: dict | None = None) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True,
                        text=True, timeout=timeout, check=False,
                        env=None if env is None else {**os.environ, **env})


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  """MindCube-Tiny built from the real question file: (data dir, rows, source folder)."""
  root = tmp_path_factory.mktemp("mindcube")
  rows = _rows()
  _write_images(root / "source", rows)
  done = _run("launch.build_benchmark", "--benchmark", "mindcube_tiny", "--source",
              str(root / "source"), "--questions", str(QUESTIONS), "--data_dir",
              str(root / "data"), "--width", "32", "--height", "24")
  assert done.returncode == 0, done.stderr[-3000:]
  # The builder's counts, printed per category, are the file's.
  assert "1050 questions" in done.stdout
  for category, n in COUNTS.items():
    assert f"{category} {n}" in done.stdout
  return root / "data", rows, root / "source"


def _user_text(body) -> str:
  return body["messages"][-1]["content"][-1]["text"] if isinstance(
      body["messages"][-1]["content"], list) else body["messages"][-1]["content"]


def test_no_tools_scores_chatty_replies_as_mindcube_does(built, tmp_path):
  data, rows, _ = built
  by_text = collections.defaultdict(list)
  for row in rows:
    by_text[row["question"]].append(row)

  def reply_fn(body):
    parts = body["messages"][1]["content"]
    text = parts[-1]["text"]
    # Questions repeat texts over image sets: the row is the one whose images' colours the
    # request's images carry, in order (each image a solid colour from its path's hash).
    shown = [_centre(part["image_url"]["url"]) for part in parts[:-1]]
    row = min((r for r in by_text[text] if len(r["images"]) == len(shown)),
              key=lambda r: sum(np.abs(_colour(i) - c).sum() for i, c in zip(r["images"],
                                                                             shown)))
    assert all(np.abs(_colour(i) - c).max() <= 8 for i, c in zip(row["images"], shown))
    return _chatty(row, body["seed"])

  out = tmp_path / "out"
  with ChatServer() as server:
    server.reply_fn = reply_fn
    done = _run("launch.eval", "--benchmark", "mindcube_tiny", "--data_dir", str(data),
                "--endpoint", server.base_url, "--model", "scripted", "--seeds", str(SEEDS),
                "--out", str(out), "--api_key_env", "JAXSPATIAL_TEST_UNSET_KEY")
    requests = list(server.requests)
  assert done.returncode == 0, done.stderr[-3000:]
  assert len(requests) == len(rows) * SEEDS
  assert {r["body"]["messages"][0]["content"] for r in requests} == {
      benchmark_run.LETTER_PROMPT}

  # Scored as MindCube's official extractor reads each chatty reply (not as it was meant).
  official = {(row["id"], seed): official_scorers.mindcube_correct(_chatty(row, seed),
                                                                   row["gt_answer"])
              for row in rows for seed in range(SEEDS)}
  per_category = collections.defaultdict(lambda: collections.defaultdict(list))
  for row in rows:
    for seed in range(SEEDS):
      per_category[row["id"].split("_")[0]][seed].append(float(official[row["id"], seed]))
  results = json.loads((out / "results.json").read_text())
  assert list(results["categories"]) == ["rotation", "around", "among"]
  for category, seeds in per_category.items():
    values = [np.mean(seeds[s]) for s in range(SEEDS)]
    entry = results["categories"][category]
    assert entry["n"] == COUNTS[category]
    assert entry["accuracy"] == pytest.approx(np.mean(values), abs=1e-12)
    assert entry["std"] == pytest.approx(np.std(values, ddof=1), abs=1e-12)
  overall = [np.mean([official[r["id"], s] for r in rows]) for s in range(SEEDS)]
  assert results["overall"]["accuracy"] == pytest.approx(np.mean(overall), abs=1e-12)
  meant = np.mean([_correct(r["id"], s) for r in rows for s in range(SEEDS)])
  assert abs(np.mean(overall) - meant) > 0.01  # some chatty forms read as another letter
  predictions = (out / "predictions.jsonl").read_text().splitlines()
  assert len(predictions) == len(rows) * SEEDS
  page = (out / "episodes.html").read_text()
  assert page.count("class=q>") == 50 and "views/00000_no_tools_0.png" in page
  assert (out / "views" / "00000_no_tools_0.png").exists()
  assert "Rotation" in (out / "results.md").read_text()
  for name in ("results.json", "results.md", "predictions.jsonl", "run.json", "episodes.html"):
    assert (out / name).stat().st_mode & 0o777 == 0o644, name  # readable, as files are


def test_episodes_page_shows_question_reference_prediction_parsed_answer_and_views(tmp_path):
  """episodes.html read as a reader reads it: per question its text, options and reference;
  per setting the prediction, the letter MindCube's scorer reads in it and its verdict,
  and every view the model saw, framed and numbered; model text escaped."""
  rows = _rows()[:3]
  questions = {q.question_id: q for q in read_mindcube(QUESTIONS, check_images=False)[:3]}
  spec = benchmark_run.named_protocol("mindcube_tiny")
  records = []
  for place, row in enumerate(rows):
    q = questions[row["id"]]
    # White views with a dark mark: the frame, not the image, must set them off the page.
    views = [np.full((24, 32, 3), 255, np.uint8) for _ in q.images]
    for k, view in enumerate(views):
      view[8:16, 4 + 6 * k:10 + 6 * k] = (40, 40, 160)
    hostile = f"{pages.HOSTILE} {'x' * 300}\nThe answer is {row['gt_answer']}."
    for setting, shown, prediction in (("no_tools", views, _chatty(row, place)),
                                       ("tools", views + [views[0]], hostile)):
      records.append({
          "setting": setting, "question_id": q.question_id, "prediction": prediction,
          "score": spec.score(q, prediction), "error": None,
          "views": benchmark_run.save_views(shown, tmp_path, f"{place:05d}_{setting}"),
          "turns": [prediction] if setting == "no_tools" else ["<tool_call>...", prediction]})
  page = benchmark_run.episodes_html(questions, records, "MindCube-Tiny")
  (tmp_path / "episodes.html").write_text(page)
  assert "<script" not in page and "overflow-wrap:anywhere" in page
  tree = pages.parse_page(page)
  assert not tree.find("script")
  blocks = tree.find("div", "q")
  assert len(blocks) == len(rows)
  for block, row in zip(blocks, rows):
    q = questions[row["id"]]
    assert pages.field(block, "question") == q.question
    assert [li.text() for li in block.find("dd", "options")[0].find("li")] == [
        f"{'ABCDEF'[k]}. {o}" for k, o in enumerate(q.options)]
    assert pages.field(block, "reference") == row["gt_answer"]
    sections = block.find("section", "episode")
    assert [s.find("h4")[0].text() for s in sections] == ["no_tools", "tools"]
    mine = [r for r in records if r["question_id"] == q.question_id]
    for section, record in zip(sections, mine):
      assert pages.field(section, "prediction") == record["prediction"]
      letter = official_scorers.mindcube_extract(record["prediction"])
      verdict = "correct" if letter == row["gt_answer"] else "incorrect"
      assert pages.field(section, "parsed") == (
          f"{letter or 'nothing parsed'} {verdict} (score {record['score']:.2f})")
      pages.check_views(section, len(record["views"]))
      for figure, name in zip(section.find("figure", "view"), record["views"]):
        assert figure.find("img")[0].attrs["src"] == f"views/{name}"
      last = len(record["views"])
      source = "from a tool" if last > len(q.images) else "input"
      assert section.find("figcaption")[-1].text() == f"View {last} ({source})"


def _caches(rows, folder: pathlib.Path) -> None:
  """A Think3D cache per image set of the first questions (a small coloured cloud) and the
  manifest scene_caches writes."""
  sets = {}
  for row in rows:
    sets.setdefault(tuple(row["images"]), []).append(row["id"])
  rng = np.random.default_rng(0)
  manifest = {"format": "think3d-cache", "backend": "test", "sets": [], "failed": []}
  for images, ids in sets.items():
    name = cache_name(images)
    xyz = rng.uniform(-1, 1, (256, 3)).astype(np.float32) + np.float32([0, 0, 3])
    poses = np.tile(np.eye(4, dtype=np.float32), (len(images), 1, 1))
    write_think3d_cache(folder / name, PointCloud.create(xyz, rng.uniform(0, 1, (256, 3))
                                                         .astype(np.float32)), poses, images)
    manifest["sets"].append({"images": list(images), "cache": name, "questions": ids})
  (folder / "manifest.json").write_text(json.dumps(manifest))


def build_small(tmp_path: pathlib.Path, rows, width: int, height: int) -> pathlib.Path:
  """`rows` of MindCube-Tiny built through launch.build_benchmark with their images and a
  Think3D cache per image set, views at width x height: the data folder."""
  questions = tmp_path / "questions.jsonl"
  questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
  _write_images(tmp_path / "source", rows)
  (tmp_path / "caches").mkdir()
  _caches(rows, tmp_path / "caches")
  done = _run("launch.build_benchmark", "--benchmark", "mindcube_tiny", "--source",
              str(tmp_path / "source"), "--questions", str(questions), "--data_dir",
              str(tmp_path / "data"), "--width", str(width), "--height", str(height),
              "--caches", str(tmp_path / "caches"))
  assert done.returncode == 0, done.stderr[-3000:]
  return tmp_path / "data"


def test_tools_and_no_tools_side_by_side(tmp_path):
  """Think3D's episodes from an endpoint: turn 1 asks for a view, turn 2 answers (right
  for even seeds' scripted questions); the two settings and their difference."""
  rows = [r for r in _rows() if r["id"].startswith("rotation")][:6]
  build_small(tmp_path, rows, 64, 48)
  writer = Think3DAgent()
  by_text = {r["question"]: r for r in rows}

  def reply_fn(body):
    messages = body["messages"]
    first = messages[1]["content"]
    text = "".join(p.get("text", "") for p in first) if isinstance(first, list) else first
    row = next(r for q, r in by_text.items() if q in text)
    if messages[0]["content"] == benchmark_run.LETTER_PROMPT:
      return "A"  # no tools: always A
    if sum(m["role"] == "assistant" for m in messages) == 0:
      return writer.call_turn("Look from the left.", camera=1, azimuth=-45, elevation=30)
    return writer.answer_turn("Seen.", row["gt_answer"])

  out = tmp_path / "out"
  with ChatServer() as server:
    server.reply_fn = reply_fn
    # The user's OpenAI key is in the environment, no --api_key_env: a loopback endpoint
    # must not receive it.
    done = _run("launch.eval", "--benchmark", "mindcube_tiny", "--data_dir",
                str(tmp_path / "data"), "--endpoint", server.base_url, "--model", "scripted",
                "--agent", "think3d", "--seeds", "2", "--out", str(out), "--config",
                "configs/think3d_rl.py:cpu", "--config.agent.width=64",
                "--config.agent.height=48", env={"OPENAI_API_KEY": "sk-not-for-loopback"})
    headers = [r["headers"] for r in server.requests]
  assert done.returncode == 0, done.stderr[-3000:]
  assert headers and not any("Authorization" in h for h in headers)
  results = json.loads((out / "results.json").read_text())
  expected_no_tools = np.mean([r["gt_answer"] == "A" for r in rows])
  assert results["settings"]["tools"]["overall"]["accuracy"] == pytest.approx(1.0)
  assert results["settings"]["no_tools"]["overall"]["accuracy"] == pytest.approx(
      expected_no_tools)
  page = (out / "episodes.html").read_text()
  assert "<tool_call>" in page or "tool_call" in page
  # The tools episodes saw the input views and a rendered view.
  assert len(list((out / "views").glob("*_tools_*.png"))) > len(
      list((out / "views").glob("*_no_tools_*.png")))


def test_failed_requests_are_counted_wrong_and_named(tmp_path):
  """Two questions' requests fail for good (HTTP 400, no retry): the run finishes the
  others, scores those two 0, names their errors in predictions.jsonl, counts them per
  category in results.json and results.md, and exits non-zero over --max_failed_share."""
  rows = [r for r in _rows() if r["id"].startswith("rotation")][:6]
  build_small(tmp_path, rows, 64, 48)
  failing = {rows[1]["question"], rows[4]["question"]}

  def text(body):
    return "".join(p.get("text", "") for p in body["messages"][1]["content"])

  out = tmp_path / "out"
  with ChatServer() as server:
    server.reply_fn = lambda body: next(f"The answer is {r['gt_answer']}." for r in rows
                                        if r["question"] in text(body))
    server.status_fn = lambda body: 400 if any(q in text(body) for q in failing) else None
    done = _run("launch.eval", "--benchmark", "mindcube_tiny", "--data_dir",
                str(tmp_path / "data"), "--endpoint", server.base_url, "--model", "scripted",
                "--seeds", "1", "--out", str(out), "--max_tokens", "32",
                "--request_timeout_s", "20", "--retries", "1")
    sent = [r["body"] for r in server.requests]
  assert len(sent) == len(rows)  # one request each: a 400 is not retried, nothing aborted
  # The setting's progress bar ends at 6 / 6 with the running accuracy and the failures.
  assert "mindcube_tiny no_tools: 100%" in done.stderr and "6/6" in done.stderr
  assert "acc=0.667, failed=2" in done.stderr
  assert f"{out}/predictions.jsonl" in done.stdout and f"{out}/run.json" in done.stdout
  assert {b["max_tokens"] for b in sent} == {32}
  assert done.returncode != 0
  message = done.stderr.strip().splitlines()[-1]
  assert "no_tools 2 of 6 (Rotation 2)" in message and "--max_failed_share 0.1" in message
  predictions = [json.loads(line) for line in (out / "predictions.jsonl").read_text()
                 .splitlines()]
  errors = {p["question_id"]: p["error"] for p in predictions if p["error"]}
  assert set(errors) == {rows[1]["id"], rows[4]["id"]}
  assert all(e.startswith("policy endpoint ") and "HTTP 400" in e for e in errors.values())
  assert all(p["score"] == (0.0 if p["error"] else 1.0) for p in predictions)
  results = json.loads((out / "results.json").read_text())
  assert results["failures"]["no_tools"] == {"items": 6, "failed": 2,
                                             "categories": {"rotation": 2}}
  assert results["overall"]["accuracy"] == pytest.approx(4 / 6)
  assert "no_tools 2 of 6 (Rotation 2)" in (out / "results.md").read_text()


@pytest.mark.slow
def test_policy_folder_on_device(tmp_path):
  """A tiny Qwen2.5-VL folder as the backend: no-tools answers through the serving engine
  and Think3D's compiled rollouts, both settings scored and written."""
  from jaxspatial import models  # pylint: disable=import-outside-toplevel
  from jaxspatial.models.qwen2_5_vl.tokenizer import save_processor  # pylint: disable=import-outside-toplevel
  from jaxspatial.rollout import tiny  # pylint: disable=import-outside-toplevel
  from tests import chat_templates  # pylint: disable=import-outside-toplevel
  rows = [r for r in _rows() if r["id"].startswith("around")][:3]
  build_small(tmp_path, rows, 56, 56)
  folder = tmp_path / "policy"
  tok = tiny.tokenizer()
  model = tiny.model(tok, "qwen2_5_vl", seed=3)
  models.export(model, folder)
  tok.chat_template = chat_templates.INSTRUCT
  save_processor(folder, tok, model)
  chat_templates.write_generation_config(folder, tok)
  out = tmp_path / "out"
  done = _run("launch.eval", "--benchmark", "mindcube_tiny", "--data_dir",
              str(tmp_path / "data"), "--checkpoint", str(folder), "--agent", "think3d",
              "--seeds", "1", "--batch", "4", "--out", str(out), "--config",
              "configs/think3d_rl.py:cpu", "--config.agent.width=56",
              "--config.agent.height=56")
  assert done.returncode == 0, done.stderr[-3000:]
  results = json.loads((out / "results.json").read_text())
  assert set(results["settings"]) == {"no_tools", "tools"}
  for setting in ("no_tools", "tools"):
    assert results["settings"][setting]["overall"]["n"] == len(rows)
  predictions = [json.loads(line) for line in
                 (out / "predictions.jsonl").read_text().splitlines()]
  assert len(predictions) == 2 * len(rows)
  run = json.loads((out / "run.json").read_text())
  assert run["backend"]["kind"] == "checkpoint" and run["agent"] == "think3d"
  assert (out / "episodes.html").read_text().count("class=q>") == len(rows)


SCANQA = REPO.parent / "shared" / "data" / "benchmarks" / "scanqa_v1.0_val.json"


@pytest.mark.skipif(not SCANQA.exists(), reason="no ScanQA file")
def test_scanqa_act3d_episodes_judged(tmp_path):
  """ScanQA on ScanNet-layout scans: Act3D's episodes from an endpoint (one camera move, then
  the answer: the reference for even questions, a wrong phrase for odd ones) and no-tools
  answers (always the reference), both scored by a judge endpoint's verdicts."""
  from jaxspatial.rollout.agents import Act3DAgent  # pylint: disable=import-outside-toplevel
  from tests.data_pipelines.test_scannet import tiny_scan  # pylint: disable=import-outside-toplevel
  records = json.loads(SCANQA.read_text())
  scenes = list(dict.fromkeys(r["scene_id"] for r in records))[:2]
  rows = [r for s in scenes for r in [r for r in records if r["scene_id"] == s][:3]]
  source = tmp_path / "source"
  source.mkdir()
  (source / "ScanQA_v1.0_val.json").write_text(json.dumps(rows))
  rng = np.random.default_rng(0)
  for scene in scenes:
    ids = sorted({i for r in rows if r["scene_id"] == scene for i in r["object_ids"]})
    tiny_scan(source / "scans", scene, [(i, f"object{i}") for i in ids], rng)
  done = _run("launch.build_benchmark", "--benchmark", "scanqa", "--source", str(source),
              "--data_dir", str(tmp_path / "data"), "--width", "64", "--height", "48")
  assert done.returncode == 0, done.stderr[-3000:]
  assert f"{len(rows)} questions" in done.stdout
  writer = Act3DAgent()
  good = {r["question"]: k % 2 == 0 for k, r in enumerate(rows)}
  answers = {r["question"]: r["answers"][0] for r in rows}

  def reply_fn(body):
    messages = body["messages"]
    first = messages[1]["content"]
    text = "".join(p.get("text", "") for p in first) if isinstance(first, list) else first
    question = next(q for q in answers if q in text)
    if messages[0]["content"] == benchmark_run.PHRASE_PROMPT:
      return answers[question]
    if sum(m["role"] == "assistant" for m in messages) == 0:
      return writer.call_turn("Step closer.", "forward", 0.5)
    return writer.answer_turn("Seen.", answers[question] if good[question] else "zebra")

  out = tmp_path / "out"
  with ChatServer() as agent_server, ChatServer() as judge_server:
    agent_server.reply_fn = reply_fn
    done = _run("launch.eval", "--benchmark", "scanqa", "--data_dir", str(tmp_path / "data"),
                "--endpoint", agent_server.base_url, "--model", "scripted", "--agent",
                "act3d", "--seeds", "1", "--out", str(out), "--api_key_env",
                "JAXSPATIAL_TEST_UNSET_KEY", "--judge_url", judge_server.base_url,
                "--config", "configs/act3d_grpo.py:cpu", "--config.judge.model=judge",
                "--config.judge.api_key_env=JAXSPATIAL_TEST_UNSET_KEY")
    judged = len(judge_server.requests)
  assert done.returncode == 0, done.stderr[-3000:]
  assert judged == 2 * len(rows)  # every answer of both settings went to the judge
  stats = json.loads((out / "run.json").read_text())["judge_stats"]
  assert stats["unreadable"] == 0 and stats["correct"] + stats["incorrect"] == judged
  results = json.loads((out / "results.json").read_text())
  assert results["settings"]["no_tools"]["overall"]["accuracy"] == pytest.approx(1.0)
  assert results["settings"]["tools"]["overall"]["accuracy"] == pytest.approx(
      np.mean(list(good.values())))
  page = (out / "episodes.html").read_text()
  assert "forward" in page and page.count("class=q>") == len(rows)


def test_a_dropped_request_fails_its_item_not_the_run(built, tmp_path):
  """Requests that fail for good (the server drops seed 1's connections) are that seed's
  failed items: the run finishes and writes every file, the failures counted; the
  endpoint's seed field is restored."""
  from jaxspatial.perception.judge import ChatEndpoint  # pylint: disable=import-outside-toplevel
  from recipes.benchmark_backends import EndpointBackend  # pylint: disable=import-outside-toplevel
  data, _, _ = built

  def reply_fn(body):
    if body["seed"] == 1:
      raise RuntimeError("scripted failure")  # the server drops the connection
    return "B"

  with ChatServer() as server:
    server.reply_fn = reply_fn
    endpoint = ChatEndpoint(server.base_url, "m", api_key_env=None, retries=0, concurrency=2)
    document = benchmark_run.run_benchmark("mindcube_tiny", data, tmp_path / "out",
                                           EndpointBackend(endpoint), seeds=(0, 1), limit=4)
  assert endpoint.extra_body == {}
  kept = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text()
          .splitlines()]
  assert [(r["seed"], r["prediction"], r["error"] is None) for r in kept] == (
      [(0, "B", True)] * 4 + [(1, "", False)] * 4)
  assert all("chat endpoint" in r["error"] for r in kept[4:])
  assert document["failures"]["no_tools"]["failed"] == 4
  assert (tmp_path / "out" / "results.json").exists()


def test_missing_backend_and_unprepared_benchmark(tmp_path):
  done = _run("launch.eval", "--benchmark", "mindcube_tiny", "--data_dir", str(tmp_path),
              "--out", str(tmp_path / "out"))
  assert done.returncode != 0 and "--checkpoint HF_FOLDER or --endpoint URL" in done.stderr
  done = _run("launch.eval", "--benchmark", "mindcube_tiny", "--data_dir", str(tmp_path),
              "--endpoint", "http://127.0.0.1:9/v1", "--model", "m", "--out",
              str(tmp_path / "out"), "--api_key_env", "")
  assert done.returncode != 0
  assert "launch.build_benchmark --benchmark mindcube_tiny" in done.stderr


def test_think3d_needs_clouds_or_reconstruction(built, tmp_path):
  from jaxspatial.perception.judge import ChatEndpoint  # pylint: disable=import-outside-toplevel
  from recipes.benchmark_backends import EndpointBackend  # pylint: disable=import-outside-toplevel
  data, _, _ = built
  backend = EndpointBackend(ChatEndpoint("http://127.0.0.1:9/v1", "m", api_key_env=None))
  with pytest.raises(ValueError, match="without point clouds.*--caches.*reconstruction"):
    benchmark_run.run_benchmark("mindcube_tiny", data, tmp_path / "out", backend,
                                agent=Think3DAgent(), settings=("tools",), limit=2)


def test_limit_and_ids_are_the_files_questions(built, tmp_path):
  """--limit 20: exactly the question file's first 20 ids (the build groups them by image
  set, in another order); --ids: those named, in the file's order of the ids file; each
  recorded in that order."""
  from jaxspatial.perception.judge import ChatEndpoint  # pylint: disable=import-outside-toplevel
  from recipes.benchmark_backends import EndpointBackend  # pylint: disable=import-outside-toplevel
  data, rows, _ = built
  asked = [r["id"] for r in rows[:20]]
  named = [rows[700]["id"], rows[3]["id"], rows[1049]["id"]]
  (tmp_path / "ids.txt").write_text("# three\n" + "\n".join(named) + "\n")
  with ChatServer() as server:
    server.reply_fn = lambda body: "A"
    backend = EndpointBackend(ChatEndpoint(server.base_url, "m", api_key_env=None))
    benchmark_run.run_benchmark("mindcube_tiny", data, tmp_path / "first", backend,
                                seeds=(0,), limit=20, progress=False)
    sent = len(server.requests)
    done = _run("launch.eval", "--benchmark", "mindcube_tiny", "--data_dir", str(data),
                "--endpoint", server.base_url, "--model", "m", "--seeds", "1", "--ids",
                str(tmp_path / "ids.txt"), "--out", str(tmp_path / "named"))
  assert done.returncode == 0, done.stderr[-3000:]
  assert sent == 20
  first = [json.loads(line)["question_id"]
           for line in (tmp_path / "first" / "predictions.jsonl").read_text().splitlines()]
  assert first == asked
  # The file's first 20 are not the build's first 20 records' questions.
  assert asked != [q.question_id for q in benchmark_run.stored_questions(
      benchmark_run.load_benchmark("mindcube_tiny", data, images=False), "mindcube_tiny")][:20]
  kept = [json.loads(line)["question_id"]
          for line in (tmp_path / "named" / "predictions.jsonl").read_text().splitlines()]
  assert kept == named
  (tmp_path / "bad.txt").write_text("no_such_question\n")
  done = _run("launch.eval", "--benchmark", "mindcube_tiny", "--data_dir", str(data),
              "--endpoint", "http://127.0.0.1:9/v1", "--model", "m", "--ids",
              str(tmp_path / "bad.txt"), "--out", str(tmp_path / "bad"))
  assert done.returncode != 0 and "no_such_question" in done.stderr


def test_reasoning_replies_are_read_for_their_answer(built, tmp_path):
  """A reasoning model's replies: the answer after a <think> block is scored, not the
  reasoning; a reply cut at its token budget (content null, the text in
  reasoning_content) is an answer without a letter, scored wrong, not a failed run."""
  from jaxspatial.perception.judge import ChatEndpoint  # pylint: disable=import-outside-toplevel
  from recipes.benchmark_backends import EndpointBackend  # pylint: disable=import-outside-toplevel
  data, rows, _ = built
  first = {r["question"]: r for r in rows[:4]}

  def reply_body(body):
    text = _user_text(body)
    row = next(r for q, r in first.items() if q in text)
    k = rows.index(row)
    if k % 2:  # cut at the budget: no content, the reasoning apart
      message = {"role": "assistant", "content": None,
                 "reasoning_content": f"Looking at image 2 the answer must be {row['gt_answer']}"}
    else:
      wrong = "B" if row["gt_answer"] == "A" else "A"
      message = {"role": "assistant",
                 "content": f"<think>Maybe {wrong}? No.</think>\n{row['gt_answer']}"}
    return json.dumps({"choices": [{"index": 0, "message": message,
                                    "finish_reason": "length" if k % 2 else "stop"}]}).encode()

  with ChatServer() as server:
    server.body_fn = reply_body
    backend = EndpointBackend(ChatEndpoint(server.base_url, "m", api_key_env=None))
    document = benchmark_run.run_benchmark("mindcube_tiny", data, tmp_path / "out", backend,
                                           seeds=(0,), limit=4, progress=False)
  kept = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text()
          .splitlines()]
  assert [(r["prediction"], r["score"], r["error"]) for r in kept] == [
      (rows[0]["gt_answer"], 1.0, None), ("", 0.0, None), (rows[2]["gt_answer"], 1.0, None),
      ("", 0.0, None)]
  assert document["failures"]["no_tools"]["failed"] == 0
  assert "Looking at image 2" in (tmp_path / "out" / "episodes.html").read_text()
