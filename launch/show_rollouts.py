"""Runs a batch of compiled rollouts and writes an HTML page: each turn's text beside the
view the agent saw, the parsed actions, the rewards.

    python -m launch.show_rollouts --config configs/rollout_demo.py [--config.key=value ...]
"""

from __future__ import annotations

import pathlib
import time

import jax
from absl import app
from ml_collections import config_flags

from jaxspatial.rollout import episode, viewer
from recipes import rollout_demo as rollout_setup

def run(c) -> pathlib.Path:
  s = rollout_setup.build(c)
  rollout = episode.compile_rollout(s.agent, s.template, s.config)
  start = time.perf_counter()
  trajectory = jax.block_until_ready(rollout(
      s.model, s.automaton, s.tasks, s.prompt_ids, s.prompt_mask, jax.random.PRNGKey(c.seed),
      s.forced))
  print(f"{c.batch} episodes in {time.perf_counter() - start:.1f} s (compilation included)")
  for name, value in trajectory.metrics().items():
    print(f"  {name}: {float(value):.3f}")
  page = viewer.trajectory_html(jax.device_get(trajectory), s.tokenizer, s.automaton.grammar,
                                title=f"{c.agent} rollouts, seed {c.seed}")
  out = pathlib.Path(c.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(page)
  print(f"rollout viewer: {out.resolve()}")
  return out


def main(argv) -> None:
  del argv
  run(_CONFIG.value)


if __name__ == "__main__":
  # Defined here, not at import, so that several launch modules can be imported together.
  _CONFIG = config_flags.DEFINE_config_file("config", "configs/rollout_demo.py",
                                            "the rollout config file")
  app.run(main)
