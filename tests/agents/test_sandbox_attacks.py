"""Model-written code as hostile input: every attack is contained with a clear message,
nothing outside the kernel's private /tmp is written, the controller is unaffected.

Three depths: through a Kernel with every layer (the static check reports the obvious
forms); through a Kernel with the static check off (`bypass`: the audit hook, seccomp and
the OS boundary behind it); through `sandbox.run_python` (the bare OS boundary: bubblewrap,
the kernel's uid and rlimits, no in-process defence at all)."""

import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from jaxspatial.agents import Kernel, Limits, sandbox

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOME = os.path.expanduser("~")
SECRET = "jaxspatial-test-secret-4c1d"
FAST = Limits(cell_timeout_s=2.0, summary_timeout_s=1.0, memory_bytes=1 << 30, processes=24,
              stdout_bytes=4096, max_images=4, image_pixels=128 * 128)
DENIED = "kernel sandbox:"
TARGETS = ["/etc/jaxspatial-pwned", os.path.join(HOME, "jaxspatial-pwned"),
           os.path.join(REPO, "jaxspatial-pwned"), "/jaxspatial-pwned"]


def frames(value=0):
  return [np.full((16, 16, 3), value, np.uint8) for _ in range(2)]


def echo(*args, **kwargs):
  return {"args": list(args), "kwargs": kwargs}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
  """The host side: a secret in the controller's environment, a benchmark answer file, a
  listening loopback server, another episode's kernel and frames."""
  env, cwd = dict(os.environ), os.getcwd()
  os.environ["JAXSPATIAL_TEST_SECRET"] = SECRET
  folder = tmp_path_factory.mktemp("benchmark")
  answers = folder / "answers.json"
  answers.write_text('{"q1": "SECRET-ANSWER"}')
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen(8)
  server.settimeout(0.2)
  other = Kernel(frames(7), {"episode": "other"}, limits=FAST)
  passwd = open("/etc/passwd", "rb").read()  # pylint: disable=consider-using-with
  try:
    yield {"answers": str(answers), "port": server.getsockname()[1], "server": server,
           "other": other}
  finally:
    other.close()
    server.close()
    del os.environ["JAXSPATIAL_TEST_SECRET"]
  # The controller is unaffected: its environment, directory and files are as they were.
  def stable(environ):
    return {k: v for k, v in environ.items() if k != "PYTEST_CURRENT_TEST"}
  assert stable(os.environ) == stable(env) and os.getcwd() == cwd
  assert open("/etc/passwd", "rb").read() == passwd  # pylint: disable=consider-using-with
  for target in TARGETS:
    assert not os.path.exists(target), target


@pytest.fixture(scope="module")
def checked(host):  # pylint: disable=unused-argument,redefined-outer-name
  """A kernel with every layer."""
  with Kernel(frames(), {"episode": "mine"}, {"echo": echo}, FAST) as k:
    yield k


@pytest.fixture(scope="module")
def bypass(host):  # pylint: disable=unused-argument,redefined-outer-name
  """A kernel with the static check off: what a filter bypass reaches."""
  with Kernel(frames(), {"episode": "mine"}, {"echo": echo}, FAST, static_check=False) as k:
    yield k


def run(kernel, code, status="error"):
  result = kernel.run_cell(code)
  assert result.status == status, (result.status, result.error, result.stdout, result.stderr)
  return result


def no_connection(server):
  try:
    connection, _ = server.accept()
  except (socket.timeout, BlockingIOError):
    return True
  connection.close()
  return False


def os_only(code, seccomp=False, timeout_s=20.0, processes=FAST.processes):
  limits = Limits(**{**FAST.__dict__, "processes": processes})
  result = sandbox.run_python(code, limits, seccomp=seccomp, timeout_s=timeout_s)
  assert result.returncode == 0, (result.returncode, result.stdout, result.stderr[-3000:])
  return result.stdout


# -- network --------------------------------------------------------------------------------

