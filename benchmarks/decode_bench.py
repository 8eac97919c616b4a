"""Decode steps over a cache sized for a whole episode: attention over every slot of the
capacity (`attention.DECODE_BLOCK = 0`, the path before issue 36) against blocks up to the
fill (`filled_attention`, the default), in one run.

    python -m benchmarks.decode_bench [--batches 1 32] [--capacities 96 1024]

32 greedy decode steps after a cache holding 64 valid tokens, float32 cache, a text decoder
of 8 layers, hidden 512, vocabulary 4,096 (27M parameters). A rollout's capacity is its
prompt, every turn and every observation, so its early turns are such steps. Cost: about
two minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse

import jax.numpy as jnp
from flax import nnx

from benchmarks.sampler_bench import decode_at_context
from jaxspatial.models.attention import DECODE_BLOCK
from jaxspatial.models.qwen2_5_vl import Qwen25VL, Qwen25VLConfig, TextConfig, VisionConfig

VALID, NEW = 64, 32


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--batches", type=int, nargs="+", default=[1, 32],
                      help="decode batch sizes (default 1 32)")
  parser.add_argument("--capacities", type=int, nargs="+", default=[96, 1024],
                      help="cache capacities in slots (default 96 1024)")
  args = parser.parse_args()
  text = TextConfig(vocab_size=4096, hidden_size=512, intermediate_size=1408,
                    num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
                    mrope_section=(8, 12, 12))
  vision = VisionConfig(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                        out_hidden_size=512, fullatt_block_indexes=(0,))
  model = Qwen25VL(Qwen25VLConfig(text=text, vision=vision), rngs=nnx.Rngs(0))
  print(f"ms per decode step, {VALID} valid slots, {NEW} steps, block {DECODE_BLOCK}")
  print(f"{'batch':>5s} {'capacity':>8s} {'whole capacity':>15s} {'filled blocks':>14s} "
        f"{'speed-up':>9s}")
  for batch in args.batches:
    for capacity in args.capacities:
      ms = {block: 1e3 / NEW * decode_at_context(model, VALID, batch, NEW, jnp.float32, 5,
                                                 capacity, block)
            for block in (0, DECODE_BLOCK)}
      print(f"{batch:5d} {capacity:8d} {ms[0]:15.2f} {ms[DECODE_BLOCK]:14.2f} "
            f"{ms[0] / ms[DECODE_BLOCK]:8.2f}x", flush=True)


if __name__ == "__main__":
  main()
