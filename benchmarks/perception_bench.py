"""Perception as host callbacks: what a call costs inside the compiled program, OCR throughput,
judge requests per second.

    python -m benchmarks.perception_bench
    python -m benchmarks.perception_bench --batches 1,8,64 --ocr-images 8 --judge-requests 64

Cost on a 2-core CPU: about a minute. Rows:
  callback    a jitted, vmapped program over B episodes with an empty host tool (it returns
              zeros of the declared shape) against the same program without it: the
              per-batch overhead of leaving the device and coming back (baseline: no
              callback)
  ocr         PP-OCRv4 (rapidocr-onnxruntime's wheel weights) on rendered text images
              through `text_ocr`, images per second, against the same engine called
              directly (the tool's JSON and crop on top of the model)
  judge       Act3D's LLM judge against a local OpenAI-compatible server (the tests' rule
              server on 127.0.0.1, answering after `--judge-latency-s`, a short judge
              generation), requests per second with one request in flight against
              `--concurrency` in flight; then the same cases judged on device by a tiny
              random jaxspatial policy (`PolicyJudge`, greedy, 4 tokens, one jitted call
              for the batch: prompt assembly, the system prompt prefilled once for the
              batch (`sampler.prefill_shared`), each case, generation and the verdict)
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.timing import timed
from jaxspatial.perception import HostTool


def callback_rows(batches, repeats: int = 20):
  rows = []
  empty = HostTool("empty", lambda image: {"n": np.zeros(image.shape[0], np.int32)},
                   {"n": ((), jnp.int32)})

  def work(image):
    return jnp.sum(image.astype(jnp.float32))

  plain = jax.jit(jax.vmap(lambda im: work(im)))
  hosted = jax.jit(jax.vmap(lambda im: work(im) + empty(image=im)["n"]))
  for batch in batches:
    images = jnp.zeros((batch, 64, 64, 3), jnp.uint8)
    jax.block_until_ready((plain(images), hosted(images)))
    base = timed(lambda: plain(images), repeats)
    with_tool = timed(lambda: hosted(images), repeats)
    rows.append((f"callback B={batch}", base * 1e3, with_tool * 1e3,
                 f"+{(with_tool - base) * 1e3:.2f} ms per batch"))
  return rows


def ocr_rows(count: int):
  from PIL import Image, ImageDraw, ImageFont  # pylint: disable=import-outside-toplevel
  from jaxspatial.perception import ocr  # pylint: disable=import-outside-toplevel
  words = ["KITCHEN", "EXIT 24", "Room 101", "NO ENTRY", "Level 3", "SALE", "Open 9-5",
           "PUSH"]
  images = []
  for i in range(count):
    image = Image.new("RGB", (320, 96), "white")
    ImageDraw.Draw(image).text((16, 20), words[i % len(words)], fill="black",
                               font=ImageFont.load_default(size=40))
    images.append(np.asarray(image))
  backend = ocr.RapidOCRBackend()
  backend.read(images[0])  # the engine's first call builds its sessions
  start = time.perf_counter()
  for image in images:
    backend.read(image)
  direct = time.perf_counter() - start
  start = time.perf_counter()
  for image in images:
    ocr.text_ocr(image, None, backend=backend)
  tool = time.perf_counter() - start
  return [(f"ocr {count} images 320x96", count / direct, count / tool,
           "images/s: engine | text_ocr")]


def judge_rows(requests: int, concurrency: int, latency_s: float):
  from jaxspatial.perception import judge  # pylint: disable=import-outside-toplevel
  from tests.perception.chat_server import ChatServer  # pylint: disable=import-outside-toplevel
  questions = [f"What is on table {i}?" for i in range(requests)]
  predictions = ["a red mug" if i % 2 else "blue vase" for i in range(requests)]
  references = [["red mug", "a red cup"]] * requests
  out = []
  with ChatServer(delay_s=latency_s) as server:
    for inflight in (1, concurrency):
      endpoint = judge.ChatEndpoint(server.base_url, "rule-judge", concurrency=inflight)
      scorer = judge.act3d_eval_judge(endpoint)
      start = time.perf_counter()
      scorer.judge_texts(questions, predictions, references)
      out.append(time.perf_counter() - start)
  rows = [(f"judge {requests} requests, {latency_s * 1e3:.0f} ms each", requests / out[0],
           requests / out[1], f"requests/s: 1 | {concurrency} in flight")]
  return rows + [policy_judge_row(questions, predictions, references, requests / out[1])]


def _byte_ids(texts, length: int) -> np.ndarray:
  out = np.full((len(texts), length), -1, np.int32)
  for i, text in enumerate(texts):
    data = text.encode()[:length]
    out[i, :len(data)] = list(data)
  return out


def policy_judge_row(questions, predictions, references, served_per_s: float):
  """The same cases judged on device by a tiny random jaxspatial policy (`PolicyJudge`,
  Act3D's evaluation setting: greedy, 4 tokens), one jitted call per batch."""
  from jaxspatial.perception import PolicyJudge  # pylint: disable=import-outside-toplevel
  from jaxspatial.rollout import tiny  # pylint: disable=import-outside-toplevel
  tok = tiny.tokenizer()
  judge = PolicyJudge.create(tok, tiny.model(tok), "act3d", temperature=0.0, max_tokens=4)
  q, a = _byte_ids(questions, 64), _byte_ids(predictions, 32)
  r = np.stack([_byte_ids([refs[k] for refs in references], 32) for k in range(2)], 1)
  seconds = timed(lambda: judge(q, a, r), repeats=3)  # after a compiling warm-up call
  return (f"policy judge on device, B={len(q)}", served_per_s, len(q) / seconds,
          "verdicts/s: served (16 in flight) | tiny policy in jit")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batches", default="1,8,64")
  parser.add_argument("--ocr-images", type=int, default=8)
  parser.add_argument("--judge-requests", type=int, default=64)
  parser.add_argument("--concurrency", type=int, default=16)
  parser.add_argument("--judge-latency-s", type=float, default=0.05)
  args = parser.parse_args(argv)
  rows = callback_rows([int(b) for b in args.batches.split(",")])
  print("| part | baseline | with perception | note |")
  print("|---|---|---|---|")
  for name, base, value, note in rows:
    print(f"| {name} | {base:.2f} ms | {value:.2f} ms | {note} |", flush=True)
  for name, base, value, note in ocr_rows(args.ocr_images):
    print(f"| {name} | {base:.2f} | {value:.2f} | {note} |", flush=True)
  for name, base, value, note in judge_rows(args.judge_requests, args.concurrency,
                                            args.judge_latency_s):
    print(f"| {name} | {base:.1f} | {value:.1f} | {note} |", flush=True)


if __name__ == "__main__":
  main()
