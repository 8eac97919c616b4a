"""Serves perception tools over HTTP until SIGTERM or SIGINT.

    python -m launch.perception_server --host 0.0.0.0 --port 30888 --tools ocr,echo

`--tools` names families of `jaxspatial.perception.service.TOOL_FACTORIES` (echo, empty,
ocr). Rollouts call them with `service.RemoteTool(url, name)` (or `remote_tools(url)`).
Prints one line with the URL and the tool names once it is listening.
"""

from __future__ import annotations

# Before anything starts the XLA backend (a tool may run a JAX model).
from jaxspatial import xla_workarounds

xla_workarounds.apply()
# pylint: disable=wrong-import-position

import signal
import threading

from absl import app, flags

from jaxspatial.perception import service

_HOST = flags.DEFINE_string("host", "127.0.0.1", "the address to listen on")
_PORT = flags.DEFINE_integer("port", 30888, "the port (0: a free one)")
_TOOLS = flags.DEFINE_list("tools", ["echo"], "tool families to serve: "
                           + ", ".join(sorted(service.TOOL_FACTORIES)))


def main(argv) -> None:
  del argv
  try:
    tools = service.build_tools(_TOOLS.value)
  except ValueError as error:  # an unknown family: a usage error, not a traceback
    raise app.UsageError(str(error)) from None
  stop = threading.Event()
  for number in (signal.SIGTERM, signal.SIGINT):
    signal.signal(number, lambda *_: stop.set())
  with service.ToolServer(tools, _HOST.value, _PORT.value) as server:
    print(f"perception server at {server.url}: {', '.join(sorted(tools))}", flush=True)
    while not stop.wait(0.5):  # a timed wait lets the signal handler run promptly
      pass
  print("perception server stopped", flush=True)


if __name__ == "__main__":
  app.run(main)
