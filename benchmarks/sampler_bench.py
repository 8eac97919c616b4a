"""Prefill and decode tokens per second: the jitted sampler against transformers' PyTorch
`generate` on the same model and prompts, in one run, for each policy family; then decode
at long context, Qwen3.5's hybrid cache against Qwen2.5-VL's KV cache.

    python -m benchmarks.sampler_bench [--batches 1 8 64] [--families qwen2_5_vl qwen3_vl qwen3_5]
                                       [--contexts 4096 16384 24576]

Cost: about fifteen minutes on a 2-core CPU. Families: Qwen2.5-VL, Qwen3-VL (QK-norm,
interleaved M-RoPE) and Qwen3.5 (three Gated DeltaNet layers to one gated-attention layer;
transformers runs its PyTorch reference delta-rule kernels here, as no fused kernel exists
for CPU); models: "tiny" (the tests' size) and "small" (5M text parameters), the same
widths in every family (Qwen3.5 with twice the layers: three DeltaNet layers to one). Prompts of 64 tokens, 32 new tokens, greedy. Prefill is timed as
generating 1 token; "decode" is the 31 further tokens (total minus prefill), and the
"generate" column the whole 32-token call. The speed-up compares whole calls.

The long-context table (`context_rows`) times 32 greedy decode steps after a cache holding
`context` tokens, batch 1, bf16 cache, for a Qwen2.5-VL and a Qwen3.5 of the same width and
depth (4 layers, hidden 64): a KV layer reads the whole cache every step, a Gated DeltaNet
layer only its fixed state. "cache / episode" is the decode cache one episode holds at that
context (`memory.cache_bytes`). The device suite runs the same rows at the papers' shapes
(Qwen3.5-9B against Qwen2.5-VL-7B) when a GPU is lent.
"""

from __future__ import annotations

import argparse
import importlib
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from flax import nnx

from jaxspatial.models import load_model
from jaxspatial.models.sampler import SamplingConfig, generate

SIZES = {
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, mrope=[2, 3, 3]),
    "small": dict(vocab_size=4096, hidden_size=256, intermediate_size=704, num_hidden_layers=6,
                  num_attention_heads=8, num_key_value_heads=2, mrope=[4, 6, 6]),
}
PROMPT, NEW = 64, 32


def _special_ids(size: dict) -> dict:
  v = size["vocab_size"]
  return dict(image_token_id=v - 6, video_token_id=v - 5, vision_start_token_id=v - 4,
              vision_end_token_id=v - 3, tie_word_embeddings=False)


def qwen2_5_vl(size: dict):
  text = {k: v for k, v in size.items() if k != "mrope"}
  text.update(rope_scaling={"type": "mrope", "mrope_section": size["mrope"]},
              max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
              tie_word_embeddings=False)
  config = transformers.Qwen2_5_VLConfig(
      text_config=text, vision_config=dict(depth=1, hidden_size=32, intermediate_size=64,
                                           num_heads=2, out_hidden_size=size["hidden_size"],
                                           fullatt_block_indexes=[0]),
      **_special_ids(size))
  return transformers.Qwen2_5_VLForConditionalGeneration(config)


def qwen3_vl(size: dict):
  text = {k: v for k, v in size.items() if k != "mrope"}
  text.update(head_dim=size["hidden_size"] // size["num_attention_heads"],
              rope_parameters={"rope_type": "default", "mrope_section": size["mrope"],
                               "mrope_interleaved": True, "rope_theta": 1e6},
              max_position_embeddings=512, bos_token_id=1, eos_token_id=2)
  config = transformers.Qwen3VLConfig(
      text_config=text, vision_config=dict(depth=1, hidden_size=32, intermediate_size=64,
                                           num_heads=2, out_hidden_size=size["hidden_size"],
                                           num_position_embeddings=64,
                                           deepstack_visual_indexes=[0]),
      **_special_ids(size))
  return transformers.Qwen3VLForConditionalGeneration(config)


