"""Scripted teacher trajectories for the synthetic dataset: the SFT data format, and data
that the agent recipe (recipes/agents.py) can train on without a frontier-model teacher.

A trajectory file is JSON lines, one episode each:

  {"scene_seed": 1234, "question": 2, "turns": ["<think>...</think><tool_call>...", ...,
   "<think>...</think><answer>...</answer>"]}

`question` indexes the scene's question list. Only the model's turns are stored: the job
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


def read_trajectories(path) -> list[dict]:
  """The records of a trajectory file; a malformed line raises naming the file and line."""
  out = []
  for number, line in enumerate(epath.Path(path).read_text().split("\n"), 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
      ok = (isinstance(record.get("scene_seed"), int) and isinstance(record.get("question"), int)
            and isinstance(record.get("turns"), list) and record["turns"]
            and all(isinstance(t, str) for t in record["turns"]))
    except json.JSONDecodeError as error:
      raise ValueError(f"{path}:{number}: not JSON ({error})") from None
    if not ok:
      raise ValueError(f"{path}:{number}: expected {{'scene_seed': int, 'question': int, "
                       f"'turns': [str, ...]}}, got {line[:120]}")
    out.append(record)
  if not out:
    raise ValueError(f"{path}: no trajectories")
  return out
