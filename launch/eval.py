"""Evaluates a training run's checkpoint with its recipe's evaluation, or a model on a
prepared benchmark with the papers' protocols.

    python -m launch.eval --config configs/<recipe>.py[:variant] [--checkpoint DIR]
        [--split NAME] [--best]

    python -m launch.eval --benchmark NAME --data_dir DIR
        (--checkpoint HF_FOLDER | --endpoint URL --model NAME)
        [--agent think3d|act3d|peria|spatialclaw|none] [--seeds 3] [--limit N | --ids FILE]
        --out DIR
        [--letter_rule mindcube|thinker3d|think3d|vsibench|blink|letter]

The first form: the demo: the test split, the policy and the same policy answering from the
first view; the agent recipes: greedy accuracy per question family on `--split` (default:
the config's `data.eval_split`); 3DThinker: the held-out metrics. DIR is a run's work
directory (default: the config's `workdir`).

The second (recipes/benchmark_run.py): NAME is a benchmark `launch.build_benchmark`
prepared under DIR (mindcube, mindcube_tiny, blink_mv, vsibench, vsibench_tiny, scanqa, ...);
the model answers each question without tools and, with an agent, runs the agent's
episodes (the agent block of its paper's config, or of `--config`), once per seed (SpatialClaw:
configs/spatialclaw.py, host-loop episodes in a sandboxed kernel per question, sampled at its
config's temperature, 0.6); writes
OUT/results.json, results.md (the paper's layout), predictions.jsonl, episodes.html and
run.json. `--limit N`: the first N questions of the benchmark's question file, in its order
(only the records holding them are read). Every finished answer is appended to
predictions.jsonl at once; rerunning the same command with the same --out (after a crash,
a kill, Ctrl-C or SIGTERM) skips what is recorded and sends only the rest (a different
model, agent, sampling or scoring is refused: another --out keeps both). Answers are scored as each benchmark's official evaluation code reads them;
`--letter_rule` / `--extract` pick a named option (a paper's own script, the strict letter).
An endpoint's key is read from the environment variable `--api_key_env` names; by default
$OPENAI_API_KEY, and only for api.openai.com (any other host gets no key unless named).
`--judge_endpoint URL --judge_model NAME`: open answers (ScanQA, SQA3D) scored by an LLM
judge's verdict (Act3D's evaluation judge: temperature 0, 4 tokens); HR-Bench's every
answer by the judge's yes / no, as HR-Bench's own scorer does. Think3D on a benchmark
built without clouds: `--config.reconstruction.backend=pi3
--config.reconstruction.checkpoint=DIR` reconstructs each question's views online; PERIA's
perception tools: `--config.perception.tools=...` (a --checkpoint backend).
"""

from __future__ import annotations

# Before anything starts the XLA backend (it reads XLA_FLAGS once).
from jaxspatial import xla_workarounds

xla_workarounds.apply()
# pylint: disable=wrong-import-position

import importlib
import json
import signal
import sys

from absl import app, flags, logging

from recipes import cli
import recipes
from jaxspatial.eval.report import failures_line

# The paper config whose agent block `--agent` takes.
AGENT_CONFIGS = {"think3d": "configs.think3d_rl", "act3d": "configs.act3d_grpo",
                 "peria": "configs.peria_or_gigpo", "spatialclaw": "configs.spatialclaw"}

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "a run's work directory; with "
                                  "--benchmark, a policy folder (Hugging Face layout)")
_SPLIT = flags.DEFINE_string("split", None, "the split to evaluate")
_BEST = flags.DEFINE_bool("best", False, "evaluate the best checkpoint instead of the latest")
_BENCHMARK = flags.DEFINE_string("benchmark", None, "a prepared benchmark to evaluate on")
_DATA_DIR = flags.DEFINE_string("data_dir", "outputs/data", "where the benchmark is prepared")
_ENDPOINT = flags.DEFINE_string("endpoint", None, "an OpenAI-compatible base URL (.../v1)")
_MODEL = flags.DEFINE_string("model", None, "the endpoint's model name")
_AGENT = flags.DEFINE_enum("agent", "none", ["none", *AGENT_CONFIGS], "the tool agent")
_SEEDS = flags.DEFINE_integer("seeds", 3, "runs per setting (seeds 0..N-1)")
_LIMIT = flags.DEFINE_integer("limit", None, "only the first N questions of the benchmark's "
                              "question file (in its order)")
