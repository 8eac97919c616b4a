"""The perception tool service: wire format, ToolServer / RemoteTool against real servers on
127.0.0.1 (slow, malformed, dying), and the launch CLI as a subprocess."""

import base64
import concurrent.futures
import json
import os
import re
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from jaxspatial.errors import ToolError, WireError
from jaxspatial.perception import client, service
from jaxspatial.perception.client import RemoteTool, wait_healthy
from jaxspatial.perception.server import ToolServer
from jaxspatial.perception.wire import (decode_request, decode_result, encode_request,
                                        encode_result)
from tests.deadline import deadline

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _bounded():
  """Every test ends within 20 s: a hang fails instead of stalling the suite."""
  with deadline(20):
    yield


def _free_port() -> int:
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


class RawServer:
  """A TCP server that reads each HTTP request, then hands the socket to `respond`: raw
  bytes, silence or a closed connection (what a broken server does)."""

  def __init__(self, respond):
    class Handler(socketserver.BaseRequestHandler):
      def handle(self):
        data = b""
        while b"\r\n\r\n" not in data:
          chunk = self.request.recv(65536)
          if not chunk:
            return
          data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length")]
        while length and len(body) < length[0]:
          body += self.request.recv(65536)
        outer.requests += 1
        respond(self.request)

    outer = self
    self.requests = 0
    self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    self.server.daemon_threads = True
    self.server.block_on_close = False
    self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
    threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()

  def close(self):
    self.server.shutdown()
    self.server.server_close()


def _http_200(body: bytes) -> bytes:
  return (b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
          + str(len(body)).encode() + b"\r\n\r\n" + body)


# --- wire format ---------------------------------------------------------------------------

def test_wire_round_trips_arrays_of_every_dtype_and_plain_json():
  rng = np.random.default_rng(0)
  arrays = {
      "image": rng.integers(0, 256, (4, 5, 3), dtype=np.uint8),
      "depth": rng.normal(size=(2, 3)).astype(np.float32),
      "half": rng.normal(size=(7,)).astype(np.float16),
      "ids": np.array(-5, np.int64),                      # 0-d
      "mask": rng.random((3, 1)) > 0.5,
      "none": np.zeros((0, 3), np.int32),                 # empty
      "big_endian": np.arange(6, dtype=">f8").reshape(3, 2),
      "strided": np.arange(24, dtype=np.int16).reshape(4, 6)[:, ::2],
      "u64": np.array([2 ** 64 - 1, 0], np.uint64),
      "c": np.array([1 + 2j], np.complex64),
  }
  args, kwargs = decode_request(encode_request(
      (np.float32(2.5), "text"), {**arrays, "box": [1, 2.5, 3, 4], "label": "chair",
                                  "opt": None, "flag": True, "nested": {"k": [arrays["ids"]]}}),
      "t")
  assert isinstance(args[0], np.ndarray) and args[0].dtype == np.float32 and args[0] == 2.5
  assert args[1] == "text"
  for name, array in arrays.items():
    got = kwargs[name]
    assert got.dtype == array.dtype.newbyteorder("=") and got.shape == array.shape, name
    np.testing.assert_array_equal(got, array)
    assert got.flags.writeable  # tools may write into their inputs
  assert kwargs["box"] == [1, 2.5, 3, 4] and kwargs["label"] == "chair"
  assert kwargs["opt"] is None and kwargs["flag"] is True
  np.testing.assert_array_equal(kwargs["nested"]["k"][0], -5)
  # Results: a dict of arrays and strings, or a text.
  out = decode_result(encode_result({"boxes": arrays["depth"], "text": "ok"}, "t"), "t")
  np.testing.assert_array_equal(out["boxes"], arrays["depth"])
  assert out["text"] == "ok"
  assert decode_result(encode_result('{"texts": ["EXIT"]}', "t"), "t") == '{"texts": ["EXIT"]}'


def _array(dtype="float32", shape=(2, 3), data=None) -> dict:
  if data is None:  # 24 zero bytes: a float32 [2, 3]
    data = base64.b64encode(bytes(24)).decode()
  return {"__ndarray__": {"dtype": dtype, "shape": list(shape), "data": data}}


