"""Engine and PrefixCache survive a failed run: an allocation the device cannot make
(RESOURCE_EXHAUSTED at run time, the 12k-token prompt's failure) leaves the model intact, and
the next normal request gets the tokens it got before (with nnx.jit the failed run wrote
its error into every parameter and each later request failed)."""

import jax
import numpy as np
import pytest

from jaxspatial.models import chat as chat_lib
from jaxspatial.rollout import tiny
from jaxspatial.serving import Engine, PrefixCache, PromptBuilder, Sampling, parse_request
from tests import chat_templates

HUGE = 1 << 28  # new tokens: a KV cache of hundreds of GB


@pytest.fixture(scope="module")
def served():
  tok = tiny.tokenizer()
  tok.chat_template = chat_templates.INSTRUCT
  model = tiny.model(tok, "qwen2_5_vl", seed=3)
  chat = chat_lib.chat_format("instruct", None, tok)
  engine = Engine(model, tok, (tok.convert_tokens_to_ids("<|im_end|>"),), batch_buckets=(1,))
  builder = PromptBuilder(tok, model, chat)
  prompt = builder.build(parse_request({"model": "m", "messages": [
      {"role": "user", "content": "Where is the red chair?"}]}))
  return engine, prompt


def test_engine_serves_on_after_an_allocation_failure(served):
  engine, prompt = served
  before, _ = engine.generate([prompt], 8, Sampling(), jax.random.PRNGKey(0))
  with pytest.raises(Exception, match="RESOURCE_EXHAUSTED|Out of memory"):
    engine.generate([prompt], HUGE, Sampling(), jax.random.PRNGKey(0))
  after, _ = engine.generate([prompt], 8, Sampling(), jax.random.PRNGKey(0))
  np.testing.assert_array_equal(after, before)
  leaves = jax.tree.leaves(engine.split[1])
  assert all(np.isfinite(np.asarray(leaf, np.float32)).all() for leaf in leaves
             if np.issubdtype(np.asarray(leaf).dtype, np.floating))


def test_prefix_cache_serves_on_after_an_allocation_failure(served):
  engine, prompt = served
  cache = PrefixCache(engine)
  before = cache.generate(prompt, 8, Sampling(), jax.random.PRNGKey(0))
  with pytest.raises(Exception, match="RESOURCE_EXHAUSTED|Out of memory"):
    PrefixCache(engine).generate(prompt, HUGE, Sampling(), jax.random.PRNGKey(0))
  after = PrefixCache(engine).generate(prompt, 8, Sampling(), jax.random.PRNGKey(0))
  np.testing.assert_array_equal(after, before)
