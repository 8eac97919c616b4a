"""The program inside the SpatialClaw kernel's sandbox: one process per episode, persistent
across its cells.

Standalone on purpose: its modules import only the standard library at module level (numpy,
scipy and PIL once it runs) and each other relatively, never jaxspatial, so the controller
copies this folder into the episode's read-only folder (`sandbox.copy_kernel_program`) and
runs it there as `python <episode>/kernel_program <config>` without the repository being
visible. Importing it has no side effects: the controller imports it for the wire format
(`wire`: `encode_value`, `decode_value`, `frame_message`, `check_array_specs`), the static
check (`checks`: `static_check`) and the tools' names (`names`: `kernel_path`).

  wire       the messages over the two pipes (never pickle)
  checks     the static check of a cell's code (a first filter, not a sandbox)
  defences   uid, rlimits, seccomp, the import guard, audit hooks (depth behind bubblewrap)
  summaries  captured output, variable summaries, compact tracebacks
  names      the preloaded names, `kernel_path`, the in-sandbox ToolError
  runtime    the Kernel (namespace, cell loop, tool proxies) and `main`
"""

from .checks import check_tree, parse_cell, static_check
from .names import PRELOADED, TOP_LEVEL, ToolError, kernel_path
from .runtime import ANSWER_MAX_CHARS, MAX_SUMMARIES, Kernel, main
from .summaries import ERROR_MAX_CHARS
from .wire import (HEADER, MAGIC, check_array_specs, decode_value, encode_value, frame_message,
                   read_message, write_buffers)

__all__ = ["ANSWER_MAX_CHARS", "ERROR_MAX_CHARS", "HEADER", "Kernel", "MAGIC", "MAX_SUMMARIES",
           "PRELOADED", "TOP_LEVEL", "ToolError", "check_array_specs", "check_tree",
           "decode_value", "encode_value", "frame_message", "kernel_path", "main", "parse_cell",
           "read_message", "static_check", "write_buffers"]