@pytest.mark.parametrize("body, message", [
    (b"not json", r"tool 'ocr' request: malformed JSON"),
    (b"\xff\xfe", r"tool 'ocr' request: body is not UTF-8"),
    (b"[1, 2]", r"tool 'ocr' request: expected an object with 'args'"),
    (b'{"kwargs": [1]}', r"'kwargs' an object"),
    (b'{"kwargs": {}, "extra": 1}', r"expected an object with 'args'"),
    (b'{"kwargs": {"bad-name": 1}}', r"argument names must be identifiers"),
    (json.dumps({"kwargs": _array()}).encode(), r"argument names must be identifiers"),
    (b'{"kwargs": {"x": NaN}}', r"NaN is not JSON"),
    (b'{"kwargs": {"x": 1, "x": 2}}', r"duplicate key 'x'"),
    (json.dumps({"kwargs": {"image": _array("float33")}}).encode(),
     r"kwargs\['image'\]: unknown dtype 'float33'"),
    (json.dumps({"kwargs": {"image": _array("object")}}).encode(), r"unknown dtype 'object'"),
    (json.dumps({"kwargs": {"image": _array(shape=(2, 3), data=base64.b64encode(
        bytes(20)).decode())}}).encode(),
     r"kwargs\['image'\]: shape \[2, 3\] of float32 is 24 bytes, but the data has 28"),
    (json.dumps({"kwargs": {"image": {"__ndarray__": {"dtype": "uint8", "shape": [-1],
                                                      "data": ""}}}}).encode(),
     r"shape must be a list of at most 32 non-negative ints"),
    (json.dumps({"kwargs": {"image": {"__ndarray__": {"dtype": "uint8", "shape": [True],
                                                      "data": "AA=="}}}}).encode(),
     r"shape must be a list"),
    (json.dumps({"kwargs": {"image": {"__ndarray__": {"dtype": "uint8", "shape": [10 ** 12],
                                                      "data": "AA=="}}}}).encode(),
     r"shape \[1000000000000\] of uint8 is 1000000000000 elements, over the 67108864"),
    (json.dumps({"kwargs": {"image": {"__ndarray__": {"dtype": "uint8", "shape": [10 ** 6],
                                                      "data": "AA=="}}}}).encode(),
     r"is 1000000 bytes, but the data has 4"),
    (json.dumps({"kwargs": {"image": _array("uint8", (3,), "!!!!")}}).encode(),
     r"data is not valid base64"),
    (json.dumps({"kwargs": {"image": {"__ndarray__": {"dtype": "uint8", "shape": [1],
                                                      "data": "AA==", "x": 1}}}}).encode(),
     r"an array needs exactly dtype, shape and data"),
    (json.dumps({"kwargs": {"image": {"__ndarray__": _array()["__ndarray__"],
                                      "y": 1}}}).encode(),
     r"an array object has only the key"),
    (b'{"kwargs": {"x": ' + b"[" * 5000 + b"]" * 5000 + b"}}", r"malformed JSON"),
    (b'{"kwargs": {"x": ' + b"[" * 100 + b"]" * 100 + b"}}", r"nested deeper than 32"),
])
def test_wire_rejects_malformed_requests_naming_the_tool(body, message):
  with pytest.raises(WireError, match=message):
    decode_request(body, "ocr")


def test_wire_refuses_values_it_cannot_send():
  with pytest.raises(WireError, match=r"kwargs\['x'\]: dtype object cannot be sent"):
    encode_request((), {"x": np.array([object()])}, "t")
  with pytest.raises(WireError, match=r"nan is not JSON"):
    encode_request((), {"x": float("nan")}, "t")
  with pytest.raises(WireError, match=r"cannot send a set"):
    encode_request((), {"x": {1, 2}}, "t")
  with pytest.raises(WireError, match=r"expected a dict of arrays or a str, got list"):
    encode_result([1, 2], "t")
  with pytest.raises(WireError, match=r"output 'x' is not an array"):
    encode_result({"x": [object()]}, "t")
  with pytest.raises(WireError, match=r"tool 't' response: expected an object with only "):
    decode_result(b'{"result": {}, "more": 1}', "t")
  with pytest.raises(WireError, match=r"output 'x' is neither an array nor a string"):
    decode_result(b'{"result": {"x": 3}}', "t")


