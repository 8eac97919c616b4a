"""The program inside the SpatialClaw kernel's sandbox: one process per episode, persistent
across its cells.

Standalone on purpose: it imports only the standard library at module level (numpy once it
runs), never jaxspatial, so the controller copies this file into the episode's read-only
folder and runs it there without the repository being visible. Importing it has no side
effects: the controller imports it for the wire format (`encode_value`, `decode_value`,
`frame_message`, `check_array_specs`) and the static check (`static_check`).

Wire format, both directions, over two pipes (never pickle):
    header  struct "<4sII": b"JSK1", JSON length, number of arrays
    JSON    UTF-8 object {"msg": {...}, "arrays": [[dtype, shape], ...]}
    arrays  each array's bytes in C order, in the order of "arrays"
Inside "msg" an array is {"\\x00array": index}, a non-finite float {"\\x00float": "nan"}; user
dictionaries may not have keys starting with "\\x00". Dtypes: bool and numeric (ALLOWED_DTYPES).

Messages, kernel -> controller: ready, executed (the cell's code finished; summaries follow),
result, tool (name, args, kwargs), show (label, image), answer (value). Controller -> kernel:
cell (code, images_left, static_check), tool_result (value) or tool_error (error).

Defences installed here, in order, before any model-written code runs (the controller's
sandbox, bubblewrap, is the boundary; these are depth): drop to the episode's uid (when the
controller is root), rlimits, a seccomp filter (x86_64), the import guard for GPU frameworks,
Python audit hooks.
"""

from __future__ import annotations

import ast
import builtins
import io
import json
import math
import os
import signal
import struct
import sys
import time
import traceback
import unicodedata

MAGIC = b"JSK1"
HEADER = struct.Struct("<4sII")
ARRAY_KEY = "\x00array"
FLOAT_KEY = "\x00float"
ALLOWED_DTYPES = frozenset({"|b1", "|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8",
                            "<f2", "<f4", "<f8", "<c8", "<c16"})
MAX_DEPTH = 64
MAX_NDIM = 8
ANSWER_MAX_CHARS = 10_000
ERROR_MAX_CHARS = 600
SUMMARY_MAX_CHARS = 240
MAX_SUMMARIES = 60
MAX_NOTES = 5
LARGE_BYTES = 500_000_000
PRELOADED = ("InputImages", "Metadata", "np", "numpy", "scipy", "math", "PIL", "tools",
             "vlm", "show", "ReturnAnswer")
# Host tools whose dotted name starts with one of these live at the top level of the
# namespace (`vlm.locate`, as the paper names them); every other name lives under `tools`
# (`Reconstruct` as tools.Reconstruct, `SAM3.video` as tools.SAM3.video).
TOP_LEVEL = ("vlm",)
BLOCKED_FRAMEWORKS = frozenset({"jax", "jaxlib", "flax", "optax", "torch", "torchvision",
                                "tensorflow", "keras"})

# ---------------------------------------------------------------------------------------
# The static check: a first filter that reports honest mistakes early. It is not a sandbox.

FORBIDDEN_MODULES = {
    # OS and processes
    "os": "operating-system access", "sys": "interpreter internals",
    "subprocess": "processes", "shutil": "file operations", "signal": "signals",
    "multiprocessing": "processes", "threading": "threads", "_thread": "threads",
    "ctypes": "native memory access", "posix": "operating-system access",
    "resource": "resource limits", "pty": "terminals", "fcntl": "file descriptors",
    "mmap": "memory maps", "gc": "interpreter internals", "builtins": "interpreter internals",
    "marshal": "code objects", "code": "code execution", "codeop": "code execution",
    # files
    "pathlib": "files", "io": "files", "glob": "files", "tempfile": "files",
    "pickle": "unpickling", "shelve": "unpickling", "dill": "unpickling",
    "cloudpickle": "unpickling", "joblib": "unpickling",
    # network
    "socket": "the network", "ssl": "the network", "http": "the network",
    "urllib": "the network", "requests": "the network", "webbrowser": "the network",
    "ftplib": "the network", "smtplib": "the network", "asyncio": "the network",
    # dynamic import
    "importlib": "dynamic imports",
    # ML frameworks (the kernel has no accelerator; perception runs through `tools`)
    "torch": "ML frameworks", "tensorflow": "ML frameworks", "jax": "ML frameworks",
    "jaxlib": "ML frameworks", "flax": "ML frameworks", "keras": "ML frameworks",
}
FORBIDDEN_BUILTINS = frozenset({"open", "exec", "eval", "compile", "__import__", "breakpoint",
                                "input", "get_ipython", "__builtins__"})
FORBIDDEN_ATTRIBUTES = frozenset({
    "__subclasses__", "__globals__", "__builtins__", "__code__", "__mro__", "__bases__",
    "__base__", "__closure__", "__loader__", "__spec__", "__reduce__", "__reduce_ex__",
    "f_globals", "f_locals", "f_back", "f_builtins", "gi_frame", "cr_frame", "ag_frame",
    "tb_frame", "co_code"})
FILE_CALLS = frozenset({"write", "writelines", "read", "readlines", "save", "savez",
                        "savez_compressed", "savetxt", "tofile", "savefig", "to_csv",
                        "to_json", "to_parquet", "to_pickle", "write_text", "write_bytes"})
