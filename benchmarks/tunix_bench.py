"""Our jitted sampler against Tunix 0.1.7's `Sampler` on the same Qwen3 weights: greedy
tokens asserted identical, then milliseconds per whole call, interleaved repetitions, medians.

    make tunix-bench   # builds .venv-tunix (this repository + google-tunix==0.1.7), runs this
    .venv-tunix/bin/python -m benchmarks.tunix_bench [--size small] [--batches 1 8 32] [--pairs 7]

Without Tunix installed it prints one line and exits 0. The model: sampler_bench's Qwen3-VL
at `--size` (text-only prompts), written by transformers' save_pretrained and read by
`load_model`. Tunix's Qwen3 loader maps Qwen3ForCausalLM key names (`model.layers.*`), not
Qwen3-VL's (`model.language_model.layers.*`), so the same tensors are written again as a
Qwen3ForCausalLM folder, vision tower left out: interleaved M-RoPE on text-only positions is
plain 1-D RoPE, which the identical tokens check. Tunix's Qwen3 applies RoPE at theta 1e6
whatever its config says, so the model must use 1e6 (sampler_bench's does).

Prompts of 64 random tokens, 32 new tokens, greedy, no stop token, a float32 cache of prompt
+ new slots on both sides. Both calls go from host token ids to host tokens: Tunix's
`Sampler.__call__` with a tokenizer that passes ids through (no text work on either side);
ours is `generate` under jax.jit with the module as a pytree, as sampler_bench times it.
Timing: one warm-up call each (compilation), then ours and Tunix alternately `--pairs` times.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy
import transformers

from jaxspatial.models import load_model
from jaxspatial.models.sampler import SamplingConfig, generate

SKIP = "tunix: not installed (make tunix-bench installs it in .venv-tunix); Tunix rows skipped"
# sampler_bench's SIZES (tiny: 90K text parameters, small: 5.3M) and a 27M one
MORE_SIZES = {
    "medium": dict(vocab_size=8192, hidden_size=512, intermediate_size=1408,
                   num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
                   mrope=[8, 12, 12]),
}


class IdTokenizer:
  """Tunix's tokenizer interface over prompts that are already token ids."""

  def encode(self, ids, **_):
    return list(ids)

  def decode(self, ids, **_):
    del ids
    return ""

  def bos_id(self):
    return None  # Tunix prepends no BOS

  def eos_id(self):
    return -1  # no stop token, as SamplingConfig's default

  def pad_id(self):
    return 0  # the prompts' ids start at 3


