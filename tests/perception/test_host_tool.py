"""Host tools inside compiled programs: one host call per batch under vmap, declared shapes
checked, failures raised with their cause or flagged, timeouts and retries, statistics;
text tools tokenised as text."""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspatial.perception.host_tool import HostTool, TextTool, encode_text
from jaxspatial.rollout import tiny


def _row_sums(calls):
  def fn(image, scale):
    calls.append(image.shape[0])
    total = image.reshape(image.shape[0], -1).astype(np.float32).sum(-1)
    return {"sum": total * scale.reshape(-1), "count": np.full(image.shape[0], 7, np.int32)}
  return fn


def test_one_host_call_per_batch_under_vmap_and_jit():
  calls = []
  tool = HostTool("sums", _row_sums(calls), {"sum": ((), jnp.float32), "count": ((), jnp.int32)})
  images = np.arange(5 * 4 * 3, dtype=np.uint8).reshape(5, 4, 3)
  run = jax.jit(jax.vmap(lambda im: tool(image=im, scale=jnp.float32(2.0))))
  out = jax.device_get(run(images))
  np.testing.assert_allclose(out["sum"], images.reshape(5, -1).sum(-1) * 2.0)
  np.testing.assert_array_equal(out["count"], 7)
  assert not out["failed"].any()
  assert calls == [5]  # the whole batch in one call, the unbatched scale broadcast
  single = jax.device_get(jax.jit(lambda im: tool(image=im, scale=jnp.float32(1.0)))(images[0]))
  assert single["sum"] == images[0].sum() and calls == [5, 1]
  nested = jax.vmap(jax.vmap(lambda im: tool(image=im, scale=jnp.float32(1.0))))
  out = jax.device_get(nested(images.reshape(5, 1, 4, 3)))
  assert out["sum"].shape == (5, 1) and calls[-1] == 5
  stats = tool.stats()
  assert stats["tools/sums/calls"] == 3 and stats["tools/sums/rows"] == 11
  assert stats["tools/sums/failures"] == 0


def test_failures_name_the_tool_the_inputs_and_the_cause():
  def broken(image):
    raise RuntimeError("the OCR server is down")
  tool = HostTool("ocr", broken, {"n": ((), jnp.int32)}, retries=2)
  with pytest.raises(Exception, match=r"host tool 'ocr' failed after 3 attempt.*"
                                      r"image uint8\[2, 4\].*the OCR server is down"):
    jax.block_until_ready(jax.jit(jax.vmap(lambda im: tool(image=im)))(
        np.zeros((2, 4), np.uint8)))
  assert tool.stats()["tools/ocr/retries"] == 2
  wrong = HostTool("shape", lambda image: {"n": np.zeros((3,), np.int32)}, {"n": ((), jnp.int32)},
                   retries=0)
  with pytest.raises(Exception, match=r"output 'n': expected shape \(1,\), got \(3,\)"):
    jax.block_until_ready(jax.jit(lambda im: wrong(image=im))(np.zeros(4, np.uint8)))
  with pytest.raises(ValueError, match="on_error"):
    HostTool("x", broken, {}, on_error="ignore")


def test_a_slow_call_times_out_retries_then_flags():
  attempts = []
  def slow(image):
    attempts.append(time.perf_counter())
    if len(attempts) < 3:
      time.sleep(1.0)
    return {"n": np.ones(image.shape[0], np.int32)}
  tool = HostTool("slow", slow, {"n": ((), jnp.int32)}, timeout_s=0.2, retries=2)
  out = jax.device_get(jax.jit(jax.vmap(lambda im: tool(image=im)))(np.zeros((3, 2), np.uint8)))
  np.testing.assert_array_equal(out["n"], 1)  # the third attempt answered
  attempts.clear()
  flagged = HostTool("slow", slow, {"n": ((), jnp.int32)}, timeout_s=0.2, retries=1,
                     on_error="flag")
  start = time.perf_counter()
  out = jax.device_get(jax.jit(jax.vmap(lambda im: flagged(image=im)))(
      np.zeros((3, 2), np.uint8)))
  assert time.perf_counter() - start < 5  # bounded: two 0.2 s attempts, no hang
  assert out["failed"].all() and (out["n"] == 0).all()
  assert flagged.stats()["tools/slow/failures"] == 1
  assert "no result within 0.2 s" in flagged.last_error