_HINT = ("the kernel has no file, process or network access; use InputImages, Metadata, np, "
         "scipy, math, PIL, tools, vlm, show and ReturnAnswer")


def kernel_path(name: str) -> str:
  """How the model's code reaches host tool `name`: "vlm.locate" as vlm.locate,
  "SAM3.video" as tools.SAM3.video."""
  return name if name.partition(".")[0] in TOP_LEVEL else f"tools.{name}"


def parse_cell(code: str) -> ast.Module:
  """ast.parse of a cell; a line that starts a shell escape (!cmd) or an IPython magic
  (%cmd) is a SyntaxError that says so."""
  try:
    return ast.parse(code, "<cell>")
  except SyntaxError as error:
    lines = code.splitlines()
    number = error.lineno or 0
    line = lines[number - 1] if 0 < number <= len(lines) else ""
    if line.lstrip().startswith(("!", "%")):
      raise SyntaxError(
          "shell escapes (!cmd) and IPython magics (%cmd) are not available in this "
          "kernel; write plain Python", ("<cell>", number, 1, line)) from None
    raise


def _nfkc(name: str) -> str:
  return unicodedata.normalize("NFKC", name)


def static_check(code: str) -> list[tuple[int, str]]:
  """(line, problem) for each forbidden import, builtin, escape attribute or file call in
  `code` (identifiers NFKC-normalised, as Python reads them); [] when none. A first filter
  only: the sandbox holds when it is bypassed. A SyntaxError propagates."""
  return check_tree(parse_cell(code))


def check_tree(tree: ast.Module) -> list[tuple[int, str]]:
  """`static_check` of a parsed cell."""
  problems = []

  def add(node, text):
    problems.append((getattr(node, "lineno", 0) or 0, text))

  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        root = _nfkc(alias.name).split(".")[0]
        if root in BLOCKED_FRAMEWORKS:
          add(node, framework_message(root))
        elif root in FORBIDDEN_MODULES:
          add(node, f"import of {root!r} ({FORBIDDEN_MODULES[root]}) is not allowed")
    elif isinstance(node, ast.ImportFrom):
      root = _nfkc(node.module or "").split(".")[0]
      if root in BLOCKED_FRAMEWORKS:
        add(node, framework_message(root))
      elif root in FORBIDDEN_MODULES:
        add(node, f"import from {root!r} ({FORBIDDEN_MODULES[root]}) is not allowed")
      for alias in node.names:
        if _nfkc(alias.name) in FORBIDDEN_MODULES and root in ("", "numpy", "scipy", "PIL"):
          add(node, f"import of {_nfkc(alias.name)!r} is not allowed")
    elif isinstance(node, ast.Name):
      name = _nfkc(node.id)
      if name in FORBIDDEN_BUILTINS:
        add(node, f"{name!r} is not allowed")
    elif isinstance(node, ast.Attribute):
      attr = _nfkc(node.attr)
      if attr in FORBIDDEN_ATTRIBUTES:
        add(node, f"attribute {attr!r} is not allowed")
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
      text = _nfkc(node.value)
      if text in FORBIDDEN_ATTRIBUTES or text == "__import__":
        add(node, f"the string {text!r} names an interpreter internal")
    if isinstance(node, ast.Call):
      func = node.func
      if isinstance(func, ast.Attribute) and _nfkc(func.attr) in FILE_CALLS:
        add(node, f"file call .{_nfkc(func.attr)}() is not allowed")
      elif isinstance(func, ast.Name) and _nfkc(func.id) == "Path":
        add(node, "Path() is not allowed (files)")
      for keyword in node.keywords:
        if (keyword.arg and _nfkc(keyword.arg) == "allow_pickle"
            and not (isinstance(keyword.value, ast.Constant) and not keyword.value.value)):
          add(node, "allow_pickle is not allowed (unpickling runs code)")
  problems.sort()
  return problems


# ---------------------------------------------------------------------------------------
# Wire format (shared with the controller, which imports this module).

