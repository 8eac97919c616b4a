"""What a user of the launch tools sees, through the real commands: `--help` exits 0 and
documents every flag with its default; a missing config, a key typo, a missing data folder
or checkpoint is one line naming the problem and the fix (exit status 1, no traceback;
JAXSPATIAL_DEBUG=1 shows it); a benchmark's missing images are reported all at once; a
build prints our line, not TFDS's "Downloading and preparing dataset Unknown size"."""

import dataclasses
import importlib
import importlib.util
import json
import pathlib
import pickle
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from data_pipelines.benchmarks.images import MissingImagesError, mindcube_scenes
from data_pipelines.readers import MissingImageError
from recipes import cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOLS = sorted(p.stem for p in (ROOT / "launch").glob("*.py") if p.stem != "__init__")
NOWHERE = "/nonexistent/jaxspatial"


def launch(tool, *args, **env):
  return subprocess.run([sys.executable, "-m", f"launch.{tool}", *map(str, args)], cwd=ROOT,
                        capture_output=True, text=True, timeout=120,
                        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin", **env})


# -- --help ------------------------------------------------------------------------------

def defined_flags(tool: str) -> set[str]:
  """The flags the tool's source defines: DEFINE_*, cli.config_flag, cli.define_flags'
  dataclass fields."""
  source = (ROOT / "launch" / f"{tool}.py").read_text()
  names = set(re.findall(r'(?:DEFINE_\w+|config_flag)\(\s*"(\w+)"', source))
  for name in re.findall(r"cli\.define_flags\((\w+)\)", source):
    module = re.search(rf"from ([\w.]+) import [^\n]*\b{name}\b", source).group(1)
    names |= {f.name for f in dataclasses.fields(getattr(importlib.import_module(module),
                                                         name))}
  return names


def help_entries(text: str) -> dict[str, str]:
  """{flag: its entry (help text and the default lines)} of absl's usage text."""
  entries, name = {}, None
  for line in text.splitlines():
    match = re.match(r"^  (?:-\S+,)?--(?:\[no\])?(\w+):(.*)", line)
    if match:
      name = match.group(1)
      entries[name] = match.group(2).strip()
    elif name and line.startswith("    "):
      entries[name] += " " + line.strip()
    else:
      name = None
  return entries


@pytest.mark.parametrize("tool", TOOLS)
def test_help_exits_zero_and_documents_every_flag(tool):
  done = launch(tool, "--help")
  assert done.returncode == 0, done.stderr[-2000:]
  entries = help_entries(done.stdout)
  wanted = defined_flags(tool)
  assert wanted and wanted <= set(entries), (wanted - set(entries), done.stdout[-3000:])
  for name in wanted:
    text = entries[name]
    assert re.sub(r"<[^>]*>:", "", text).strip(), f"--{name} has no help text"
    assert "(default:" in text or "(required)" in text, f"--{name}: {text!r} shows no default"
  assert "JAXSPATIAL_DEBUG=1" in done.stdout


@pytest.mark.parametrize("option", ["-h", "--helpshort", "--helpfull", "-?"])
def test_every_help_option_exits_zero(option):
  done = launch("train", option)
  assert done.returncode == 0 and "--config" in done.stdout, done.stderr[-2000:]


# -- one-line errors ---------------------------------------------------------------------

def one_line_error(done, *words):
  """The command failed with status 1 and one stderr line holding every one of `words`."""
  assert done.returncode == 1, done.stderr[-3000:]
  assert "Traceback" not in done.stderr, done.stderr[-3000:]
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1, done.stderr[-3000:]
  for word in words:
    assert word in lines[0], (word, lines[0])
  return lines[0]


@pytest.mark.parametrize("tool, args, words", [
    ("train", ["--config", "configs/nope.py"],
     ["train: --config configs/nope.py: no such config file", "configs/*.py"]),
    ("train", ["--config", "configs/demo.py", "--config.sft.stepz=3"],
     ["--config.sft.stepz", "sft has no key 'stepz'", "did you mean sft.steps?"]),
    ("train", ["--config", "configs/agent_recipe.py"],
     ["configs/agent_recipe.py: it defines no get_config()"]),
    ("eval", ["--config", "configs/demo.py", "--checkpoint", NOWHERE],
     [f"eval: --checkpoint {NOWHERE}: no such folder",
      "python -m launch.train --config configs/demo.py"]),
    ("eval", ["--benchmark", "mindcube_tiny", "--data_dir", NOWHERE, "--endpoint",
              "http://127.0.0.1:9/v1", "--model", "m", "--out", NOWHERE],
     [f"benchmark mindcube_tiny is not prepared under {NOWHERE}",
      "python -m launch.build_benchmark --benchmark mindcube_tiny"]),
    ("export", ["--checkpoint", NOWHERE, "--out", NOWHERE],
     [f"--checkpoint {NOWHERE}: no such folder", "python -m launch.train"]),
    ("serve", ["--checkpoint", NOWHERE],
     [f"serve: --checkpoint {NOWHERE}: no such folder", "launch.export --out"]),
    ("build_benchmark", ["--benchmark", "mindcube_tiny", "--source", NOWHERE],
     [f"build_benchmark: --source {NOWHERE}: no such folder", "published files"]),
    ("build_benchmark", ["--source", NOWHERE], ["--benchmark must have a value"]),
    ("build_data", ["--data-dir", "x"], ["Unknown command line flag 'data-dir'", "data_dir"]),
    ("perception_server", ["--tools", "nope"], ["unknown tool families or tools ['nope']"]),
    ("show_samples", ["--split", "nope"], ["unknown split 'nope'", "'validation'"]),
])
def test_a_mistake_is_one_line_with_the_fix(tool, args, words):
  one_line_error(launch(tool, *args), *words)


def test_debug_shows_the_traceback():
  done = launch("show_samples", "--split", "nope", JAXSPATIAL_DEBUG="1")
  assert done.returncode == 1 and "Traceback" in done.stderr
  assert done.stderr.strip().endswith("expected one of ('train', 'validation', 'test')")


def test_a_bug_keeps_its_traceback(tmp_path, monkeypatch):
  """A ValueError our code raises on purpose reports the input; one a builtin or a library
  raises is a bug."""
  (tmp_path / "recipes").mkdir()
  module = tmp_path / "recipes" / "tool.py"
  module.write_text("def chosen(x):\n  raise ValueError(f'--x: {x} is not one of a, b')\n\n"
                    "def empty():\n  return max([])\n\ndef missing(path):\n"
                    "  return open(path)\n")
  spec = importlib.util.spec_from_file_location("_tool_under_test", module)
  tool = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(tool)
  monkeypatch.setattr(cli, "_ROOT", tmp_path)

  def raised(function, *args):
    with pytest.raises(Exception) as caught:
      function(*args)
    return caught.value

  assert cli.user_error(raised(tool.chosen, "c"))
  assert cli.user_error(raised(tool.missing, tmp_path / "absent"))
  assert not cli.user_error(raised(tool.empty))
  assert not cli.user_error(raised(np.zeros(2).reshape, 3))
  assert not cli.user_error(raised(dict().__getitem__, "key"))


# -- a benchmark's images ----------------------------------------------------------------

def mindcube(source: pathlib.Path, questions: int, missing: int) -> list[str]:
  """A MindCube-Tiny layout under `source`: `questions` rows of two images each, the last
  `missing` images (in row order) absent; returns their paths."""
  rows = [{"id": f"among_q{k}", "category": ["c"], "type": "two_view", "meta_info": [],
           "question": "Which is left? A. chair B. table", "gt_answer": "A",
           "images": [f"other_all_image/among/set{k}/{view}.png" for view in ("front", "left")]}
          for k in range(questions)]
  names = [name for row in rows for name in row["images"]]
  for k, name in enumerate(names[:len(names) - missing]):
    (source / name).parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 6), (20 * k % 255, 90, 160)).save(source / name)
  (source / "raw").mkdir(parents=True, exist_ok=True)
  (source / "raw" / "MindCube_tinybench.jsonl").write_text(
      "".join(json.dumps(row) + "\n" for row in rows))
  return [str(source / name) for name in names[len(names) - missing:]]


