"""An ASGI app on uvicorn in a background thread: the one web stack of jaxspatial's servers
(`serving.ChatServer`, `perception.server.ToolServer`). uvicorn bounds the open
connections (more get 503), times idle keep-alive connections out and, on stop, lets
requests in flight finish for a few seconds; the app owns logging (uvicorn's own access
log and logging configuration are off)."""

from __future__ import annotations

import threading
import time

import uvicorn


class BackgroundServer:
  """Serves `app` on host:port (0: a free port) from a daemon thread."""

  def __init__(self, app, host: str = "127.0.0.1", port: int = 0,
               max_connections: int = 1024, keep_alive_s: float = 30.0, name: str = "web"):
    self.app, self.host, self.port = app, host, int(port)
    self.max_connections, self.keep_alive_s, self.name = int(max_connections), keep_alive_s, name
    self._server: uvicorn.Server | None = None
    self._thread: threading.Thread | None = None

  @property
  def running(self) -> bool:
    return self._server is not None

  @property
  def address(self) -> str:
    """host:port to connect to (a wildcard host reads as the loopback address)."""
    host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
    return f"{host}:{self.port}"

  def start(self) -> "BackgroundServer":
    if self._server is not None:
      return self
    config = uvicorn.Config(self.app, host=self.host, port=self.port, log_config=None,
                            access_log=False, lifespan="off",
                            limit_concurrency=self.max_connections,
                            timeout_keep_alive=int(self.keep_alive_s),
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True, name=self.name)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
      time.sleep(0.01)
    if not server.started:
      server.should_exit = True
      raise OSError(f"{self.name}: could not listen on {self.host}:{self.port} (in use?)")
    self.port = server.servers[0].sockets[0].getsockname()[1]
    self._server, self._thread = server, thread
    return self

  def stop(self) -> None:
    """Stops listening and ends open connections (requests in flight get 5 s)."""
    if self._server is not None:
      self._server.should_exit = True
      self._thread.join(timeout=10)
      self._server = self._thread = None


__all__ = ["BackgroundServer"]
