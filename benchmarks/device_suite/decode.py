"""The decode part: Act3D's policy family at long context (Qwen3.5-9B's hybrid decoder
against Qwen2.5-VL-7B's KV decoder), only the rows that fit the budget."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from benchmarks.device_suite.core import Clock, Report, Sizes, log
from jaxspatial.models import memory, shapes
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL


def zeros_policy(cls, config):
  """A bf16 policy of `config` with every parameter zero, made on the device without a
  random initialisation (a decode step's work does not depend on the values)."""
  shapes = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0), dtype=jnp.bfloat16,
                                      param_dtype=jnp.bfloat16, attention="auto"))
  graphdef, state = nnx.split(shapes)
  return nnx.merge(graphdef, jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), state))


def paper_decode_policies() -> dict:
  """Builders of Qwen3.5-9B's and Qwen2.5-VL-7B's text decoders (a one-block vision tower:
  decode never runs it)."""
  from jaxspatial.models.qwen3_5 import Qwen35  # pylint: disable=import-outside-toplevel
  from jaxspatial.models.qwen2_5_vl.config import VisionConfig  # pylint: disable=import-outside-toplevel
  from jaxspatial.models.qwen3_vl.config import VisionConfig as Qwen3VisionConfig  # pylint: disable=import-outside-toplevel
  hybrid = shapes.published_config("Qwen3.5-9B")
  hybrid = dataclasses.replace(hybrid, vision=Qwen3VisionConfig(
      depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
      out_hidden_size=hybrid.text.hidden_size, deepstack_visual_indexes=()))
  kv = shapes.published_config("Qwen2.5-VL-7B")
  kv = dataclasses.replace(kv, vision=VisionConfig(
      depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
      out_hidden_size=kv.text.hidden_size, fullatt_block_indexes=(0,)))
  return {"qwen2_5_vl 7B (28 KV)": lambda: zeros_policy(Qwen25VL, kv),
          "qwen3_5 9B (24 DeltaNet+8)": lambda: zeros_policy(Qwen35, hybrid)}


def decode_part(entry: dict, sizes: Sizes, clock: Clock, report: Report) -> None:
  from benchmarks import sampler_bench  # pylint: disable=import-outside-toplevel
  if sizes.decode_policy == "tiny":
    builders = {name: (lambda m=m: m)
                for name, m in sampler_bench.tiny_long_context_models().items()}
  else:
    builders = paper_decode_policies()
  rows = entry.setdefault("rows", [])
  for name, build in builders.items():
    if clock.left() < sizes.decode_row_s:
      entry.setdefault("skipped", []).append(f"{name}: out of budget")
      continue
    model = build()
    for context in sizes.decode_contexts:
      if clock.left() < sizes.decode_row_s:
        entry.setdefault("skipped", []).append(f"{name} at {context}: out of budget")
        continue
      seconds = sampler_bench.decode_at_context(model, context, repeats=sizes.decode_repeats)
      rows.append(dict(model=name, context=context, decode_tok_s=32 / seconds,
                       cache_bytes=memory.cache_bytes(model, 1, context + 32, jnp.bfloat16)))
      log(clock, f"decode: {name} at {context}: {32 / seconds:.0f} tok/s")
      report.save()
    del model
