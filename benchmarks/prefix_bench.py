"""A SpatialClaw-shaped conversation on a jaxspatial policy: each step's prompt is the
previous one plus the reply and a feedback turn. `serving.Scheduler` reusing the
conversation's slot (each step appends what is new; PolicyChat's default) against the
baseline, the same scheduler prefilling the whole prompt every step (`reuse=False`).

    python -m benchmarks.prefix_bench
    python -m benchmarks.prefix_bench --steps 6 --feedback 256   # quicker

Cost on a 2-core CPU: about a minute, most of it compiling. Tiny random Qwen2.5-VL
(hidden 64, `--layers`), one conversation, greedy, float32; the first prompt holds one
224x224 image; each step adds a reply (`--reply` tokens, no stop; not the generated one, so
each step reuses the slot up to the previous prompt's end) and `--feedback` text tokens.
Both ways run the conversation once to compile, then once timed. Rows: seconds for all
steps, prompt tokens run through the model, and the last prompt's length.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
from flax import nnx

from jaxspatial.models.policy import policy_class
from jaxspatial.models.qwen2_5_vl.config import Qwen25VLConfig
from jaxspatial.rollout import tiny
from jaxspatial.serving import Engine, Prompt, Sampling, Scheduler


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
  engine = Engine(model, tok, stop_ids=())
  first, turns = conversation(model.image_tokens(image.shape[:2]), model.config.image_token_id,
                              args.steps, args.feedback, args.reply)
  greedy = Sampling()
  capacity = 1 << (len(first) + args.steps * (args.reply + args.feedback) + args.reply
                   ).bit_length()
  rows = {}
  for name in ("whole prompt", "slot reuse"):
    for _ in range(2):  # compile, then timed
      scheduler = Scheduler(engine, slots=1, capacity=capacity, steps=8,
                            reuse=name == "slot reuse")
      seconds, lengths = run(lambda p, s=scheduler: s.generate(p, args.reply, greedy),
                             first, turns, image)
      scheduler.close()
    rows[name] = (seconds, scheduler.stats()["prefilled_tokens"])
  print(f"{args.steps} steps, +{args.feedback} feedback and {args.reply} reply tokens each, "
        f"last prompt {lengths[-1]} tokens; hidden {text.hidden_size}, {args.layers} layers, "
        "one slot")
  print("| way | seconds (steps) | prompt tokens run | per step |")
  print("|---|---|---|---|")
  for name, (seconds, tokens) in rows.items():
    print(f"| {name} | {seconds:.2f} | {tokens} | {seconds / args.steps * 1e3:.0f} ms |")
  speedup = rows["whole prompt"][0] / rows["slot reuse"][0]
  print(f"slot reuse: {speedup:.2f}x the baseline's speed, "
        f"{rows['whole prompt'][1] / rows['slot reuse'][1]:.1f}x fewer prompt tokens run")


if __name__ == "__main__":
  main()
