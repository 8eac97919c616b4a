r"""Serves perception tools over HTTP until SIGTERM or SIGINT.

    python -m launch.perception_server --host 0.0.0.0 --port 30888 --tools ocr,echo
    python -m launch.perception_server --tools text_ocr,sam3,grounding_dino \
        --models sam3=/models/sam3,grounding_dino=/models/grounding-dino-base

`--tools` names families of `jaxspatial.perception.service.TOOL_FACTORIES` (echo, empty,
ocr, sam3, grounding_dino) or single public perception tools (`jaxspatial.perception.TOOLS`:
text_ocr, auto_segment, ...). `--models` gives a family its Hugging Face model folder
(sam3 and grounding_dino need one; an ocr folder is PaddleOCR-VL instead of PP-OCRv4); the
models load before the server listens. Rollouts call the tools with
`client.RemoteTool(url, name)` (or `remote_tools(url)`). Prints one line with the URL and
the tool names once it is listening (with --port 0, the port it picked). `--max_concurrent`
bounds the tool calls running at once, `--max_connections` the open connections.
"""

from __future__ import annotations

# Before anything starts the XLA backend (a tool may run a JAX model).
from jaxspatial import xla_workarounds

xla_workarounds.apply()
# pylint: disable=wrong-import-position

import logging
import signal
import threading

from absl import app, flags

from jaxspatial.perception import service
from jaxspatial.perception.server import ToolServer
from recipes import cli

_HOST = flags.DEFINE_string("host", "127.0.0.1", "the address to listen on")
_PORT = flags.DEFINE_integer("port", 30888, "the port (0: a free one)")
_TOOLS = flags.DEFINE_list("tools", ["echo"], "tool families ("
                           + ", ".join(sorted(service.TOOL_FACTORIES))
                           + ") or public perception tool names (text_ocr, auto_segment, ...) "
                           "to serve")
_MAX_CONCURRENT = flags.DEFINE_integer("max_concurrent", None, "tool calls running at once, "
                                      "the rest waiting (default: one per request; 1 for a "
                                      "backend that is not thread-safe)", lower_bound=1)
_MAX_CONNECTIONS = flags.DEFINE_integer("max_connections", 1024, "open connections at most "
                                        "(more get 503)", lower_bound=1)
_MODELS = flags.DEFINE_list("models", [], "model folders by family: family=/path,... "
                            "(sam3, grounding_dino; ocr: a PaddleOCR-VL folder)")


def parse_models(items) -> dict[str, str]:
  """{family: folder} from ["family=/path", ...]; a UsageError names a malformed item."""
  models: dict[str, str] = {}
  for item in items:
    family, sep, folder = (part.strip() for part in item.partition("="))
    if not sep or not family or not folder:
      raise app.UsageError(f"--models: expected family=/path/to/folder, got {item!r}")
    if family in models:
      raise app.UsageError(f"--models: family {family!r} is given twice")
    models[family] = folder
  return models


def main(argv) -> None:
  del argv
  try:
    tools = service.build_tools(_TOOLS.value, parse_models(_MODELS.value))
  except ValueError as error:  # an unknown name, a missing folder: usage, not a traceback
    raise app.UsageError(str(error)) from None
  stop = threading.Event()
  for number in (signal.SIGTERM, signal.SIGINT):
    signal.signal(number, lambda *_: stop.set())
  # A failing tool's traceback goes to stderr; callers get its type and message only.
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
  with ToolServer(tools, _HOST.value, _PORT.value, max_concurrent=_MAX_CONCURRENT.value,
                  max_connections=_MAX_CONNECTIONS.value) as server:
    print(f"perception server at {server.url}: {', '.join(sorted(tools))}", flush=True)
    while not stop.wait(0.5):  # a timed wait lets the signal handler run promptly
      pass
  print("perception server stopped", flush=True)


if __name__ == "__main__":
  cli.run(main)
