"""The rollout viewer writes one section per episode with its turns and views; the profiler
reports compile time, cost and memory analysis and a trace."""

import re

import pytest

from configs import rollout_demo as rollout_config
from recipes import rollout_demo


def _small():
  config = rollout_config.get_config()
  config.batch, config.rollout.max_turns, config.rollout.max_turn_tokens = 2, 3, 40
  config.data.points, config.agent.width, config.agent.height = 8_000, 56, 56
  return config


@pytest.mark.slow
def test_show_rollouts_writes_each_episode_with_its_turns_and_views(tmp_path):
  config = _small()
  config.out = str(tmp_path / "rollouts.html")
  page = rollout_demo.show(config).read_text()
  assert page.count("<h2>episode") == 2
  # Scripted: two camera moves per episode with their parsed action, each beside its view.
  assert len(re.findall(r"call action=\w+", page)) == 4
  assert page.count("data:image/png;base64,") >= 6
  assert "render_view_tool" in page and "reward" in page


@pytest.mark.slow
def test_profile_rollout_reports_costs_and_writes_a_trace(tmp_path):
  config = _small()
  config.repeats = 1
  config.trace_dir = str(tmp_path / "trace")
  report = rollout_demo.profile(config)
  assert report["flops"] > 0 and report["bytes_accessed"] > 0
  assert report["compile_s"] > 0 and report["ms_per_episode"] > 0
  assert any((tmp_path / "trace").rglob("*.xplane.pb"))
