"""The chat-completions server against the `openai` client over real HTTP on 127.0.0.1,
serving a tiny Qwen2.5-VL policy folder (the instruct chat template, generation_config's
stop ids): greedy replies equal `sampler.generate`'s tokens for the template's prompt (an
image's pixels from transformers' image processor), concurrent requests run as batches
and each equals its solo reply, stop sequences, sampling, usage counts, malformed
requests (a 4xx with a message, then the server goes on), and perception.judge's
ChatEndpoint / LLMJudge using the server as a judge."""

import base64
import concurrent.futures
import io
import json
import logging
import socket
import time
import urllib.error
import urllib.parse
import urllib.request

import jax
import jax.numpy as jnp
import numpy as np
import openai
import pytest
from flax import nnx
from PIL import Image

from jaxspatial import models
from jaxspatial.models.qwen2_5_vl.tokenizer import save_processor
from jaxspatial.models.sampler import SamplingConfig, generate
from jaxspatial.perception.judge import ChatEndpoint, LLMJudge
from jaxspatial.rollout import tiny
from jaxspatial.serving import load_server
from tests import chat_templates
from tests.deadline import deadline

NAME = "tiny-policy"
MAX_TOKENS = 12


@pytest.fixture(autouse=True)
def _bounded():
  """Every test ends within 60 s (first compiles included): a hang fails instead."""
  with deadline(60):
    yield


@pytest.fixture(scope="module")
def served(tmp_path_factory):
  """(server, client, tokenizer, model, stop ids, folder) for a tiny policy folder."""
  folder = tmp_path_factory.mktemp("serving") / NAME
  tok = tiny.tokenizer()
  model = tiny.model(tok, "qwen2_5_vl", seed=3)
  models.export(model, folder)
  tok.chat_template = chat_templates.INSTRUCT
  save_processor(folder, tok, model)
  stops = chat_templates.write_generation_config(folder, tok)
  server = load_server(folder, max_batch=8, max_context=4096).start()
  client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
  yield server, client, tok, model, stops, folder
  client.close()
  server.stop()


@nnx.jit(static_argnames=("config", "grids"))
def _reference(model, ids, key, config, pixels=None, grids=(), sequence_grids=None):
  return generate(model, ids, jnp.ones_like(ids, bool), key, config, pixels, grids,
                  sequence_grids)


def _expected(tok, stops, tokens):
  """(text, finish_reason, completion tokens) of greedy tokens, written from the spec:
  up to the first stop id, ids past the tokenizer's dropped, special tokens skipped."""
  tokens = [int(t) for t in tokens[:MAX_TOKENS]]
  end = next((k for k, t in enumerate(tokens) if t in stops), None)
  body = tokens if end is None else tokens[:end]
  text = tok.decode([t for t in body if t < len(tok)], skip_special_tokens=True)
  return text, ("length" if end is None else "stop"), (len(tokens) if end is None else end + 1)


def _ask(client, messages, **options):
  options = {"temperature": 0, "max_tokens": MAX_TOKENS, **options}
  return client.chat.completions.create(model=NAME, messages=messages, **options)


def _user(text):
  return [{"role": "system", "content": "You answer questions about a room."},
          {"role": "user", "content": text}]


def _png_url(image, fmt="PNG"):
  buffer = io.BytesIO()
  Image.fromarray(image).save(buffer, format=fmt)
  kind = "png" if fmt == "PNG" else "jpeg"
  return f"data:image/{kind};base64," + base64.b64encode(buffer.getvalue()).decode()


def test_models_health_and_a_greedy_reply_equal_to_the_samplers(served):
  server, client, tok, model, stops, _ = served
  assert [m.id for m in client.models.list().data] == [NAME]
  with urllib.request.urlopen(server.url.replace("/v1", "/health"), timeout=10) as response:
    assert json.load(response) == {"status": "ok", "model": NAME}

  messages = _user("Which object is closer to the door?")
  reply = _ask(client, messages)
  ids = tok.encode(tok.apply_chat_template(messages, tokenize=False,
                                           add_generation_prompt=True),
                   add_special_tokens=False)
  out = _reference(model, jnp.asarray([ids], jnp.int32), jax.random.PRNGKey(0),
                   SamplingConfig(max_new_tokens=MAX_TOKENS, stop_tokens=tuple(stops)))
  text, finish, used = _expected(tok, stops, np.asarray(out.tokens)[0])
  choice = reply.choices[0]
  assert choice.message.role == "assistant" and choice.message.content == text
  assert choice.finish_reason == finish
  assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(ids), used)
  assert reply.usage.total_tokens == len(ids) + used and reply.model == NAME


