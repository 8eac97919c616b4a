"""The SpatialClaw kernel, controller side: one sandboxed Python process per episode,
persistent across its cells.

    with Kernel(frames, metadata, tools={"Reconstruct": reconstruct}) as kernel:
      result = kernel.run_cell("points = tools.Reconstruct(frames=[0, 1])\\nprint(points.shape)")
      result.status, result.stdout, result.variables, result.images, result.answer

The model's code is hostile input. The boundary is the operating system (sandbox.py:
bubblewrap namespaces, read-only binds, a fresh unprivileged uid, rlimits); inside,
kernel_program adds a seccomp filter, audit hooks and a static check as depth. The
controller trusts nothing the kernel sends: messages are length-prefixed JSON (strict:
no NaN, no duplicate keys) and raw arrays of bool / numeric dtypes only, every size is
checked before it is read, the answer arrives only as an `answer` message (never parsed
from stdout), images and outputs are capped again here, and a kernel that breaks the
protocol is killed like one that crashed.

Limits and how each is enforced:
  cell_timeout_s     wall clock, here: past it the sandbox is SIGKILLed (bwrap's process
                     group; the PID namespace's init goes with it, and with the init every
                     process inside), status "timeout", the kernel restarted with its
                     preloaded state (earlier variables lost, which `error` says). Host tool
                     calls count toward it; one in progress is not interrupted.
  summary_timeout_s  inside: SIGALRM around each summary (a Python-level loop in a repr
                     becomes "(summary timed out)"); here: a cell whose summaries run past
                     it plus SUMMARY_GRACE_S (a repr that swallows the alarm or blocks in C)
                     is killed like a timeout.
  memory_bytes       RLIMIT_AS (allocations past it raise MemoryError in the cell).
  tmp_bytes          the private /tmp: a tmpfs of this size, RLIMIT_FSIZE alike (a write
                     past it fails with ENOSPC). A tmpfs is host memory outside RLIMIT_AS, so
                     it is capped on its own: one kernel holds at most memory_bytes +
                     tmp_bytes of host memory (defaults 4 GiB + 256 MiB), its controller
                     cell_image_bytes more.
  processes          RLIMIT_NPROC for the kernel's own uid (threads count; a fork bomb or a
                     thread bomb stops there); seccomp refuses fork / exec outright.
  stdout_bytes       inside: stdout / stderr each keep the first and last halves; here:
                     truncated again, and every message's size is bounded before reading.
  max_images         per episode (a timeout's restart keeps the count), inside and here.
  image_pixels       per image, inside (before sending) and here.
  cell_image_bytes   the bytes of images one cell may show (the controller holds them until
                     the cell ends), inside and here: a kernel that sends past it is stopped
                     before the controller reads the image. With the message size bounds and
                     reads that grow only as bytes arrive, the controller holds at most this
                     plus one message (MAX_ARRAY_BYTES) per cell.
  cpu_s              RLIMIT_CPU of the kernel process: CPU seconds (threads' included) over
                     the process's life after its start-up (a restart starts a new budget);
                     past it SIGXCPU ends the kernel: "killed", restarted. Default 1,800 s (an
                     episode's 30 cells of wall-clock-bounded work rarely use a tenth of it;
                     None: no cap).
  rollback           "full": a failed cell's new names are removed and rebound names
                     restored (in-place mutation of an existing object is not undone);
                     "partial": state up to the failing line is kept (status "partial").
Not enforced: GPU use (the kernel has none), a per-cell count of tool calls (the caller's
tools bound their own cost), monkeypatching of numpy / scipy within one episode (the next
episode is a fresh process).

A Kernel's sandbox dies with the thread that started it (bwrap's --die-with-parent uses
PR_SET_PDEATHSIG, which follows the creating thread): start kernels from long-lived
threads.
"""

from __future__ import annotations

import collections
import dataclasses
import fcntl
import inspect
import json
import keyword
import os
import select
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from typing import Callable, Mapping, Sequence

import numpy as np

from jaxspatial import strict_json
from jaxspatial.agents import kernel_program as wire
from jaxspatial.agents import sandbox as sandbox_lib
from jaxspatial.errors import KernelStartError