_IDS = flags.DEFINE_string("ids", None, "a file of the question ids to evaluate (one per "
                           "line, or a JSON list), in its order")
_OUT = flags.DEFINE_string("out", None, "the output folder")
_BATCH = flags.DEFINE_integer("batch", 16, "questions per batch")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "sampling temperature")
_CONCURRENCY = flags.DEFINE_integer("concurrency", 16, "requests in flight")
_REQUEST_TIMEOUT = flags.DEFINE_float("request_timeout_s", 60.0, "seconds one request to the "
                                      "policy endpoint may take (each attempt)")
_RETRIES = flags.DEFINE_integer("retries", 3, "more attempts of a policy request after a "
                                "timeout, a dropped connection, 429 or 5xx")
_ANSWER_TOKENS = flags.DEFINE_integer("max_tokens", 64, "the token budget of a no-tools "
                                      "answer (a reasoning model needs more)")
_TURN_TOKENS = flags.DEFINE_integer("turn_tokens", 1024, "the token budget of each turn of "
                                    "an endpoint's tool episodes")
_MAX_REQUESTS = flags.DEFINE_integer("max_requests", None, "the request budget")
_API_KEY_ENV = flags.DEFINE_string(
    "api_key_env", "auto", "the environment variable holding the endpoint's key (auto: "
    "$OPENAI_API_KEY, sent only to api.openai.com; '' for none)")
_TOOLS_ONLY = flags.DEFINE_bool("tools_only", False, "skip the no-tools setting")
_JUDGE_ENDPOINT = flags.DEFINE_string("judge_endpoint", None, "an OpenAI-compatible judge of "
                                      "open answers (Act3D: Qwen3-30B-A3B-Instruct)")
_LETTER_RULE = flags.DEFINE_enum(
    "letter_rule", None, ["mindcube", "thinker3d", "think3d", "vsibench", "blink", "letter"],
    "how option letters are read (default: the benchmark's official evaluation code; "
    "think3d / thinker3d: those papers' own scripts, letter: the strict leading letter)")
_EXTRACT = flags.DEFINE_enum("extract", None, ["reply", "answer_block"],
                             "which text rules read (default: as the official code does)")
_MAX_FAILED = flags.DEFINE_float(
    "max_failed_share", 0.1, "exit non-zero when more than this share of a setting's items "
    "failed (requests or episodes that failed for good; they score 0 and are counted)")
_JUDGE_MODEL = flags.DEFINE_string("judge_model", None, "the judge endpoint's model")
_JUDGE_KEY_ENV = flags.DEFINE_string(
    "judge_api_key_env", "auto", "the environment variable holding the judge's key (auto: "
    "$OPENAI_API_KEY, sent only to api.openai.com)")