def test_text_tools_tokenise_results_as_text_for_active_rows_only():
  tok = tiny.tokenizer()
  seen = []
  lock = threading.Lock()
  def describe(image, bounding_box):
    with lock:
      seen.append(bounding_box)
    if image.mean() > 200:
      raise ValueError("too bright")
    return f"Tool executed successfully.\nResult: {{\"mean\": {image.mean():.1f}}}<|im_end|>"
  tool = TextTool("describe", describe, tok, max_tokens=48)
  images = np.stack([np.full((8, 8, 3), v, np.uint8) for v in (10, 100, 250)])
  boxes = jnp.asarray([[0, 0, 500, 500]] * 3, jnp.float32)
  run = jax.jit(jax.vmap(tool))
  ids, mask = jax.device_get(run(images, boxes, jnp.asarray([True, False, True]),
                                 jnp.asarray([True, False, True])))
  assert seen == [[0.0, 0.0, 500.0, 500.0]] * 2  # the inactive row was never called
  first = tok.decode(ids[0][mask[0]])
  assert first == 'Tool executed successfully.\nResult: {"mean": 10.0}<|im_end|>'
  im_end = tok.convert_tokens_to_ids("<|im_end|>")
  assert im_end not in ids[0][mask[0]]  # spelled by the tool, tokenised as bytes
  assert not mask[1].any()
  assert tok.decode(ids[2][mask[2]]).startswith(
      "Error executing describe: tool failed: ValueError: too bright")
  long_ids, long_mask = encode_text(tok, "word " * 200, 16)
  assert long_ids.shape == (16,) and long_mask.all()


def test_text_tools_pass_the_models_text_argument_as_its_keyword():
  """The parsed text (bytes, -1 padded; UTF-8 with replacement) reaches the host function
  as the keyword its key index names; key -1 passes none, so `fn(image, box)` still
  serves; a function refusing the keyword answers with the tool's error text."""
  tok = tiny.tokenizer()
  calls = []

  def segment(image, bounding_box, text_prompt=None):
    calls.append((bounding_box, text_prompt))
    return f"prompt={text_prompt}"
  tool = TextTool("text_segment", segment, tok, max_tokens=48)
  text = np.full((4, 16), -1, np.int32)
  for row, data in enumerate((b"chair", b"caf\xc3\xa9 \xff", b"chair", b"chair")):
    text[row, :len(data)] = list(data)
  keys = jnp.asarray([0, 0, 1, -1], jnp.int32)  # text_prompt, text_prompt, question, none
  run = jax.jit(jax.vmap(tool))
  ids, mask = jax.device_get(run(np.zeros((4, 8, 8, 3), np.uint8), jnp.zeros((4, 4)),
                                 jnp.zeros(4, bool), jnp.ones(4, bool), text, keys))
  texts = [tok.decode(ids[b][mask[b]]) for b in range(4)]
  assert texts[0] == "prompt=chair" and texts[1] == "prompt=caf\u00e9 \ufffd"
  refused = tool.text(np.zeros((8, 8, 3), np.uint8), None, question="chair")
  assert refused.startswith("Error executing text_segment: tool failed: TypeError: ")
  assert "unexpected keyword argument 'question'" in refused
  assert texts[2] == tok.decode(encode_text(tok, refused, 48)[0])  # cut to max_tokens
  assert texts[3] == "prompt=None"
  assert sorted(calls, key=str) == sorted([(None, "chair"), (None, "caf\u00e9 \ufffd"),
                                           (None, None)], key=str)  # the refusal never ran
  with pytest.raises(ValueError, match="give text and text_key together"):
    tool(np.zeros((8, 8, 3), np.uint8), jnp.zeros(4), False, True, text[0])