def qwen3_5(size: dict):
  text = {k: v for k, v in size.items() if k != "mrope"}
  head_dim = size["hidden_size"] // size["num_attention_heads"]
  layers = size["num_hidden_layers"]
  text.update(head_dim=head_dim, num_hidden_layers=2 * layers,  # 3:1 linear / full
              layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (layers // 2),
              linear_key_head_dim=head_dim, linear_value_head_dim=head_dim,
              linear_num_key_heads=size["num_key_value_heads"],
              linear_num_value_heads=size["num_attention_heads"],
              rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2]
                               if head_dim == 16 else [2, 3, 3], "mrope_interleaved": True,
                               "rope_theta": 1e6, "partial_rotary_factor": 0.5},
              max_position_embeddings=512, bos_token_id=1, eos_token_id=2)
  config = transformers.Qwen3_5Config(
      text_config=text, vision_config=dict(depth=1, hidden_size=32, intermediate_size=64,
                                           num_heads=2, out_hidden_size=size["hidden_size"],
                                           num_position_embeddings=64),
      **_special_ids(size))
  return transformers.Qwen3_5ForConditionalGeneration(config)


FAMILIES = {"qwen2_5_vl": qwen2_5_vl, "qwen3_vl": qwen3_vl, "qwen3_5": qwen3_5}
CONTEXTS = (4096, 16384, 24576)


def decode_at_context(model, context: int, batch: int = 1, new: int = 32,
                      cache_dtype=jnp.bfloat16, repeats: int = 3, capacity: int | None = None,
                      block: int | None = None) -> float:
  """Seconds for `new` greedy decode steps after a cache that holds `context` valid slots
  (their content does not change the work) in a cache of `capacity` slots (default: context
  + new); `block`: `attention.DECODE_BLOCK` for this program (0: every slot read each step;
  default: the library's)."""
  from jaxspatial.models.sampler import DecodeState, decode  # pylint: disable=import-outside-toplevel
  hidden, vocab = model.config.text.hidden_size, model.config.text.vocab_size
  capacity = capacity or context + new

  @jax.jit
  def run(model, key):
    state = DecodeState(
        cache=model.language_model.init_cache(batch, capacity, cache_dtype),
        valid=jnp.broadcast_to(jnp.arange(capacity) < context, (batch, capacity)),
        next_slot=jnp.asarray(context, jnp.int32),
        next_position=jnp.full((batch,), context, jnp.int32),
        last_hidden=jnp.zeros((batch, hidden), jnp.float32),
        last_token=jnp.zeros((batch,), jnp.int32))
    return decode(model, state, jnp.zeros((batch, vocab), jnp.float32), key,
                  SamplingConfig(max_new_tokens=new)).tokens

  attention = importlib.import_module("jaxspatial.models.attention")
  default = attention.DECODE_BLOCK
  attention.DECODE_BLOCK = default if block is None else block  # read when `run` traces
  try:
    return best(lambda: jax.block_until_ready(run(model, jax.random.key(0))), repeats)
  finally:
    attention.DECODE_BLOCK = default


def context_rows(models: dict, contexts=CONTEXTS, batch: int = 1, new: int = 32,
                 cache_dtype=jnp.bfloat16, repeats: int = 3) -> list[dict]:
  """Per model and context: decode tokens per second and the cache bytes of one episode."""
  from jaxspatial.models import memory  # pylint: disable=import-outside-toplevel
  rows = []
  for name, model in models.items():
    for context in contexts:
      seconds = decode_at_context(model, context, batch, new, cache_dtype, repeats)
      rows.append(dict(model=name, context=context, decode_tok_s=batch * new / seconds,
                       cache_bytes=memory.cache_bytes(model, 1, context + new, cache_dtype)))
  return rows


def print_context_rows(rows: list[dict]) -> None:
  from jaxspatial.models import memory  # pylint: disable=import-outside-toplevel
  print(f"{'model':<28}{'context':>9}{'decode tok/s':>14}{'cache / episode':>17}"
        f"{'vs KV cache':>13}")
  print("-" * 81)
  base = {r["context"]: r for r in rows if r["model"].startswith("qwen2_5_vl")}
  for r in rows:
    kv = base.get(r["context"])
    versus = (f"{r['decode_tok_s'] / kv['decode_tok_s']:.2f}x, "
              f"{r['cache_bytes'] / kv['cache_bytes']:.2f}" if kv and kv is not r else "")
    print(f"{r['model']:<28}{r['context']:>9}{r['decode_tok_s']:>14.0f}"
          f"{memory.size(r['cache_bytes']):>17}{versus:>13}")
  print("(vs KV cache: decode speed-up, cache-size ratio against Qwen2.5-VL at that context)")