def encode_value(value, arrays: list, depth: int = 0):
  """`value` as JSON-able data; numpy arrays appended to `arrays`. A TypeError / ValueError
  names what cannot be sent (anything but None, bool, int, float, str, lists, tuples,
  str-keyed dicts, numpy scalars and bool / numeric arrays)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  if depth > MAX_DEPTH:
    raise ValueError(f"nesting deeper than {MAX_DEPTH} levels")
  kind = type(value)
  if value is None or kind in (bool, str, int):
    return value
  if kind is float:
    return value if math.isfinite(value) else {FLOAT_KEY: repr(value)}
  if isinstance(value, np.ndarray):
    array = np.ascontiguousarray(value)
    if array.dtype.str not in ALLOWED_DTYPES:
      raise TypeError(f"arrays of dtype {array.dtype} cannot be sent (bool and numeric "
                      "dtypes only)")
    if array.ndim > MAX_NDIM:
      raise ValueError(f"arrays of more than {MAX_NDIM} dimensions cannot be sent")
    arrays.append(array)
    return {ARRAY_KEY: len(arrays) - 1}
  if isinstance(value, np.generic):
    if value.dtype.str not in ALLOWED_DTYPES:
      raise TypeError(f"numpy scalars of dtype {value.dtype} cannot be sent")
    return encode_value(value.item(), arrays, depth + 1)
  if kind in (list, tuple):
    return [encode_value(item, arrays, depth + 1) for item in value]
  if kind is dict:
    out = {}
    for key, item in value.items():
      if type(key) is not str:  # pylint: disable=unidiomatic-typecheck
        raise TypeError(f"dictionary keys must be str, not {type(key).__name__}")
      if key.startswith("\x00"):
        raise ValueError("dictionary keys may not start with NUL")
      out[key] = encode_value(item, arrays, depth + 1)
    return out
  raise TypeError(f"a {kind.__name__} cannot be sent: JSON values and bool / numeric numpy "
                  "arrays only")


def decode_value(data, arrays: list, depth: int = 0):
  """The inverse of `encode_value` (arrays by index into `arrays`); ValueError on anything
  malformed."""
  if depth > MAX_DEPTH + 1:
    raise ValueError("nesting too deep")
  kind = type(data)
  if data is None or kind in (bool, str, int, float):
    return data
  if kind is list:
    return [decode_value(item, arrays, depth + 1) for item in data]
  if kind is dict:
    if ARRAY_KEY in data:
      index = data[ARRAY_KEY]
      if len(data) != 1 or type(index) is not int or not 0 <= index < len(arrays):  # pylint: disable=unidiomatic-typecheck
        raise ValueError("bad array reference")
      return arrays[index]
    if FLOAT_KEY in data:
      if len(data) != 1 or data[FLOAT_KEY] not in ("nan", "inf", "-inf"):
        raise ValueError("bad float")
      return float(data[FLOAT_KEY])
    if any(key.startswith("\x00") for key in data):
      raise ValueError("reserved key")
    return {key: decode_value(item, arrays, depth + 1) for key, item in data.items()}
  raise ValueError(f"unexpected {kind.__name__}")


def frame_message(msg: dict, arrays=()) -> list:
  """The buffers of one message (header, JSON, each array's bytes)."""
  specs = [[array.dtype.str, list(array.shape)] for array in arrays]
  body = json.dumps({"msg": msg, "arrays": specs}, allow_nan=False,
                    separators=(",", ":")).encode("utf-8")
  return [HEADER.pack(MAGIC, len(body), len(specs)), body] + [
      memoryview(array).cast("B") if array.nbytes else b"" for array in arrays]


def check_array_specs(specs, count: int, max_bytes: int) -> list[tuple[str, tuple, int]]:
  """(dtype, shape, nbytes) of each declared array; ValueError for a dtype outside
  ALLOWED_DTYPES, a malformed shape, a count that differs from the header or more than
  `max_bytes` in all."""
  if type(specs) is not list or len(specs) != count:  # pylint: disable=unidiomatic-typecheck
    raise ValueError("array list does not match the header")
  out, total = [], 0
  for spec in specs:
    if type(spec) is not list or len(spec) != 2:  # pylint: disable=unidiomatic-typecheck
      raise ValueError("malformed array spec")
    dtype, shape = spec
    if dtype not in ALLOWED_DTYPES:
      raise ValueError(f"dtype {str(dtype)[:20]!r} is not allowed")
    if (type(shape) is not list or len(shape) > MAX_NDIM  # pylint: disable=unidiomatic-typecheck
        or any(type(d) is not int or not 0 <= d <= 1 << 40 for d in shape)):  # pylint: disable=unidiomatic-typecheck
      raise ValueError("malformed array shape")
    nbytes = int(dtype[2:]) if dtype[1] != "b" else 1
    for d in shape:
      nbytes *= d
    total += nbytes
    if total > max_bytes:
      raise ValueError(f"arrays larger than {max_bytes} bytes")
    out.append((dtype, tuple(shape), nbytes))
  return out


def _read_exact(fd: int, n: int) -> bytearray:
  buf = bytearray(n)
  view = memoryview(buf)
  got = 0
  while got < n:
    k = os.readv(fd, [view[got:]])
    if k == 0:
      raise EOFError("the controller closed the channel")
    got += k
  return buf


def read_message(fd: int):
  """One message from the (trusted) controller: (msg, arrays)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  magic, size, count = HEADER.unpack(_read_exact(fd, HEADER.size))
  if magic != MAGIC:
    raise ValueError("bad magic")
  envelope = json.loads(_read_exact(fd, size).decode("utf-8"))
  arrays = []
  for dtype, shape, nbytes in check_array_specs(envelope["arrays"], count, 1 << 40):
    arrays.append(np.frombuffer(_read_exact(fd, nbytes), dtype=dtype).reshape(shape))
  return envelope["msg"], arrays


def write_buffers(fd: int, buffers) -> None:
  for buf in buffers:
    view = memoryview(buf).cast("B")
    while len(view):
      view = view[os.write(fd, view):]


# ---------------------------------------------------------------------------------------
# Defences.

_X86_64_DENY = (
    41, 42, 43, 49, 50, 53, 288,  # socket, connect, accept, bind, listen, socketpair, accept4
    57, 58, 59, 322,  # fork, vfork, execve, execveat
    101, 310, 311, 438,  # ptrace, process_vm_readv / writev, pidfd_getfd
    105, 106, 113, 114, 116, 117, 119, 122, 123,  # set*uid / set*gid / setgroups
    135, 155, 159, 161, 163, 164, 165, 166, 167, 168, 169, 170, 171, 172, 173, 175, 176,
    179,  # personality .. quotactl (mount, chroot, swap, reboot, modules, iopl ...)
    212, 227, 246, 248, 249, 250, 272, 298, 303, 304, 305, 308, 313, 320, 321, 323,
    # lookup_dcookie, clock_settime, kexec, keys, unshare, perf_event_open, handles,
    # clock_adjtime, setns, finit_module, kexec_file_load, bpf, userfaultfd
    425, 426, 427, 428, 429, 430, 431, 432, 433, 442,  # io_uring, new mount API
)


def seccomp_program(machine: str) -> bytes | None:
  """A classic-BPF seccomp program for `machine` (x86_64 only; None elsewhere): EPERM for
  sockets, fork / exec, ptrace, mounts, namespaces, keys, bpf, io_uring and the like; clone
  only for threads (clone3 answers ENOSYS, so libc falls back to clone); anything not x86_64
  kills the process."""
  if machine != "x86_64":
    return None
  ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
  allow, errno, kill = 0x7FFF0000, 0x00050000, 0x80000000
  eperm, enosys = 1, 38
  prog = []

  def ins(code, jt, jf, k):
    prog.append(struct.pack("<HBBI", code, jt, jf, k))

  ins(ld, 0, 0, 4)  # seccomp_data.arch
  ins(jeq, 1, 0, 0xC000003E)  # AUDIT_ARCH_X86_64
  ins(ret, 0, 0, kill)
  ins(ld, 0, 0, 0)  # seccomp_data.nr
  ins(jge, 0, 1, 0x40000000)  # the x32 ABI
  ins(ret, 0, 0, errno | eperm)
  for nr in _X86_64_DENY:
    ins(jeq, 0, 1, nr)
    ins(ret, 0, 0, errno | eperm)
  ins(jeq, 0, 1, 435)  # clone3
  ins(ret, 0, 0, errno | enosys)
  ins(jeq, 0, 3, 56)  # clone: threads only
  ins(ld, 0, 0, 16)  # args[0], low 32 bits
  ins(jset, 1, 0, 0x00010000)  # CLONE_THREAD
  ins(ret, 0, 0, errno | eperm)
  ins(ret, 0, 0, allow)
  return b"".join(prog)


def install_seccomp() -> str:
  """Loads `seccomp_program` into this process (and the threads it starts later); the
  defence's name, or why it was skipped."""
  import ctypes  # pylint: disable=import-outside-toplevel
  import platform  # pylint: disable=import-outside-toplevel
  program = seccomp_program(platform.machine())
  if program is None:
    return f"seccomp skipped ({platform.machine()} has no filter here)"

  class Filter(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

  libc = ctypes.CDLL(None, use_errno=True)
  if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
    raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
  fprog = Filter(len(program) // 8, program)
  if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, FILTER
    raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP failed")
  return "seccomp"


def drop_privileges_and_limit(config: dict) -> None:
  """The episode's uid / gid (when started as root with CAP_SETUID) and the rlimits:
  address space, processes (threads count), file size, open files, no core dumps (CPU
  seconds: `limit_cpu`). Soft and hard limits alike, so the code inside cannot raise them."""
  import resource  # pylint: disable=import-outside-toplevel
  uid = config.get("uid")
  if uid is not None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
  limits = config["rlimits"]

  def both(name, value):
    resource.setrlimit(getattr(resource, name), (value, value))

  both("RLIMIT_CORE", 0)
  both("RLIMIT_AS", limits["memory_bytes"])
  both("RLIMIT_NPROC", limits["processes"])
  both("RLIMIT_FSIZE", limits["file_bytes"])
  both("RLIMIT_NOFILE", 256)


def limit_cpu(config: dict) -> None:
  """RLIMIT_CPU: `cpu_s` seconds from now (the interpreter's start-up not counted); past it
  SIGXCPU ends the process (the hard limit, 2 s later, SIGKILL)."""
  import resource  # pylint: disable=import-outside-toplevel
  cpu_s = config["rlimits"].get("cpu_s")
  if cpu_s is not None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime + cpu_s)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 2))


