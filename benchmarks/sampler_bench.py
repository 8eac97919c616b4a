"""Prefill and decode tokens per second: the jitted sampler against transformers' PyTorch
`generate` on the same model and prompts, in one run, for each policy family.

    python -m benchmarks.sampler_bench [--batches 1 8 64] [--families qwen2_5_vl qwen3_vl]

Cost: about ten minutes on a 2-core CPU. Families: Qwen2.5-VL and Qwen3-VL (QK-norm,
interleaved M-RoPE); models: "tiny" (the tests' size) and "small" (5M text parameters),
the same text shapes in both families. Prompts of 64 tokens, 32 new tokens, greedy. Prefill is timed as
generating 1 token; "decode" is the 31 further tokens (total minus prefill), and the
"generate" column the whole 32-token call. The speed-up compares whole calls.
"""

from __future__ import annotations

import argparse
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


FAMILIES = {"qwen2_5_vl": qwen2_5_vl, "qwen3_vl": qwen3_vl}


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
  parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
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

      runs = {n: nnx.jit(lambda m, i, a, k, n=n: generate(
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


if __name__ == "__main__":
  main()