# --- server and client ---------------------------------------------------------------------

def _describe(image, bounding_box=None):
  """A text tool: PERIA's perception tools return text."""
  return json.dumps({"shape": list(image.shape), "box": bounding_box})


def _stats_tool(points, weights):
  return {"mean": (points * weights[:, None]).sum(0) / weights.sum(),
          "count": np.array(points.shape[0], np.int32), "label": "ok"}


def _raises(image):
  raise ValueError(f"cannot read an image of shape {image.shape}")


def test_tools_are_called_remotely_like_local_ones():
  tools = {"describe": _describe, "stats": _stats_tool, "broken": _raises,
           **service.build_tools(["echo", "empty"])}
  rng = np.random.default_rng(1)
  points = rng.normal(size=(10, 3)).astype(np.float32)
  weights = rng.random(10)
  image = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
  with ToolServer(tools) as server:
    assert wait_healthy(server.url, 5) == {"status": "ok", "tools": sorted(tools)}
    remote = client.remote_tools(server.url, timeout_s=5)
    assert sorted(remote) == sorted(tools)
    out = remote["stats"](points=points, weights=weights)
    want = _stats_tool(points, weights)
    assert out["mean"].dtype == np.float64 and out["count"].dtype == np.int32
    np.testing.assert_array_equal(out["mean"], want["mean"])
    assert out["count"] == 10 and out["label"] == "ok"
    # Positional and keyword calls of a text tool, as TextTool calls its function.
    assert remote["describe"](image, [10.0, 20.0, 30.0, 40.0]) == _describe(image, [10.0, 20.0,
                                                                                    30.0, 40.0])
    assert json.loads(remote["describe"](image=image)) == {"shape": [48, 64, 3], "box": None}
    echoed = remote["echo"](image, depth=points, note="hi")
    np.testing.assert_array_equal(echoed["arg0"], image)
    np.testing.assert_array_equal(echoed["depth"], points)
    assert echoed["note"] == "hi"
    assert remote["empty"](image=image) == {}
    stats = remote["stats"].stats()  # shared by the tools of one remote_tools call
    assert stats["stats"]["calls"] == 1 and stats["describe"]["calls"] == 2
    assert stats["describe"]["latency"]["count"] == 2 and stats["describe"]["failures"] == 0
    assert stats["describe"]["latency"]["max_s"] > 0
    served = server.stats()
    assert served["describe"]["calls"] == 2 and served["echo"]["calls"] == 1


