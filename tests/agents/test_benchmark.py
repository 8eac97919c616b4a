"""`launch.eval --benchmark mindcube_tiny --agent spatialclaw --endpoint ...` end to end on a
tiny MindCube-Tiny build (Think3D caches, so Reconstruct draws the stored cloud): a scripted
endpoint plans, reconstructs and shows a view, then answers with the reference letter;
no_tools always answers A. Both settings are scored and written."""

import json
import re

import numpy as np
import pytest

from recipes import benchmark_run
from tests.perception.chat_server import ChatServer
from tests.recipes.test_benchmark_run import QUESTIONS, _rows, _run, build_small

pytestmark = pytest.mark.skipif(not QUESTIONS.exists(), reason="no MindCube-Tiny file")

PLAN = ('**Task Analysis**\nrotation\n**Verification Checklist**\n'
        '[{"priority": "HIGH", "description": "geometry checked"}]')
LOOK = """**Purpose**
Reconstruct the first view.
**Reasoning**
Geometry first. Verified: 1
**Next Goal**
Answer.
**Code**
```python
rec = tools.Reconstruct(frames=[0])
print("points", rec["points"].shape, int(rec["valid"].sum()) > 0)
show(InputImages[0], "view 0")
```"""


def test_spatialclaw_on_mindcube_tiny(tmp_path):
  rows = [r for r in _rows() if r["id"].startswith("rotation")][:3]
  build_small(tmp_path, rows, 64, 48)
  by_question = {r["question"]: r for r in rows}

  def reply_fn(body):
    messages = body["messages"]
    system = messages[0]["content"]
    if system == benchmark_run.LETTER_PROMPT:
      return "A"
    if system.startswith("You plan how to answer"):
      return PLAN
    first = messages[1]["content"]
    text = "".join(p.get("text", "") for p in first)
    row = next(r for q, r in by_question.items() if q in text)
    if sum(m["role"] == "assistant" for m in messages) == 0:
      return LOOK
    return LOOK.split("**Code**")[0] + f'**Code**\n```python\nReturnAnswer("{row["gt_answer"]}")\n```'

  out = tmp_path / "out"
  with ChatServer() as server:
    server.reply_fn = reply_fn
    done = _run("launch.eval", "--benchmark", "mindcube_tiny", "--data_dir",
                str(tmp_path / "data"), "--endpoint", server.base_url, "--model", "scripted",
                "--agent", "spatialclaw", "--seeds", "1", "--out", str(out), "--api_key_env",
                "JAXSPATIAL_TEST_UNSET_KEY", "--config", "configs/spatialclaw.py:cpu",
                "--config.kernel.cell_timeout_s=30")
    bodies = [r["body"] for r in server.requests]
  assert done.returncode == 0, done.stderr[-3000:]
  results = json.loads((out / "results.json").read_text())
  assert results["settings"]["tools"]["overall"]["accuracy"] == pytest.approx(1.0)
  assert results["settings"]["no_tools"]["overall"]["accuracy"] == pytest.approx(
      np.mean([r["gt_answer"] == "A" for r in rows]))
  # Per question: no_tools 1 request; SpatialClaw a plan and two steps, seeded.
  assert len(bodies) == len(rows) * 4 and all(b["seed"] == 0 for b in bodies)
  agent = [b for b in bodies if b["messages"][0]["content"] != benchmark_run.LETTER_PROMPT]
  assert {b["temperature"] for b in agent} == {0.6}
  predictions = [json.loads(line) for line in (out / "predictions.jsonl").read_text()
                 .splitlines()]
  tools = [p for p in predictions if p["setting"] == "tools"]
  assert sorted(p["prediction"] for p in tools) == sorted(r["gt_answer"] for r in rows)
  page = (out / "episodes.html").read_text()
  assert page.count("== Step 1 feedback ==") == len(rows)
  assert re.search(r"points \(1, 48, 64, 3\) True", page)
  assert "Reconstruct x1" in page and "Answer submitted:" in page
  # The tools setting's views: the frames shown, then the image the step showed.
  shown = [p for p in (out / "views").glob("*_tools_*.png") if "_no_tools_" not in p.name]
  assert len(shown) == sum(len(r["images"]) + 1 for r in rows)
  run = json.loads((out / "run.json").read_text())
  assert run["agent"] == "spatialclaw" and run["settings"] == ["no_tools", "tools"]


def test_spatialclaw_endpoint_timeouts_are_failed_items(tmp_path):
  """An endpoint too slow for the request timeout: each SpatialClaw episode is a failed
  item, its error naming the policy endpoint and its timeout, counted in results.json and
  results.md (not a 0 that looks like a wrong answer), and the run exits non-zero."""
  import time  # pylint: disable=import-outside-toplevel
  rows = [r for r in _rows() if r["id"].startswith("rotation")][:2]
  build_small(tmp_path, rows, 32, 24)

  def reply_fn(body):
    time.sleep(2.0)  # over --request_timeout_s
    return PLAN

  out = tmp_path / "out"
  with ChatServer() as server:
    server.reply_fn = reply_fn
    done = _run("launch.eval", "--benchmark", "mindcube_tiny", "--data_dir",
                str(tmp_path / "data"), "--endpoint", server.base_url, "--model", "slow",
                "--agent", "spatialclaw", "--seeds", "1", "--out", str(out), "--tools_only",
                "--request_timeout_s", "0.5", "--retries", "1", "--config",
                "configs/spatialclaw.py:cpu")
    sent = len(server.requests)
  assert done.returncode != 0
  assert "tools 2 of 2" in done.stderr.strip().splitlines()[-1]
  # Per episode: the plan request and then the first step's, each tried twice, given up.
  assert sent == len(rows) * 4
  predictions = [json.loads(line) for line in (out / "predictions.jsonl").read_text()
                 .splitlines()]
  assert len(predictions) == len(rows)
  for p in predictions:
    assert p["error"].startswith("EndpointError: policy endpoint ") and (
        "no complete response within 0.5 s" in p["error"]), p["error"]
    assert p["score"] == 0.0 and p["prediction"] == ""
  results = json.loads((out / "results.json").read_text())
  assert results["failures"]["tools"] == {"items": 2, "failed": 2,
                                          "categories": {"rotation": 2}}
  assert "tools 2 of 2 (Rotation 2)" in (out / "results.md").read_text()