def test_an_image_message_is_the_processors_pixels_in_the_prompt(served):
  _, client, tok, model, stops, folder = served
  rng = np.random.default_rng(0)
  image = rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)
  reply = _ask(client, [{"role": "user", "content": [
      {"type": "image_url", "image_url": {"url": _png_url(image)}},
      {"type": "text", "text": "What is on the table?"}]}])
  # The reference: transformers' image processor saved in the folder, the template's
  # text with Qwen's image placeholder expanded to the grid's tokens.
  import transformers  # pylint: disable=import-outside-toplevel
  processor = transformers.AutoImageProcessor.from_pretrained(folder)
  inputs = processor(images=[Image.fromarray(image)], return_tensors="np")
  grid = tuple(int(g) for g in inputs["image_grid_thw"][0])
  count = grid[0] * grid[1] * grid[2] // 4
  text = tok.apply_chat_template(
      [{"role": "user", "content": "<|vision_start|><|image_pad|><|vision_end|>What is on "
                                   "the table?"}], tokenize=False, add_generation_prompt=True)
  text = text.replace("<|image_pad|>", "<|image_pad|>" * count)
  ids = tok.encode(text, add_special_tokens=False)
  out = _reference(model, jnp.asarray([ids], jnp.int32), jax.random.PRNGKey(0),
                   SamplingConfig(max_new_tokens=MAX_TOKENS, stop_tokens=tuple(stops)),
                   jnp.asarray(inputs["pixel_values"]), (grid,),
                   jnp.asarray([[grid]], jnp.int32))
  expected, finish, used = _expected(tok, stops, np.asarray(out.tokens)[0])
  assert reply.choices[0].message.content == expected
  assert reply.choices[0].finish_reason == finish
  assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(ids), used)
  # The same picture as a JPEG is accepted too (its pixels differ: only the count).
  jpeg = _ask(client, [{"role": "user", "content": [
      {"type": "image_url", "image_url": {"url": _png_url(image, "JPEG")}},
      {"type": "text", "text": "What is on the table?"}]}])
  assert jpeg.usage.prompt_tokens == len(ids)