def tiny_long_context_models() -> dict:
  """A Qwen2.5-VL and a Qwen3.5 of one shape: 4 layers, hidden 64, 4 heads (2 KV)."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  from jaxspatial.models.qwen2_5_vl import Qwen25VL, Qwen25VLConfig  # pylint: disable=import-outside-toplevel
  from jaxspatial.models.qwen3_5 import Qwen35, Qwen35Config  # pylint: disable=import-outside-toplevel
  kv = Qwen25VLConfig.tiny(256)
  kv = dataclasses.replace(kv, text=dataclasses.replace(kv.text, num_hidden_layers=4))
  return {"qwen2_5_vl tiny (4 KV)": Qwen25VL(kv, rngs=nnx.Rngs(0)),
          "qwen3_5 tiny (3 DeltaNet+1)": Qwen35(Qwen35Config.tiny(256), rngs=nnx.Rngs(0))}


def best(fn, repeats=3):
  fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return min(times)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
  parser.add_argument("--families", nargs="*", default=list(FAMILIES), choices=list(FAMILIES))
  parser.add_argument("--contexts", type=int, nargs="*", default=list(CONTEXTS))
  args = parser.parse_args(argv)
  torch.set_num_threads(2)
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}; torch {torch.__version__} CPU, "
        f"{torch.get_num_threads()} threads; prompt {PROMPT}, {NEW} new tokens, greedy\n")
  print(f"{'family':<12}{'model':<7}{'batch':>6}{'impl':>14}{'prefill tok/s':>15}"
        f"{'decode tok/s':>14}{'generate s':>12}{'speed-up':>10}")
  print("-" * 90)
  runs_of = [(family, name, size) for family in args.families for name, size in SIZES.items()]
  for family, name, size in runs_of:
    torch.manual_seed(0)
    reference = FAMILIES[family](size).eval()
    with tempfile.TemporaryDirectory() as folder:
      reference.save_pretrained(folder)
      ours = load_model(folder)  # the family from config.json's model_type
    params = sum(p.numel() for p in reference.model.language_model.parameters())
    for batch in args.batches:
      ids = np.random.default_rng(batch).integers(3, size["vocab_size"] - 10, (batch, PROMPT))
      mask = np.ones_like(ids)
      t_ids, t_mask = torch.from_numpy(ids), torch.from_numpy(mask)

      def hf(n):
        with torch.no_grad():
          reference.generate(input_ids=t_ids, attention_mask=t_mask, max_new_tokens=n,
                             min_new_tokens=n, do_sample=False, pad_token_id=0,
                             mm_token_type_ids=torch.zeros_like(t_ids))

      # jax.jit over the module as a pytree: like the engine's programs, no nnx.jit graph walk
      # per call (it would be timed as sampling)
      runs = {n: jax.jit(lambda m, i, a, k, n=n: generate(
          m, i, a, k, SamplingConfig(max_new_tokens=n))) for n in (1, NEW)}
      j_ids, j_mask = jnp.asarray(ids), jnp.asarray(mask)
      ours_run = lambda n: jax.block_until_ready(runs[n](ours, j_ids, j_mask, jax.random.key(0)))
      rows = {}
      for impl, fn in (("transformers", hf), ("jaxspatial", ours_run)):
        prefill = best(lambda: fn(1))
        total = best(lambda: fn(NEW))
        decode = total - prefill
        rows[impl] = (batch * PROMPT / prefill,
                      f"{batch * (NEW - 1) / decode:.0f}" if decode > 0.05 * total else "-",
                      total)
      for impl, (prefill_rate, decode_rate, total) in rows.items():
        speedup = rows["transformers"][2] / total
        print(f"{family:<12}{name:<7}{batch:>6}{impl:>14}{prefill_rate:>15.0f}"
              f"{decode_rate:>14}{total:>12.3f}{speedup:>9.1f}x")
    print(f"({family} {name}: {params:,} text parameters)\n")
  if args.contexts:
    print(f"Decode at long context: {32} greedy steps after the context, batch 1, bf16 cache")
    print_context_rows(context_rows(tiny_long_context_models(), args.contexts))


if __name__ == "__main__":
  main()
