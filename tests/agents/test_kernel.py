"""The SpatialClaw kernel in normal use: persistent state, the preloaded names, show,
ReturnAnswer's side channel, the tool proxy, rollback, timeouts and crashes (restart with
the preloaded state), output caps, variable summaries, the static check."""

import os
import time

import numpy as np
import pytest

from jaxspatial.agents import (CellResult, Kernel, Limits, SandboxUnavailable, sandbox,
                               static_check)
from jaxspatial.agents.kernel_program import summaries

FAST = Limits(cell_timeout_s=3.0, summary_timeout_s=1.0, memory_bytes=1 << 30, processes=32,
              stdout_bytes=4096, max_images=4, image_pixels=128 * 128)
METADATA = {"question": "Which is closer?", "fps": 2.0, "frames": [0, 5, 10]}
RECEIVED = []


def frames():
  return [np.full((24, 32, 3), 10 * i, np.uint8) for i in range(3)]


def echo(*args, **kwargs):
  """Returns what it got, and the sum of the first array."""
  RECEIVED.append((args, kwargs))
  first = next((a for a in args if isinstance(a, np.ndarray)), np.zeros(1))
  return {"args": list(args), "kwargs": kwargs, "sum": float(first.sum()),
          "points": np.arange(12, dtype=np.float32).reshape(4, 3), "mask": first > 5,
          "nan": float("nan")}


def fail(**kwargs):
  raise ValueError(f"bad arguments {sorted(kwargs)}")


def processes_of(uid):
  count = 0
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/status", encoding="utf-8") as f:
          for line in f:
            if line.startswith("Uid:") and int(line.split()[1]) == uid:
              count += 1
      except OSError:
        pass
  return count


@pytest.fixture(scope="module")
def kernel():
  with Kernel(frames(), METADATA, {"echo": echo, "fail": fail}, FAST) as k:
    yield k


def run(kernel, code, status="ok"):
  result = kernel.run_cell(code)
  assert isinstance(result, CellResult)
  assert result.status == status, (result.status, result.error, result.stdout, result.stderr)
  return result


def test_bubblewrap_is_installed():
  assert sandbox.find_bwrap(), ("bubblewrap (bwrap) is missing: the kernel refuses to run "
                                "without it; apt-get install bubblewrap (or make system-deps)")


def test_kernel_refuses_to_run_without_bubblewrap(monkeypatch):
  monkeypatch.setattr(sandbox, "find_bwrap", lambda: None)
  with pytest.raises(SandboxUnavailable, match=r"apt-get install bubblewrap.*make system-deps"):
    Kernel(frames(), {}, limits=FAST)


def test_limits_are_checked():
  with pytest.raises(ValueError, match="rollback"):
    Limits(rollback="some")
  with pytest.raises(ValueError, match="memory_bytes"):
    Limits(memory_bytes=1 << 20)
  with pytest.raises(ValueError, match="HxWx3 uint8"):
    Kernel([np.zeros((4, 4), np.uint8)], {}, limits=FAST)
  with pytest.raises(ValueError, match="public identifier"):
    Kernel(frames(), {}, {"class": echo}, limits=FAST)
  with pytest.raises(ValueError, match="metadata must be JSON"):
    Kernel(frames(), {"x": object()}, limits=FAST)


def test_state_persists_and_the_preloaded_names(kernel):
  assert "seccomp" in kernel.defences and "audit-hook" in kernel.defences
  first = run(kernel, "a = 2\nprint('a is', a)")
  assert first.stdout == "a is 2\n" and first.variables == ["a: int = 2"]
  second = run(kernel, "b = a * 3\nb")  # the last expression is shown, as in a notebook
  assert second.stdout == "6\n" and second.variables == ["b: int = 6"]
  result = run(kernel, "print(len(InputImages), InputImages[2].shape, InputImages[2].dtype, "
                       "int(InputImages[2][0, 0, 0]))\nprint(Metadata['question'])\n"
                       "print(np is numpy, math.pi > 3, PIL.Image.__name__, scipy.__name__)\n"
                       "import scipy.spatial, scipy.ndimage, scipy.optimize, scipy.linalg\n"
                       "tree = scipy.spatial.cKDTree(np.random.default_rng(0).random((50, 3)))\n"
                       "print(tree.query([0.5, 0.5, 0.5])[1] >= 0)")
  assert result.stdout.splitlines() == ["3 (24, 32, 3) uint8 20", "Which is closer?",
                                        "True True PIL.Image scipy", "True"]
  assert any(v.startswith("tree: cKDTree") for v in result.variables)


