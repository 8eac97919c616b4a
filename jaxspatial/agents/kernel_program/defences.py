"""The kernel's in-process defences, installed before any model-written code runs (the
controller's sandbox, bubblewrap, is the boundary; these are depth): drop to the episode's
uid (when the controller is root), rlimits, a seccomp filter (x86_64), the import guard for
GPU frameworks, Python audit hooks."""

from __future__ import annotations

import math
import os
import struct

BLOCKED_FRAMEWORKS = frozenset({"jax", "jaxlib", "flax", "optax", "torch", "torchvision",
                                "tensorflow", "keras"})

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


class BlockedFrameworks:
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
  the GPU frameworks, extension modules loaded from `writable`, and writes (or path
  changes) outside it."""
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
      # An extension module's load names its file (before dlopen): native code written
      # into the writable folder never runs, whatever its name or loader.
      if len(args) > 1 and isinstance(args[1], (str, bytes)) and inside(args[1]):
        refuse(f"loading native code from {args[1]!r}")
      return
    if event in denied or event.startswith(denied_prefixes):
      refuse(event)
    if event in path_events:
      for arg in args:
        if isinstance(arg, (str, bytes)) and not inside(arg):
          refuse(f"{event} on {arg!r}")
      return

  return hook
