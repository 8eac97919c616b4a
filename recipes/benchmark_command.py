"""`launch.eval --benchmark`: its options (each field one flag of the same name) and the
run they describe: the backend (a policy folder or an OpenAI-compatible endpoint), the
agent (its paper config's agent block, or the `--config` given), the judge of open
answers, then `benchmark_run.run_benchmark`; the results printed and the failure share
checked.

    python -m launch.eval --benchmark NAME --data_dir DIR
        (--checkpoint HF_FOLDER | --endpoint URL --model NAME)
        [--agent think3d|act3d|peria|spatialclaw|none] [--seeds 3] [--limit N | --ids FILE]
        --out DIR [--letter_rule mindcube|thinker3d|think3d|vsibench|blink|letter]

NAME is a benchmark `launch.build_benchmark` prepared under DIR (mindcube, mindcube_tiny,
blink_mv, vsibench, scanqa, ...); the model answers each question without tools and, with
an agent, runs the agent's episodes, once per seed (SpatialClaw: configs/spatialclaw.py,
host-loop episodes in a sandboxed kernel per question, sampled at its config's
temperature, 0.6); writes OUT/results.json, results.md (the paper's layout),
predictions.jsonl, episodes.html and run.json. `--limit N`: the first N questions of the
benchmark's question file, in its order (only the records holding them are read). Every
finished answer is appended to predictions.jsonl at once; rerunning the same command with
the same --out (after a crash, a kill, Ctrl-C or SIGTERM) skips what is recorded and sends
only the rest (a different model, agent, sampling or scoring is refused: another --out
keeps both). Answers are scored as each benchmark's official evaluation code reads them;
`--letter_rule` / `--extract` pick a named option (a paper's own script, the strict
letter). An endpoint's key is read from the environment variable `--api_key_env` names; by
default $OPENAI_API_KEY, and only for api.openai.com (any other host gets no key unless
named). The judge is the config's `judge` block (its keys as in training:
`judge.url`, `judge.model`, `judge.api_key_env`, ...); `--judge_url URL --judge_model NAME`
(and `--judge_api_key_env`) set those keys: open answers (ScanQA, SQA3D) scored by
an LLM judge's verdict (Act3D's evaluation judge: temperature 0, 4 tokens); HR-Bench's
every answer by the judge's yes / no, as HR-Bench's own scorer does. Think3D on a
benchmark built without clouds: `--config.reconstruction.backend=pi3
--config.reconstruction.checkpoint=DIR` reconstructs each question's views online;
PERIA's perception tools: `--config.perception.tools=...` (a --checkpoint backend).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys

from jaxspatial.errors import InputError
from jaxspatial.eval.report import failures_line

# The paper config whose agent block `--agent` takes.
AGENT_CONFIGS = {"think3d": "configs.think3d_rl", "act3d": "configs.act3d_grpo",
                 "peria": "configs.peria_or_gigpo", "spatialclaw": "configs.spatialclaw"}
LETTER_RULES = ("mindcube", "thinker3d", "think3d", "vsibench", "blink", "letter")


def _option(default, help_: str, choices=None, kind=None):
  return dataclasses.field(default=default, metadata={"help": help_, "choices": choices,
                                                      "kind": kind})


@dataclasses.dataclass(frozen=True)
class BenchmarkOptions:
  """The options of `launch.eval --benchmark`; launch/eval.py defines one flag per field."""
  benchmark: str | None = _option(None, "a prepared benchmark to evaluate on")
  data_dir: str = _option("outputs/data", "where the benchmark is prepared")
  endpoint: str | None = _option(None, "an OpenAI-compatible base URL (.../v1)")
  model: str | None = _option(None, "the endpoint's model name")
  agent: str = _option("none", "the tool agent", ["none", *AGENT_CONFIGS])
  seeds: int = _option(3, "runs per setting (seeds 0..N-1)")
  limit: int | None = _option(None, "only the first N questions of the benchmark's question "
                              "file (in its order)", kind=int)
  ids: str | None = _option(None, "a file of the question ids to evaluate (one per line, or "
                            "a JSON list), in its order")
  out: str | None = _option(None, "the output folder")
  batch: int = _option(16, "questions per batch")
  temperature: float = _option(0.0, "sampling temperature")
  concurrency: int = _option(16, "requests in flight")
  request_timeout_s: float = _option(60.0, "seconds one request to the policy endpoint may "
                                     "take (each attempt)")
  retries: int = _option(3, "more attempts of a policy request after a timeout, a dropped "
                         "connection, 429 or 5xx")
  max_tokens: int = _option(64, "the token budget of a no-tools answer (a reasoning model "
                            "needs more)")
  turn_tokens: int = _option(1024, "the token budget of each turn of an endpoint's tool "
                             "episodes")
  max_requests: int | None = _option(None, "the request budget", kind=int)
  api_key_env: str = _option("auto", "the environment variable holding the endpoint's key "
                             "(auto: $OPENAI_API_KEY, sent only to api.openai.com; '' for none)")
  tools_only: bool = _option(False, "skip the no-tools setting")
  judge_url: str | None = _option(None, "judge.url: an OpenAI-compatible judge of open "
                                  "answers (Act3D: Qwen3-30B-A3B-Instruct)")
  judge_model: str | None = _option(None, "judge.model: the judge endpoint's model")
  judge_api_key_env: str | None = _option(None, "judge.api_key_env: the environment variable "
                                          "holding the judge's key (default: the config's, "
                                          "else auto: $OPENAI_API_KEY, sent only to "
                                          "api.openai.com)")
  letter_rule: str | None = _option(
      None, "how option letters are read (default: the benchmark's official evaluation code; "
      "think3d / thinker3d: those papers' own scripts, letter: the strict leading letter)",
      list(LETTER_RULES))
  extract: str | None = _option(None, "which text rules read (default: as the official code "
                                "does)", ["reply", "answer_block"])
  max_failed_share: float = _option(0.1, "exit non-zero when more than this share of a "
                                    "setting's items failed (requests or episodes that failed "
                                    "for good; they score 0 and are counted)")


class UsageError(InputError):
  """A combination of options that cannot run; launch.eval shows it with the usage."""


def agent_config(options: BenchmarkOptions, config, config_given: bool, overrides: bool):
  """The config whose agent block runs the tool setting: `config` when given, else the
  `--agent`'s paper config (reference variant); None without an agent."""
  if not config_given and overrides:
    name = AGENT_CONFIGS.get(options.agent, "configs.<paper>").split(".")[-1]
    raise UsageError("--config.KEY overrides need the config they change: pass "
                     f"--config configs/{name}.py with them")
  if options.agent == "none":
    return None
  return config if config_given else importlib.import_module(
      AGENT_CONFIGS[options.agent]).get_config("reference")