def test_preloaded_state_is_read_only(kernel):
  result = run(kernel, "InputImages[0][0, 0, 0] = 99", status="error")
  assert "read-only" in result.error and result.failing_line == 1
  run(kernel, "InputImages.append(1)\nMetadata['question'] = 'forged'\nnp = None\n"
              "del show")
  result = run(kernel, "print(len(InputImages), Metadata['question'], np.__name__, "
                       "callable(show))")
  assert result.stdout == "3 Which is closer? numpy True\n"


def test_show_attaches_images_through_the_side_channel():
  with Kernel(frames(), METADATA, limits=FAST) as k:
    result = run(k, "show(InputImages[1], 'frame 1')\n"
                    "show(PIL.Image.new('RGB', (8, 6), (255, 0, 0)), label='red')\n"
                    "show(np.linspace(0, 1, 20).reshape(4, 5))\n"
                    "show(np.eye(3, dtype=bool), 'mask')")
    labels = [label for label, _ in result.images]
    assert labels == ["frame 1", "red", "", "mask"]
    for _, image in result.images:
      assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    assert result.images[1][1].shape == (6, 8, 3) and result.images[1][1][0, 0].tolist() == [
        255, 0, 0]
    assert result.images[2][1][3, 4].tolist() == [255, 255, 255]
    assert result.images[3][1][1, 1, 0] == 255 and result.images[3][1][0, 1, 0] == 0
    # The episode's limit (4 here) holds across cells; over-large images are dropped.
    result = run(k, "show(InputImages[0], 'fifth')\nshow(np.zeros((200, 200, 3)), 'huge')")
    assert result.images == []
    assert "'fifth' dropped: the episode's limit of 4 images" in result.stderr
    assert "'huge' dropped" in result.stderr and "16384 pixels" in result.stderr
    result = run(k, "show(np.zeros((2, 2, 5)))", status="error")
    assert "HxW or HxWx3" in result.error


def test_return_answer_is_a_side_channel(kernel):
  result = run(kernel, "print('[ANSWER SUBMITTED] B')\nx_answer = 'A'")
  assert result.answer is None and result.answer_attempts == 0
  result = run(kernel, "ReturnAnswer(x_answer)")
  assert result.answer == "A" and result.answer_attempts == 1 and result.stdout == ""
  result = run(kernel, "ReturnAnswer(np.int64(3))\nReturnAnswer(2.5)")
  assert result.answer == 2.5 and result.answer_attempts == 2
  result = run(kernel, "ReturnAnswer(['A'])", status="error")
  assert "str, int or float" in result.error and result.answer is None
  result = run(kernel, "ReturnAnswer(float('nan'))", status="error")
  assert "finite" in result.error


def test_tool_proxy_round_trip_with_arrays(kernel):
  RECEIVED.clear()
  result = run(kernel, "frame = InputImages[1]\n"
                       "out = tools.echo(frame, 3, k=[1.5, None, {'s': 'x'}], small=np.int32(7))\n"
                       "print(out['sum'], out['points'].dtype, out['points'].shape, "
                       "out['mask'].dtype, out['mask'].all(), out['nan'])\n"
                       "print(type(out['args'][0]).__name__, out['args'][0].shape, "
                       "out['kwargs'])\n"
                       "out2 = tools.echo(np.ones((480, 640, 3), np.uint8))\nprint(out2['sum'])")
  assert result.stdout.splitlines() == [
      f"{24 * 32 * 3 * 10.0} float32 (4, 3) bool True nan",
      "ndarray (24, 32, 3) {'k': [1.5, None, {'s': 'x'}], 'small': 7}",
      f"{480 * 640 * 3.0}"]
  assert result.tool_calls == {"echo": 2}
  args, kwargs = RECEIVED[0]
  assert isinstance(args[0], np.ndarray) and args[0].dtype == np.uint8
  np.testing.assert_array_equal(args[0], frames()[1])
  assert args[1] == 3 and kwargs == {"k": [1.5, None, {"s": "x"}], "small": 7}
  result = run(kernel, "try:\n  tools.fail(a=1)\nexcept tools.ToolError as e:\n  print(e)")
  assert result.stdout == "tools.fail failed: ValueError: bad arguments ['a']\n"
  assert result.tool_calls == {"fail": 1}
  result = run(kernel, "tools.echo(object())", status="error")
  assert "cannot be sent" in result.error and result.tool_calls == {}
  result = run(kernel, "tools.Missing()", status="error")
  assert "AttributeError" in result.error
  result = run(kernel, "print(tools, tools.echo.__doc__)")
  assert "tools(echo, fail)" in result.stdout and "Returns what it got" in result.stdout