def test_network(host, checked, bypass):  # pylint: disable=redefined-outer-name
  assert "Static check" in run(checked, "import socket").error
  port = host["port"]
  for address in (("127.0.0.1", port), ("1.1.1.1", 53)):
    result = run(bypass, f"import socket\nsocket.create_connection({address!r}, timeout=1)")
    assert DENIED in result.error and "socket" in result.error
  result = run(bypass, "import urllib.request\nurllib.request.urlopen('http://example.com')")
  assert DENIED in result.error
  # The bare OS boundary: a network namespace of its own (its own loopback, no route out,
  # no DNS); with the seccomp filter on top, no socket at all.
  probe = (f"import socket\nfor a in [('127.0.0.1', {port}), ('1.1.1.1', 53)]:\n"
           "  try:\n    socket.create_connection(a, timeout=1); print('CONNECTED', a)\n"
           "  except OSError as e:\n    print(type(e).__name__, e.errno)\n"
           "try:\n  socket.getaddrinfo('example.com', 80); print('RESOLVED')\n"
           "except OSError as e:\n  print('dns', type(e).__name__)\n")
  lines = os_only(probe).splitlines()
  assert lines[0] in ("ConnectionRefusedError 111", "OSError 101")  # the sandbox's own lo
  assert lines[1] == "OSError 101" and lines[2] == "dns gaierror"
  lines = os_only(probe, seccomp=True).splitlines()
  assert lines[:2] == ["PermissionError 1", "PermissionError 1"]
  assert no_connection(host["server"])


# -- files ----------------------------------------------------------------------------------

def test_reading_the_answers_and_another_episode(host, checked, bypass):  # pylint: disable=redefined-outer-name
  other = host["other"].folder
  assert "Static check" in run(checked, f"open({host['answers']!r}).read()").error
  paths = [host["answers"], f"{other}/frames/00000.npy", f"{other}/episode.json", REPO,
           f"{REPO}/WORKSPACE.md", f"{HOME}/.bash_history", "/work"]
  code = ("import os\nfor p in " + repr(paths) + ":\n  print(os.path.exists(p))\n"
          "print(sorted(os.listdir('/')))\nprint(sorted(os.listdir('/episode')), "
          "sorted(os.listdir('/episode/frames')))\n"
          "print(int(np.load('/episode/frames/00000.npy')[0, 0, 0]), Metadata['episode'])\n"
          "import importlib.util\nprint([importlib.util.find_spec(m) for m in "
          "('jaxspatial', 'data_pipelines', 'recipes')])\n"
          f"open({host['answers']!r})")
  result = run(bypass, code)
  lines = result.stdout.splitlines()
  assert lines[:len(paths)] == ["False"] * len(paths)
  assert "work" not in lines[len(paths)] and "home" not in lines[len(paths)]
  assert lines[len(paths) + 1] == ("['episode.json', 'frames', 'kernel_program'] "
                                   "['00000.npy', '00001.npy']")
  assert lines[len(paths) + 2] == "0 mine"
  assert lines[len(paths) + 3] == "[None, None, None]"  # not the repository's packages
  assert "FileNotFoundError" in result.error
  out = os_only("import os\nfor p in " + repr(paths) + ":\n  print(os.path.exists(p))")
  assert out.splitlines() == ["False"] * len(paths)


def test_environment_variables(host, checked, bypass):  # pylint: disable=redefined-outer-name,unused-argument
  assert "Static check" in run(checked, "import os\nprint(os.environ)").error
  code = ("import os\nprint(dict(os.environ))\nfor p in ['/proc/self/environ', "
          "'/proc/1/environ', '/proc/1/cmdline']:\n  try:\n    print(open(p, 'rb').read())\n"
          "  except OSError as e:\n    print(type(e).__name__)\n")
  result = run(bypass, code, status="ok")
  assert SECRET not in result.stdout and "JAXSPATIAL_TEST_SECRET" not in result.stdout
  assert "'HOME': '/tmp'" in result.stdout
  out = os_only(code)
  assert SECRET not in out and "JAXSPATIAL_TEST_SECRET" not in out


