"""The operating-system boundary around the SpatialClaw kernel: bubblewrap (bwrap).

One process per episode, started as

    bwrap <namespaces> --die-with-parent --new-session --clearenv <read-only binds>
          --ro-bind <episode folder> /episode --proc /proc --dev /dev --tmpfs /tmp
          --remount-ro / --chdir /tmp  <python> -I -S -B /episode/kernel_program <config>

- namespaces: every one bwrap has (network: no interfaces at all, not even loopback; PID:
  the kernel sees only its own processes; IPC, UTS, cgroup). As an ordinary user: a user
  namespace as well (`--unshare-all --unshare-user --uid 65534 --gid 65534
  --disable-userns`). As root, a user namespace would map the kernel to host root, whom the
  kernel exempts from RLIMIT_NPROC, so instead bwrap runs privileged with only CAP_SETUID /
  CAP_SETGID kept and the kernel program switches to a fresh unprivileged uid (random in
  [2^24, 2^31)) before anything else: no capabilities, no-new-privs, processes counted per
  kernel.
- files: read-only binds of the interpreter's installation (its own site-packages hidden
  under an empty tmpfs), /usr/lib (libc and friends), /etc/ld.so.cache, and numpy / scipy /
  PIL (with their bundled .libs) under /opt/kernel-site; the episode folder (kernel_program/,
  frames as .npy, episode.json) read-only, owned by the kernel's uid with modes 0500 / 0400;
  a private tmpfs /tmp (`Limits.tmp_bytes`); / remounted read-only. Not the repository,
  /work, $HOME, the data or any other episode. bwrap reads its options from a file
  descriptor (`--args`), so /proc/1/cmdline inside names no host path; /proc/self/mountinfo
  still shows each bind's host source path (procfs has no way to hide it): accepted, as
  the names reveal nothing that is not bound read-only already (the interpreter's and the
  packages' install locations, the episode folder's temporary name).
- /tmp is writable and executable (bwrap 0.8 mounts no tmpfs noexec): native code written
  there is kept out by seccomp (no exec) and the kernel's audit hook (no extension module,
  ctypes or dlopen from a writable path).
- environment: empty but for HOME / TMPDIR (/tmp), LANG and the BLAS thread counts.
- resources (set by the kernel program as soon as it starts): RLIMIT_AS, RLIMIT_NPROC (threads
  count), RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE 0.

`run_python` runs a script under exactly this boundary without the kernel's in-process
defences: the tests of the boundary alone use it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile

from jaxspatial.errors import SandboxUnavailable

INSTALL_HINT = ("install bubblewrap: `apt-get install bubblewrap` (or `make system-deps`); "
                "Kernel(..., sandbox=False) runs without it, unsafely (benchmark baselines "
                "only)")
EPISODE = "/episode"
SITE = "/opt/kernel-site"
TMP = "/tmp"
PACKAGES = ("numpy", "scipy", "PIL")
NOBODY = 65534
KERNEL_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_program")
KERNEL_SCRIPT = "kernel_program"  # what `launch` runs: the copied package, as a folder


def copy_kernel_program(folder: str) -> None:
  """Copies the kernel program (the `kernel_program` package, its sources only) into
  `folder`, the episode folder it runs from."""
  shutil.copytree(KERNEL_PROGRAM, os.path.join(folder, KERNEL_SCRIPT),
                  ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def find_bwrap() -> str | None:
  """The bwrap executable, or None."""
  found = shutil.which("bwrap")
  if found:
    return found
  return "/usr/bin/bwrap" if os.access("/usr/bin/bwrap", os.X_OK) else None


def require_bwrap() -> str:
  found = find_bwrap()
  if found is None:
    raise SandboxUnavailable(
        "bubblewrap (bwrap) is not installed: the SpatialClaw kernel runs model-written code "
        f"only inside it; {INSTALL_HINT}")
  return found


def interpreter() -> str:
  """The real Python executable (a virtual environment's base interpreter)."""
  return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def package_binds() -> list[tuple[str, str]]:
  """(host path, sandbox path) of numpy, scipy and PIL and their bundled shared-library
  folders (numpy.libs, scipy.libs, pillow.libs)."""
  binds, seen = [], set()
  for name in PACKAGES:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
      raise RuntimeError(f"{name} is not installed: the kernel preloads it")
    folder = os.path.dirname(os.path.realpath(spec.origin))
    binds.append((folder, f"{SITE}/{name}"))
    parent = os.path.dirname(folder)
    dist = {"PIL": "pillow"}.get(name, name)
    for entry in sorted(os.listdir(parent)):
      if entry.lower() in (f"{dist}.libs", f"{name.lower()}.libs") and entry not in seen:
        seen.add(entry)
        binds.append((os.path.join(parent, entry), f"{SITE}/{entry}"))
  return binds


@dataclasses.dataclass(frozen=True)
class Identity:
  """Who the kernel runs as: `uid` is the uid the kernel program switches to (root controllers),
  None when bwrap itself runs unprivileged inside a user namespace."""
  uid: int | None

  @staticmethod
  def fresh() -> "Identity":
    if os.geteuid() == 0:
      return Identity(uid=(1 << 24) + secrets.randbelow((1 << 31) - (1 << 24) - 1))
    return Identity(uid=None)

  @property
  def owner(self) -> int:
    """The host uid that owns the kernel's processes."""
    return self.uid if self.uid is not None else os.getuid()


def prepare_folder(folder: str, identity: Identity | None) -> None:
  """Makes the episode folder read-only for the kernel: owned by its uid, 0500 / 0400."""
  for root, dirs, files in os.walk(folder):
    for name in files:
      path = os.path.join(root, name)
      os.chmod(path, 0o400)
      if identity is not None and identity.uid is not None:
        os.chown(path, identity.uid, identity.uid)
    for name in dirs:
      os.chmod(os.path.join(root, name), 0o500)
  for root, dirs, _ in os.walk(folder):
    for name in dirs:
      if identity is not None and identity.uid is not None:
        os.chown(os.path.join(root, name), identity.uid, identity.uid)
  os.chmod(folder, 0o500)
  if identity is not None and identity.uid is not None:
    os.chown(folder, identity.uid, identity.uid)


def remove_folder(folder: str) -> None:
  if not os.path.isdir(folder):
    return
  for root, dirs, _ in os.walk(folder):
    os.chmod(root, 0o700)
    for name in dirs:
      os.chmod(os.path.join(root, name), 0o700)
  shutil.rmtree(folder, ignore_errors=True)


def _ancestors(path: str) -> list[str]:
  out = []
  path = os.path.dirname(path)
  while path not in ("/", ""):
    out.append(path)
    path = os.path.dirname(path)
  return out[::-1]


def bwrap_argv(bwrap: str, folder: str, identity: Identity, *, tmp_bytes: int,
               threads: int) -> list[str]:
  """bwrap's arguments up to (not including) the command."""
  argv = [bwrap, "--die-with-parent", "--new-session"]
  if identity.uid is not None:
    argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
             "--unshare-cgroup-try", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
  else:
    argv += ["--unshare-all", "--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY),
             "--disable-userns"]
  argv += ["--hostname", "kernel", "--clearenv"]
  for key, value in (("HOME", TMP), ("TMPDIR", TMP), ("LANG", "C.UTF-8"),
                     ("OPENBLAS_NUM_THREADS", str(threads)), ("OMP_NUM_THREADS", str(threads)),
                     ("MKL_NUM_THREADS", str(threads))):
    argv += ["--setenv", key, value]
  made = set()

  def ro_bind(source, dest, kind="--ro-bind"):
    for parent in _ancestors(dest):
      if parent not in made:
        argv.extend(["--perms", "0755", "--dir", parent])
        made.add(parent)
    argv.extend([kind, source, dest])
    made.add(dest)

  for path in ("/usr/lib", "/usr/lib64", "/usr/lib32"):
    if os.path.isdir(path) and not os.path.islink(path):
      ro_bind(path, path)
  for path in ("/lib", "/lib64", "/lib32", "/libx32"):
    if os.path.islink(path):
      argv += ["--symlink", os.readlink(path), path]
    elif os.path.isdir(path):
      ro_bind(path, path)
  for path in ("/etc/ld.so.cache", "/etc/localtime"):
    if os.path.exists(path):
      ro_bind(path, path, "--ro-bind-try")
  exe = interpreter()
  base = os.path.realpath(sys.base_prefix)
  if base == "/usr" or not exe.startswith(base + os.sep):
    ro_bind(exe, exe)
  if base != "/usr":
    ro_bind(base, base)
  # The installation's own site-packages (pip, IPython, anything installed globally) hidden.
  purelib = sysconfig.get_paths(vars={"base": base, "platbase": base})["purelib"]
  if os.path.isdir(purelib) and purelib.startswith(base + os.sep):
    argv += ["--tmpfs", purelib]
  for source, dest in package_binds():
    ro_bind(source, dest)
  ro_bind(folder, EPISODE)
  argv += ["--proc", "/proc", "--dev", "/dev",
           "--size", str(tmp_bytes), "--perms", "1777", "--tmpfs", TMP,
           "--remount-ro", "/", "--chdir", TMP]
  return argv


@dataclasses.dataclass
class Launch:
  """What `launch` started."""
  process: subprocess.Popen
  identity: Identity | None


def rlimit_config(limits, tmp_bytes: int) -> dict:
  return {"memory_bytes": int(limits.memory_bytes), "processes": int(limits.processes),
          "cpu_s": limits.cpu_s, "file_bytes": int(tmp_bytes)}


def tmp_bytes_for(limits) -> int:
  """The private /tmp's size and RLIMIT_FSIZE (`Limits.tmp_bytes`)."""
  return int(limits.tmp_bytes)


def blas_threads(limits) -> int:
  return max(1, min(4, os.cpu_count() or 1, int(limits.processes) // 16))


def launch(folder: str, script: str, config: dict, limits, *, sandbox: bool,
           identity: Identity | None, pass_fds=(), stdout=None, stderr=None) -> Launch:
  """Starts `script` (a file in `folder`) with `config` (JSON, argv[1]); inside bwrap when
  `sandbox` (the folder is then /episode, the temp dir /tmp, the packages under SITE),
  else as a plain child process in a session of its own (unsafe)."""
  tmp_bytes = tmp_bytes_for(limits)
  config = dict(config)
  options = None
  if sandbox:
    bwrap = require_bwrap()
    config.update(sandboxed=True, uid=identity.uid, episode=EPISODE, tmp=TMP, site=SITE,
                  rlimits=rlimit_config(limits, tmp_bytes))
    # bwrap's options (host paths of the episode folder and the packages) reach it through
    # a file descriptor: the command line, which the kernel reads as /proc/1/cmdline, holds
    # none of them.
    options = tempfile.TemporaryFile()  # pylint: disable=consider-using-with
    options.write(b"".join(arg.encode() + b"\0" for arg in bwrap_argv(
        bwrap, folder, identity, tmp_bytes=tmp_bytes, threads=blas_threads(limits))[1:]))
    options.seek(0)
    pass_fds = (*pass_fds, options.fileno())
    argv = [bwrap, "--args", str(options.fileno()), interpreter(), "-I", "-S", "-B",
            f"{EPISODE}/{script}", json.dumps(config)]
  else:
    tmp = os.path.join(folder, "tmp")
    os.makedirs(tmp, exist_ok=True)
    config.update(sandboxed=False, uid=None, episode=folder, tmp=tmp, site=None)
    argv = [sys.executable, "-I", "-B", os.path.join(folder, script), json.dumps(config)]
  try:
    process = subprocess.Popen(  # pylint: disable=consider-using-with
        argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
        pass_fds=tuple(pass_fds), close_fds=True, start_new_session=True,
        env={} if sandbox else _plain_env())
  finally:
    if options is not None:
      options.close()
  return Launch(process=process, identity=identity)


def _plain_env() -> dict:
  """The unsandboxed baseline's environment: no keys or tokens, just what Python needs."""
  keep = ("PATH", "LANG", "LC_ALL", "HOME")
  env = {k: os.environ[k] for k in keep if k in os.environ}
  env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
  return env


def kill(process: subprocess.Popen) -> int | None:
  """SIGKILL to the process group bwrap leads (bwrap, the namespace's init; the init's death
  takes every process of the PID namespace with it), then reaps bwrap. Its exit status."""
  try:
    os.killpg(process.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass
  try:
    process.kill()
  except ProcessLookupError:
    pass
  try:
    return process.wait(timeout=30)
  except subprocess.TimeoutExpired:
    return None


_RUNNER = """\
import json, sys
sys.path.insert(0, {episode!r})
from kernel_program import defences
config = json.loads(sys.argv[1])
defences.drop_privileges_and_limit(config)
defences.limit_cpu(config)
if config.get("seccomp_on"):
  defences.install_seccomp()
if config.get("site"):
  sys.path.append(config["site"])
with open({episode!r} + "/attack.py", encoding="utf-8") as f:
  source = f.read()
exec(compile(source, "attack.py", "exec"), {{"__name__": "__main__"}})
"""


def run_python(code: str, limits, *, seccomp: bool = False, timeout_s: float = 30.0,
               files: dict[str, bytes] | None = None) -> subprocess.CompletedProcess:
  """Runs `code` with the kernel's interpreter under the kernel's boundary alone: the same
  bwrap arguments, uid and rlimits, none of the kernel program's in-process defences (the static
  check, the audit hook, the import guard; the seccomp filter only with `seccomp`). `files`
  land in the read-only episode folder. stdout / stderr come back as text; past `timeout_s`
  the sandbox is killed and the return code is None."""
  require_bwrap()
  folder = tempfile.mkdtemp(prefix="jaxspatial-sandbox-")
  try:
    copy_kernel_program(folder)
    with open(os.path.join(folder, "runner.py"), "w", encoding="utf-8") as f:
      f.write(_RUNNER.format(episode=EPISODE))
    with open(os.path.join(folder, "attack.py"), "w", encoding="utf-8") as f:
      f.write(code)
    for name, data in (files or {}).items():
      with open(os.path.join(folder, name), "wb") as f:
        f.write(data)
    identity = Identity.fresh()
    prepare_folder(folder, identity)
    launched = launch(folder, "runner.py", {"seccomp_on": seccomp}, limits, sandbox=True,
                      identity=identity, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process = launched.process
    try:
      out, err = process.communicate(timeout=timeout_s)
      code_ = process.returncode
    except subprocess.TimeoutExpired:
      kill(process)
      out, err = process.communicate()
      code_ = None
    return subprocess.CompletedProcess(process.args, code_, out.decode("utf-8", "replace"),
                                       err.decode("utf-8", "replace"))
  finally:
    remove_folder(folder)