STARTUP_TIMEOUT_S = 60.0
SUMMARY_GRACE_S = 1.0
MAX_ARRAY_BYTES = 1 << 30
ANSWER_MAX_CHARS = wire.ANSWER_MAX_CHARS
ERROR_MAX_CHARS = wire.ERROR_MAX_CHARS
LABEL_MAX_CHARS = 200
TOOL_DOC_MAX_CHARS = 4000
DIAGNOSTICS_BYTES = 8192
STATUSES = ("ok", "error", "partial", "timeout", "killed")


@dataclasses.dataclass(frozen=True)
class Limits:
  """A kernel's limits (defaults for real episodes; tests pass small values)."""
  cell_timeout_s: float = 600.0
  summary_timeout_s: float = 5.0
  memory_bytes: int = 4 << 30
  processes: int = 64
  stdout_bytes: int = 1 << 20
  max_images: int = 250
  image_pixels: int = 4096 * 4096
  cell_image_bytes: int = 256 << 20
  tmp_bytes: int = 256 << 20
  cpu_s: float | None = 1800.0
  rollback: str = "full"  # "full" | "partial"

  def __post_init__(self):
    if self.rollback not in ("full", "partial"):
      raise ValueError(f"rollback must be 'full' or 'partial', not {self.rollback!r}")
    for name in ("cell_timeout_s", "summary_timeout_s"):
      if not getattr(self, name) > 0:
        raise ValueError(f"{name} must be positive")
    if self.memory_bytes < 256 << 20:
      raise ValueError("memory_bytes below 256 MiB cannot hold numpy and scipy")
    if self.processes < 4:
      raise ValueError("processes must be at least 4 (the interpreter's own threads count)")
    if (self.stdout_bytes < 64 or self.max_images < 0 or self.image_pixels < 1
        or self.cell_image_bytes < 0):
      raise ValueError("stdout_bytes >= 64, max_images >= 0, image_pixels >= 1 and "
                       "cell_image_bytes >= 0")
    if self.tmp_bytes < 1 << 20:
      raise ValueError(f"tmp_bytes must be at least 1 MiB, got {self.tmp_bytes}")
    if self.cpu_s is not None and not self.cpu_s > 0:
      raise ValueError("cpu_s must be positive or None")


@dataclasses.dataclass
class CellResult:
  """What one cell did. `status`: "ok", "error" (static check, syntax or runtime error; in
  full rollback the cell's bindings are undone), "partial" (runtime error in partial
  rollback: state kept up to `failing_line`), "timeout" or "killed" (the process was
  restarted; `error` says why and that earlier variables are lost)."""
  status: str
  stdout: str
  stderr: str
  error: str | None
  failing_line: int | None
  images: list[tuple[str, np.ndarray]]
  variables: list[str]
  answer: object | None
  answer_attempts: int
  tool_calls: dict[str, int]
  seconds: float


class _Deadline(Exception):
  pass


class _Died(Exception):
  """The kernel died, or (`protocol`) sent something the controller does not accept."""

  def __init__(self, message: str, protocol: bool = False):
    super().__init__(message)
    self.protocol = protocol


class _Drain(threading.Thread):
  """Reads the kernel's fd 1 / 2 (C-level output, crashes) and keeps the last bytes."""

  def __init__(self, fd: int):
    super().__init__(daemon=True, name="kernel-diagnostics")
    self.fd = fd
    self.tail = bytearray()

  def run(self):
    try:
      while True:
        chunk = os.read(self.fd, 65536)
        if not chunk:
          break
        self.tail += chunk
        if len(self.tail) > DIAGNOSTICS_BYTES:
          del self.tail[:len(self.tail) - DIAGNOSTICS_BYTES]
    except OSError:
      pass
    finally:
      os.close(self.fd)

  def text(self) -> str:
    return bytes(self.tail).decode("utf-8", "replace")


class _State:
  """What the finalizer needs: the process and the episode folder."""

  def __init__(self, folder: str):
    self.folder = folder
    self.process: subprocess.Popen | None = None
    self.fds: list[int] = []

  def stop(self, grace_s: float = 0.0) -> int | None:
    """Kills the process (after `grace_s` for it to exit by itself); its exit status."""
    code = None
    if self.process is not None:
      if grace_s > 0:
        try:
          self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
          pass
      code = sandbox_lib.kill(self.process)
      self.process = None
    for fd in self.fds:
      try:
        os.close(fd)
      except OSError:
        pass
    self.fds = []
    return code

  def cleanup(self) -> None:
    self.stop()
    sandbox_lib.remove_folder(self.folder)