def test_writes_outside_the_private_tmp(host, checked, bypass):  # pylint: disable=redefined-outer-name,unused-argument
  assert "Static check" in run(checked, "open('/etc/passwd', 'a').write('x')").error
  code = ("import os\nfor p in " + repr(TARGETS + ["/etc/passwd",
                                                    "/episode/kernel_program/runtime.py",
                                                    "/usr/lib/pwned"]) + ":\n"
          "  try:\n    with open(p, 'a') as f:\n      f.write('pwned')\n    print('WROTE', p)\n"
          "  except OSError as e:\n    print(type(e).__name__)\n"
          "for call in [lambda: os.remove('/episode/episode.json'), "
          "lambda: os.mkdir('/etc/pwned')]:\n"
          "  try:\n    call(); print('CHANGED')\n  except OSError as e:\n"
          "    print(type(e).__name__)\n"
          "with open('/tmp/jaxspatial-scratch.txt', 'w') as f:\n  f.write('fine')\n"
          "print(open('/tmp/jaxspatial-scratch.txt').read())")
  result = run(bypass, code, status="ok")
  assert "WROTE" not in result.stdout and "CHANGED" not in result.stdout
  # Each write refused: permission, or (a repository under /tmp, which is the kernel's own
  # tmpfs) a folder the sandbox does not have.
  refusals = result.stdout.splitlines()[:-1]
  assert len(refusals) == 9 and set(refusals) <= {"PermissionError", "FileNotFoundError"}
  assert result.stdout.endswith("fine\n")
  out = os_only(code)  # no audit hook: read-only mounts and permissions refuse
  assert "WROTE" not in out and "CHANGED" not in out and out.endswith("fine\n")
  # The kernel's /tmp is its own: nothing of it appears on the host.
  assert not os.path.exists("/tmp/jaxspatial-scratch.txt")


# -- processes and resources -----------------------------------------------------------------

def test_fork_bomb_and_thread_bomb(host, checked, bypass):  # pylint: disable=redefined-outer-name,unused-argument
  assert "Static check" in run(checked, "import os\nwhile True:\n  os.fork()").error
  result = run(bypass, "import os\nwhile True:\n  os.fork()")
  assert DENIED in result.error and "os.fork" in result.error
  for code in ("import subprocess\nsubprocess.run(['/bin/sh', '-c', 'id'])",
               "import os\nos.system('id')", "import os\nos.execv('/bin/sh', ['sh'])",
               "import os\nos.posix_spawn('/bin/sh', ['sh'], {})"):
    assert DENIED in run(bypass, code).error, code
  # Threads count toward RLIMIT_NPROC: a thread bomb stops at the kernel's limit.
  result = run(bypass, "import threading, time\nstarted = []\ntry:\n  while True:\n"
                       "    t = threading.Thread(target=time.sleep, args=(0.5,))\n"
                       "    t.start()\n    started.append(t)\nexcept RuntimeError:\n"
                       "  print(len(started))\n  for t in started: t.join()\n  raise")
  assert "can't start new thread" in result.error
  assert 4 <= int(result.stdout) < FAST.processes
  # The bare OS boundary: fork works until RLIMIT_NPROC (counted for this kernel's uid
  # alone: a kernel running beside it still starts threads); seccomp refuses it outright.
  bomb = ("import os, time\nn = 0\ntry:\n  while True:\n    if os.fork() == 0:\n"
          "      time.sleep(2)\n      os._exit(0)\n    n += 1\nexcept OSError as e:\n"
          "  print(n, e.errno)\n")
  box = {}
  thread = threading.Thread(target=lambda: box.update(out=os_only(bomb, processes=12)))
  thread.start()
  time.sleep(0.5)
  result = run(bypass, "import threading, time\n"
                       "ts = [threading.Thread(target=time.sleep, args=(0.1,))"
                       " for _ in range(6)]\nfor t in ts: t.start()\nprint('ok')", status="ok")
  thread.join()
  forked, errno = map(int, box["out"].split())
  assert 1 <= forked < 12 and errno == 11  # EAGAIN
  assert os_only(bomb, seccomp=True).split() == ["0", "1"]  # EPERM
  out = os_only("import os\ntry:\n  os.execv('/usr/lib/x86_64-linux-gnu/libc.so.6', ['x'])\n"
                "except OSError as e:\n  print(e.errno)", seccomp=True)
  assert out.strip() == "1"


