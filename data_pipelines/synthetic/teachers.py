"""Scripted teacher trajectories for the synthetic dataset: the SFT data format, and data
that the agent recipe (recipes/agents.py) can train on without a frontier-model teacher.

A trajectory file is JSON lines, one episode each:

  {"scene_seed": 1234, "question": 2, "turns": ["<think>...</think><tool_call>...", ...,
   "<think>...</think><answer>...</answer>"]}

`question` indexes the scene's question list. On a benchmark's tasks
(builders/spatial_benchmark.py) a record names its question by the benchmark's id instead:
{"question_id": "scene0011_00-12", "turns": [...]} (what a converted teacher file holds:
Act3D's and PERIA's trajectories carry their question's id). Only the model's turns are stored: the job
replays them through the environment (forced tokens), so observations are rendered exactly
as in rollouts and masked from the loss (the papers' SFT: Act3D's GPT-5.4 trajectories,
PERIA's cold-start data, converted to this form).

The scripted teacher makes one tool call, then answers correctly: multiple-choice answers
by letter (Think3D, PERIA), open answers by the answer text (Act3D).
"""

from __future__ import annotations

import json

import numpy as np
from etils import epath

from jaxspatial.rollout.registry import AGENTS
from jaxspatial import errors

AGENT_NAMES = ("think3d", "act3d", "peria")


def scripted_turns(agent: str, question: dict, rng: np.random.Generator) -> list[str]:
  """One tool call, then the right answer (the dataset's question record), written by the
  registry's agent (its default settings)."""
  if agent not in AGENT_NAMES:
    raise ValueError(f"scripted_turns: agent must be one of {sorted(AGENT_NAMES)}, got "
                     f"{agent!r}")
  writer = AGENTS[agent]()
  azimuth = int(rng.choice([-90, -45, 45, 90]))
  turn = str(rng.choice(["turn_left", "turn_right"]))
  thought = "Look from another side."
  call = {"think3d": lambda: writer.call_turn(thought, camera=1, azimuth=azimuth, elevation=30),
          "act3d": lambda: writer.call_turn(thought, action=turn),
          "peria": lambda: writer.call_turn(thought, "image_crop", 0,
                                            [(250, 250), (750, 750)])}[agent]()
  answer = question["answer_text"] if agent == "act3d" or not question["options"] else (
      question["answer"])
  return [call, writer.answer_turn("Now I can tell.", answer)]


def write_scripted(source, agent: str, path, seed: int = 0) -> int:
  """Writes one scripted trajectory per question of every scene in `source` (atomically);
  returns the count."""
  rng = np.random.default_rng(seed)
  path = epath.Path(path)  # local or remote (gs://)
  path.parent.mkdir(parents=True, exist_ok=True)
  lines = []
  for index in range(len(source)):
    example = source[index]
    for q_index, question in enumerate(json.loads(example["questions"])):
      lines.append(json.dumps({"scene_seed": int(example["scene_seed"]), "question": q_index,
                               "turns": scripted_turns(agent, question, rng)}))
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text("\n".join(lines) + "\n")
  tmp.replace(path)
  return len(lines)


class TrajectoryError(errors.RecordError):
  """A trajectory file line that breaks the format: names the file, the line (from 1; 0 for
  the whole file) and the field, what was expected and what the line holds."""

  def __init__(self, path, line: int, field: str, problem: str):
    self.path, self.line, self.field, self.problem = str(path), line, field, problem
    super().__init__(f"{path}:{line}: {field}: {problem}")

  def __reduce__(self):
    return type(self), (self.path, self.line, self.field, self.problem)