def test_unknown_tool_bad_arguments_and_tool_exceptions_are_named():
  calls = []

  def counted(image):
    calls.append(1)
    return _raises(image)

  def failing(image):
    raise RuntimeError("the backend lost its device")

  with ToolServer({"describe": _describe, "broken": counted, "failing": failing}) as server:
    image = np.zeros((4, 5, 3), np.uint8)
    with pytest.raises(ToolError, match=r"tool 'nope' at http://127\.0\.0\.1:\d+/tools/nope "
                       r"\(inputs: image=uint8\[4, 5, 3\]\): HTTP 404: unknown tool 'nope'; "
                       r"this server has \['broken', 'describe', 'failing'\] \(1 attempt\(s\)\)"):
      RemoteTool(server.url, "nope")(image=image)
    with pytest.raises(ToolError, match=r"HTTP 400: .*unexpected keyword argument 'colour'.*"
                       r"signature is describe\(image, bounding_box=None\).*\(1 attempt\(s\)\)"):
      RemoteTool(server.url, "describe")(image=image, colour="red")
    # Inputs the tool refuses (ValueError, TypeError): 400, deterministic, not retried.
    tool = RemoteTool(server.url, "broken", retries=2, backoff_s=0.01)
    with pytest.raises(ToolError, match=r"tool 'broken' .*\(inputs: image=uint8\[4, 5, 3\]\): "
                       r"HTTP 400: tool 'broken' refused its inputs: ValueError: cannot read an "
                       r"image of shape \(4, 5, 3\) \(1 attempt\(s\)\)"):
      tool(image=image)
    assert len(calls) == 1
    # A tool that fails otherwise: 500 with its exception (no traceback), retried (5xx),
    # then one named error.
    flaky = RemoteTool(server.url, "failing", retries=2, backoff_s=0.01)
    with pytest.raises(ToolError, match=r"HTTP 500: tool 'failing' raised RuntimeError: the "
                       r"backend lost its device \(3 attempt\(s\)\)"):
      flaky(image=image)
    assert flaky.stats()["failing"] == {"calls": 1, "failures": 1, "attempts": 3,
                                        "latency": {"count": 0, "total_s": 0.0, "max_s": 0.0}}
    status, _, body = client.http_request(f"{server.url}/tools/failing", "POST",
                                          encode_request((), {"image": image}),
                                          {"Content-Type": "application/json"})
    assert status == 500 and set(json.loads(body)) == {"error"}
    assert "Traceback" not in body.decode() and ".py" not in body.decode()
    # A claimed shape numpy cannot index, even empty: a 400 naming it, the server serves on.
    claim = json.dumps({"args": [{"__ndarray__": {"dtype": "uint8", "shape": [0, 2 ** 62,
                                                                              2 ** 62],
                                                  "data": ""}}]}).encode()
    status, _, body = client.http_request(f"{server.url}/tools/describe", "POST", claim,
                                          {"Content-Type": "application/json"})
    assert status == 400 and "elements (its 0s counted as 1)" in json.loads(body)["error"]
    # Bad paths and a GET of a tool are 404s with JSON errors, not crashes.
    status, _, body = client.http_request(f"{server.url}/nowhere")
    assert status == 404 and "no such path" in json.loads(body)["error"]
    status, _, body = client.http_request(f"{server.url}/tools/describe", "POST", b"{]",
                                          {"Content-Type": "application/json"})
    assert status == 400 and "tool 'describe' request: malformed JSON" in json.loads(body)["error"]


def _claim(shape, dtype="uint8", data="", where="args") -> bytes:
  """A request body whose one array claims `shape` (hostile: the data need not match)."""
  array = {"__ndarray__": {"dtype": dtype, "shape": shape, "data": data}}
  return json.dumps({"args": [array]} if where == "args" else
                    {"kwargs": {"image": array}}).encode()


def _assert_clean_400(status: int, body: bytes) -> str:
  """The error text of a 400 that is one line and carries no server internals."""
  text = body.decode()
  assert status == 400, text
  message = json.loads(body)["error"]
  assert "\n" not in message and len(message) < 1000, message
  for internal in ("Traceback", 'File "', "/work/", ".py", "site-packages"):
    assert internal not in text, text
  return message


@pytest.mark.parametrize("body, message", [
    # Empty, yet 2**124 elements: numpy refuses the shape (it killed the handler once).
    (_claim([0, 2 ** 62, 2 ** 62]), r"args\[0\]: shape \[0, 4611686018427387904, "
     r"4611686018427387904\] of uint8 is about 2\*\*124 elements \(its 0s counted as 1\), "
     r"over the 67108864 a body can carry$"),
    # Empty, but one dimension no body can carry: a tool allocating from it would fail.
    (_claim([0, 2 ** 40]), r"args\[0\]: shape \[0, 1099511627776\] of uint8 is "
     r"1099511627776 elements \(its 0s counted as 1\)"),
    (_claim([2 ** 40], data="AA==", where="kwargs"),
     r"kwargs\['image'\]: shape \[1099511627776\] of uint8 is 1099511627776 elements, "
     r"over the 67108864"),
    # Dimensions too long to print: the message stays one bounded line.
    (_claim([10 ** 4000] * 32), r"args\[0\]: shape \[10{95}\.\.\. of uint8 is about "
     r"2\*\*\d+ elements, over"),
    (_claim([1] * 33), r"args\[0\]: shape must be a list of at most 32 non-negative ints"),
    (_claim([2, 3], "float64", "AAAA", "kwargs"),
     r"kwargs\['image'\]: shape \[2, 3\] of float64 is 48 bytes, but the data has 4 base64 "
     r"characters"),
    (_claim([-1]), r"args\[0\]: shape must be a list"),
    (_claim(7), r"args\[0\]: shape must be a list"),
], ids=["numpy-range", "empty-huge", "huge-few-bytes", "huge-digits", "rank-33", "short-data",
        "negative", "not-a-list"])