def _cleanup(state: _State) -> None:
  state.cleanup()


def _json_default(value):
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, np.ndarray):
    return value.tolist()
  raise TypeError(f"{type(value).__name__} is not JSON")


def _clip(text: str, limit: int) -> str:
  if len(text) <= limit:
    return text
  return text[:limit - 40] + f" ... [{len(text) - limit + 40} characters cut]"


class Kernel:
  """A sandboxed, persistent Python kernel for one episode.

  Args:
    frames: the episode's input images (HxWx3 uint8), visible as `InputImages`.
    metadata: JSON-able frame / sample metadata, visible as `Metadata`.
    tools: host functions by name, visible as `tools.<name>(...)`, a dotted name as nested
      attributes (`SAM3.video`: tools.SAM3.video) and one under a top-level namespace
      (kernel_program.TOP_LEVEL: `vlm.locate`) as `vlm.locate(...)`: arguments and results
      are JSON values and bool / numeric numpy arrays (nested in lists / dicts).
    limits: see Limits and the module docstring.
    sandbox: False runs the kernel as a plain child process without bubblewrap, a uid,
      rlimits or seccomp: UNSAFE, for benchmarks' unsandboxed baseline only.
    static_check: False skips the static first filter (tests use it to reach the layers
      behind it).
  """

  def __init__(self, frames: Sequence[np.ndarray], metadata: dict,
               tools: Mapping[str, Callable] = {},  # pylint: disable=dangerous-default-value
               limits: Limits = Limits(), *, sandbox: bool = True, static_check: bool = True):
    if sandbox:
      sandbox_lib.require_bwrap()
    self.limits = limits
    self._sandbox = bool(sandbox)
    self._static_check = bool(static_check)
    self._tools = dict(tools)
    docs = {}
    for name, fn in self._tools.items():
      parts = name.split(".") if isinstance(name, str) else [None]
      if not all(isinstance(part, str) and part.isidentifier() and not part.startswith("_")
                 and not keyword.iskeyword(part) and part != "ToolError" for part in parts):
        raise ValueError(f"tool name {name!r} is not a dotted public identifier (or holds "
                         "ToolError)")
      if name in wire.TOP_LEVEL:
        raise ValueError(f"tool name {name!r} is a namespace; name its tools {name}.<name>")
      if not callable(fn):
        raise TypeError(f"tool {name!r} is not callable")
      docs[name] = (inspect.getdoc(fn) or "")[:TOOL_DOC_MAX_CHARS]
    try:
      episode = json.dumps({"metadata": metadata, "tools": docs}, allow_nan=False,
                           default=_json_default)
    except (TypeError, ValueError) as error:
      raise ValueError(f"metadata must be JSON (str keys, finite numbers): {error}") from None
    arrays = []
    for index, frame in enumerate(frames):
      frame = np.asarray(frame)
      if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError(f"frame {index} must be HxWx3 uint8, got {frame.dtype} "
                         f"{frame.shape}")
      arrays.append(frame)
    folder = tempfile.mkdtemp(prefix="jaxspatial-episode-")
    self._state = _State(folder)
    self._finalizer = weakref.finalize(self, _cleanup, self._state)
    os.makedirs(os.path.join(folder, "frames"))
    for index, frame in enumerate(arrays):
      np.save(os.path.join(folder, "frames", f"{index:05d}.npy"), frame, allow_pickle=False)
    with open(os.path.join(folder, "episode.json"), "w", encoding="utf-8") as f:
      f.write(episode)
    sandbox_lib.copy_kernel_program(folder)
    self._identity = sandbox_lib.Identity.fresh() if sandbox else None
    sandbox_lib.prepare_folder(folder, self._identity)
    self._images_shown = 0
    self._nonce = None  # the running cell's: every message in it must carry it
    self._image_bytes_left = 0
    self._closed = False
    self.defences: list[str] = []
    self._start()

  # -- lifecycle --
  def __enter__(self) -> "Kernel":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def close(self) -> None:
    """Kills the kernel and removes the episode folder."""
    self._closed = True
    self._finalizer()

  def reset(self) -> None:
    """A new process with the preloaded state (earlier variables are gone). The episode's
    image count is kept."""
    self._check_open()
    self._state.stop()
    self._start()

  @property
  def pid(self) -> int | None:
    """bwrap's (or the unsandboxed kernel's) host pid."""
    process = self._state.process
    return process.pid if process is not None else None

  @property
  def uid(self) -> int:
    """The host uid the kernel's processes run as."""
    return self._identity.owner if self._identity is not None else os.getuid()

  @property
  def folder(self) -> str:
    """The episode folder on the host (read-only for the kernel)."""
    return self._state.folder

  def _check_open(self):
    if self._closed:
      raise RuntimeError("the kernel is closed")

  def _start(self) -> None:
    self._nonce = None  # a new process: its first message is "ready", outside any cell
    to_kernel_r, to_kernel_w = os.pipe()
    from_kernel_r, from_kernel_w = os.pipe()
    diag_r, diag_w = os.pipe()
    for fd in (to_kernel_w, from_kernel_r):
      try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
      except OSError:
        pass
    os.set_blocking(to_kernel_w, False)
    config = {"inbox": to_kernel_r, "outbox": from_kernel_w, "limits": {
        "stdout_bytes": int(self.limits.stdout_bytes),
        "image_pixels": int(self.limits.image_pixels),
        "max_images": int(self.limits.max_images),
        "cell_image_bytes": int(self.limits.cell_image_bytes),
        "summary_timeout_s": float(self.limits.summary_timeout_s),
        "rollback": self.limits.rollback}}
    try:
      launched = sandbox_lib.launch(
          self._state.folder, sandbox_lib.KERNEL_SCRIPT, config, self.limits, sandbox=self._sandbox,
          identity=self._identity, pass_fds=(to_kernel_r, from_kernel_w), stdout=diag_w,
          stderr=diag_w)
    finally:
      for fd in (to_kernel_r, from_kernel_w, diag_w):
        os.close(fd)
    self._state.process = launched.process
    self._state.fds = [to_kernel_w, from_kernel_r]
    self._to, self._from = to_kernel_w, from_kernel_r
    self._drain = _Drain(diag_r)
    self._drain.start()
    try:
      msg, _ = self._receive(time.monotonic() + STARTUP_TIMEOUT_S)
      if msg.get("type") != "ready":
        raise _Died("no ready message")
    except (_Deadline, _Died) as error:
      self._state.stop()
      self._drain.join(timeout=5)
      raise KernelStartError(
          f"the kernel did not start ({error}); its output: "
          f"{self._drain.text()[-2000:] or '(none)'}") from None
    defences = msg.get("defences")
    self.defences = [str(d)[:100] for d in defences] if isinstance(defences, list) else []

  # -- the channel (everything from the kernel is hostile) --
  def _read_exact(self, n: int, deadline: float) -> bytearray:
    # The buffer grows as bytes arrive: a header claiming a large array that never comes
    # costs nothing.
    buf = bytearray()
    while len(buf) < n:
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        raise _Deadline()
      if not _wait(self._from, select.POLLIN, remaining):
        raise _Deadline()
      try:
        chunk = os.read(self._from, min(n - len(buf), 4 << 20))
      except OSError as error:
        raise _Died(f"reading the channel failed: {error}") from None
      if not chunk:
        raise _Died("the channel closed")
      buf += chunk
    return buf

  def _receive(self, deadline: float):
    magic, size, count = wire.HEADER.unpack(self._read_exact(wire.HEADER.size, deadline))
    max_json = 4 * int(self.limits.stdout_bytes) + (16 << 20)
    if magic != wire.MAGIC or size > max_json:
      raise _Died("protocol violation: bad header", protocol=True)
    try:
      envelope = strict_json.loads(self._read_exact(size, deadline).decode("utf-8"))
      if type(envelope) is not dict or type(envelope.get("msg")) is not dict:  # pylint: disable=unidiomatic-typecheck
        raise ValueError("not a message")
      specs = wire.check_array_specs(envelope.get("arrays"), count, MAX_ARRAY_BYTES)
    except (ValueError, RecursionError, UnicodeDecodeError) as error:
      raise _Died(f"protocol violation: {str(error)[:200]}", protocol=True) from None
    msg = envelope["msg"]
    if self._nonce is not None and msg.get("nonce") != self._nonce:
      raise _Died("protocol violation: a message that is not this cell's (an early or "
                  "forged one put the channel out of step)", protocol=True)
    if msg.get("type") == "show" and specs:
      shown = sum(nbytes for _, _, nbytes in specs)
      if shown > self._image_bytes_left:
        raise _Died(f"protocol violation: {shown} bytes of images past the cell's "
                    f"{self.limits.cell_image_bytes}", protocol=True)
      self._image_bytes_left -= shown
    arrays = []
    for dtype, shape, nbytes in specs:
      arrays.append(np.frombuffer(self._read_exact(nbytes, deadline), dtype=dtype)
                    .reshape(shape))
    return msg, arrays

  def _send(self, msg: dict, arrays=(), deadline: float | None = None) -> None:
    deadline = time.monotonic() + 60.0 if deadline is None else deadline
    for buf in wire.frame_message(msg, arrays):
      view = memoryview(buf).cast("B")
      while len(view):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
          raise _Deadline()
        if not _wait(self._to, select.POLLOUT, remaining):
          raise _Deadline()
        try:
          view = view[os.write(self._to, view[:1 << 20]):]
        except BlockingIOError:
          continue
        except OSError as error:
          raise _Died(f"writing the channel failed: {error}") from None

  # -- cells --
  def run_cell(self, code: str) -> CellResult:
    """Runs one cell; never raises for anything the code does."""
    self._check_open()
    if not isinstance(code, str):
      raise TypeError("code must be a str")
    start = time.monotonic()
    deadline = start + self.limits.cell_timeout_s
    images, notes = [], []
    tool_calls = collections.Counter()
    answer, attempts = None, 0
    phase = "cell"
    self._nonce = os.urandom(8).hex()
    self._image_bytes_left = int(self.limits.cell_image_bytes)
    try:
      self._send({"type": "cell", "code": code, "static_check": self._static_check,
                  "images_left": max(0, self.limits.max_images - self._images_shown),
                  "image_bytes_left": self._image_bytes_left, "nonce": self._nonce},
                 deadline=deadline)
      while True:
        msg, arrays = self._receive(deadline)
        kind = msg.get("type")
        if kind == "result":
          break
        if kind == "executed":
          if phase == "cell":
            phase = "summaries"
            deadline = time.monotonic() + self.limits.summary_timeout_s + SUMMARY_GRACE_S
        elif kind == "tool":
          self._tool(msg, arrays, tool_calls, deadline)
        elif kind == "show":
          self._show(msg, arrays, images, notes)
        elif kind == "answer":
          value = msg.get("value")
          if (type(value) in (str, int, float)  # pylint: disable=unidiomatic-typecheck
              and not (type(value) is str and len(value) > ANSWER_MAX_CHARS)):  # pylint: disable=unidiomatic-typecheck
            answer, attempts = value, attempts + 1
          else:
            notes.append("ReturnAnswer: an answer that is not one str, int or float was "
                         "ignored")
        else:
          raise _Died(f"protocol violation: unexpected message {str(kind)[:40]!r}",
                      protocol=True)
    except _Deadline:
      if phase == "cell":
        reason = (f"Timeout: the cell ran past {self.limits.cell_timeout_s:g} s and was "
                  "stopped.")
      else:
        reason = (f"Timeout: summarising the cell's variables ran past "
                  f"{self.limits.summary_timeout_s:g} s (a repr or len that does not return) "
                  "and the kernel was stopped.")
      return self._restart_result("timeout", reason, start, images, answer, attempts,
                                  tool_calls, notes)
    except _Died as error:
      if error.protocol:
        self._state.stop()
        reason = (f"Killed: the kernel sent a message the controller does not accept "
                  f"({error}) and was stopped.")
      else:
        code_ = self._state.stop(grace_s=1.0)
        reason = f"Killed: the kernel process died ({_exit_reason(code_, str(error))})."
      self._drain.join(timeout=5)
      last = [line for line in self._drain.text().splitlines() if line.strip()][-3:]
      if last:
        reason += " Its last output: " + " | ".join(line.strip()[:200] for line in last)
      return self._restart_result("killed", reason, start, images, answer, attempts,
                                  tool_calls, notes, stopped=True)
    return self._result(msg, start, images, answer, attempts, tool_calls, notes)

  def _restart_result(self, status, reason, start, images, answer, attempts, tool_calls,
                      notes, stopped=False) -> CellResult:
    if not stopped:
      self._state.stop()
    seconds = time.monotonic() - start
    reason += (" The kernel was restarted: variables from earlier cells are lost; "
               "InputImages, Metadata, tools, vlm, show and ReturnAnswer are loaded again.")
    self._start()
    return CellResult(status=status, stdout="", stderr="".join(f"{n}\n" for n in notes),
                      error=reason, failing_line=None, images=images, variables=[],
                      answer=answer, answer_attempts=attempts, tool_calls=dict(tool_calls),
                      seconds=seconds)

  def _result(self, msg, start, images, answer, attempts, tool_calls, notes) -> CellResult:
    def text(value, limit):
      return _clip(value, limit) if isinstance(value, str) else ""

    status = msg.get("status")
    if status not in ("ok", "error", "partial"):
      status, error = "error", "the kernel sent a malformed result"
    else:
      error = msg.get("error")
      error = _clip(error, ERROR_MAX_CHARS + 100) if isinstance(error, str) else None
    line = msg.get("failing_line")
    line = line if type(line) is int else None  # pylint: disable=unidiomatic-typecheck
    variables = msg.get("variables")
    variables = ([_clip(v, 300) for v in variables[:wire.MAX_SUMMARIES + 1]
                  if isinstance(v, str)] if isinstance(variables, list) else [])
    cap = int(self.limits.stdout_bytes) + 200
    stderr = text(msg.get("stderr"), cap) + "".join(f"{n}\n" for n in notes)
    return CellResult(status=status, stdout=text(msg.get("stdout"), cap), stderr=stderr,
                      error=error, failing_line=line, images=images, variables=variables,
                      answer=answer, answer_attempts=attempts, tool_calls=dict(tool_calls),
                      seconds=time.monotonic() - start)

  def _tool(self, msg, arrays, tool_calls, deadline) -> None:
    name = msg.get("name")
    fn = self._tools.get(name) if isinstance(name, str) else None
    if fn is None:
      self._send({"type": "tool_error", "error": f"there is no tool {str(name)[:60]!r}"},
                 deadline=deadline)
      return
    tool_calls[name] += 1
    try:
      args = wire.decode_value(msg.get("args"), arrays)
      kwargs = wire.decode_value(msg.get("kwargs"), arrays)
      if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise ValueError("malformed tool call")
    except (ValueError, RecursionError) as error:
      raise _Died(f"protocol violation: {str(error)[:200]}", protocol=True) from None
    try:
      value = fn(*args, **kwargs)
      out_arrays = []
      data = wire.encode_value(value, out_arrays)
    except Exception as error:  # pylint: disable=broad-except
      self._send({"type": "tool_error", "error": _clip(
          f"{wire.kernel_path(name)} failed: {type(error).__name__}: {error}", 1000)},
                 deadline=deadline)
      return
    self._send({"type": "tool_result", "value": data}, out_arrays, deadline=deadline)

  def _show(self, msg, arrays, images, notes) -> None:
    label = msg.get("label")
    label = label[:LABEL_MAX_CHARS] if isinstance(label, str) else ""
    image = arrays[0] if len(arrays) == 1 else None
    if (image is None or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3
        or image.shape[0] < 1 or image.shape[1] < 1):
      notes.append(f"show(): image {label!r} dropped: not an HxWx3 uint8 image")
    elif image.shape[0] * image.shape[1] > self.limits.image_pixels:
      notes.append(f"show(): image {label!r} dropped: over the limit of "
                   f"{self.limits.image_pixels} pixels")
    elif self._images_shown >= self.limits.max_images:
      notes.append(f"show(): image {label!r} dropped: the episode's limit of "
                   f"{self.limits.max_images} images is reached")
    else:
      self._images_shown += 1
      images.append((label, image))


def _wait(fd: int, event: int, timeout_s: float) -> bool:
  """Whether `fd` is ready for `event` (or hung up) within `timeout_s` (poll: no 1024-fd
  limit as with select)."""
  poller = select.poll()
  poller.register(fd, event)
  return bool(poller.poll(max(0, int(timeout_s * 1000) + 1)))


def _exit_reason(code: int | None, fallback: str) -> str:
  if code is None:
    return fallback
  number = -code if code < 0 else code - 128 if code > 128 else None
  if number is not None:
    try:
      name = signal.Signals(number).name
    except ValueError:
      name = f"signal {number}"
    extra = {"SIGXCPU": ": the CPU time limit", "SIGKILL": ": killed (e.g. out of memory)",
             "SIGSEGV": ": a crash", "SIGABRT": ": an abort"}.get(name, "")
    return f"{name}{extra}"
  return f"exit status {code}"
