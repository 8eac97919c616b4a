"""The prefill memory estimate against XLA's own accounting of the compiled prefill program
(its temporary and output buffers): never below it, at most three times above it, for
prompts of 256 and 1,536 tokens and one with an image, on a tiny Qwen2.5-VL and a
Qwen3.5 (hybrid: four attention maps in one of its layers only). A scheduler with a budget
refuses, at submit, a prompt whose prefill would pass it, naming both."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspatial.rollout import tiny
from jaxspatial.serving import Engine, Prompt, Scheduler
from jaxspatial.serving import memory
from jaxspatial.serving import slots as slot_programs
from jaxspatial.serving.scheduler import _right_padded


def _xla_bytes(engine, length, image=None):
  """Temporary + output bytes XLA assigns to prefilling `length` tokens into one row."""
  graphdef, params = engine.split
  model = engine.model
  state = jax.eval_shape(lambda: slot_programs.init_slots(graphdef, params, 1, length, "float32"))
  ids, mask, real = _right_padded(np.arange(10, 10 + length - 3, dtype=np.int32), length, 0)
  vision = sequence = None
  if image is not None:
    grid = model.image_grid(image.shape[:2])
    count = model.image_tokens(image.shape[:2])
    ids = ids.at[0, 2:2 + count].set(model.config.image_token_id)
    vision = slot_programs.encode_image(graphdef, params, engine.pixel_values([image]), grid)
    sequence = jnp.asarray([[grid]], jnp.int32)
  compiled = slot_programs.prefill_into.lower(
      graphdef, params, state, jnp.int32(0), ids, mask, real, vision, sequence,
      jax.random.PRNGKey(0), "float32").compile()
  analysis = compiled.memory_analysis()
  return analysis.temp_size_in_bytes + analysis.output_size_in_bytes - analysis.alias_size_in_bytes


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_5"])
def test_the_prefill_estimate_bounds_xlas_accounting(family):
  tok = tiny.tokenizer()
  engine = Engine(tiny.model(tok, family, seed=0), tok, stop_ids=())
  image = np.random.default_rng(0).integers(0, 256, (112, 140, 3), np.uint8)
  for length, picture in ((256, None), (1536, None), (256, image)):
    xla = _xla_bytes(engine, length, picture)
    patches = () if picture is None else (memory.image_patches(engine.model, image.shape),)
    estimate = memory.prefill_bytes(engine.model, length, patches)
    assert xla <= estimate <= 3 * xla, (family, length, picture is not None, xla, estimate)


def test_a_prompt_past_the_budget_is_refused_at_submit():
  tok = tiny.tokenizer()
  engine = Engine(tiny.model(tok, "qwen2_5_vl", seed=0), tok, stop_ids=())
  budget = memory.prefill_bytes(engine.model, 512)
  scheduler = Scheduler(engine, slots=1, capacity=4096, memory_budget=budget)
  try:
    fits = Prompt(np.arange(10, 400, dtype=np.int32), ())
    assert scheduler.generate(fits, 2).completion_tokens == 2
    over = Prompt(np.arange(10, 1500, dtype=np.int32) % 600 + 10, ())
    with pytest.raises(ValueError, match=r"1490 tokens \(prefilled as 2048\) and 0 images need "
                                         r"about [\d.]+ GB to prefill, over this server's "
                                         r"prefill memory budget of [\d.]+ GB"):
      scheduler.submit(over, 2)
    assert scheduler.stats()["requests"] == 1
  finally:
    scheduler.close()