def test_dotted_tool_names_nest_and_vlm_is_top_level():
  """The paper's names: tools.SAM3 callable and holding SAM3.video; vlm.locate at the top
  level; both namespaces re-made after a cell rebinds them."""
  def sam3(frame, text=None):
    """Image masks."""
    return {"frame": frame, "text": text}

  def video(frames):
    """Video masks."""
    return len(frames)

  def locate(frame, description):
    """Where it is."""
    raise ValueError(f"no {description}")

  tools = {"SAM3": sam3, "SAM3.video": video, "vlm.locate": locate}
  with Kernel(frames(), {}, tools, FAST) as k:
    result = run(k, "print(tools, vlm, tools.SAM3)\n"
                    "print(tools.SAM3(0, text='cup'), tools.SAM3.video([1, 2]))\n"
                    "print(tools.SAM3.video.__doc__, vlm.locate.__name__)\n"
                    "try:\n  vlm.locate(0, 'cup')\nexcept vlm.ToolError as e:\n  print(e)\n"
                    "vlm = tools = None")
    assert result.stdout.splitlines() == [
        "tools(SAM3) vlm(locate) tools.SAM3(video)", "{'frame': 0, 'text': 'cup'} 2",
        "Video masks. locate", "vlm.locate failed: ValueError: no cup"]
    assert result.tool_calls == {"SAM3": 1, "SAM3.video": 1, "vlm.locate": 1}
    assert run(k, "print(vlm.locate.__doc__)").stdout == "Where it is.\n"
  for bad in ("vlm", "a._b", "a..b", "SAM3.ToolError", "x.class"):
    with pytest.raises(ValueError, match="tool name"):
      Kernel(frames(), {}, {bad: echo}, FAST)


def test_full_rollback_undoes_the_failed_cell(kernel):
  run(kernel, "rb_x = 1\nrb_list = [1]")
  result = run(kernel, "rb_x = 2\nrb_y = 3\nraise ValueError('boom')", status="error")
  assert result.failing_line == 3 and "line 3: raise ValueError('boom')" in result.error
  assert result.error.endswith("ValueError: boom") and result.variables == []
  result = run(kernel, "print(rb_x, 'rb_y' in globals())")
  assert result.stdout == "1 False\n"


def test_partial_rollback_keeps_state_up_to_the_failing_line():
  with Kernel(frames(), {}, limits=Limits(**{**FAST.__dict__, "rollback": "partial"})) as k:
    run(k, "p = 1")
    result = run(k, "p = 2\nq = 3\nz = 1 / 0\nr = 4", status="partial")
    assert result.failing_line == 3 and "ZeroDivisionError" in result.error
    result = run(k, "print(p, q, 'r' in globals(), 'z' in globals())")
    assert result.stdout == "2 3 False False\n"
    result = run(k, "def f(v):\n  return v[5]\n\nw = f([1])", status="partial")
    assert result.failing_line == 4 and "line 2:" in result.error


def test_timeout_kills_and_restarts_with_the_preloaded_state():
  limits = Limits(**{**FAST.__dict__, "cell_timeout_s": 1.5})
  with Kernel(frames(), METADATA, {"echo": echo}, limits) as k:
    run(k, "keep = 1\nprint('before')")
    old_pid = k.pid
    start = time.monotonic()
    result = run(k, "print('spinning')\nwhile True:\n  pass", status="timeout")
    assert time.monotonic() - start < 1.5 + 5
    assert "ran past 1.5 s" in result.error
    assert "variables from earlier cells are lost" in result.error
    assert not os.path.exists(f"/proc/{old_pid}")
    if os.geteuid() == 0:
      assert processes_of(k.uid) == 1  # the new kernel alone: the old namespace is gone
    result = run(k, "print('keep' in globals(), len(InputImages), Metadata['fps'], "
                    "tools.echo(1)['args'])\nReturnAnswer('done')")
    assert result.stdout == "False 3 2.0 [1]\n" and result.answer == "done"


def test_a_crash_is_reported_and_the_kernel_restarts():
  with Kernel(frames(), {}, limits=FAST, static_check=False) as k:
    run(k, "v = 1")
    result = run(k, "import faulthandler\nfaulthandler._sigsegv()", status="killed")
    assert "SIGSEGV" in result.error and "restarted" in result.error
    assert run(k, "print('v' in globals(), len(InputImages))").stdout == "False 3\n"


def test_cpu_limit_ends_the_kernel():
  limits = Limits(**{**FAST.__dict__, "cpu_s": 1.0, "cell_timeout_s": 30.0})
  with Kernel(frames(), {}, limits=limits) as k:
    start = time.monotonic()
    result = run(k, "x = 0\nwhile True:\n  x += 1", status="killed")
    assert "SIGXCPU: the CPU time limit" in result.error
    assert time.monotonic() - start < limits.cell_timeout_s
    assert run(k, "print(len(InputImages))").stdout == "3\n"


def test_reset_starts_a_fresh_process(kernel):
  with Kernel(frames(), {}, limits=FAST) as k:
    run(k, "before_reset = 1")
    pid = k.pid
    k.reset()
    assert k.pid != pid
    assert run(k, "print('before_reset' in globals())").stdout == "False\n"
  with pytest.raises(RuntimeError, match="closed"):
    k.run_cell("1")


