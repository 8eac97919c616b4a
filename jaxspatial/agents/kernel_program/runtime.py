"""The kernel itself: the namespace the model's code runs in, the cell loop, the proxies to
the host tools, and `main`, the program's entry (`__main__`).

Messages, kernel -> controller: ready, executed (the cell's code finished; summaries follow),
result, tool (name, args, kwargs), show (label, image), answer (value). Controller -> kernel:
cell (code, images_left, image_bytes_left, nonce, static_check), tool_result (value) or
tool_error (error). Every message the kernel sends during a cell carries the cell's nonce.
"""

from __future__ import annotations

import ast
import builtins
import json
import math
import os
import signal
import sys
import time

from .checks import HINT, check_tree, parse_cell
from .defences import (BlockedFrameworks, drop_privileges_and_limit, install_seccomp, limit_cpu,
                       make_audit_hook)
from .names import PRELOADED, TOP_LEVEL, ToolError, kernel_path
from .summaries import Capped, clip, compact_error, short_repr, size_key, summary
from .wire import decode_value, encode_value, frame_message, read_message, write_buffers

ANSWER_MAX_CHARS = 10_000
SUMMARY_MAX_CHARS = 240
MAX_SUMMARIES = 60
MAX_NOTES = 5


class _SummaryTimeout(BaseException):
  pass


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
    self.image_bytes_left = 0
    self.nonce = None
    self.notes = []
    self.cells = 0
    self.sources = {}  # each cell's file name -> its lines, for tracebacks
    self.inject()

  # -- the channel --
  def send(self, msg: dict, arrays=()) -> None:
    if self.nonce is not None:
      msg = dict(msg, nonce=self.nonce)
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
      if array.nbytes > kernel.image_bytes_left:
        kernel.notes.append(
            f"show(): image {label!r} dropped: the cell's limit of "
            f"{kernel.limits['cell_image_bytes']} bytes of images is reached")
        return
      kernel.images_left -= 1
      kernel.image_bytes_left -= array.nbytes
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
    stdout, stderr = Capped(self.limits["stdout_bytes"]), Capped(self.limits["stdout_bytes"])
    result = {"type": "result", "status": "ok", "error": None, "failing_line": None}
    lines = code.splitlines()
    self.cells += 1
    filename = f"<cell {self.cells}>"
    self.sources[filename] = lines
    import linecache  # pylint: disable=import-outside-toplevel
    linecache.cache[filename] = (len(code), None, [line + "\n" for line in lines], filename)
    ns = self.ns
    before = {k: v for k, v in ns.items() if k not in PRELOADED and not k.startswith("__")}
    sizes = {k: size_key(v, np) for k, v in before.items()}
    try:
      tree = None
      try:
        tree = parse_cell(code)
        problems = check_tree(tree) if check else []
      except SyntaxError as error:
        result.update(status="error", failing_line=error.lineno,
                      error=clip(f"SyntaxError: {error.msg} (line {error.lineno}: "
                                  f"{(error.text or '').strip()[:120]})"))
      except (RecursionError, MemoryError, ValueError) as error:
        result.update(status="error", error=clip(f"{type(error).__name__}: the cell could "
                                                  f"not be parsed ({error})"))
      else:
        if problems:
          text = "; ".join(f"line {n}: {p}" for n, p in problems[:5])
          more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
          result.update(status="error", failing_line=problems[0][0],
                        error=clip(f"Static check: {text}{more} ({HINT})."))
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
          print(short_repr(value, 2000))
    except BaseException as error:  # pylint: disable=broad-except
      if isinstance(error, SyntaxError) and error.filename == filename:
        result.update(status="error", failing_line=error.lineno,
                      error=clip(f"SyntaxError: {error.msg} (line {error.lineno})"))
        return
      status = "partial" if self.limits["rollback"] == "partial" else "error"
      text, line = compact_error(error, filename, self.sources)
      result.update(status=status, error=text, failing_line=line)
    finally:
      sys.stdout, sys.stderr = old

  def _summaries(self, before, sizes, stdout, stderr) -> list[str]:
    np = self.np
    names = [k for k in self.ns if k not in PRELOADED and not k.startswith("_")
             and (k not in before or self.ns[k] is not before[k]
                  or size_key(self.ns[k], np) != sizes.get(k))]
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
            text = summary(self.ns[name], np)
          finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        except _SummaryTimeout:
          text = "(summary timed out)"
        except BaseException as error:  # pylint: disable=broad-except
          text = f"(summary failed: {type(error).__name__})"
        out.append(clip(f"{name}: {text}", SUMMARY_MAX_CHARS))
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
      self.image_bytes_left = int(msg.get("image_bytes_left", 0))
      self.nonce = str(msg.get("nonce", ""))
      try:
        result = self.run(str(msg.get("code", "")), bool(msg.get("static_check", True)))
      except BaseException as error:  # pylint: disable=broad-except
        # The cell broke the kernel's own bookkeeping (e.g. patched builtins): report it.
        result = {"type": "result", "status": "error", "failing_line": None,
                  "error": clip(f"the kernel could not finish the cell: "
                                 f"{type(error).__name__}: {error}"),
                  "stdout": "", "stderr": "", "variables": []}
      self.send(result)


def _raise_summary_timeout(signum, frame):  # pylint: disable=unused-argument
  raise _SummaryTimeout()


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
  sys.meta_path.insert(0, BlockedFrameworks())
  os.chdir(config["tmp"])
  kernel = Kernel(config, config["inbox"], config["outbox"], defences)
  if config.get("sandboxed"):
    limit_cpu(config)
  sys.addaudithook(make_audit_hook(config["tmp"]))
  defences.append("audit-hook")
  kernel.serve()
  return 0