def test_concurrent_requests_run_as_batches_and_equal_their_solo_replies(served):
  server, client, *_ = served
  questions = [f"Where is the {thing}?" for thing in
               ("chair", "red chair", "sofa", "table", "lamp", "door", "window", "bed")]
  solo = [_ask(client, _user(q)).choices[0].message.content for q in questions]
  before = server.stats()
  with concurrent.futures.ThreadPoolExecutor(len(questions)) as pool:
    replies = list(pool.map(lambda q: _ask(client, _user(q)), questions))
  after = server.stats()
  assert after["requests"] - before["requests"] == len(questions)
  # Run one at a time, the 8 replies would take 8 x 3 decode calls of 4 steps.
  calls = after["decode_calls"] - before["decode_calls"]
  assert calls < len(questions) * -(-MAX_TOKENS // 4)
  assert after["decode_steps"] - before["decode_steps"] > 4 * calls
  assert [r.choices[0].message.content for r in replies] == solo


def test_a_stop_sequence_cuts_the_reply(served):
  _, client, *_ = served
  messages = _user("Is the lamp left of the bed?")
  full = _ask(client, messages).choices[0].message.content
  assert len(full) >= 6, full
  stop = full[3:6]
  cut = _ask(client, messages, stop=[stop, "never in the reply \u2603"])
  assert cut.choices[0].message.content == full[:full.find(stop)]
  assert cut.choices[0].finish_reason == "stop"
  assert cut.usage.completion_tokens <= MAX_TOKENS
  # Sampling: temperature and top-p with a seed give the same reply twice.
  sampled = [_ask(client, messages, temperature=1.0, top_p=0.9, seed=5).choices[0]
             for _ in range(2)]
  assert sampled[0].message.content == sampled[1].message.content
  assert sampled[0].finish_reason in ("stop", "length")


def _post(url, body: bytes, headers=None):
  request = urllib.request.Request(url, data=body, method="POST",
                                   headers={"Content-Type": "application/json",
                                            **(headers or {})})
  try:
    with urllib.request.urlopen(request, timeout=30) as response:
      return response.status, json.load(response)
  except urllib.error.HTTPError as error:
    return error.code, json.load(error)


def test_malformed_requests_get_a_4xx_with_a_message_and_the_server_goes_on(served):
  server, client, *_ = served
  url = server.url + "/chat/completions"
  good = {"model": NAME, "messages": _user("Where is the chair?"), "max_tokens": 4,
          "temperature": 0}
  cases = [
      (b"{not json", 400, "malformed JSON"),
      (b'{"model": "a", "model": "b"}', 400, "duplicate key"),
      (json.dumps([1, 2]).encode(), 400, "JSON object"),
      (json.dumps({**good, "messages": []}).encode(), 400, "messages"),
      (json.dumps({**good, "messages": [{"role": "robot", "content": "hi"}]}).encode(), 400,
       "role"),
      (json.dumps({**good, "temperature": 5}).encode(), 400, "temperature"),
      (json.dumps({**good, "n": 9}).encode(), 400, "n: expected an integer"),
      (json.dumps({**good, "tools": [{"type": "function"}]}).encode(), 400, "tools"),
      (json.dumps({**good, "max_tokens": 0}).encode(), 400, "max_tokens"),
      (json.dumps({**good, "max_tokens": 10 ** 9}).encode(), 400, "context"),
      (json.dumps({**good, "model": "gpt-4"}).encode(), 404, "does not exist"),
      (json.dumps({**good, "messages": [{"role": "user", "content": [
          {"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}]}]}).encode(),
       400, "does not fetch"),
      (json.dumps({**good, "messages": [{"role": "user", "content": [
          {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}
                  ).encode(), 400, "cannot be decoded"),
      (json.dumps({**good, "messages": [{"role": "user", "content": "<|image_pad|>"}]}
                  ).encode(), 400, "vision token"),
      # Hostile values: a top_k past int32, a lone surrogate, a one-word text no context
      # holds (refused before the tokenizer reads it), an image past 4 x the most the
      # processor keeps (refused from its header, undecoded).
      (json.dumps({**good, "messages": [{"role": "user", "content": [
          {"type": "image_url", "image_url": {
              "url": _png_url(np.zeros((2048, 2048, 3), np.uint8))}}]}]}).encode(),
       400, "outside 1 ..."),
      (json.dumps({**good, "top_k": 10 ** 18}).encode(), 400, "top_k"),
      (json.dumps({**good, "messages": [{"role": "user", "content": "\ud800"}]}).encode(),
       400, "lone surrogate"),
      (json.dumps({**good, "messages": _user("a" * (2 << 20))}).encode(), 400,
       "cannot fit this server's context"),
  ]
  for body, status, words in cases:
    code, payload = _post(url, body)
    assert code == status, (body[:80], payload)
    error = payload["error"]
    assert words in error["message"] and error["type"], (body[:80], error)
  code, payload = _post(server.url + "/completions", json.dumps(good).encode())
  assert code == 404 and "no such path" in payload["error"]["message"]
  # A claimed body over the limit: 413 before reading it.
  code, payload = _post(url, b"{}", {"Content-Length": str(10 ** 12)})
  assert code == 413 and "limit" in payload["error"]["message"]
  # The openai client raises its typed errors with the server's message.
  with pytest.raises(openai.BadRequestError, match="n: expected an integer"):
    _ask(client, _user("hi"), n=9)
  with pytest.raises(openai.NotFoundError, match="does not exist"):
    client.chat.completions.create(model="other", messages=_user("hi"))
  # ... and the server still answers.
  assert _post(url, json.dumps(good).encode())[0] == 200
  assert _ask(client, _user("Where is the chair?")).choices[0].finish_reason in ("stop",
                                                                                  "length")
  assert server.stats()["errors"] >= len(cases)


def test_the_served_policy_is_a_judge_for_perception_judge(served):
  server, client, *_ = served
  endpoint = ChatEndpoint(server.url, NAME, api_key_env=None, timeout_s=30, retries=0,
                          concurrency=4)
  judge = LLMJudge(endpoint, "act3d", max_tokens=4)
  verdicts = judge.judge_texts(["What is left of the bed?"] * 3, ["a lamp", "the sofa", ""],
                               [["lamp"], ["chair", "red chair"], ["lamp"]])
  assert len(verdicts) == 3 and all(isinstance(v, bool) for v in verdicts)
  assert verdicts[2] is False  # an empty prediction: no request
  stats = judge.stats()
  assert stats["requests"] == 2 and stats["endpoint"]["usage"]["completion_tokens"] > 0
  # The endpoint's text is the server's reply, as the openai client reads it.
  messages = _user("Is the chair red?")
  assert endpoint.complete(messages, max_tokens=4) == _ask(
      client, messages, max_tokens=4).choices[0].message.content


def test_a_full_queue_is_a_429_and_a_client_that_hangs_up_frees_its_slot(served):
  server, client, *_ = served
  url = server.url + "/chat/completions"
  good = json.dumps({"model": NAME, "messages": _user("Where is the chair?"),
                     "max_tokens": 4, "temperature": 0}).encode()
  scheduler = server.scheduler
  limit = scheduler.max_queue
  try:
    scheduler.max_queue = 0
    request = urllib.request.Request(url, good, {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as caught:
      urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 429 and caught.value.headers["Retry-After"] == "1"
    assert "max_queue 0" in json.loads(caught.value.read())["error"]["message"]
    with pytest.raises(openai.RateLimitError, match="max_queue 0"):  # streamed: 429 too
      list(_ask(client, _user("Where is the chair?"), stream=True))
  finally:
    scheduler.max_queue = limit
  # A long reply whose client hangs up once it runs: its slot is freed mid-reply.
  long = json.dumps({"model": NAME, "messages": _user("Describe the room."),
                     "max_tokens": 3000, "temperature": 0}).encode()
  before = server.stats()
  host, port = urllib.parse.urlsplit(server.url).netloc.split(":")
  with socket.create_connection((host, int(port)), timeout=5) as client:
    client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                   b"Content-Type: application/json\r\nContent-Length: "
                   + str(len(long)).encode() + b"\r\n\r\n" + long)
    stop = time.monotonic() + 30
    while server.stats()["running"] == 0 and time.monotonic() < stop:
      time.sleep(0.02)
    assert server.stats()["running"] == 1
  stop = time.monotonic() + 10
  while server.stats()["cancelled"] == before["cancelled"] and time.monotonic() < stop:
    time.sleep(0.05)
  after = server.stats()
  assert after["cancelled"] == before["cancelled"] + 1 and after["running"] == 0
  assert after["decode_steps"] - before["decode_steps"] < 3000
  assert after["completed"] == before["completed"]
  assert _post(url, good)[0] == 200  # and it serves on


def _streamed(client, messages, **options):
  """(text per choice, finish reason per choice, the usage chunk's usage) of a stream."""
  texts, finishes, usage = {}, {}, None
  for chunk in _ask(client, messages, stream=True, stream_options={"include_usage": True},
                    **options):
    if chunk.usage is not None:
      usage = chunk.usage
    for choice in chunk.choices:
      texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
      if choice.finish_reason:
        finishes[choice.index] = choice.finish_reason
  return texts, finishes, usage


def test_a_stream_is_the_reply_and_n_choices_are_their_seeds(served, caplog):
  _, client, *_ = served
  messages = _user("Which wall has the window?")
  whole = _ask(client, messages)
  texts, finishes, usage = _streamed(client, messages)
  assert texts == {0: whole.choices[0].message.content}
  assert finishes == {0: whole.choices[0].finish_reason}
  assert (usage.prompt_tokens, usage.completion_tokens) == (whole.usage.prompt_tokens,
                                                            whole.usage.completion_tokens)
  # A stop string: nothing past it is ever sent.
  full = whole.choices[0].message.content
  stop = full[4:7]
  texts, finishes, _ = _streamed(client, messages, stop=[stop])
  assert texts == {0: full[:full.find(stop)]} and finishes == {0: "stop"}
  # n choices: choice i is the reply seeded with seed + i, streamed or not.
  hot = dict(temperature=1.0, max_tokens=8)
  singles = [_ask(client, messages, seed=40 + i, **hot).choices[0].message.content
             for i in range(3)]
  both = _ask(client, messages, seed=40, n=3, **hot)
  assert [c.message.content for c in both.choices] == singles
  assert both.usage.completion_tokens == sum(
      _ask(client, messages, seed=40 + i, **hot).usage.completion_tokens for i in range(3))
  texts, _, _ = _streamed(client, messages, seed=40, n=3, **hot)
  assert [texts[i] for i in range(3)] == singles
  # Every request was logged: one JSON line each, with its status and tokens.
  with caplog.at_level(logging.INFO, logger="jaxspatial.serving.access"):
    _ask(client, messages)
  line = json.loads(caplog.records[-1].getMessage())
  assert line["status"] == 200 and line["completion_tokens"] == whole.usage.completion_tokens
  assert line["id"].startswith("chatcmpl-") and line["ms"] > 0


def test_logprobs_are_the_samplers(served):
  _, client, tok, model, stops, _ = served
  messages = _user("Is the lamp on?")
  reply = _ask(client, messages, logprobs=True, top_logprobs=3)
  ids = tok.encode(tok.apply_chat_template(messages, tokenize=False,
                                           add_generation_prompt=True),
                   add_special_tokens=False)
  out = _reference(model, jnp.asarray([ids], jnp.int32), jax.random.PRNGKey(0),
                   SamplingConfig(max_new_tokens=MAX_TOKENS, stop_tokens=tuple(stops)))
  tokens, logprobs = np.asarray(out.tokens)[0], np.asarray(out.logprobs)[0]
  entries = reply.choices[0].logprobs.content
  kept = [k for k in range(MAX_TOKENS) if tokens[k] not in stops][:len(entries)]
  assert len(entries) == len([t for t in tokens[:reply.usage.completion_tokens]
                              if t not in stops])
  for entry, k in zip(entries, kept):
    assert entry.token == tok.decode([int(tokens[k])], skip_special_tokens=True)
    assert abs(entry.logprob - float(logprobs[k])) < 1e-4
    tops = entry.top_logprobs
    assert len(tops) == 3 and tops[0].logprob == entry.logprob  # greedy: the most likely
    assert tops[0].logprob >= tops[1].logprob >= tops[2].logprob
  assert _ask(client, messages).choices[0].logprobs is None


def test_two_hundred_concurrent_requests_all_succeed(served):
  server, client, *_ = served
  before = server.stats()
  with concurrent.futures.ThreadPoolExecutor(200) as pool:
    replies = list(pool.map(lambda k: _ask(client, _user(f"Where is chair {k}?"),
                                           max_tokens=3), range(200)))
  assert all(r.choices[0].finish_reason in ("stop", "length") for r in replies)
  after = server.stats()
  assert after["completed"] - before["completed"] == 200 and after["running"] == 0
  assert after["errors"] == before["errors"]


def test_a_prompt_whose_prefill_passes_the_memory_budget_is_a_400_and_the_server_serves_on(
    served):
  """The poison case: a long prompt the device could not prefill is refused before any
  allocation (launch.serve's --prefill_memory_gb; here a budget fit for 256 tokens)."""
  server, client, *_ = served
  from jaxspatial.serving import memory  # pylint: disable=import-outside-toplevel
  scheduler = server.scheduler
  scheduler.memory_budget = memory.prefill_bytes(server.engine.model, 256)
  try:
    with pytest.raises(openai.BadRequestError, match="prefill memory budget"):
      _ask(client, _user("Where is the chair? " * 150))
  finally:
    scheduler.memory_budget = None
  assert _ask(client, _user("Where is the chair?")).choices[0].finish_reason in ("stop",
                                                                                  "length")