class _BlockedFrameworks:
  """A meta-path finder that refuses the GPU frameworks with a message that says why."""

  def find_spec(self, name, path=None, target=None):  # pylint: disable=unused-argument
    if name.partition(".")[0] in BLOCKED_FRAMEWORKS:
      raise ModuleNotFoundError(framework_message(name))
    return None


def framework_message(name: str) -> str:
  return (f"{name.partition('.')[0]} is not available in the kernel: it has no accelerator; "
          "perception models run on the host through `tools`, numeric work with numpy / "
          "scipy")


_DENIED_PREFIXES = ("socket.", "ctypes.", "subprocess.", "os.exec", "os.spawn",
                    "os.posix_spawn", "os.fork", "os.forkpty", "pty.", "gc.get_",
                    "resource.", "_posixsubprocess.")
_DENIED = frozenset({"os.system", "os.startfile", "os.link", "os.symlink", "os.mkfifo",
                     "os.mknod", "code.__new__", "pickle.find_class", "fcntl.ioctl",
                     "builtins.input", "builtins.breakpoint", "sys._current_frames", "webbrowser.open", "urllib.Request",
                     "http.client.connect", "ftplib.connect", "smtplib.connect",
                     "sys.setprofile", "sys.settrace", "cpython._PySys_ClearAuditHooks"})
_PATH_EVENTS = frozenset({"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod",
                          "os.chown", "os.truncate", "os.utime", "os.chflags", "os.lchflags",
                          "os.setxattr", "os.removexattr", "shutil.copyfile", "shutil.copymode",
                          "shutil.copystat", "shutil.copytree", "shutil.move", "shutil.rmtree",
                          "shutil.make_archive", "shutil.unpack_archive", "os.chdir"})


