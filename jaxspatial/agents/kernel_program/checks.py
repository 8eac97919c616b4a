"""The static check: a first filter that reports honest mistakes early. It is not a sandbox
(`defences` and the bubblewrap boundary are)."""

from __future__ import annotations

import ast
import unicodedata

from .defences import BLOCKED_FRAMEWORKS, framework_message

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
# Modules that other modules hold as attributes (PIL.Image.os, numpy's sys): reaching one
# that way is an import by another name. Not every forbidden module: scipy.io, scipy.signal
# and an object's `.code` are ordinary.
MODULE_ATTRIBUTES = frozenset({
    "os", "sys", "subprocess", "posix", "ctypes", "builtins", "importlib", "shutil",
    "socket", "pickle", "marshal", "multiprocessing", "_thread", "pty", "fcntl", "mmap",
    "resource", "gc"})
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
HINT = ("the kernel has no file, process or network access; use InputImages, Metadata, np, "
         "scipy, math, PIL, tools, vlm, show and ReturnAnswer")


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
      elif attr in MODULE_ATTRIBUTES:
        add(node, f"attribute {attr!r} (the module: {FORBIDDEN_MODULES[attr]}) is not "
            "allowed")
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
