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


def test_a_tool_that_succeeds_exits_zero(tmp_path):
  """absl passes main's return value to sys.exit: a main returning anything but None fails."""
  done = launch("launch.show_samples", "--count", "1", "--out", str(tmp_path / "s.png"))
  assert done.returncode == 0, done.stderr[-2000:]
  assert (tmp_path / "s.png").stat().st_size > 0