def make_audit_hook(writable: str):
  """An audit hook refusing, once installed: sockets and the network, processes (subprocess,
  os.system, exec, fork, spawn), ctypes, unpickling classes, code objects, gc's object lists,
  the GPU frameworks, and writes (or path changes) outside `writable`."""
  prefix = os.path.normpath(writable) + os.sep
  write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
  denied, denied_prefixes, path_events = _DENIED, _DENIED_PREFIXES, _PATH_EVENTS
  blocked = BLOCKED_FRAMEWORKS
  fspath, normpath, isabs, join = os.fspath, os.path.normpath, os.path.isabs, os.path.join
  getcwd = os.getcwd

  def inside(path) -> bool:
    try:
      path = fspath(path)
      if isinstance(path, bytes):
        path = path.decode("utf-8", "surrogateescape")
      if not isinstance(path, str):
        return False
      if not isabs(path):
        path = join(getcwd(), path)
      path = normpath(path)
    except Exception:  # pylint: disable=broad-except
      return False
    return path == "/dev/null" or (path + os.sep).startswith(prefix)

  def refuse(what):
    raise PermissionError(f"kernel sandbox: {what} is not allowed (no processes, network, "
                          f"native code or writes outside {writable})")

  def hook(event, args):
    if event == "open":
      path, mode, flags = args
      writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
          isinstance(flags, int) and flags & write_flags)
      if writing and (isinstance(path, int) or not inside(path)):
        refuse(f"writing to {path!r}")
      return
    if event == "import":
      if args and isinstance(args[0], str) and args[0].partition(".")[0] in blocked:
        raise ModuleNotFoundError(framework_message(args[0]))
      return
    if event in denied or event.startswith(denied_prefixes):
      refuse(event)
    if event in path_events:
      for arg in args:
        if isinstance(arg, (str, bytes)) and not inside(arg):
          refuse(f"{event} on {arg!r}")
      return

  return hook


# ---------------------------------------------------------------------------------------
# The kernel.

