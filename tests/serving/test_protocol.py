"""Request parsing without a model: the fields the server acts on, OpenAI's error body,
data-URL images (formats, remote URLs refused, size bounds), prompts (the vision tokens
cannot be spelled in text), the engine's reply rule (stop tokens, stop strings, the
length limit) and its shape buckets."""

import base64
import io
import json

import numpy as np
import pytest
from PIL import Image

from jaxspatial.serving import engine, images, protocol
from jaxspatial.serving.protocol import APIError, parse_json, parse_request


def _request(**fields):
  return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def test_a_request_parses_into_the_fields_the_server_uses():
  request = parse_request(_request(
      messages=[{"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "look: "},
                                             {"type": "image_url",
                                              "image_url": {"url": "data:image/png;base64,"}}]},
                {"role": "assistant", "content": None}],
      max_completion_tokens=7, temperature=0.0005, top_p=0.5, stop="END", seed=3, n=1,
      stream=False, user="someone", tools=[], frequency_penalty=0))
  assert request.max_tokens == 7 and request.greedy and request.top_p == 0.5
  assert request.stop == ("END",) and request.seed == 3
  assert request.messages[1].parts[0] == "look: "
  assert isinstance(request.messages[1].parts[1], protocol.ImagePart)
  assert request.messages[2].parts == ()
  defaults = parse_request(_request())
  assert defaults.temperature == 1.0 and not defaults.greedy and defaults.max_tokens is None
  assert (defaults.n, defaults.stream, defaults.logprobs, defaults.top_logprobs) == (
      1, False, False, 0)
  streamed = parse_request(_request(stream=True, stream_options={"include_usage": True}, n=3,
                                    logprobs=True, top_logprobs=5))
  assert (streamed.stream, streamed.include_usage, streamed.n, streamed.logprobs,
          streamed.top_logprobs) == (True, True, 3, True, 5)


@pytest.mark.parametrize("fields, words", [
    ({"n": 9}, "n: expected an integer >= 1 and <= 8"), ({"stream": "yes"}, "stream"),
    ({"stream_options": {"include_usage": True}}, "with stream=true"),
    ({"top_logprobs": 3}, "needs logprobs=true"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"), ({"logit_bias": {"1": 2}}, "logit_bias"),
    ({"tools": [{"type": "function"}]}, "tools"), ({"presence_penalty": 0.5}, "presence"),
    ({"temperature": -1}, "temperature"), ({"temperature": True}, "temperature"),
    ({"top_p": 0}, "top_p"), ({"max_tokens": 2.5}, "max_tokens"),
    ({"max_tokens": 3, "max_completion_tokens": 4}, "disagree"), ({"stop": ["a"] * 5}, "stop"),
    ({"stop": [""]}, "stop"), ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"model": 3}, "model"), ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "user"}]}, "content"),
    ({"messages": [{"role": "user", "content": [{"type": "audio"}]}]}, "not supported"),
    ({"messages": [{"role": "system", "content": [
        {"type": "image_url", "image_url": {"url": "data:,"}}]}]}, "user messages only"),
    ({"messages": [{"role": "assistant", "content": "x", "tool_calls": [{}]}]}, "tool calls"),
])
def test_malformed_fields_are_400s_naming_them(fields, words):
  with pytest.raises(APIError, match=words) as caught:
    parse_request(_request(**fields))
  body = caught.value.body()["error"]
  assert caught.value.status == 400 and body["type"] == "invalid_request_error"
  assert words in body["message"]
  json.dumps(body)  # serialisable


def test_strict_json():
  for body, words in [(b'{"a": 1, "a": 2}', "duplicate"), (b'{"a": NaN}', "NaN"),
                      (b"\xff", "UTF-8"), (b"[1,", "malformed JSON")]:
    with pytest.raises(APIError, match=words):
      parse_json(body)
  assert parse_json(b'{"a": [1]}') == {"a": [1]}


def _url(image, fmt):
  buffer = io.BytesIO()
  Image.fromarray(image).save(buffer, format=fmt)
  media = {"PNG": "png", "JPEG": "jpeg", "BMP": "bmp"}[fmt]
  return f"data:image/{media};base64," + base64.b64encode(buffer.getvalue()).decode()


def test_data_url_images():
  image = np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3)
  np.testing.assert_array_equal(images.decode_data_url(_url(image, "PNG"), "x"), image)
  assert images.decode_data_url(_url(image, "JPEG"), "x").shape == (5, 7, 3)
  rgba = np.zeros((4, 4, 4), np.uint8)
  assert images.decode_data_url(_url(rgba, "PNG"), "x").shape == (4, 4, 3)
  for url, words in [("https://example.com/a.png", "does not fetch"),
                     ("file:///etc/passwd", "does not fetch"),
                     ("data:image/png;base64,@@@", "base64"),
                     ("data:image/png;base64," + base64.b64encode(b"nope").decode(),
                      "cannot be decoded"),
                     (_url(image, "BMP"), "not accepted")]:
    with pytest.raises(APIError, match=words):
      images.decode_data_url(url, "messages[0].content[0]")
  with pytest.raises(APIError, match="pixels"):
    images.decode_data_url(_url(image, "PNG"), "x", max_pixels=10)


