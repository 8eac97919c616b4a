"""The rollout viewer writes one section per episode with its turns and views (the demo
recipe's page: each episode's question, reference, prediction and parsed answer); the
profiler reports compile time, cost and memory analysis and a trace."""

import re
import types

import numpy as np
import pytest

from configs import rollout_demo as rollout_config
from data_pipelines.synthetic import look_around
from jaxspatial.models.qwen2_5_vl.tokenizer import train_tokenizer
from jaxspatial.rollout import grammars
from recipes import look_around as look_around_recipe
from recipes import rollout_demo
from tests.rollout import test_viewer as pages


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


def test_look_around_page_shows_question_reference_prediction_and_views(tmp_path):
  """The demo's rollouts.html (`LookAround._page`) with the rollout's split: per episode
  the question, its reference colour, the answer turn, the parsed colour and its verdict,
  and every view numbered."""
  tasks, questions = look_around.make_tasks(2, 0, points=400)
  split = look_around_recipe.Split(tasks, questions, np.zeros((2, 1), np.int32),
                                   np.ones((2, 1), bool))
  answers = [questions[0].colour, "<script>x</script>"]
  episodes = [[pages.call_turn("turn_left"), pages.answer_turn(answers[0])],
              [pages.answer_turn(answers[1])]]
  corpus = [pages.call_turn("turn_left"), pages.answer_turn("red"), questions[0].question]
  tokenizer = train_tokenizer(corpus * 4, vocab_size=300)
  traj = pages.make_trajectory(tokenizer, questions[0].question, episodes, judge=[1.0, 0.0])
  recipe = look_around_recipe.LookAround(types.SimpleNamespace(workdir=str(tmp_path)))
  recipe.tokenizer = tokenizer
  recipe.run = types.SimpleNamespace(automaton=types.SimpleNamespace(grammar=grammars.act3d()))
  # pylint: disable-next=protected-access
  recipe._page(traj, "rollouts.html", "test episodes", split=split)
  page = (tmp_path / "rollouts.html").read_text()
  assert "<script>x" not in page
  sections = pages.parse_page(page).find("section", "episode")
  assert len(sections) == 2
  for b, section in enumerate(sections):
    assert pages.field(section, "question") == questions[b].question
    assert pages.field(section, "reference") == questions[b].colour
    assert pages.field(section, "prediction") == episodes[b][-1]
    assert pages.field(section, "parsed") == answers[b] + (" correct", " incorrect")[b]
    pages.check_views(section, (2, 1)[b])