class _Capped(io.TextIOBase):
  """A text stream keeping the first and the last `cap / 2` bytes of what is written."""

  def __init__(self, cap: int):
    super().__init__()
    self._half = max(1, cap // 2)
    self._head = bytearray()
    self._tail = bytearray()
    self._dropped = 0

  def writable(self):
    return True

  @property
  def encoding(self):
    return "utf-8"

  def write(self, text):
    if not isinstance(text, str):
      raise TypeError(f"write() argument must be str, not {type(text).__name__}")
    data = str.encode(text, "utf-8", "replace")
    room = self._half - len(self._head)
    if room > 0:
      self._head += data[:room]
      data = data[room:]
    if data:
      self._tail += data
      if len(self._tail) > 2 * self._half:
        cut = len(self._tail) - self._half
        self._dropped += cut
        del self._tail[:cut]
    return len(text)

  def getvalue(self) -> str:
    tail = self._tail
    dropped = self._dropped
    if len(tail) > self._half:
      dropped += len(tail) - self._half
      tail = tail[len(tail) - self._half:]
    head = self._head.decode("utf-8", "replace")
    if not dropped:
      return head + tail.decode("utf-8", "replace")
    return (head + f"\n[... {dropped} bytes of output dropped ...]\n"
            + tail.decode("utf-8", "ignore"))


class _SummaryTimeout(BaseException):
  pass


class ToolError(Exception):
  """A host tool failed; the message names the tool and the cause."""


class Kernel:
  """The in-sandbox side: the namespace, the cell loop and the proxies."""

  def __init__(self, config: dict, inbox: int, outbox: int, defences: list[str]):
    import numpy as np  # pylint: disable=import-outside-toplevel
    import scipy  # pylint: disable=import-outside-toplevel
    import PIL.Image  # pylint: disable=import-outside-toplevel,unused-import
    import PIL  # pylint: disable=import-outside-toplevel
    self.np, self.scipy, self.PIL = np, scipy, PIL
    self.inbox, self.outbox = inbox, outbox
    self.limits = config["limits"]
    self.defences = defences
    folder = config["episode"]
    self.frames = []
    for name in sorted(os.listdir(os.path.join(folder, "frames"))):
      self.frames.append(np.load(os.path.join(folder, "frames", name), mmap_mode="r",
                                 allow_pickle=False))
    with open(os.path.join(folder, "episode.json"), encoding="utf-8") as f:
      episode = json.load(f)
    self.metadata_text = json.dumps(episode["metadata"])
    self.tool_docs = episode["tools"]
    self.builtins = dict(builtins.__dict__)
    for name in ("breakpoint", "input", "exit", "quit", "copyright", "credits", "license"):
      self.builtins.pop(name, None)
    self.ns = {"__name__": "__main__"}
    self.images_left = 0
    self.notes = []
    self.cells = 0
    self.sources = {}  # each cell's file name -> its lines, for tracebacks
    self.inject()

  # -- the channel --
  def send(self, msg: dict, arrays=()) -> None:
    write_buffers(self.outbox, frame_message(msg, arrays))

  # -- the preloaded names (re-made after every cell: a rebinding or patch is undone) --
  def inject(self) -> None:
    ns = self.ns
    ns["__builtins__"] = dict(self.builtins)
    ns["InputImages"] = list(self.frames)
    ns["Metadata"] = json.loads(self.metadata_text)
    ns["np"] = ns["numpy"] = self.np
    ns["scipy"] = self.scipy
    ns["math"] = math
    ns["PIL"] = self.PIL
    ns.update(self.make_tools())
    ns["show"] = self.make_show()
    ns["ReturnAnswer"] = self.make_answer()

  def make_tools(self):
    """The `tools` and `vlm` namespaces (kernel_path): each dotted tool name a proxy; a
    name that is also a prefix of others (SAM3, SAM3.video) is callable and holds them."""
    kernel = self

    def proxy(name, doc):
      def call(*args, **kwargs):
        arrays = []
        try:
          msg = {"type": "tool", "name": name, "args": encode_value(list(args), arrays),
                 "kwargs": encode_value(dict(kwargs), arrays)}
        except (TypeError, ValueError) as error:
          raise TypeError(f"{kernel_path(name)}: {error}") from None
        kernel.send(msg, arrays)
        reply, reply_arrays = read_message(kernel.inbox)
        if reply.get("type") == "tool_error":
          raise ToolError(reply.get("error", f"{kernel_path(name)} failed"))
        return decode_value(reply.get("value"), reply_arrays)
      call.__name__ = call.__qualname__ = name.rpartition(".")[2]
      call.__doc__ = doc
      return call

    trees = {"tools": {}, **{root: {} for root in TOP_LEVEL}}
    for name in sorted(self.tool_docs):
      parts = name.split(".")
      root = parts[0] if parts[0] in TOP_LEVEL else "tools"
      node = trees[root]
      for part in (parts[1:] if root != "tools" else parts):
        node = node.setdefault(part, {})
      node[""] = name  # the tool this node calls

    def namespace(label, node, top):
      names = sorted(k for k in node if k)
      attrs = {}
      for key in names:
        child = node[key]
        if set(child) == {""}:
          attrs[key] = staticmethod(proxy(child[""], kernel.tool_docs[child[""]]))
        else:
          attrs[key] = namespace(f"{label}.{key}", child, False)
      if "" in node:
        attrs["__call__"] = staticmethod(proxy(node[""], kernel.tool_docs[node[""]]))
        attrs["__doc__"] = kernel.tool_docs[node[""]]
      else:
        attrs["__doc__"] = ("The host tools; each call runs on the host, arrays in and out."
                            if top else f"The {label} tools.")
      if top:
        attrs["ToolError"] = ToolError
      attrs["__repr__"] = lambda self: f"{label}({', '.join(names)})"
      attrs["__dir__"] = lambda self: list(names)
      attrs["__slots__"] = ()
      return type("Tools" if top else "ToolGroup", (), attrs)()

    return {root: namespace(root, tree, True) for root, tree in trees.items()}

  def make_show(self):
    kernel = self
    np = self.np

    def show(image, label=""):
      """Attaches an image (HxW or HxWx3; uint8, bool or float in [0, 1]; or a PIL image)
      to the next observation, with an optional label."""
      label = str(label)[:200]
      if isinstance(image, kernel.PIL.Image.Image):
        image = np.asarray(image.convert("RGB"))
      array = np.asarray(image)
      if array.ndim == 3 and array.shape[2] in (1, 4):
        array = array[..., :3] if array.shape[2] == 4 else array[..., 0]
      if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] != 3):
        raise ValueError(f"show() takes an HxW or HxWx3 image, got shape {array.shape}")
      pixels = int(array.shape[0]) * int(array.shape[1])
      if pixels == 0:
        raise ValueError("show() got an empty image")
      if pixels > kernel.limits["image_pixels"]:
        kernel.notes.append(
            f"show(): image {label!r} dropped: {array.shape[1]}x{array.shape[0]} is over the "
            f"limit of {kernel.limits['image_pixels']} pixels; resize it first")
        return
      if kernel.images_left <= 0:
        kernel.notes.append(
            f"show(): image {label!r} dropped: the episode's limit of "
            f"{kernel.limits['max_images']} images is reached")
        return
      if array.dtype == bool:
        array = array.astype(np.uint8) * 255
      elif array.dtype.kind == "f":
        scale = 255.0 if np.nanmax(array, initial=0.0) <= 1.0 else 1.0
        array = np.nan_to_num(np.clip(array * scale, 0, 255)).round().astype(np.uint8)
      elif array.dtype != np.uint8:
        array = np.clip(array, 0, 255).astype(np.uint8)
      if array.ndim == 2:
        array = np.repeat(array[:, :, None], 3, axis=2)
      kernel.images_left -= 1
      kernel.send({"type": "show", "label": label}, [np.ascontiguousarray(array)])

    return show

  def make_answer(self):
    kernel = self
    np = self.np

    def ReturnAnswer(value):  # pylint: disable=invalid-name
      """Submits the final answer (one str, int or float) to the controller."""
      if isinstance(value, np.generic):
        value = value.item()
      if type(value) not in (str, int, float):
        raise TypeError("ReturnAnswer takes one str, int or float, not "
                        f"{type(value).__name__}")
      if type(value) is float and not math.isfinite(value):
        raise ValueError("ReturnAnswer takes a finite number")
      if type(value) is str and len(value) > ANSWER_MAX_CHARS:
        raise ValueError(f"the answer is longer than {ANSWER_MAX_CHARS} characters")
      if type(value) is int and abs(value) > 10 ** 100:
        raise ValueError("the answer is too large a number")
      kernel.send({"type": "answer", "value": value})

    return ReturnAnswer

  # -- cells --
  def run(self, code: str, check: bool) -> dict:
    np = self.np
    self.notes = []
    stdout, stderr = _Capped(self.limits["stdout_bytes"]), _Capped(self.limits["stdout_bytes"])
    result = {"type": "result", "status": "ok", "error": None, "failing_line": None}
    lines = code.splitlines()
    self.cells += 1
    filename = f"<cell {self.cells}>"
    self.sources[filename] = lines
    import linecache  # pylint: disable=import-outside-toplevel
    linecache.cache[filename] = (len(code), None, [line + "\n" for line in lines], filename)
    ns = self.ns
    before = {k: v for k, v in ns.items() if k not in PRELOADED and not k.startswith("__")}
    sizes = {k: _size_key(v, np) for k, v in before.items()}
    try:
      tree = None
      try:
        tree = parse_cell(code)
        problems = check_tree(tree) if check else []
      except SyntaxError as error:
        result.update(status="error", failing_line=error.lineno,
                      error=_clip(f"SyntaxError: {error.msg} (line {error.lineno}: "
                                  f"{(error.text or '').strip()[:120]})"))
      except (RecursionError, MemoryError, ValueError) as error:
        result.update(status="error", error=_clip(f"{type(error).__name__}: the cell could "
                                                  f"not be parsed ({error})"))
      else:
        if problems:
          text = "; ".join(f"line {n}: {p}" for n, p in problems[:5])
          more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
          result.update(status="error", failing_line=problems[0][0],
                        error=_clip(f"Static check: {text}{more} ({_HINT})."))
          tree = None
      if tree is not None:
        self._execute(tree, filename, stdout, stderr, result)
        if result["status"] != "ok" and self.limits["rollback"] == "full":
          for key in [k for k in ns if k not in PRELOADED and not k.startswith("__")]:
            if key not in before:
              del ns[key]
          ns.update(before)
    finally:
      self.inject()
    self.send({"type": "executed"})
    result["variables"] = self._summaries(before, sizes, stdout, stderr)
    result["stdout"] = stdout.getvalue()
    notes = self.notes[:MAX_NOTES]
    if len(self.notes) > MAX_NOTES:
      notes.append(f"show(): {len(self.notes) - MAX_NOTES} more images dropped")
    result["stderr"] = stderr.getvalue() + "".join(f"{n}\n" for n in notes)
    return result

  def _execute(self, tree, filename, stdout, stderr, result) -> None:
    ns = self.ns
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = stdout, stderr
    try:
      last = None
      if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body.pop()
      exec(compile(tree, filename, "exec", dont_inherit=True), ns)  # pylint: disable=exec-used
      if last is not None:
        value = eval(compile(ast.Expression(last.value), filename, "eval",  # pylint: disable=eval-used
                             dont_inherit=True), ns)
        if value is not None:
          print(_short_repr(value, 2000))
    except BaseException as error:  # pylint: disable=broad-except
      if isinstance(error, SyntaxError) and error.filename == filename:
        result.update(status="error", failing_line=error.lineno,
                      error=_clip(f"SyntaxError: {error.msg} (line {error.lineno})"))
        return
      status = "partial" if self.limits["rollback"] == "partial" else "error"
      text, line = _compact_error(error, filename, self.sources)
      result.update(status=status, error=text, failing_line=line)
    finally:
      sys.stdout, sys.stderr = old

  def _summaries(self, before, sizes, stdout, stderr) -> list[str]:
    np = self.np
    names = [k for k in self.ns if k not in PRELOADED and not k.startswith("_")
             and (k not in before or self.ns[k] is not before[k]
                  or _size_key(self.ns[k], np) != sizes.get(k))]
    # Values whose summary runs no model-written code first; each summary gets at most a
    # quarter of the budget, so one adversarial repr does not starve the others.
    safe = (int, float, bool, str, type(None), np.ndarray)
    names.sort(key=lambda k: type(self.ns[k]) not in safe)
    budget = float(self.limits["summary_timeout_s"])
    deadline = time.monotonic() + budget
    out = []
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = stdout, stderr
    previous = signal.signal(signal.SIGALRM, _raise_summary_timeout)
    try:
      for index, name in enumerate(names):
        if index >= MAX_SUMMARIES:
          out.append(f"... and {len(names) - index} more")
          break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
          out.append(f"{name}: (not summarised: the {budget:g} s summary limit is spent)")
          continue
        try:
          signal.setitimer(signal.ITIMER_REAL, min(remaining, max(0.05, budget / 4)))
          try:
            text = _summary(self.ns[name], np)
          finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        except _SummaryTimeout:
          text = "(summary timed out)"
        except BaseException as error:  # pylint: disable=broad-except
          text = f"(summary failed: {type(error).__name__})"
        out.append(_clip(f"{name}: {text}", SUMMARY_MAX_CHARS))
    finally:
      signal.setitimer(signal.ITIMER_REAL, 0)
      signal.signal(signal.SIGALRM, previous)
      sys.stdout, sys.stderr = old
    return out

  def serve(self) -> None:
    self.send({"type": "ready", "defences": self.defences})
    while True:
      try:
        msg, _ = read_message(self.inbox)
      except EOFError:
        return
      if msg.get("type") != "cell":
        continue
      self.images_left = int(msg.get("images_left", 0))
      try:
        result = self.run(str(msg.get("code", "")), bool(msg.get("static_check", True)))
      except BaseException as error:  # pylint: disable=broad-except
        # The cell broke the kernel's own bookkeeping (e.g. patched builtins): report it.
        result = {"type": "result", "status": "error", "failing_line": None,
                  "error": _clip(f"the kernel could not finish the cell: "
                                 f"{type(error).__name__}: {error}"),
                  "stdout": "", "stderr": "", "variables": []}
      self.send(result)