def test_hostile_array_claims_are_400s_naming_the_argument_and_the_server_serves_on(body,
                                                                                    message):
  with ToolServer({"describe": _describe}) as server:
    status, _, reply = client.http_request(f"{server.url}/tools/describe", "POST", body,
                                           {"Content-Type": "application/json"}, timeout_s=5)
    error = _assert_clean_400(status, reply)
    assert re.search(rf"^tool 'describe' request: {message}", error), error
    # The next call is served at its first attempt: the claim hurt nothing.
    tool = RemoteTool(server.url, "describe", timeout_s=5, retries=2, backoff_s=0.01)
    assert json.loads(tool(np.zeros((2, 3, 3), np.uint8)))["shape"] == [2, 3, 3]
    assert tool.stats()["describe"]["attempts"] == 1
    row = server.stats()["describe"]
    assert (row["calls"], row["failures"]) == (2, 1)


def test_callers_mistakes_are_400s_without_internals_and_never_retried():
  """Images a perception tool cannot take (float, 2-D, 0 x 0, a ragged batch) sent to the
  OCR tools as served by the launch script: the caller's mistake, said once."""
  tools = service.build_tools(["text_ocr", "text_spotting"])
  good = np.full((8, 8, 3), 255, np.uint8)
  mistakes = [
      ("text_ocr", (np.zeros((8, 8, 3), np.float32),), r"dtype float32 \(floats in \[0, 1\]"),
      ("text_spotting", (np.zeros((8, 8), np.uint8),), r"got shape \(8, 8\) uint8"),
      ("text_ocr", (np.zeros((0, 0, 3), np.uint8),), r"got an empty image \(0, 0, 3\)"),
      ("text_ocr", ([good, np.zeros((4, 6, 3), np.uint8)],), r"got list \(.*inhomogeneous"),
      ("text_spotting", (good, [1, 2, 3, 4], "extra"), r"too many positional arguments"),
  ]
  with ToolServer(tools) as server:
    for name, args, message in mistakes:
      tool = RemoteTool(server.url, name, timeout_s=5, retries=3, backoff_s=0.01)
      with pytest.raises(ToolError, match=rf"HTTP 400: .*{message}.*\(1 attempt\(s\)\)"):
        tool(*args)
      assert tool.stats()[name]["attempts"] == 1
      status, _, reply = client.http_request(f"{server.url}/tools/{name}", "POST",
                                             encode_request(args, tool=name),
                                             {"Content-Type": "application/json"}, timeout_s=5)
      _assert_clean_400(status, reply)
    served = server.stats()
    assert served["text_ocr"]["calls"] == 6 and served["text_spotting"]["calls"] == 4
  assert not any(row["latency"]["count"] for row in served.values())


def test_oversize_bodies_are_refused_on_both_sides():
  with ToolServer({"echo": service.echo}, max_body_bytes=1000) as server:
    tool = RemoteTool(server.url, "echo", retries=2, backoff_s=0.01)
    with pytest.raises(ToolError, match=r"HTTP 413: tool 'echo' request: body of \d+ bytes is "
                       r"over the server's 1000 limit \(1 attempt\(s\)\)"):
      tool(image=np.zeros(2000, np.uint8))
    small = RemoteTool(server.url, "echo", max_response_bytes=500, retries=0)
    with pytest.raises(ToolError, match=r"response over 500 bytes"):
      small(x=np.zeros(600, np.uint8).tobytes().hex()[:900])


