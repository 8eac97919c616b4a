"""HR-Bench scored as its own evaluation does: an LLM judge asked whether each answer is
right, its reply read as yes / no (`hrbench/vlmeval/dataset/utils/hrbench.py` parse_score,
re-stated below), through `run_benchmark` with a scripted policy and a scripted judge on
loopback."""

import json
import re

import numpy as np
import pytest

from data_pipelines.builders import build_benchmark
from jaxspatial.perception.judge import ChatEndpoint, yes_no_verdict
from jaxspatial.perception.judges import make_judge
from recipes import benchmark_run
from recipes.benchmark_backends import EndpointBackend
from tests.data_pipelines.test_image_benchmarks import hr_rows, picture, write_tsv
from tests.perception.chat_server import ChatServer

JUDGE_FORMS = ("Yes", "yes.", "No", "no, it picks another option", "YES, it is right",
               " yes", "The answer is yes", "nO", "<think>It says C, the right one.</think>\n"
               "yes", "Maybe", "")


def hr_parse_score(reply: str) -> float:
  """HR-Bench's reading: lower-cased, "yes" or "no" at the very start; else 0."""
  found = re.match(r"^(yes|no)", reply.lower(), re.IGNORECASE)
  return 1.0 if found and found[0] == "yes" else 0.0


def test_yes_no_reading_matches_hrbench():
  rng = np.random.default_rng(0)
  words = ["yes", "Yes", "YES", "no", "No", "nope", "yesterday", "not", "y", " ", "\n", ".",
           "right", "<think>no</think>", "maybe"]
  for _ in range(300):
    reply = "".join(rng.choice(words, int(rng.integers(0, 4))))
    ours = yes_no_verdict(reply)
    if "<think>" not in reply:
      assert float(ours is True) == hr_parse_score(reply), repr(reply)


def test_hrbench_answers_scored_by_the_judge(tmp_path):
  rows = hr_rows(picture(21, 40, 64), picture(22, 30, 30))
  (tmp_path / "source").mkdir()
  write_tsv(tmp_path / "source" / "hr_bench_4k.tsv", rows)
  build_benchmark("hrbench", tmp_path / "source", tmp_path / "data", width=32, height=24)

  def policy(body):
    text = body["messages"][-1]["content"][-1]["text"]
    return f"Option B, case {len(text) % 7}"

  def judge(body):
    case = body["messages"][-1]["content"]
    return JUDGE_FORMS[sum(map(ord, case)) % len(JUDGE_FORMS)]

  with ChatServer() as agent_server, ChatServer() as judge_server:
    agent_server.reply_fn, judge_server.reply_fn = policy, judge
    backend = EndpointBackend(ChatEndpoint(agent_server.base_url, "scripted",
                                           api_key_env=None))
    scorer = make_judge({"url": judge_server.base_url, "model": "judge", "api_key_env": None},
                        "hrbench")
    document = benchmark_run.run_benchmark("hrbench", tmp_path / "data", tmp_path / "out",
                                           backend, seeds=(0,), split="test_4k",
                                           judge=scorer)
    cases = [r["body"]["messages"][-1]["content"] for r in judge_server.requests]
    replies = [judge(r["body"]) for r in judge_server.requests]
  assert len(cases) == len(rows)  # every answer went to the judge
  assert {c.split("\n1. ")[1].split("\n")[0] for c in cases} == {"C. blue", "A. blue",
                                                                 "D. blue", "B. blue",
                                                                 "A. yes"}
  expected = np.mean([hr_parse_score(r) for r in replies])
  got = sum(document["categories"][c]["accuracy"] * document["categories"][c]["n"]
            for c in document["categories"]) / len(rows)
  assert got == pytest.approx(expected)
  assert 0 < expected < 1, replies
  stats = scorer.stats()
  assert stats["correct"] == sum(hr_parse_score(r) for r in replies)


def test_a_failed_judge_request_fails_its_item(tmp_path):
  """The judge endpoint refuses some cases for good: those items are failed (their error
  names the judge endpoint), counted per category; the other answers are judged and the
  run finishes; a rerun with the same --out sends nothing again."""
  rows = hr_rows(picture(21, 40, 64), picture(22, 30, 30))
  (tmp_path / "source").mkdir()
  write_tsv(tmp_path / "source" / "hr_bench_4k.tsv", rows)
  build_benchmark("hrbench", tmp_path / "source", tmp_path / "data", width=32, height=24)
  refused = lambda body: 400 if "blue" in body["messages"][-1]["content"] else None  # pylint: disable=unnecessary-lambda-assignment

  def run(agent_server, judge_server):
    backend = EndpointBackend(ChatEndpoint(agent_server.base_url, "scripted",
                                           api_key_env=None))
    scorer = make_judge({"url": judge_server.base_url, "model": "judge", "api_key_env": None,
                         "retries": 0}, "hrbench")
    return benchmark_run.run_benchmark("hrbench", tmp_path / "data", tmp_path / "out",
                                       backend, seeds=(0,), split="test_4k", judge=scorer,
                                       progress=False)

  with ChatServer() as agent_server, ChatServer() as judge_server:
    agent_server.reply_fn = lambda body: "B"
    judge_server.reply_fn = lambda body: "yes"
    judge_server.status_fn = refused
    document = run(agent_server, judge_server)
    cases = [r["body"]["messages"][-1]["content"] for r in judge_server.requests]
    asked = (len(agent_server.requests), len(judge_server.requests))
    run(agent_server, judge_server)
    again = (len(agent_server.requests), len(judge_server.requests))
  assert asked == again == (len(rows), len(rows))
  failed = sum("blue" in c for c in cases)
  assert 0 < failed < len(rows)
  kept = [json.loads(line) for line in
          (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
  errors = [k["error"] for k in kept if k["error"]]
  assert len(errors) == failed
  assert all(e.startswith("judge endpoint ") and "HTTP 400" in e for e in errors)
  assert all(k["score"] == (0.0 if k["error"] else 1.0) for k in kept)
  assert document["failures"]["no_tools"]["failed"] == failed
  assert document["overall"]["n"] == len(rows)