def write_qwen3(vl_folder: str, text, folder: str) -> None:
  """The Qwen3-VL folder's decoder and LM head as a Qwen3ForCausalLM folder (Tunix's key
  names), tensors unchanged."""
  prefix = "model.language_model."
  tensors = safetensors.numpy.load_file(os.path.join(vl_folder, "model.safetensors"))
  renamed = {"model." + k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
  renamed["lm_head.weight"] = tensors["lm_head.weight"]
  safetensors.numpy.save_file(renamed, os.path.join(folder, "model.safetensors"),
                              metadata={"format": "pt"})
  transformers.Qwen3Config(
      vocab_size=text.vocab_size, hidden_size=text.hidden_size,
      intermediate_size=text.intermediate_size, num_hidden_layers=text.num_hidden_layers,
      num_attention_heads=text.num_attention_heads, num_key_value_heads=text.num_key_value_heads,
      head_dim=text.head_dim, rms_norm_eps=text.rms_norm_eps, tie_word_embeddings=False,
      rope_parameters={"rope_type": "default", "rope_theta": text.rope_parameters["rope_theta"]},
      architectures=["Qwen3ForCausalLM"]).save_pretrained(folder)


def tunix_sampler(folder: str, capacity: int):
  """Tunix's Sampler over its Qwen3 read from a Qwen3ForCausalLM folder."""
  from tunix.generate import sampler as tunix_sampling  # pylint: disable=import-outside-toplevel
  from tunix.models.qwen3 import model as qwen3, params  # pylint: disable=import-outside-toplevel
  hf = transformers.Qwen3Config.from_pretrained(folder)
  theta = hf.rope_parameters["rope_theta"]
  if theta != 1e6:
    raise ValueError(f"rope_theta {theta}: Tunix's Qwen3 applies RoPE at 1e6 only")
  config = qwen3.ModelConfig(
      num_layers=hf.num_hidden_layers, vocab_size=hf.vocab_size, embed_dim=hf.hidden_size,
      hidden_dim=hf.intermediate_size, num_heads=hf.num_attention_heads, head_dim=hf.head_dim,
      num_kv_heads=hf.num_key_value_heads, rope_theta=int(theta), norm_eps=hf.rms_norm_eps,
      use_tied_embedding=hf.tie_word_embeddings)
  model = params.create_model_from_safe_tensors(folder, config)
  return tunix_sampling.Sampler(model, IdTokenizer(), tunix_sampling.CacheConfig(
      cache_size=capacity, num_layers=hf.num_hidden_layers,
      num_kv_heads=hf.num_key_value_heads, head_dim=hf.head_dim))


def check_identical(ours: np.ndarray, theirs: np.ndarray, batch: int) -> None:
  """Raises naming the first row and position where the two samplers' tokens differ."""
  if ours.shape != theirs.shape:
    raise AssertionError(f"batch {batch}: ours {ours.shape} tokens, Tunix {theirs.shape}")
  rows, cols = np.nonzero(ours != theirs)
  if rows.size:
    r, c = rows[0], cols[0]
    raise AssertionError(
        f"batch {batch}: tokens differ first at row {r}, position {c}: ours {ours[r, c]}, "
        f"Tunix {theirs[r, c]} ({rows.size} of {ours.size} tokens differ)")


def interleaved(calls: dict, pairs: int) -> dict:
  """Median seconds per call: one warm-up each, then the calls in turn `pairs` times."""
  for call in calls.values():
    call()
  times = {name: [] for name in calls}
  for _ in range(pairs):
    for name, call in calls.items():
      start = time.perf_counter()
      call()
      times[name].append(time.perf_counter() - start)
  return {name: statistics.median(t) for name, t in times.items()}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", default="small", choices=["tiny", "small", *MORE_SIZES])
  parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
  parser.add_argument("--pairs", type=int, default=7)
  args = parser.parse_args(argv)
  if importlib.util.find_spec("tunix") is None:
    print(SKIP)
    return
  # only past the check: the skip line needs neither Tunix nor torch
  import tunix  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  from benchmarks import sampler_bench  # pylint: disable=import-outside-toplevel

  transformers.utils.logging.disable_progress_bar()  # save_pretrained's, between the tables
  size = {**sampler_bench.SIZES, **MORE_SIZES}[args.size]
  prompt, new = sampler_bench.PROMPT, sampler_bench.NEW
  torch.manual_seed(0)
  reference = sampler_bench.qwen3_vl(size).eval()
  params = sum(p.numel() for p in reference.model.language_model.parameters())
  with tempfile.TemporaryDirectory() as vl, tempfile.TemporaryDirectory() as text_only:
    reference.save_pretrained(vl)
    ours = load_model(vl)
    write_qwen3(vl, reference.config.text_config, text_only)
    theirs = tunix_sampler(text_only, prompt + new)
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}; tunix {tunix.__version__}; "
        f"Qwen3-VL {args.size} ({params:,} text parameters), prompt {prompt}, {new} new "
        f"tokens, greedy; medians of {args.pairs} interleaved pairs\n")
  print(f"{'batch':>6}{'ours ms':>10}{'tunix ms':>10}{'speed-up':>10}")
  print("-" * 36)
  run = jax.jit(lambda m, i, a, k: generate(m, i, a, k, SamplingConfig(max_new_tokens=new)))
  for batch in args.batches:
    ids = np.random.default_rng(batch).integers(3, size["vocab_size"] - 10, (batch, prompt))
    ours_call = lambda: np.asarray(run(ours, jnp.asarray(ids), jnp.ones(ids.shape, jnp.int32),
                                       jax.random.key(0)).tokens)
    tunix_call = lambda: np.stack(theirs(list(ids), max_generation_steps=new,
                                         max_prompt_length=prompt).tokens)
    check_identical(ours_call(), tunix_call(), batch)
    seconds = interleaved({"ours": ours_call, "tunix": tunix_call}, args.pairs)
    print(f"{batch:>6}{1e3 * seconds['ours']:>10.1f}{1e3 * seconds['tunix']:>10.1f}"
          f"{seconds['tunix'] / seconds['ours']:>9.2f}x")
  print("(whole calls, host token ids in, host tokens out; tokens identical at every batch)")


if __name__ == "__main__":
  main()
