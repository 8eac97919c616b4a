"""A SpatialClaw-shaped conversation on a jaxspatial policy: each step's prompt is the
previous one plus the reply and a feedback turn. `serving.PrefixCache` (appends what is
new to the kept cache; PolicyChat's default) against the baseline, `serving.Engine` over the
whole prompt every step (PolicyChat before the prefix cache; the batcher's path).

    python -m benchmarks.prefix_bench
    python -m benchmarks.prefix_bench --steps 6 --feedback 256   # quicker

Cost on a 2-core CPU: about a minute, most of it compiling. Tiny random Qwen2.5-VL
(hidden 64, `--layers`), batch 1, greedy, float32; the first prompt holds one 224x224
image; each step adds the reply (`--reply` tokens, no stop) and `--feedback` text tokens.
Both ways run the conversation once to compile, then once timed. Rows: seconds for all
steps, prompt tokens run through the model, and the last prompt's length.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import numpy as np
from flax import nnx

from jaxspatial.models.policy import policy_class
from jaxspatial.models.qwen2_5_vl.config import Qwen25VLConfig
from jaxspatial.rollout import tiny
from jaxspatial.serving import Engine, PrefixCache, Prompt, Sampling


def conversation(image_tokens: int, image_pad_id: int, steps: int, feedback: int, reply: int,
                 seed=0):
  """The first prompt's ids (one image), then per step (reply ids, feedback ids)."""
  rng = np.random.default_rng(seed)
  text = lambda n: rng.integers(20, 600, n).astype(np.int32)
  first = np.concatenate([text(40), np.full(image_tokens, image_pad_id, np.int32), text(40)])
  return first, [(text(reply), text(feedback)) for _ in range(steps)]


def run(generate, first, turns, image) -> tuple[float, list[int]]:
  """(seconds, each prompt's length) of the conversation through `generate(prompt)`."""
  ids, lengths = first, []
  start = time.perf_counter()
  for reply, feedback in turns:
    generate(Prompt(ids, (image,)))
    lengths.append(len(ids))
    ids = np.concatenate([ids, reply, feedback])  # the reply as the template writes it back
  return time.perf_counter() - start, lengths


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--feedback", type=int, default=384)
  parser.add_argument("--reply", type=int, default=32)
  parser.add_argument("--layers", type=int, default=4)
  args = parser.parse_args(argv)
  tok = tiny.tokenizer()
  base = Qwen25VLConfig.tiny(len(tok))
  text = dataclasses.replace(base.text, num_hidden_layers=args.layers)
  model = policy_class("qwen2_5_vl")(tiny.model_config(tok, dataclasses.replace(base, text=text)),
                                     rngs=nnx.Rngs(0))
  image = np.random.default_rng(1).integers(0, 256, (224, 224, 3), dtype=np.uint8)
  engine = Engine(model, tok, stop_ids=(), batch_buckets=(1,))
  first, turns = conversation(model.image_tokens(image.shape[:2]), model.config.image_token_id,
                              args.steps, args.feedback, args.reply)
  key, greedy = jax.random.PRNGKey(0), Sampling()

  def whole(prompt):
    return engine.generate([prompt], args.reply, greedy, key)[0]

  rows = {}
  for name in ("whole prompt", "prefix cache"):
    for _ in range(2):  # compile, then timed
      cache = PrefixCache(engine, entries=2)
      call = whole if name == "whole prompt" else (
          lambda p, c=cache: c.generate(p, args.reply, greedy, key))
      seconds, lengths = run(call, first, turns, image)
    run_tokens = sum(lengths) if name == "whole prompt" else cache.stats()["prefilled_tokens"]
    rows[name] = (seconds, run_tokens)
  print(f"{args.steps} steps, +{args.feedback} feedback and {args.reply} reply tokens each, "
        f"last prompt {lengths[-1]} tokens; hidden {text.hidden_size}, {args.layers} layers, "
        "batch 1")
  print("| way | seconds (steps) | prompt tokens run | per step |")
  print("|---|---|---|---|")
  for name, (seconds, tokens) in rows.items():
    print(f"| {name} | {seconds:.2f} | {tokens} | {seconds / args.steps * 1e3:.0f} ms |")
  speedup = rows["whole prompt"][0] / rows["prefix cache"][0]
  print(f"prefix cache: {speedup:.2f}x the baseline's speed, "
        f"{rows['whole prompt'][1] / rows['prefix cache'][1]:.1f}x fewer prompt tokens run")


if __name__ == "__main__":
  main()
