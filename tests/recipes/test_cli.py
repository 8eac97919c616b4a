"""The launch tools' flag mistakes: one line naming the flag, the file and the nearest keys,
exit status 1; `--help` exits 0 with the usage on stdout."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def launch(*args):
  return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=300, env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin"})


@pytest.mark.parametrize("args, message", [
    (("launch.render_demo", "--config.widthh=3"),
     "render_demo: --config.widthh: configs/render_demo.py: the config has no key 'widthh'; "
     "did you mean width?"),
    (("launch.train", "--config", "configs/demo.py", "--config.sft.stepz=3"),
     "train: --config.sft.stepz: configs/demo.py: sft has no key 'stepz'; did you mean "
     "sft.steps?"),
    (("launch.train", "--config", "configs/demo.py", "--config.seed.x=1"),
     "train: --config.seed.x: configs/demo.py: seed is a value (int), not a group of keys"),
    (("launch.train", "--config", "configs/nope.py"),
     "train: --config configs/nope.py: no such config file"),
    (("launch.train", "--config", "configs/demo.py", "--config.sft.steps=abc"),
     "train: flag --config.sft.steps=abc: invalid literal for int()"),
    (("launch.build_data", "--data-dir", "x"), "build_data: Unknown command line flag 'data-dir'"),
])
def test_a_mistake_is_one_line(args, message):
  done = launch(*args)
  assert done.returncode == 1, done.stderr[-2000:]
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(message), done.stderr[-2000:]


def test_help_exits_zero():
  done = launch("launch.build_benchmark", "--help")
  assert done.returncode == 0, done.stderr[-2000:]
  assert "--data_dir" in done.stdout and "--benchmark" in done.stdout


def test_the_judge_is_the_config_block_with_the_flags_over_it():
  """launch.eval --benchmark's judge: training's `judge` keys, `--judge_*` setting them."""
  from configs import act3d_grpo  # pylint: disable=import-outside-toplevel
  from recipes.benchmark_command import (BenchmarkOptions, UsageError,  # pylint: disable=import-outside-toplevel
                                         judge_block)
  c = act3d_grpo.get_config("reference")
  c.judge.url, c.judge.model, c.judge.retries = "http://a/v1", "config-model", 7
  block = judge_block(BenchmarkOptions(judge_model="flag-model", judge_api_key_env=""), c)
  assert (block["url"], block["model"], block["api_key_env"], block["retries"]) == (
      "http://a/v1", "flag-model", None, 7)
  assert judge_block(BenchmarkOptions(judge_url="http://b/v1"))["url"] == "http://b/v1"
  assert judge_block(BenchmarkOptions()) == {}
  c.judge.url, c.judge.checkpoint = "", "some/policy"
  with pytest.raises(UsageError, match="judge.checkpoint"):
    judge_block(BenchmarkOptions(), c)
