"""Host time per call of a jitted program over a policy, for an empty program: `nnx.jit`
(the module graph walked on every call; the baseline of issue 36) against what the per-step
paths use now: `reading_jit` (rollouts, the module as a pytree) and `split_train_step` on
state split once per update (`grpo.update`'s mini-batches).

    python -m benchmarks.call_overhead_bench [--layers 36] [--vision_depth 32]

The graph is a Qwen2.5-VL-3B's (36 decoder layers, 32 vision blocks: 824 arrays, 2,474 with
AdamW's state) at tiny widths: the host cost depends on the number of arrays, not their
size. Cost: under a minute on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxspatial.models import reading_jit
from jaxspatial.models.qwen2_5_vl import Qwen25VL, Qwen25VLConfig, TextConfig, VisionConfig


def median_ms(fn, repeats: int = 20) -> float:
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    started = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - started)
  return float(np.median(times)) * 1e3


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--layers", type=int, default=36, help="decoder layers (default 36)")
  parser.add_argument("--vision_depth", type=int, default=32,
                      help="vision blocks (default 32)")
  args = parser.parse_args()
  text = TextConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                    num_hidden_layers=args.layers, num_attention_heads=4,
                    num_key_value_heads=2, mrope_section=(2, 3, 3))
  vision = VisionConfig(depth=args.vision_depth, hidden_size=32, intermediate_size=64,
                        num_heads=2, out_hidden_size=64, fullatt_block_indexes=())
  model = Qwen25VL(Qwen25VLConfig(text=text, vision=vision), rngs=nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
  arrays = len(jax.tree.leaves(nnx.state(model)))
  with_optimizer = arrays + len(jax.tree.leaves(nnx.state(optimizer)))
  empty = lambda *_: jnp.zeros(())

  rollout_nnx = nnx.jit(empty)
  rollout_ours = reading_jit(empty)
  step_nnx = nnx.jit(empty)
  held = jax.jit(lambda graphdef, state: jnp.zeros(()), static_argnums=0)
  graphdef, state = nnx.split((model, optimizer))
  rows = [
      ("rollout call (model)", arrays, median_ms(lambda: rollout_nnx(model)),
       median_ms(lambda: rollout_ours(model))),
      ("update step (model + AdamW)", with_optimizer,
       median_ms(lambda: step_nnx(model, optimizer)), median_ms(lambda: held(graphdef, state))),
      ("split + write back, once an update", with_optimizer, float("nan"),
       median_ms(lambda: nnx.update((model, optimizer), nnx.split((model, optimizer))[1]))),
  ]
  print(f"host ms per call, empty program, {args.layers} layers / {args.vision_depth} vision "
        f"blocks, {jax.devices()[0].platform}")
  print(f"{'path':38s} {'arrays':>7s} {'nnx.jit':>9s} {'now':>9s} {'speed-up':>9s}")
  for name, count, before, now in rows:
    known = before == before  # NaN: no nnx.jit counterpart
    print(f"{name:38s} {count:7d} {f'{before:.1f}' if known else '-':>9s} {now:9.1f} "
          f"{f'{before / now:.1f}x' if known else '-':>9s}")
  print("an update of M mini-batches: M x nnx.jit before; one split + write back and M held "
        "calls now")


if __name__ == "__main__":
  main()