def test_concurrent_calls_are_served_at_once():
  in_flight = {"now": 0, "max": 0}
  lock = threading.Lock()
  # Each call waits until all 8 are in the tool: a server that served one at a time would
  # break the barrier (its 5 s timeout) instead.
  barrier = threading.Barrier(8, timeout=5)

  def together(x):
    with lock:
      in_flight["now"] += 1
      in_flight["max"] = max(in_flight["max"], in_flight["now"])
    barrier.wait()
    with lock:
      in_flight["now"] -= 1
    return {"y": x * 2}

  with ToolServer({"together": together}) as server:
    tool = RemoteTool(server.url, "together", timeout_s=10, retries=0)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
      outs = list(pool.map(lambda i: tool(x=np.full(3, i, np.int32)), range(8)))
  assert in_flight["max"] == 8
  for i, out in enumerate(outs):
    np.testing.assert_array_equal(out["y"], np.full(3, 2 * i, np.int32))
  assert tool.stats()["together"]["calls"] == 8

  # max_concurrent=1: a backend that is not thread-safe sees one call at a time.
  in_flight.update(now=0, max=0)

  def alone(x):
    with lock:
      in_flight["now"] += 1
      in_flight["max"] = max(in_flight["max"], in_flight["now"])
    time.sleep(0.02)
    with lock:
      in_flight["now"] -= 1
    return {"y": x}

  with ToolServer({"alone": alone}, max_concurrent=1) as server:
    tool = RemoteTool(server.url, "alone", timeout_s=10, retries=0)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
      list(pool.map(lambda i: tool(x=np.int32(i)), range(6)))
  assert in_flight["max"] == 1 and server.stats()["alone"]["calls"] == 6


def test_a_slow_tool_times_out_is_retried_then_fails_with_a_named_error():
  calls = []
  release = threading.Event()

  def slow(image):
    calls.append(time.monotonic())
    release.wait(5)
    return {"ok": np.ones(1)}

  with ToolServer({"slow": slow}) as server:
    tool = RemoteTool(server.url, "slow", timeout_s=0.3, retries=1, backoff_s=0.05)
    start = time.monotonic()
    with pytest.raises(ToolError, match=r"tool 'slow' at http://127\.0\.0\.1:\d+/tools/slow "
                       r"\(inputs: image=float32\[2, 2\]\): no complete response within "
                       r"0\.3 s \(2 attempt\(s\)\)"):
      tool(image=np.zeros((2, 2), np.float32))
    elapsed = time.monotonic() - start
    # A total deadline shorter than the retries would take ends the call first.
    hurried = RemoteTool(server.url, "slow", timeout_s=0.3, retries=5, backoff_s=0.05,
                         deadline_s=0.5)
    with pytest.raises(ToolError, match=r"no complete response within 0\.(1|2)\d* s; the "
                       r"call's deadline of 0\.5 s passed \(2 attempt\(s\)\)"):
      hurried(image=np.zeros((2, 2), np.float32))
    release.set()
  assert len(calls) == 4
  assert elapsed < 2.0  # two 0.3 s attempts and a backoff, not the tool's 5 s
  assert tool.stats()["slow"]["failures"] == 1


def test_a_trickling_server_cannot_outlast_the_timeout():
  # Headers, then one byte of the body every 50 ms: each read succeeds, the response never
  # completes. The watchdog ends the attempt at timeout_s.
  def trickle(sock):
    try:
      sock.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 1000\r\n\r\n")
      for _ in range(200):
        sock.sendall(b" ")
        time.sleep(0.05)
    except OSError:
      pass

  server = RawServer(trickle)
  try:
    start = time.monotonic()
    with pytest.raises(ToolError, match=r"no complete response within 0\.4 s \(1 attempt"):
      RemoteTool(server.url, "t", timeout_s=0.4, retries=0)(x=1)
    assert time.monotonic() - start < 2.0
  finally:
    server.close()