class _Tokenizer:
  """Characters as tokens; "S" is the stop token 0, "@" the special token 1."""
  pad_token_id = 9

  def __len__(self):
    return 200

  def decode(self, ids, skip_special_tokens=True):
    return "".join("" if t == 1 and skip_special_tokens else chr(t) for t in ids)


def test_the_reply_rule():
  run = engine.Engine(model=None, tokenizer=_Tokenizer(), stop_ids=(0,))
  text = [ord(c) for c in "abcdefgh"]
  reply = run.reply(np.asarray(text + [0, 5]), 4, 20)
  assert (reply.text, reply.finish_reason, reply.completion_tokens) == ("abcdefgh", "stop", 9)
  reply = run.reply(np.asarray(text + [0]), 4, 5)
  assert (reply.text, reply.finish_reason, reply.completion_tokens) == ("abcde", "length", 5)
  reply = run.reply(np.asarray(text + [0]), 4, 20, stop=("ef", "cd", "zz"))
  assert (reply.text, reply.finish_reason, reply.completion_tokens) == ("ab", "stop", 4)
  reply = run.reply(np.asarray([1, 300] + text), 4, 20)  # special and past-vocabulary ids
  assert reply.text == "abcdefgh" and reply.completion_tokens == 10


def test_buckets_bound_the_shapes():
  run = engine.Engine(model=None, tokenizer=_Tokenizer(), stop_ids=(0,),
                      batch_buckets=(1, 4, 8))
  prompt = lambda n: type("P", (), {"ids": np.zeros(n, np.int32)})()
  assert run.shapes([prompt(10)], 5) == (1, 64, 16)
  assert run.shapes([prompt(10), prompt(65)], 17) == (4, 128, 32)
  assert run.shapes([prompt(3)] * 8, 16) == (8, 64, 16)
  assert engine.next_power(1000, 64) == 1024


def _mutations(seed: int):
  """Seeded hostile variants of a valid request: fields replaced by values of other kinds,
  removed, nested, and bytes of the encoded body flipped or cut."""
  rng = np.random.default_rng(seed)
  base = _request(messages=[{"role": "system", "content": "s"},
                            {"role": "user", "content": [
                                {"type": "text", "text": "t"},
                                {"type": "image_url",
                                 "image_url": {"url": "data:image/png;base64,"}}]}],
                  max_tokens=5, temperature=0.5, top_p=0.9, stop=["x"], seed=1)
  values = [None, True, -1, 0, 2 ** 70, 1e308, -0.0, "", "x" * 300, [], {}, [None], {"a": {}},
            [{"role": "user"}], {"type": "image_url"}, "data:image/png;base64,@@"]
  for _ in range(300):
    obj = json.loads(json.dumps(base))
    for _ in range(int(rng.integers(1, 4))):
      target = obj
      path = [k for k in ("messages", int(rng.integers(0, 2)), "content",
                          int(rng.integers(0, 2)))][:int(rng.integers(0, 5))]
      for key in path:
        try:
          target = target[key]
        except (KeyError, IndexError, TypeError):
          break
      if isinstance(target, dict) and target:
        key = list(target)[int(rng.integers(0, len(target)))]
        if rng.random() < 0.2:
          del target[key]
        else:
          target[key] = json.loads(json.dumps(values[int(rng.integers(0, len(values)))]))
      elif isinstance(target, list) and target:
        target[int(rng.integers(0, len(target)))] = json.loads(json.dumps(
            values[int(rng.integers(0, len(values)))]))
    body = bytearray(json.dumps(obj).encode())
    if rng.random() < 0.3:
      for _ in range(int(rng.integers(1, 4))):
        body[int(rng.integers(0, len(body)))] = int(rng.integers(0, 256))
    if rng.random() < 0.1:
      body = body[:int(rng.integers(0, len(body)))]
    yield bytes(body)


def test_hostile_request_bodies_are_a_request_or_a_400():
  outcomes = {"ok": 0, "400": 0}
  for body in _mutations(0):
    try:
      request = parse_request(parse_json(body))
    except APIError as error:
      assert error.status == 400 and error.message, body[:120]
      json.dumps(error.body())
      outcomes["400"] += 1
      continue
    for message in request.messages:
      for part in message.parts:
        if isinstance(part, protocol.ImagePart):
          try:
            images.decode_data_url(part.url, part.where)
          except APIError as error:
            assert error.status == 400
    outcomes["ok"] += 1
  assert outcomes["ok"] > 10 and outcomes["400"] > 100, outcomes