def _raise_summary_timeout(signum, frame):  # pylint: disable=unused-argument
  raise _SummaryTimeout()


def _clip(text: str, limit: int = ERROR_MAX_CHARS) -> str:
  if len(text) <= limit:
    return text
  half = (limit - 5) // 2
  return text[:half] + " ... " + text[len(text) - (limit - 5 - half):]


def _short_repr(value, limit: int = 100) -> str:
  text = repr(value)
  if type(text) is not str:  # pylint: disable=unidiomatic-typecheck
    text = "<repr is not a str>"
  text = " ".join(text.split()) if limit <= 200 else text
  return _clip(text, limit)


def _size_key(value, np):
  kind = type(value)
  if kind in (list, dict, set, bytearray):
    return (kind, len(value))
  if kind is np.ndarray:
    return (kind, value.shape, value.dtype.str)
  return None


def _summary(value, np) -> str:
  kind = type(value)
  name = kind.__name__
  if isinstance(value, np.ndarray):
    text = f"ndarray shape={value.shape} dtype={value.dtype}"
    if value.size <= 8:
      text += f" = {_short_repr(value.tolist(), 80)}"
    elif value.size and value.dtype.kind in "biuf" and value.size <= 50_000_000:
      text += f" min={value.min():.4g} max={value.max():.4g}"
    if value.nbytes > LARGE_BYTES:
      text += f" [WARNING: {value.nbytes / 1e9:.2f} GB]"
    return text
  if kind in (int, float, bool, complex) or value is None:
    return f"{name} = {_short_repr(value)}"
  if kind is str:
    return f"str len={len(value)} = {_short_repr(value)}"
  if kind in (list, tuple, dict, set, frozenset):
    text = f"{name} len={len(value)} = {_short_repr(value)}"
    items = value.values() if kind is dict else value
    total = 0
    for i, item in enumerate(items):
      if i >= 10_000:
        break
      if type(item) is np.ndarray:
        total += item.nbytes
    if total > LARGE_BYTES:
      text += f" [WARNING: arrays of {total / 1e9:.2f} GB]"
    return text
  if kind.__name__ == "module":
    return f"module {getattr(value, '__name__', '?')}"
  if callable(value) and hasattr(value, "__name__") and kind.__name__ in (
      "function", "builtin_function_or_method", "type"):
    return f"{name} {value.__name__}"
  return f"{name} = {_short_repr(value)}"