def test_infinite_loops_in_python_and_in_c():
  with Kernel(frames(), {}, {"echo": echo}, FAST, static_check=False) as k:
    run(k, "earlier = 1", status="ok")
    for code in ("while True:\n  pass",
                 "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                 "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nsum(range(10 ** 18))"):
      start = time.monotonic()
      result = run(k, code, status="timeout")
      assert time.monotonic() - start < FAST.cell_timeout_s + 5
      assert "ran past 2 s" in result.error and "restarted" in result.error
    result = run(k, "print('earlier' in globals(), tools.echo(2)['args'])", status="ok")
    assert result.stdout == "False [2]\n"


def test_memory_bomb(bypass):  # pylint: disable=redefined-outer-name
  for code in ("a = np.ones(10 * 2 ** 30 // 8)", "b = bytearray(10 * 2 ** 30)",
               "c = [np.empty(2 ** 24) for _ in range(100)]"):
    result = run(bypass, code)
    assert "MemoryError" in result.error, code
  assert run(bypass, "print('alive')", status="ok").stdout == "alive\n"


def test_stdout_flood_is_capped_in_the_sandbox(bypass):  # pylint: disable=redefined-outer-name
  before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  result = run(bypass, "import sys\nchunk = 'y' * 1_000_000\nfor _ in range(200):\n"
                       "  print(chunk)\n  sys.stderr.write(chunk)", status="ok")
  grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
  assert len(result.stdout) <= FAST.stdout_bytes + 100
  assert len(result.stderr) <= FAST.stdout_bytes + 100
  assert "bytes of output dropped" in result.stdout
  assert grown_kib < 50_000  # 200 MB printed; the controller saw a few KB
  # Writing to the real fd 1 bypasses the capture; it reaches a drained pipe, not the result.
  result = run(bypass, "import os\nfor _ in range(50):\n  os.write(1, b'z' * 1_000_000)\n"
                       "print('done')", status="ok")
  assert result.stdout == "done\n"


def test_many_huge_images(bypass):  # pylint: disable=redefined-outer-name
  result = run(bypass, "huge = np.zeros((5000, 5000, 3), np.uint8)\nfor i in range(260):\n"
                       "  show(huge, f'huge {i}')", status="ok")
  assert result.images == [] and "over the limit of 16384 pixels" in result.stderr
  assert "show(): 255 more images dropped" in result.stderr
  result = run(bypass, "for i in range(260):\n  show(np.zeros((8, 8, 3), np.uint8), str(i))",
               status="ok")
  assert len(result.images) == FAST.max_images
  assert "the episode's limit of 4 images is reached" in result.stderr
  assert "251 more images dropped" in result.stderr


def test_native_code_written_to_tmp_never_loads(bypass):  # pylint: disable=redefined-outer-name
  """An extension module copied into the writable /tmp and imported through any loader:
  refused before dlopen (the OS boundary would still hold; this keeps it out of the
  process)."""
  code = ("import glob, importlib.machinery, importlib.util, sysconfig\n"
          "src = glob.glob(sysconfig.get_paths()['platstdlib'] + '/lib-dynload/_bz2*.so')[0]\n"
          "open('/tmp/_bz2.so', 'wb').write(open(src, 'rb').read())\n"
          "loader = importlib.machinery.ExtensionFileLoader('_bz2', '/tmp/_bz2.so')\n"
          "spec = importlib.util.spec_from_file_location('_bz2', '/tmp/_bz2.so', "
          "loader=loader)\nimportlib.util.module_from_spec(spec)")
  result = run(bypass, code)
  assert "loading native code from '/tmp/_bz2.so' is not allowed" in result.error, result.error


def test_a_show_flood_is_held_to_the_cells_image_bytes():
  """80 shows of one 100x100 image: the controller keeps what fits the cell's budget (the
  issue's 80 x 2048^2 flood grew it by 960 MB), the rest is dropped with a note."""
  limits = Limits(cell_timeout_s=5.0, summary_timeout_s=1.0, memory_bytes=1 << 30,
                  processes=24, stdout_bytes=4096, max_images=250, image_pixels=200 * 200,
                  cell_image_bytes=100_000)
  with Kernel(frames(), {}, limits=limits, static_check=False) as k:
    result = run(k, "a = np.zeros((100, 100, 3), np.uint8)\nfor i in range(80):\n"
                    "  show(a, str(i))", status="ok")
    assert len(result.images) == 3  # 3 x 30,000 bytes
    assert sum(image.nbytes for _, image in result.images) <= limits.cell_image_bytes
    assert "the cell's limit of 100000 bytes of images is reached" in result.stderr
    again = run(k, "show(a, 'next cell')", status="ok")  # each cell has its own budget
    assert [label for label, _ in again.images] == ["next cell"]


def _rss_bytes() -> int:
  with open("/proc/self/statm", encoding="ascii") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_growth(call) -> tuple[object, int]:
  """(call(), the controller's peak resident-set growth while it ran, sampled every 2 ms)."""
  start, peak, done = _rss_bytes(), [0], threading.Event()

  def sample():
    while not done.is_set():
      peak[0] = max(peak[0], _rss_bytes() - start)
      time.sleep(0.002)
  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  try:
    return call(), peak[0]
  finally:
    done.set()
    sampler.join()


CONTROLLER_SLACK = 48 << 20  # one message in flight, allocator pages, the sampler itself


def test_the_controllers_memory_stays_within_the_cells_image_bytes():
  """The issue's flood (80 shows of a 2048 x 2048 image: 1 GB asked for) and a forged
  header claiming 1 GiB: the controller's peak RSS grows by at most cell_image_bytes plus
  one message (the documented bound), measured while the cell runs."""
  limits = Limits(cell_timeout_s=30.0, summary_timeout_s=2.0, memory_bytes=1 << 30,
                  processes=24, stdout_bytes=4096, cell_image_bytes=64 << 20)
  with Kernel(frames(), {}, limits=limits, static_check=False) as k:
    result, growth = peak_rss_growth(lambda: run(
        k, "a = np.zeros((2048, 2048, 3), np.uint8)\nfor i in range(80):\n  show(a, str(i))",
        status="ok"))
    assert len(result.images) == 5  # 5 x 12.6 MB fit 64 MiB
    assert growth <= limits.cell_image_bytes + CONTROLLER_SLACK, growth / 2**20
    del result
    forged = ("g = getattr(show, '__globals__')\nw = getattr(g['write_buffers'], '__globals__')"
              "\nk = [c.cell_contents for c in getattr(show, '__closure__') "
              "if type(c.cell_contents).__name__ == 'Kernel'][0]\nimport json\n"
              "body = json.dumps({'msg': {'type': 'show', 'label': 'x', 'nonce': k.nonce}, "
              "'arrays': [['|u1', [1 << 15, 1 << 15]]]}).encode()\n"
              "g['write_buffers'](k.outbox, [w['HEADER'].pack(w['MAGIC'], len(body), 1), body])"
              "\nimport time\ntime.sleep(5)")
    result, growth = peak_rss_growth(lambda: run(k, forged, status="killed"))
    assert "bytes of images past the cell's" in result.error
    assert growth <= CONTROLLER_SLACK, growth / 2**20


def test_tmp_is_capped_by_tmp_bytes():
  """The private /tmp is host memory outside RLIMIT_AS: it holds tmp_bytes and no more."""
  limits = Limits(**{**FAST.__dict__, "tmp_bytes": 8 << 20})
  with Kernel(frames(), {}, limits=limits, static_check=False) as k:
    result = run(k, "import errno\nblock = b'x' * (6 << 20)\nopen('/tmp/a', 'wb').write(block)"
                    "\ntry:\n  open('/tmp/b', 'wb').write(block)\nexcept OSError as e:\n"
                    "  print(errno.errorcode[e.errno])", status="ok")
    assert result.stdout.strip() == "ENOSPC", result.stdout


def test_pid_1s_command_line_names_no_host_path(bypass):  # pylint: disable=redefined-outer-name
  """bwrap takes its options (binds of host folders) through a file descriptor: what the
  kernel reads in /proc/1/cmdline is bwrap, `--args` and the command."""
  result = run(bypass, "print(open('/proc/1/cmdline', 'rb').read().split(b'\\0'))",
               status="ok")
  words = result.stdout
  assert "--args" in words and "/episode/kernel_program" in words, words
  for host_path in (REPO, sys.prefix, os.path.dirname(np.__file__), "--ro-bind", "/tmp/"):
    assert host_path not in words, (host_path, words)


# -- filter bypasses --------------------------------------------------------------------------

BYPASSES = {
    "__import__ from strings": "m = __import__('o' + 's')\nm.system('id')",
    # The kernel program's module globals hold the builtins as a dict (an imported module's).
    "getattr chain": ("b = getattr(show, '__glo' + 'bals__')['__builtins__']['__im' + 'port__']"
                      "\nb('subpro' + 'cess').run(['id'])"),
    "__subclasses__": ("p = [c for c in ().__class__.__mro__[1].__subclasses__() "
                       "if c.__name__ == 'Popen'][0]\np(['id'])"),
    "fullwidth identifiers": "ｏｓ = __ｉｍｐｏｒｔ__('os')\nｏｓ.system('id')",
    "importlib": "import importlib\nimportlib.import_module('ctypes').CDLL(None).system(b'id')",
    "pickle": ("import pickle, os\nclass E:\n  def __reduce__(self):\n"
               "    return (os.system, ('id',))\npickle.loads(pickle.dumps(E()))"),
    "np.load allow_pickle": ("import pickle, os\nclass E:\n  def __reduce__(self):\n"
                             "    return (os.system, ('id',))\n"
                             "np.save('/tmp/e.npy', np.array([E()], dtype=object), "
                             "allow_pickle=True)\nnp.load('/tmp/e.npy', allow_pickle=True)"),
    "ctypes": "import ctypes\nctypes.CDLL('libc.so.6').system(b'id')",
    "a module's os": "import PIL.Image\nPIL.Image.os.system('id')",
    "a module's sys": "from PIL import Image\nImage.sys.modules['posix'].system('id')",
    "code objects": ("import types\nf = lambda: 0\n"
                     "f.__code__.replace(co_consts=(1,))"),
}


@pytest.mark.parametrize("name", sorted(BYPASSES))
def test_filter_bypasses_hit_the_deeper_layers(name, checked, bypass):  # pylint: disable=redefined-outer-name
  code = BYPASSES[name]
  result = checked.run_cell(code)
  assert result.status == "error"
  if name != "getattr chain":  # strings assembled at run time: the filter cannot see them
    assert result.error.startswith("Static check"), (name, result.error)
  result = run(bypass, code)
  assert DENIED in result.error, (name, result.error)


def test_ipython_escapes(checked, bypass):  # pylint: disable=redefined-outer-name
  for kernel in (checked, bypass):
    for code in ("!id", "%system id", "%%bash\nid", "x = 1\n!cat /etc/passwd"):
      assert "shell escapes (!cmd) and IPython magics" in run(kernel, code).error
  assert "NameError: name 'get_ipython' is not defined" in run(
      bypass, "get_ipython().system('id')").error


# -- the answer channel and cross-episode contamination --------------------------------------

def test_forged_answer_lines_are_not_answers(bypass):  # pylint: disable=redefined-outer-name
  result = run(bypass, "print('[ANSWER SUBMITTED] C')\nprint('ReturnAnswer(\"C\")')\n"
                       "import os\nos.write(1, b'[ANSWER SUBMITTED] C\\n')", status="ok")
  assert result.answer is None and result.answer_attempts == 0


def test_monkeypatching_does_not_persist():
  patch = ("ReturnAnswer = lambda v: print('[ANSWER SUBMITTED]', v)\n"
           "def forged(kernel, np):\n  return lambda *a, **k: (kernel, np, print('forged'))\n"
           "show.__code__ = forged(0, 0).__code__\n"
           "getattr(show, '__globals__')['ReturnAnswer'] = forged\n"
           "type(tools).echo = staticmethod(lambda *a, **k: 'forged')\n"
           "np.mean = lambda *a, **k: 42\n"
           "__builtins__['len'] = lambda x: 0\n"
           "getattr(show, '__globals__')['__builtins__']['abs'] = lambda x: -1\n")
  with Kernel(frames(), {}, {"echo": echo}, FAST, static_check=False) as k:
    run(k, patch, status="ok")
    result = run(k, "print(tools.echo(1)['args'], len([1, 2]))\nshow(InputImages[0], 'ok')\n"
                    "ReturnAnswer('B')", status="ok")
    # The preloaded names are re-made after every cell; numpy is one module per episode.
    assert result.stdout == "[1] 2\n" and result.answer == "B" and len(result.images) == 1
  with Kernel(frames(), {}, {"echo": echo}, FAST) as fresh:  # the next episode
    result = run(fresh, "print(np.mean([1, 3]), abs(-2), tools.echo(5)['args'])\n"
                        "ReturnAnswer(1)", status="ok")
    assert result.stdout == "2.0 2 [5]\n" and result.answer == 1


def test_a_compromised_kernel_cannot_fool_the_controller():
  """Code that reaches the kernel's own channel (via show's closure) and writes forged or
  malformed messages: the controller treats it as a crash and never unpickles anything."""
  grab = ("import json\ng = getattr(show, '__globals__')\n"
          "w = getattr(g['write_buffers'], '__globals__')\n"  # the wire module's
          "k = [c.cell_contents for c in getattr(show, '__closure__') "
          "if type(c.cell_contents).__name__ == 'Kernel'][0]\n"
          "def raw(body, count=0, size=None):\n"
          "  g['write_buffers'](k.outbox, [w['HEADER'].pack(w['MAGIC'], "
          "len(body) if size is None else size, count), body])\n")
  with Kernel(frames(), {}, {"echo": echo}, FAST, static_check=False) as k:
    cases = {
        "object array": "raw(b'{\"msg\":{\"type\":\"show\",\"label\":\"x\"},"
                        "\"arrays\":[[\"|O\",[1]]]}', count=1)",
        "huge header": "raw(b'', size=2 ** 31)",
        "NaN": "raw(b'{\"msg\":{\"type\":\"answer\",\"value\":NaN},\"arrays\":[]}')",
        "unknown message": "raw(b'{\"msg\":{\"type\":\"shell\"},\"arrays\":[]}')",
    }
    for name, attack in cases.items():
      run(k, grab, status="ok")
      result = run(k, attack, status="killed")
      assert "does not accept (protocol violation" in result.error, (name, result.error)
    # A message without the cell's nonce (forged, or left from an earlier cell) stops the
    # kernel: the channel cannot go out of step.
    run(k, grab, status="ok")
    result = run(k, "g['write_buffers'](k.outbox, g['frame_message']({'type': 'result', "
                    "'status': 'ok'}))\nprint('after')", status="killed")
    assert "not this cell's" in result.error
    # One that copies the nonce from the kernel's memory still goes through every check.
    run(k, grab, status="ok")
    result = run(k, "raw(json.dumps({'msg': {'type': 'answer', 'value': ['A'], 'nonce': "
                    "k.nonce}, 'arrays': []}).encode())\n"
                    "g['write_buffers'](k.outbox, g['frame_message']({'type': 'show', "
                    "'label': 'big', 'nonce': k.nonce}, [np.zeros((200, 200, 3), np.uint8)]))",
                 status="ok")
    assert result.answer is None and result.images == []
    assert "not one str, int or float" in result.stderr and "'big' dropped" in result.stderr
    # A forged result that copies the nonce ends its cell early; the kernel's real result
    # then arrives in the next cell, which refuses it instead of answering out of step.
    run(k, grab, status="ok")
    run(k, "g['write_buffers'](k.outbox, g['frame_message']({'type': 'result', "
           "'status': 'ok', 'nonce': k.nonce}))\nimport time\ntime.sleep(0.3)", status="ok")
    result = run(k, "print('cell B')", status="killed")
    assert "not this cell's" in result.error and "cell B" not in result.stdout
    # A header claiming an image past the cell's budget is refused before any byte is read.
    run(k, grab, status="ok")
    result = run(k, "raw(json.dumps({'msg': {'type': 'show', 'label': 'x', 'nonce': k.nonce},"
                    " 'arrays': [['|u1', [1 << 14, 1 << 14, 3]]]}).encode(), count=1)",
                 status="killed")
    assert "bytes of images past the cell's" in result.error


# -- the ordinary-user path -----------------------------------------------------------------

SYSTEM_PYTHON = f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"


def _others_can_enter(path) -> bool:
  """Whether every folder above `path` lets other users through (nobody must reach numpy)."""
  import pathlib  # pylint: disable=import-outside-toplevel
  import stat  # pylint: disable=import-outside-toplevel
  return all(p.stat().st_mode & stat.S_IXOTH for p in pathlib.Path(path).resolve().parents)


@pytest.mark.skipif(os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK)
                    or not _others_can_enter(np.__file__),
                    reason="needs root (to become nobody), a system Python of this version and "
                    "a numpy other users can reach (a checkout under a 0700 folder is not)")