@pytest.mark.parametrize("reply, message", [
    (_http_200(b"{not json"), r"malformed response: tool 't' response: malformed JSON"),
    (_http_200(b'{"result": {"x": {"__ndarray__": {"dtype": "float32", "shape": [3], '
               b'"data": "AAAA"}}}}'),
     r"malformed response: tool 't' response: output 'x': shape \[3\] of float32 is 12 bytes"),
    # A hostile claim in a response: refused before numpy sees it, not a crash.
    (_http_200(b'{"result": {"x": {"__ndarray__": {"dtype": "uint8", "shape": [0, '
               b'4611686018427387904, 4611686018427387904], "data": ""}}}}'),
     r"malformed response: tool 't' response: output 'x': shape \[0, 4611686018427387904, "
     r"4611686018427387904\] of uint8 is about 2\*\*124 elements"),
    (_http_200(b'{"error": "not a result"}'),
     r"malformed response: tool 't' response: expected an object with only 'result', got "
     r"\['error'\]"),
    (b"garbage\r\n\r\n", r"malformed HTTP response"),
])
def test_malformed_responses_fail_once_with_a_named_error(reply, message):
  server = RawServer(lambda sock: sock.sendall(reply))
  try:
    tool = RemoteTool(server.url, "t", retries=3, backoff_s=0.01)
    with pytest.raises(ToolError, match=rf"tool 't' at {server.url}/tools/t \(inputs: "
                       rf"x=int32\[2\]\): {message}"):
      tool(x=np.zeros(2, np.int32))
    assert server.requests == 1  # a server that answers nonsense is not asked again
  finally:
    server.close()


def test_a_server_that_dies_mid_request_is_retried_then_named():
  def die(sock):
    sock.shutdown(socket.SHUT_RDWR)

  server = RawServer(die)
  try:
    tool = RemoteTool(server.url, "ocr", retries=2, backoff_s=0.01)
    with pytest.raises(ToolError, match=r"tool 'ocr' .*: the server closed the connection "
                       r"mid-request .*\(3 attempt\(s\)\)"):
      tool(image=np.zeros((8, 8, 3), np.uint8))
    assert server.requests == 3
  finally:
    server.close()


def test_a_response_cut_mid_body_is_a_dropped_connection_and_retried():
  # The headers promise 1,000 bytes; 20 arrive, then the connection closes (a network cut,
  # a proxy restart): a transport failure, retried, not a malformed answer.
  def cut(sock):
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n" + b'{"result": {"x": "ab')
    sock.shutdown(socket.SHUT_RDWR)

  server = RawServer(cut)
  try:
    tool = RemoteTool(server.url, "t", timeout_s=2, retries=2, backoff_s=0.01)
    with pytest.raises(ToolError, match=r"tool 't' .*: the server closed the connection "
                       r"mid-response \(20 of the 1000 bytes its Content-Length promised\) "
                       r"\(3 attempt\(s\)\)"):
      tool(x=np.zeros(2, np.int32))
    assert server.requests == 3
    assert tool.stats()["t"]["attempts"] == 3
  finally:
    server.close()


def test_a_stopped_server_fails_the_next_call_fast():
  with ToolServer({"echo": service.echo}) as server:
    url = server.url
    tool = RemoteTool(url, "echo", timeout_s=5, retries=2, backoff_s=0.01)
    assert tool(x=np.ones(2))["x"].shape == (2,)
  start = time.monotonic()
  with pytest.raises(ToolError, match=r"tool 'echo' .*: connection refused .*\(3 attempt"):
    tool(x=np.ones(2))
  assert time.monotonic() - start < 2.0
  with pytest.raises(ToolError, match=rf"tool server at {url} not healthy after 0\.3 s: .*"
                     r"connection refused"):
    wait_healthy(url, timeout_s=0.3)


def _launch(port: int, tools: str) -> subprocess.Popen:
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.Popen([sys.executable, "-m", "launch.perception_server", "--host",
                           "127.0.0.1", "--port", str(port), "--tools", tools], cwd=REPO,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_launch_cli_serves_until_sigterm():
  port = _free_port()
  process = _launch(port, "echo,empty")
  try:
    url = f"http://127.0.0.1:{port}"
    assert wait_healthy(url, timeout_s=15, process=process)["tools"] == ["echo", "empty"]
    out = RemoteTool(url, "echo", timeout_s=5)(image=np.arange(12, dtype=np.uint8).reshape(2, 6))
    np.testing.assert_array_equal(out["image"], np.arange(12, dtype=np.uint8).reshape(2, 6))
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=10)
  finally:
    if process.poll() is None:
      process.kill()
      process.communicate()
  assert process.returncode == 0, stderr
  assert f"perception server at {url}: echo, empty" in stdout
  assert "perception server stopped" in stdout