def _benchmark() -> dict:
  # pylint: disable=import-outside-toplevel
  from jaxspatial.perception.judge import ChatEndpoint
  from jaxspatial.perception.judges import make_judge
  from recipes.benchmark_backends import (EndpointBackend, PolicyBackend, benchmark_agent,
                                          evaluation_rollout)
  from recipes.benchmark_run import read_ids, run_benchmark
  if not _OUT.value:
    raise app.UsageError("--benchmark needs --out DIR")
  if bool(_ENDPOINT.value) == bool(_CHECKPOINT.value):
    raise app.UsageError("--benchmark needs one backend: --checkpoint HF_FOLDER or "
                         "--endpoint URL --model NAME")
  config = None
  given = any(a == "--config" or a.startswith("--config=") for a in sys.argv[1:])
  if not given and any(a.startswith("--config.") for a in sys.argv[1:]):
    name = AGENT_CONFIGS.get(_AGENT.value, "configs.<paper>").split(".")[-1]
    raise app.UsageError("--config.KEY overrides need the config they change: pass "
                         f"--config configs/{name}.py with them")
  if _AGENT.value != "none":
    config = (_CONFIG.value if given else
              importlib.import_module(AGENT_CONFIGS[_AGENT.value]).get_config("reference"))
  if _ENDPOINT.value:
    if not _MODEL.value:
      raise app.UsageError("--endpoint needs --model")
    backend = EndpointBackend(ChatEndpoint(_ENDPOINT.value, _MODEL.value,
                                           api_key_env=_API_KEY_ENV.value or None,
                                           concurrency=_CONCURRENCY.value,
                                           timeout_s=_REQUEST_TIMEOUT.value,
                                           retries=_RETRIES.value,
                                           max_requests=_MAX_REQUESTS.value, role="policy"),
                              temperature=_TEMPERATURE.value,
                              answer_tokens=_ANSWER_TOKENS.value,
                              turn_tokens=_TURN_TOKENS.value)
  else:
    rollout = evaluation_rollout(config) if config is not None else {}
    backend = PolicyBackend(_CHECKPOINT.value, temperature=_TEMPERATURE.value,
                            rollout=rollout)
  agent = None if config is None else benchmark_agent(config, backend)
  settings = ("tools",) if _TOOLS_ONLY.value else None
  judge = None
  if _JUDGE_ENDPOINT.value:
    judge = make_judge({"url": _JUDGE_ENDPOINT.value, "model": _JUDGE_MODEL.value or "",
                        "api_key_env": _JUDGE_KEY_ENV.value or None},
                       "hrbench" if _BENCHMARK.value == "hrbench" else
                       "peria" if _AGENT.value == "peria" else "act3d_eval")
  return run_benchmark(_BENCHMARK.value, _DATA_DIR.value, _OUT.value, backend, agent=agent,
                       seeds=tuple(range(_SEEDS.value)), split=_SPLIT.value or "test",
                       limit=_LIMIT.value, batch=_BATCH.value, settings=settings,
                       ids=read_ids(_IDS.value) if _IDS.value else None,
                       judge=judge, rules={k: v for k, v in (("letter_rule", _LETTER_RULE.value),
                                                             ("extract", _EXTRACT.value))
                                           if v is not None})


def _stop(signum, frame) -> None:
  del frame
  raise KeyboardInterrupt(f"signal {signum}")


def main(argv) -> None:
  del argv
  logging.set_verbosity(logging.WARNING)
  if _BENCHMARK.value:
    # SIGTERM (a scheduler's stop) as SIGINT: the recorded answers are kept and the
    # results written from them before the run ends.
    signal.signal(signal.SIGTERM, _stop)
    try:
      document = _benchmark()
    except KeyboardInterrupt:
      sys.exit(f"launch.eval: interrupted; every finished answer is in {_OUT.value}/"
               "predictions.jsonl (results.json: the partial results): rerun the same "
               "command to finish")
    print(json.dumps({"overall": document["overall"], "categories": document["categories"]},
                     indent=2))
    print("outputs: " + ", ".join(f"{_OUT.value}/{name}" for name in (
        "results.json", "results.md", "predictions.jsonl", "episodes.html", "run.json")))
    failed = document.get("failures", {})
    worst = max((e["failed"] / e["items"] for e in failed.values() if e["items"]), default=0)
    if worst > _MAX_FAILED.value:
      sys.exit(f"launch.eval: {failures_line(document)} More than --max_failed_share "
               f"{_MAX_FAILED.value:g} failed; see the error field of {_OUT.value}/"
               "predictions.jsonl")
    return
  results = recipes.evaluate(_CONFIG.value, _CHECKPOINT.value, _SPLIT.value, _BEST.value)
  print(json.dumps(results, indent=2))


if __name__ == "__main__":
  _CONFIG = cli.config_flag("config", "configs/demo.py", "the training config")
  cli.run(main)
