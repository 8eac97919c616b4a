"""The demo recipe shrunk for trainer tests, and a run's metrics read back."""

import pathlib

from configs import demo
from jaxspatial.train import read_jsonl

# Wall-clock figures vary from run to run; nothing else in a row may.
TIMING = ("time", "rl/tokens_per_s")


def demo_config(workdir, overrides: dict):
  """configs/demo.py with `overrides` ({"dotted.key": value}) and `workdir`."""
  c = demo.get_config()
  c.workdir = str(workdir)
  for key, value in overrides.items():
    *parents, name = key.split(".")
    node = c
    for parent in parents:
      node = node[parent]
    node[name] = value
  return c


def step_metrics(workdir) -> dict:
  """{step: the step's metrics without timings} from metrics.jsonl; each step exactly once."""
  rows = read_jsonl(pathlib.Path(workdir) / "metrics.jsonl")
  steps = [row["step"] for row in rows]
  assert len(steps) == len(set(steps)), f"steps logged twice: {steps}"
  return {row["step"]: {k: v for k, v in row.items() if k not in TIMING + ("step",)}
          for row in rows}