def test_a_server_killed_mid_rollout_fails_the_next_call_fast():
  port = _free_port()
  process = _launch(port, "echo")
  try:
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, timeout_s=15, process=process)
    tool = RemoteTool(url, "echo", timeout_s=5, retries=1, backoff_s=0.05)
    assert tool(step=np.int32(0))["step"] == 0
    process.kill()  # SIGKILL between two calls: no goodbye
    process.communicate(timeout=10)
    start = time.monotonic()
    with pytest.raises(ToolError, match=rf"tool 'echo' at {url}/tools/echo \(inputs: "
                       r"step=int32\[\]\): connection refused"):
      tool(step=np.int32(1))
    assert time.monotonic() - start < 2.0
    # A launcher polling a process that already exited hears so at once.
    with pytest.raises(ToolError, match=r"its process exited with code -9"):
      wait_healthy(url, timeout_s=10, process=process)
  finally:
    if process.poll() is None:
      process.kill()
      process.communicate()


def test_the_registry_names_what_it_cannot_build(monkeypatch):
  monkeypatch.delenv("JAXSPATIAL_SAM3_MODEL", raising=False)
  with pytest.raises(ValueError, match=r"unknown tool families or tools \['sam'\]; families: "
                     r"\['echo', 'empty', 'grounding_dino', 'ocr', 'sam3'\]; tools: "
                     r"\['auto_segment', .*'text_spotting'\]"):
    service.build_tools(["echo", "sam"])
  with pytest.raises(ValueError, match=r"tool 'echo' of family 'echo' is already served"):
    service.build_tools(["echo", "echo"])
  with pytest.raises(ValueError, match=r"tool 'text_ocr' of family 'ocr' is already served"):
    service.build_tools(["ocr", "text_ocr"])
  with pytest.raises(ValueError, match=r"model folders given for \['sam3'\], but no tool of "
                     r"that family is served \(serving \['echo'\]\)"):
    service.build_tools(["echo"], {"sam3": "/models/sam3"})
  with pytest.raises(ValueError, match=r"model folders for unknown families \['sam'\]"):
    service.build_tools(["echo"], {"sam": "/models/sam3"})
  with pytest.raises(ValueError, match=r"tool family 'echo' takes no model folder"):
    service.build_tools(["echo"], {"echo": "/models/echo"})
  with pytest.raises(ValueError, match=r"text_segment \(family 'sam3'\) needs a SAM 3 model "
                     r"folder and has none: .* pass --models sam3=/path/to/folder"):
    service.build_tools(["text_segment"])
  # Families and single tools mix; empty folders are no folders.
  assert list(service.build_tools(["empty", "map_text_ocr", "text_ocr"],
                                  {"sam3": "", "grounding_dino": ""})) == [
                                      "empty", "map_text_ocr", "text_ocr"]


def test_ocr_tools_answer_remotely_as_they_do_locally():
  from PIL import Image, ImageDraw, ImageFont  # pylint: disable=import-outside-toplevel
  from jaxspatial.perception import ocr  # pylint: disable=import-outside-toplevel
  tools = service.build_tools(["ocr"])  # one RapidOCRBackend shared by the five tools
  assert sorted(tools) == sorted(ocr.TOOLS)
  canvas = Image.new("RGB", (320, 96), "white")
  ImageDraw.Draw(canvas).text((12, 24), "EXIT 42", fill="black",
                              font=ImageFont.load_default(size=40))
  image = np.asarray(canvas)
  with ToolServer(tools) as server:
    text_ocr = RemoteTool(server.url, "text_ocr", timeout_s=60, retries=0)
    # Called as TextTool calls its function: (image, bounding_box).
    remote = text_ocr(image, [0, 0, 1000, 1000])
    assert remote == ocr.SUCCESS + '{"task":"ocr","text":"EXIT 42"}'
    # A model-written bad box is the tool's error text, not a failed call.
    assert text_ocr(image, "garbage").startswith("Error executing text_ocr: bounding_box")