def _got(value) -> str:
  text = json.dumps(value) if isinstance(value, (dict, list, str, int, float, type(None))) else (
      repr(value))
  return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _check_trajectory(path, number: int, record, question_counts, question_ids=None) -> None:
  """One parsed line: {'scene_seed': int, 'question': int, 'turns': [str, ...]} (bools are
  not ints), paired with its scene when `question_counts` is given; or, with `question_ids`
  ({id: (scene_seed, question index)}), {'question_id': str, 'turns': [...]}, which gains
  its scene_seed and question."""
  if not isinstance(record, dict):
    raise TrajectoryError(path, number, "<line>", "expected a JSON object {'scene_seed': int, "
                          f"'question': int, 'turns': [str, ...]}}, got {_got(record)}")
  if question_ids is not None and "question_id" in record:
    qid = record["question_id"]
    if not isinstance(qid, str):
      raise TrajectoryError(path, number, "question_id", f"expected the benchmark's question "
                            f"id, got {_got(qid)}")
    if qid not in question_ids:
      raise TrajectoryError(path, number, "question_id", f"expected the id of one of the "
                            f"source's {len(question_ids)} questions, got {qid!r:.80}")
    record["scene_seed"], record["question"] = question_ids[qid]
  for name in ("scene_seed", "question", "turns"):
    if name not in record:
      raise TrajectoryError(path, number, name, "missing")
  for name in ("scene_seed", "question"):
    value = record[name]
    if not isinstance(value, int) or isinstance(value, bool):
      raise TrajectoryError(path, number, name, f"expected an integer, got {_got(value)}")
  seed, question, turns = record["scene_seed"], record["question"], record["turns"]
  if not isinstance(turns, list) or not turns:
    raise TrajectoryError(path, number, "turns", f"expected a non-empty list of model turns, "
                          f"got {_got(turns)}")
  for k, turn in enumerate(turns):
    if not isinstance(turn, str) or not turn.strip():
      raise TrajectoryError(path, number, f"turns[{k}]", f"expected a non-empty string, got "
                            f"{_got(turn)}")
    try:
      turn.encode("utf-8")
    except UnicodeEncodeError as error:
      raise TrajectoryError(path, number, f"turns[{k}]", f"expected UTF-8 encodable text, got "
                            f"{error.object[error.start:error.end]!r} at {error.start}") from None
  if question < 0:
    raise TrajectoryError(path, number, "question", f"expected an index >= 0 into the scene's "
                          f"questions, got {question}")
  if question_counts is None:
    return
  if seed not in question_counts:
    known = sorted(question_counts)[:3]
    raise TrajectoryError(path, number, "scene_seed", f"expected the seed of one of the "
                          f"source's {len(question_counts)} scenes (e.g. {known}), got {seed}")
  if question >= question_counts[seed]:
    raise TrajectoryError(path, number, "question", f"expected 0..{question_counts[seed] - 1} "
                          f"(scene {seed} has {question_counts[seed]} questions), got {question}")


def read_trajectories(path, question_counts=None, question_ids=None) -> list[dict]:
  """The records of a trajectory file; a malformed line raises a TrajectoryError naming the
  file, the line and the field. `question_counts` ({scene_seed: the scene's number of
  questions}, from the source the trajectories pair with): every record's scene is in it and
  0 <= question < its count (else -1 would pair with the last question)."""
  out = []
  for number, raw in enumerate(epath.Path(path).read_bytes().split(b"\n"), 1):
    try:
      line = raw.decode("utf-8")
    except UnicodeDecodeError as error:
      raise TrajectoryError(path, number, "<line>", f"expected UTF-8 text, got byte "
                            f"{raw[error.start:error.start + 1]!r} at {error.start}") from None
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except (ValueError, RecursionError) as error:  # JSONDecodeError; nesting too deep
      raise TrajectoryError(path, number, "<line>", f"expected a JSON object, got text that "
                            f"does not parse ({str(error)[:80]}): {line[:60]!r}") from None
    _check_trajectory(path, number, record, question_counts, question_ids)
    out.append(record)
  if not out:
    raise TrajectoryError(path, 0, "<file>", "expected at least one trajectory, got none")
  return out