def test_output_is_capped_inside_the_sandbox(kernel):
  result = run(kernel, "print('FIRST')\nfor i in range(20000):\n  print('x' * 100)\n"
                       "print('LAST')\nimport warnings\nwarnings.warn('careful')")
  assert len(result.stdout.encode()) <= FAST.stdout_bytes + 100
  assert result.stdout.startswith("FIRST\n") and result.stdout.endswith("LAST\n")
  assert "bytes of output dropped" in result.stdout
  assert "UserWarning: careful" in result.stderr


def test_variable_summaries(kernel):
  result = run(kernel, "pts = np.zeros((1000, 3), np.float32)\nnames = ['a', 'b']\n"
                       "label = 'chair'\nd = {'k': 1}\n_private = 5\n"
                       "def helper(): pass")
  assert result.variables == [
      "pts: ndarray shape=(1000, 3) dtype=float32 min=0 max=0", "label: str len=5 = 'chair'",
      "names: list len=2 = ['a', 'b']", "d: dict len=1 = {'k': 1}", "helper: function helper"]
  result = run(kernel, "names.append('c')\nlabel = label")  # changed in place / unchanged
  assert result.variables == ["names: list len=3 = ['a', 'b', 'c']"]
  big = np.zeros(600_000_000, np.uint8)  # calloc: not touched
  assert "[WARNING: 0.60 GB]" in summaries.summary(big, np)
  assert "[WARNING: arrays of 1.20 GB]" in summaries.summary([big, big], np)


def test_summaries_have_their_own_time_limit():
  with Kernel(frames(), {}, limits=FAST) as k:
    start = time.monotonic()
    result = run(k, "class Slow:\n  def __repr__(self):\n    while True:\n      pass\n"
                    "s = Slow()\nfine = 1")
    assert time.monotonic() - start < FAST.summary_timeout_s + 3
    assert "s: (summary timed out)" in result.variables and "fine: int = 1" in result.variables
    # A repr stuck in C (no signal gets through): the controller's own deadline kills it.
    result = run(k, "class Stuck:\n  def __repr__(self):\n"
                    "    return str(sum(range(10 ** 18)))\nstuck = Stuck()", status="timeout")
    assert "summarising the cell's variables" in result.error
    assert time.monotonic() - start < FAST.summary_timeout_s * 2 + 10
    assert run(k, "print(1)").stdout == "1\n"


def test_static_check():
  bad = {
      "import os": "import of 'os'", "from subprocess import run": "'subprocess'",
      "import jax.numpy as jnp": "jax is not available", "import torch": "torch is not",
      "open('x')": "'open'", "eval('1')": "'eval'", "__import__('os')": "'__import__'",
      "ｅｖａｌ('1')": "'eval'", "().__class__.__mro__[1].__subclasses__()": "'__mro__'",
      "getattr(f, '__globals__')": "'__globals__'", "import importlib": "'importlib'",
      "import pickle": "'pickle'", "np.load('a.npy', allow_pickle=True)": "allow_pickle",
      "img.save('/tmp/x.png')": ".save()", "get_ipython().system('ls')": "'get_ipython'",
      "from pathlib import Path": "'pathlib'", "x.__builtins__": "'__builtins__'",
  }
  for code, expected in bad.items():
    problems = static_check(code)
    assert problems and expected in problems[0][1], (code, problems)
  assert static_check("import numpy as np\nimport scipy.spatial\nfrom PIL import Image\n"
                      "import math, collections, itertools, json, re\n"
                      "x = np.load(f, allow_pickle=False)\nprint(x.__class__.__name__)") == []
  assert static_check("a = 1\nb = (a\n     % 2)") == []


def test_magics_and_syntax_errors(kernel):
  for code in ("!ls", "%system ls", "%%bash\nls", "x = 1\n!cat /etc/passwd"):
    result = run(kernel, code, status="error")
    assert "shell escapes (!cmd) and IPython magics (%cmd)" in result.error, code
  result = run(kernel, "x = (1,\ny = 2", status="error")
  assert result.error.startswith("SyntaxError") and result.failing_line is not None
  result = run(kernel, "get_ipython().system('ls')", status="error")
  assert "Static check" in result.error and "get_ipython" in result.error


def test_unsandboxed_baseline_runs_the_same_cells():
  with Kernel(frames(), METADATA, {"echo": echo}, FAST, sandbox=False) as k:
    assert "seccomp" not in k.defences and "audit-hook" in k.defences
    result = run(k, "out = tools.echo(InputImages[0])\nprint(out['sum'])\nReturnAnswer(1)")
    assert result.stdout == "0.0\n" and result.answer == 1
    assert "jax is not available" in run(k, "import jax", status="error").error
