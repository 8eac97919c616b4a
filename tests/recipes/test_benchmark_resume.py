"""launch.eval --benchmark never loses a run: killed with SIGKILL at five points (and stopped
once with SIGTERM before them) and rerun with the same --out, it ends with the uninterrupted run's
results.json, and the scripted OpenAI-compatible server (a real HTTP server on loopback)
answers no request twice except the turns of a tool episode cut mid-way."""

import collections
import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from jaxspatial.rollout.agents import Think3DAgent
from recipes import benchmark_run
from tests.perception.chat_server import ChatServer
from tests.recipes.test_benchmark_run import QUESTIONS, REPO, _rows, build_small

pytestmark = pytest.mark.skipif(not QUESTIONS.exists(), reason="no MindCube-Tiny file")

SEEDS = 2


def _first_text(body) -> str:
  content = body["messages"][1]["content"]
  return "".join(p.get("text", "") for p in content) if isinstance(content, list) else content


def _request_key(body) -> str:
  """A request's identity: its conversation and seed (the same question asked again)."""
  return json.dumps([body["messages"], body.get("seed")], sort_keys=True)


def _episode_key(body) -> str:
  return json.dumps([_first_text(body), body.get("seed"), body["messages"][0]["content"]])


def _scripted(rows):
  """Replies known per question and seed: no tools answers A; Think3D's episode asks for a
  view, then answers right for even seeds."""
  writer = Think3DAgent()
  by_text = {r["question"]: r for r in rows}

  def reply(body) -> str:
    row = next(r for q, r in by_text.items() if q in _first_text(body))
    if body["messages"][0]["content"] == benchmark_run.LETTER_PROMPT:
      return "A"
    if not any(m["role"] == "assistant" for m in body["messages"]):
      return writer.call_turn("Look from the left.", camera=1, azimuth=-45, elevation=30)
    return writer.answer_turn("Seen.", row["gt_answer"] if body["seed"] % 2 == 0 else "D")
  return reply


def _command(base_url: str, data, out) -> list[str]:
  return [sys.executable, "-m", "launch.eval", "--benchmark", "mindcube_tiny", "--data_dir",
          str(data), "--endpoint", base_url, "--model", "scripted", "--agent", "think3d",
          "--seeds", str(SEEDS), "--out", str(out), "--config", "configs/think3d_rl.py:cpu",
          "--config.agent.width=32", "--config.agent.height=24", "--concurrency", "1",
          "--batch", "1", "--retries", "0"]


def _untimed(out) -> list[dict]:
  rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
  return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]


def test_killed_runs_resume_to_the_same_results(tmp_path):
  rows = [r for r in _rows() if r["id"].startswith("rotation")][:4]
  data = build_small(tmp_path, rows, 32, 24)
  reply = _scripted(rows)

  # The uninterrupted run.
  with ChatServer() as server:
    server.reply_fn = reply
    done = subprocess.run(_command(server.base_url, data, tmp_path / "whole"), cwd=REPO,
                          capture_output=True, text=True, timeout=600, check=False)
    whole = [_request_key(r["body"]) for r in server.requests]
  assert done.returncode == 0, done.stderr[-3000:]
  assert len(whole) == len(set(whole)) == len(rows) * SEEDS * 3  # no tools 1, tools 2 turns

  # Stops at six request counts: the first by SIGTERM, five by SIGKILL, each while the
  # request is in flight (the server never answers a SIGKILLed one): in the no-tools
  # setting, at a tool episode's first turn and at its second.
  stops = {3: signal.SIGTERM, 6: signal.SIGKILL, 11: signal.SIGKILL, 15: signal.SIGKILL,
           19: signal.SIGKILL, 22: signal.SIGKILL}
  state = {"count": 0, "process": None, "killed": [], "answered": []}
  lock = threading.Lock()

  def stopping_reply(body):
    with lock:
      state["count"] += 1
      stop = stops.get(state["count"])
    if stop is not None:
      state["process"].send_signal(stop)
      if stop == signal.SIGKILL:
        state["process"].wait()
        state["killed"].append(body)
        raise RuntimeError("killed")  # the dead client gets no answer
    text = reply(body)
    state["answered"].append(_request_key(body))
    return text

  out = tmp_path / "resumed"
  codes = []
  with ChatServer() as server:
    server.reply_fn = stopping_reply
    for _ in range(len(stops) + 1):
      state["process"] = subprocess.Popen(_command(server.base_url, data, out), cwd=REPO,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True)
      stdout, stderr = state["process"].communicate(timeout=600)
      codes.append(state["process"].returncode)
      if codes[-1] == 0:
        break
      if len(codes) == 1:  # SIGTERM: partial results written from what was recorded
        assert "rerun the same command" in stderr, stderr[-2000:]
        assert json.loads((out / "results.json").read_text())["partial"]["recorded"] >= 2
  assert codes == [1, -9, -9, -9, -9, -9, 0], stdout + stderr[-3000:]
  assert (out / "results.json").read_text() == (tmp_path / "whole" / "results.json").read_text()
  # The same rows in the same order (all but their timings).
  assert _untimed(out) == _untimed(tmp_path / "whole")
  # Every request the uninterrupted run sent was answered; none twice, except the first
  # turn of a tool episode whose second turn was in flight at a kill (episodes are
  # recorded whole).
  answered = collections.Counter(state["answered"])
  assert set(answered) == set(whole)
  cut = collections.Counter(_episode_key(b) for b in state["killed"]
                            if any(m["role"] == "assistant" for m in b["messages"]))
  twice = collections.Counter()
  for key, n in answered.items():
    if n > 1:
      twice[_episode_key({"messages": json.loads(key)[0], "seed": json.loads(key)[1]})] += n - 1
  assert twice == cut and sum(cut.values()) == 3  # the kills at 11, 15, 19: second turns
  predictions = [json.loads(line) for line in (out / "predictions.jsonl").read_text()
                 .splitlines()]
  assert len(predictions) == len(rows) * SEEDS * 2 and not any(p["error"] for p in predictions)
  assert json.loads((out / "run.json").read_text())["resumed_items"] > 0
  assert os.stat(out / "predictions.jsonl").st_mode & 0o777 == 0o644