def test_every_missing_image_is_reported_at_once(tmp_path):
  source = tmp_path / "MindCube"
  absent = mindcube(source, questions=10, missing=12)
  done = launch("build_benchmark", "--benchmark", "mindcube_tiny", "--source", source,
                "--data_dir", tmp_path / "data", "--width", 16, "--height", 12)
  assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
  first, *listed = done.stderr.strip().splitlines()
  assert first.startswith(f"build_benchmark: {source}/raw/MindCube_tinybench.jsonl: 12 "
                          "images not found, named by 6 questions"), first
  assert "the first 10" in first and len(listed) == 10, done.stderr
  for line, path in zip(listed, absent[:10]):
    row = 5 + absent.index(path) // 2
    assert line.strip() == f"row {row} (id 'among_q{row - 1}'): {path}"
  assert not any(path in done.stderr for path in absent[10:])


def test_a_build_prints_our_line_not_tfds(tmp_path):
  source = tmp_path / "MindCube"
  mindcube(source, questions=3, missing=0)
  done = launch("build_benchmark", "--benchmark", "mindcube_tiny", "--source", source,
                "--data_dir", tmp_path / "data", "--width", 16, "--height", 12)
  assert done.returncode == 0, done.stderr[-3000:]
  out = done.stdout.splitlines()
  assert out[0] == (f"building spatial_benchmark/mindcube_tiny from {source} into "
                    f"{tmp_path}/data/spatial_benchmark/mindcube_tiny/1.0.0"), done.stdout
  assert "test" in out[1] and "3 questions" in out[1] and "ready in" in out[-1]
  for tfds_line in ("Downloading and preparing", "Unknown size", "downloaded and prepared",
                    "Generating dataset"):
    assert tfds_line not in done.stdout + done.stderr


def test_the_missing_images_error_keeps_every_one(tmp_path):
  """In the library: one error with each missing image's own (file, row, id, path), a
  MissingImageError whose fields are the first one's; it survives pickling (a builder's
  worker process)."""
  absent = mindcube(tmp_path, questions=10, missing=12)
  with pytest.raises(MissingImagesError) as caught:
    mindcube_scenes(tmp_path / "raw" / "MindCube_tinybench.jsonl", tmp_path, width=16,
                    height=12)
  error = caught.value
  assert isinstance(error, MissingImageError) and isinstance(error, FileNotFoundError)
  assert [m.image for m in error.missing] == absent and error.questions == 6
  assert (error.row, error.record_id, error.image) == (5, "among_q4", absent[0])
  assert str(pickle.loads(pickle.dumps(error))) == str(error)