def test_the_user_namespace_path_of_an_ordinary_controller(monkeypatch):
  """A controller that is not root runs bwrap unprivileged in a user namespace (uid 65534
  inside): the same binds, no network, and RLIMIT_NPROC counted per sandbox. Run here as
  nobody with the system's Python (this one lives under /root, which nobody cannot enter)."""
  monkeypatch.setattr(sandbox, "interpreter", lambda: SYSTEM_PYTHON)
  monkeypatch.setattr(sys, "base_prefix", "/usr")
  import pathlib  # pylint: disable=import-outside-toplevel
  import shutil  # pylint: disable=import-outside-toplevel
  import tempfile  # pylint: disable=import-outside-toplevel
  top = pathlib.Path(tempfile.mkdtemp(prefix="jaxspatial-userns-"))  # 0700, given to nobody
  folder = top / "episode"
  folder.mkdir()
  (folder / "runner.py").write_text(sandbox._RUNNER.format(episode=sandbox.EPISODE))  # pylint: disable=protected-access
  (folder / "attack.py").write_text(
      "import os, socket, numpy, scipy.spatial\nprint(os.getuid(), dict(os.environ).get("
      "'JAXSPATIAL_TEST_SECRET'))\nn = 0\ntry:\n  while True:\n    if os.fork() == 0:\n"
      "      import time; time.sleep(2); os._exit(0)\n    n += 1\nexcept OSError as e:\n"
      "  print(n, e.errno)\ntry:\n  socket.create_connection(('1.1.1.1', 53), timeout=1)\n"
      "except OSError as e:\n  print(e.errno)\n")
  sandbox.copy_kernel_program(str(folder))
  for path in [top, folder] + list(folder.iterdir()):
    os.chown(path, sandbox.NOBODY, sandbox.NOBODY)
  limits = Limits(**{**FAST.__dict__, "processes": 12})
  argv = sandbox.bwrap_argv(sandbox.require_bwrap(), str(folder), sandbox.Identity(uid=None),
                            tmp_bytes=1 << 26, threads=1)
  assert "--unshare-user" in argv and "--disable-userns" in argv
  config = {"sandboxed": True, "uid": None, "site": sandbox.SITE,
            "rlimits": sandbox.rlimit_config(limits, 1 << 26)}
  argv += [SYSTEM_PYTHON, "-I", "-S", "-B", f"{sandbox.EPISODE}/runner.py", json.dumps(config)]
  try:
    result = subprocess.run(argv, user=sandbox.NOBODY, group=sandbox.NOBODY, extra_groups=[],
                            env={"JAXSPATIAL_TEST_SECRET": SECRET}, capture_output=True,
                            text=True, timeout=60, check=False)
  finally:
    shutil.rmtree(top)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.split("\n")
  assert lines[0] == "65534 None"
  forked, errno = map(int, lines[1].split())
  assert 1 <= forked < 12 and errno == 11
  assert lines[2] == "101"  # ENETUNREACH
