"""PrefixCache: a growing conversation (images in its first and third turns) appends each
request's new tokens to the cache its previous prompt left, and every reply equals
`sampler.generate` over the whole prompt (greedy; tiny Qwen2.5-VL, Qwen3-VL and Qwen3.5
policies); a history rewritten before its end, an image changed under the same tokens, and
a full cache are prefilled whole and still equal it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspatial.agents.backends import openai_messages
from jaxspatial.models import chat as chat_lib
from jaxspatial.models.sampler import SamplingConfig, generate
from jaxspatial.rollout import tiny
from jaxspatial.serving import Engine, PrefixCache, PromptBuilder, Sampling, parse_request
from tests import chat_templates

BUDGET = 16


def _policy(family):
  tok = tiny.tokenizer()
  tok.chat_template = chat_templates.INSTRUCT
  model = tiny.model(tok, family, seed=3)
  chat = chat_lib.chat_format("instruct", None, tok)
  stops = (tok.convert_tokens_to_ids("<|im_end|>"),)
  engine = Engine(model, tok, stops, batch_buckets=(1,))
  return tok, model, engine, PromptBuilder(tok, model, chat, max_images=8)


@pytest.fixture(scope="module")
def policy():
  return _policy("qwen2_5_vl")


@nnx.jit(static_argnames=("config", "grids"))
def _whole(model, ids, key, config, pixels, grids, sequence_grids):
  return generate(model, ids, jnp.ones_like(ids, bool), key, config, pixels, grids,
                  sequence_grids).tokens


def _reference(engine, prompt):
  """Greedy tokens of the whole prompt through the sampler (no cache kept)."""
  model = engine.model
  grids = tuple(model.image_grid(image.shape[:2]) for image in prompt.images)
  pixels = engine.pixel_values(prompt.images) if grids else None
  sequence = jnp.asarray([grids], jnp.int32) if grids else None
  config = SamplingConfig(max_new_tokens=BUDGET, stop_tokens=engine.stop_ids,
                          pad_token=engine.pad_id)
  return np.asarray(_whole(model, jnp.asarray(prompt.ids)[None], jax.random.PRNGKey(0), config,
                           pixels, grids, sequence))[0]


def _prompt(builder, messages):
  return builder.build(parse_request({"model": "m", "messages": openai_messages(messages)}))


def _image(seed):
  return np.random.default_rng(seed).integers(0, 256, (28, 42, 3), dtype=np.uint8)


def _reply_text(engine, tokens):
  return engine.reply(tokens, 0, BUDGET).text


def test_a_growing_conversation_appends_and_equals_whole_prompts(policy):
  _conversation(*policy[2:])


# Qwen3-VL's append path is Qwen2.5-VL's attention with its own rope (tests/models covers
# it): slow-tests; Qwen3.5's delta-rule cache stays in the suite.
@pytest.mark.parametrize("family", [pytest.param("qwen3_vl", marks=pytest.mark.slow),
                                    "qwen3_5"])
def test_other_families_append_as_whole_prompts(family):
  """DeepStack (Qwen3-VL) and the hybrid cache (Qwen3.5: linear layers skip the padding
  the next segment writes over)."""
  _conversation(*_policy(family)[2:])


def _conversation(engine, builder):
  cache = PrefixCache(engine, entries=2, min_capacity=256)
  greedy, key = Sampling(), jax.random.PRNGKey(1)
  history = [{"role": "system", "content": "You write code about a room."},
             {"role": "user", "content": [{"type": "image", "image": _image(0)},
                                          {"type": "text", "text": "Which chair is closer?"}]}]
  lengths = []
  turns = [[{"type": "text", "text": "Step 1 ran: 3 chairs."},
            {"type": "image", "image": _image(1)}],
           "Step 2 ran without output."]
  for turn in [None] + turns:
    if turn is not None:
      history.append({"role": "user", "content": turn})
    prompt = _prompt(builder, history)
    tokens = cache.generate(prompt, BUDGET, greedy, key)
    np.testing.assert_array_equal(tokens, _reference(engine, prompt))
    lengths.append(len(prompt.ids))
    history.append({"role": "assistant", "content": _reply_text(engine, tokens)})
  stats = cache.stats()
  assert stats["requests"] == 3 and stats["hits"] == 2
  assert stats["reused_tokens"] == lengths[0] + lengths[1]
  assert stats["prefilled_tokens"] == lengths[2]  # every prompt token ran exactly once
  assert stats["entries"] == 1  # each step's entry replaced the one it extended


def test_rewritten_history_changed_image_and_full_cache_prefill_whole(policy):
  _, _, engine, builder = policy
  cache = PrefixCache(engine, entries=4, growth=1.0, min_capacity=1)
  greedy, key = Sampling(), jax.random.PRNGKey(1)
  first = [{"role": "user", "content": [{"type": "image", "image": _image(0)},
                                        {"type": "text", "text": "Count the lamps."}]}]
  base = _prompt(builder, first)
  cache.generate(base, BUDGET, greedy, key)
  # Rewritten before its end (a condensed step): no entry is a prefix.
  rewritten = [{"role": "user", "content": [{"type": "image", "image": _image(0)},
                                            {"type": "text", "text": "Count the beds."}]},
               {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
  # The same tokens as an extension of `first`, but another picture in the first image.
  swapped = [{"role": "user", "content": [{"type": "image", "image": _image(5)},
                                          {"type": "text", "text": "Count the lamps."}]},
             {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
  for messages in (rewritten, swapped):
    prompt = _prompt(builder, messages)
    np.testing.assert_array_equal(cache.generate(prompt, BUDGET, greedy, key),
                                  _reference(engine, prompt))
  assert cache.stats()["hits"] == 0
  # growth 1: `base`'s cache has room for at most its own length again; an extension
  # longer than that misses too.
  extended = _prompt(builder, first + [{"role": "assistant", "content": "ok"},
                                       {"role": "user", "content": "more " * 300}])
  np.testing.assert_array_equal(cache.generate(extended, BUDGET, greedy, key),
                                _reference(engine, extended))
  assert cache.stats()["hits"] == 0 and cache.stats()["entries"] == 4