def _compact_error(error: BaseException, filename: str,
                   sources: dict) -> tuple[str, int | None]:
  """(a traceback of at most ERROR_MAX_CHARS: the cells' lines on the way (this cell's as
  "line N", an earlier cell's as "cell K, line N"), the exception; the line of this cell's
  statement that raised)."""
  try:
    entries = traceback.extract_tb(error.__traceback__)
  except Exception:  # pylint: disable=broad-except
    entries = []
  ours = [e for e in entries if e.filename == filename]
  line = ours[0].lineno if ours else None
  cells = [e for e in entries if e.filename in sources]
  parts = []
  for entry in cells[-4:]:
    lines = sources[entry.filename]
    source = lines[entry.lineno - 1].strip() if 0 < (entry.lineno or 0) <= len(lines) else ""
    where = "" if entry.filename == filename else f"cell {entry.filename[6:-1]}, "
    parts.append(f"{where}line {entry.lineno}: {source[:160]}")
  if entries and entries[-1].filename not in sources:
    parts.append(f"  in {os.path.basename(entries[-1].filename)}, {entries[-1].name}")
  try:
    message = str(error)
  except BaseException:  # pylint: disable=broad-except
    message = "<unprintable>"
  exc = _clip(f"{type(error).__name__}: {message}" if message else type(error).__name__, 400)
  head = "\n".join(parts)
  room = ERROR_MAX_CHARS - len(exc) - 1
  if len(head) > room:
    head = head[len(head) - room:] if room > 0 else ""
  return (f"{head}\n{exc}" if head else exc), line


def main(argv: list[str]) -> int:
  config = json.loads(argv[1])
  defences = []
  if config.get("sandboxed"):
    drop_privileges_and_limit(config)
    defences.append("uid" if config.get("uid") is not None else "user-namespace")
    defences.append("rlimits")
    if config.get("seccomp", True):
      defences.append(install_seccomp())
  if config.get("site"):
    sys.path.append(config["site"])
  sys.meta_path.insert(0, _BlockedFrameworks())
  os.chdir(config["tmp"])
  kernel = Kernel(config, config["inbox"], config["outbox"], defences)
  if config.get("sandboxed"):
    limit_cpu(config)
  sys.addaudithook(make_audit_hook(config["tmp"]))
  defences.append("audit-hook")
  kernel.serve()
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
