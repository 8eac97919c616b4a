"""Every Python block of README.md runs as shown, each in a fresh interpreter; every
`python -m` command the README names is a module that exists."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def test_the_readme_has_python_blocks():
  assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_python_block_runs(index):
  # The caller's environment: conftest's shared compilation cache comes with it.
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  done = subprocess.run([sys.executable, "-c", BLOCKS[index]], cwd=ROOT, capture_output=True,
                        text=True, timeout=600, env=env)
  assert done.returncode == 0, f"README block {index}:\n{BLOCKS[index]}\n{done.stderr[-3000:]}"


def test_named_modules_exist():
  modules = set(re.findall(r"python -m ([\w.]+)", README))
  missing = [m for m in sorted(modules)
             if not (ROOT / (m.replace(".", "/") + ".py")).exists()
             and not (ROOT / m.replace(".", "/") / "__main__.py").exists()]
  assert not missing, f"README names modules that do not exist: {missing}"
