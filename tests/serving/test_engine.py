"""The Engine survives a failed run: an allocation the device cannot make
(RESOURCE_EXHAUSTED at run time, the 12k-token prompt's failure) leaves the model intact, and
the next normal request gets the tokens it got before (with nnx.jit the failed run wrote
its error into every parameter and each later request failed)."""

import jax
import numpy as np
import pytest

from jaxspatial.models import chat as chat_lib
from jaxspatial.rollout import tiny
from jaxspatial.serving import Engine, PromptBuilder, Sampling, parse_request
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
  engine.builder = builder
  return engine, prompt


def test_an_in_process_request_is_the_data_url_request_without_the_detour(served):
  """`local_request` (images as arrays) builds the prompt the same messages with PNG data
  URLs build (PNG is lossless); an HTTP body naming a local image is refused."""
  from jaxspatial.agents.backends import openai_messages  # pylint: disable=import-outside-toplevel
  from jaxspatial.serving.protocol import APIError, local_request  # pylint: disable=import-outside-toplevel
  engine, _ = served
  rng = np.random.default_rng(0)
  views = [rng.integers(0, 256, (48, 64, 3), np.uint8), rng.integers(0, 256, (30, 30, 3),
                                                                        np.uint8)]
  messages = [{"role": "system", "content": "Answer briefly."},
              {"role": "user", "content": [{"type": "image", "image": views[0]},
                                           {"type": "text", "text": "and"},
                                           {"type": "image", "image": views[1]},
                                           {"type": "text", "text": "Which is brighter?"}]}]
  local = engine.builder.build(local_request("m", messages, max_tokens=4))
  remote = engine.builder.build(parse_request({"model": "m", "max_tokens": 4,
                                               "messages": openai_messages(messages)}))
  np.testing.assert_array_equal(local.ids, remote.ids)
  assert len(local.images) == 2
  for a, b in zip(local.images, remote.images):
    np.testing.assert_array_equal(a, b)
  forged = parse_request({"model": "m", "messages": [{"role": "user", "content": [
      {"type": "image_url", "image_url": {"url": "local-image:0"}}]}]})
  with pytest.raises(APIError, match="only base64 data URLs"):
    engine.builder.build(forged)


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


def test_row_sampling_equals_each_rows_own_sampling():
  """`sample_rows` with mixed per-row settings draws, row by row, what `sample_token` draws
  with that row's settings alone (same key, same batch shape)."""
  from jaxspatial.models.sampler import RowSampling, sample_rows, sample_token  # pylint: disable=import-outside-toplevel
  settings = [(0.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 5, 1.0), (0.9, 0, 0.8), (1.3, 40, 0.5),
              (0.5, 1, 1.0), (2.0, 250, 0.95), (0.0, 3, 0.2)]
  logits = jax.random.normal(jax.random.PRNGKey(1), (len(settings), 300)) * 3
  for step in range(5):
    key = jax.random.PRNGKey(step)
    rows = RowSampling.create(*zip(*settings))
    token, logp = sample_rows(logits, key, rows)
    for b, (t, k, p) in enumerate(settings):
      want, want_logp = sample_token(logits, key, t, k, p)
      assert int(token[b]) == int(want[b]), (step, settings[b])
      np.testing.assert_allclose(float(logp[b]), float(want_logp[b]), rtol=1e-5, atol=1e-6)


def test_sampling_settings_compile_nothing_new(served):
  """24 distinct (temperature, top_p, top_k) settings after a warm-up request: no new
  program (the engine's count and jit's own cache), and a greedy reply is unchanged."""
  from jaxspatial.serving import engine as engine_lib  # pylint: disable=import-outside-toplevel
  engine, prompt = served
  greedy, _ = engine.generate([prompt], 8, Sampling(), jax.random.PRNGKey(0))
  programs, compiled = len(engine.programs), engine_lib._generate._cache_size()  # pylint: disable=protected-access
  settings = [Sampling(t, p, k) for t in (0.3, 0.7, 1.0, 1.5) for p in (1.0, 0.9, 0.5)
              for k in (0, 20)]
  assert len(set(settings)) == 24
  for n, sampling in enumerate(settings):
    engine.generate([prompt], 8, sampling, jax.random.PRNGKey(n))
  assert len(engine.programs) == programs
  assert engine_lib._generate._cache_size() == compiled  # pylint: disable=protected-access
  again, _ = engine.generate([prompt], 8, Sampling(), jax.random.PRNGKey(0))
  np.testing.assert_array_equal(again, greedy)