def judge_block(options: BenchmarkOptions, config=None) -> dict:
  """The judge's settings: the config's `judge` block (training's keys) with the
  `--judge_*` flags over it."""
  block = dict(config.judge) if config is not None and "judge" in config else {}
  if block.pop("checkpoint", "") and not (options.judge_url or block.get("url")):
    raise UsageError("judge.checkpoint (a policy judging inside training rollouts) does not "
                     "judge benchmark answers: pass --judge_url URL --judge_model NAME")
  given = {"url": options.judge_url, "model": options.judge_model,
           "api_key_env": options.judge_api_key_env}
  block.update({k: v for k, v in given.items() if v is not None})
  if block.get("api_key_env") == "":
    block["api_key_env"] = None
  return block


def run(options: BenchmarkOptions, checkpoint: str | None, split: str | None,
        config=None) -> dict:
  """The benchmark evaluation `options` describe; returns the results document."""
  # pylint: disable=import-outside-toplevel
  from jaxspatial.perception.judge import ChatEndpoint
  from jaxspatial.perception.judges import make_judge
  from recipes.benchmark_backends import (EndpointBackend, PolicyBackend, benchmark_agent,
                                          evaluation_rollout)
  from recipes.benchmark_run import read_ids, run_benchmark
  if not options.out:
    raise UsageError("--benchmark needs --out DIR")
  if bool(options.endpoint) == bool(checkpoint):
    raise UsageError("--benchmark needs one backend: --checkpoint HF_FOLDER or "
                     "--endpoint URL --model NAME")
  if options.endpoint:
    if not options.model:
      raise UsageError("--endpoint needs --model")
    endpoint = ChatEndpoint(options.endpoint, options.model,
                            api_key_env=options.api_key_env or None,
                            concurrency=options.concurrency,
                            timeout_s=options.request_timeout_s, retries=options.retries,
                            max_requests=options.max_requests, role="policy")
    backend = EndpointBackend(endpoint, temperature=options.temperature,
                              answer_tokens=options.max_tokens,
                              turn_tokens=options.turn_tokens)
  else:
    backend = PolicyBackend(checkpoint, temperature=options.temperature,
                            rollout=evaluation_rollout(config) if config is not None else {})
  block = judge_block(options, config)
  judge = None
  if block.get("url"):
    judge = make_judge(block, "hrbench" if options.benchmark == "hrbench" else
                       "peria" if options.agent == "peria" else "act3d_eval")
  rules = {k: v for k, v in (("letter_rule", options.letter_rule),
                             ("extract", options.extract)) if v is not None}
  return run_benchmark(options.benchmark, options.data_dir, options.out, backend,
                       agent=None if config is None else benchmark_agent(config, backend),
                       seeds=tuple(range(options.seeds)), split=split or "test",
                       limit=options.limit, batch=options.batch,
                       settings=("tools",) if options.tools_only else None,
                       ids=read_ids(options.ids) if options.ids else None, judge=judge,
                       rules=rules)


def report(document: dict, options: BenchmarkOptions) -> None:
  """Prints the results and the output files; exits non-zero past `max_failed_share`."""
  print(json.dumps({"overall": document["overall"], "categories": document["categories"]},
                   indent=2))
  print("outputs: " + ", ".join(f"{options.out}/{name}" for name in (
      "results.json", "results.md", "predictions.jsonl", "episodes.html", "run.json")))
  failed = document.get("failures", {})
  worst = max((e["failed"] / e["items"] for e in failed.values() if e["items"]), default=0)
  if worst > options.max_failed_share:
    sys.exit(f"launch.eval: {failures_line(document)} More than --max_failed_share "
             f"{options.max_failed_share:g} failed; see the error field of {options.out}/"
             "predictions.jsonl")
