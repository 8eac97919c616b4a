"""The continuous-batching scheduler against `sampler.generate` over each whole prompt
(greedy; tiny policies of the three families): requests of mixed lengths, images and budgets
share two slots and refill them as they free; conversations' next turns reuse their slots
(from the end of the reply, or from the end of the previous prompt when the history
rewrote the reply) while other requests run beside them; sampling settings are data; a
cancelled request frees its slot; a failing stream consumer ends its request alone."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspatial.agents.backends import openai_messages
from jaxspatial.models import chat as chat_lib
from jaxspatial.models.sampler import SamplingConfig, generate
from jaxspatial.rollout import tiny
from jaxspatial.serving import Engine, Prompt, PromptBuilder, Sampling, Scheduler, parse_request
from jaxspatial.serving import slots as slot_programs
from tests import chat_templates

BUDGET = 16


def _policy(family):
  tok = tiny.tokenizer()
  tok.chat_template = chat_templates.INSTRUCT
  model = tiny.model(tok, family, seed=3)
  chat = chat_lib.chat_format("instruct", None, tok)
  engine = Engine(model, tok, (tok.convert_tokens_to_ids("<|im_end|>"),), batch_buckets=(1,))
  return engine, PromptBuilder(tok, model, chat, max_images=8)


@pytest.fixture(scope="module")
def policy():
  return _policy("qwen2_5_vl")


@nnx.jit(static_argnames=("config", "grids"))
def _whole(model, ids, mask, key, config, pixels, grids, sequence_grids):
  return generate(model, ids, mask, key, config, pixels, grids, sequence_grids).tokens


def _reference(engine, prompt, budget=BUDGET):
  """The greedy reply to the whole prompt through the sampler at batch 1 (left-padded to a
  power of two, so prompts share programs)."""
  model = engine.model
  grids = tuple(model.image_grid(image.shape[:2]) for image in prompt.images)
  pixels = engine.pixel_values(prompt.images) if grids else None
  sequence = jnp.asarray([grids], jnp.int32) if grids else None
  config = SamplingConfig(max_new_tokens=max(BUDGET, 1 << (budget - 1).bit_length()),
                          stop_tokens=engine.stop_ids,
                          pad_token=engine.pad_id)
  length = 1 << max(6, (len(prompt.ids) - 1).bit_length())
  ids = np.full((1, length), engine.pad_id, np.int32)
  ids[0, length - len(prompt.ids):] = prompt.ids
  tokens = _whole(model, jnp.asarray(ids), jnp.asarray(ids != engine.pad_id) | (
      np.arange(length) >= length - len(prompt.ids))[None], jax.random.PRNGKey(0), config,
                  pixels, grids, sequence)
  return engine.reply(np.asarray(tokens)[0], len(prompt.ids), budget)


def _prompt(builder, messages):
  return builder.build(parse_request({"model": "m", "messages": openai_messages(messages)}))


def _image(seed, size=(28, 42)):
  return np.random.default_rng(seed).integers(0, 256, size + (3,), dtype=np.uint8)


def _mixed(builder):
  rng = np.random.default_rng(0)
  prompts = []
  for i in range(5):
    text = " ".join(f"word{rng.integers(100)}" for _ in range(3 + 12 * i))
    content = ([{"type": "image", "image": _image(i)}, {"type": "text", "text": text}]
               if i % 2 else text)
    prompts.append(_prompt(builder, [{"role": "user", "content": content}]))
  return prompts


# Qwen3.5's hybrid cache runs in the conversation test (restores included); here slow-tests.
@pytest.mark.parametrize("family", ["qwen2_5_vl",
                                    pytest.param("qwen3_vl", marks=pytest.mark.slow),
                                    pytest.param("qwen3_5", marks=pytest.mark.slow)])
def test_continuous_replies_equal_whole_prompt_generation(family, policy):
  engine, builder = policy if family == "qwen2_5_vl" else _policy(family)
  prompts = _mixed(builder)
  budgets = [BUDGET, 3, 11, 7, BUDGET]
  scheduler = Scheduler(engine, slots=2, capacity=512, steps=4)
  try:
    futures = [scheduler.submit(p, b) for p, b in zip(prompts, budgets)]
    replies = [f.result(timeout=600) for f in futures]
    stats = scheduler.stats()
  finally:
    scheduler.close()
  for prompt, budget, reply in zip(prompts, budgets, replies):
    assert reply == _reference(engine, prompt, budget)
  assert stats["completed"] == 5 and stats["prefills"] == 5 and stats["running"] == 0
  # Two rows stepped together: more row steps than one row per decode call could take.
  assert stats["decode_steps"] > 4 * stats["decode_calls"] - 8


def _conversation(scheduler, engine, builder, seed, rewrite, out):
  history = [{"role": "system", "content": f"You write code about room {seed}."},
             {"role": "user", "content": [{"type": "image", "image": _image(seed)},
                                          {"type": "text", "text": "Which chair is closer?"}]}]
  turns = [[{"type": "text", "text": "Step 1 ran: 3 chairs."},
            {"type": "image", "image": _image(seed + 1)}]]
  for turn in [None] + turns:
    if turn is not None:
      history.append({"role": "user", "content": turn})
    prompt = _prompt(builder, history)
    reply = scheduler.submit(prompt, BUDGET).result(timeout=600)
    out.append((prompt, reply))
    # `rewrite`: the history keeps another reply than the one generated (a condensed step),
    # so the next turn restores the slot to this prompt's end.
    history.append({"role": "assistant", "content": "ok." if rewrite else reply.text})


def _replay_exactly(scheduler, prompt, reply_ids, out):
  """A turn whose prompt repeats the previous reply token for token: appended after it."""
  first = scheduler.submit(prompt, BUDGET).result(timeout=600)
  out.append((prompt, first))
  follow = Prompt(np.concatenate([prompt.ids, reply_ids(prompt, first), prompt.ids[-6:]]),
                  prompt.images)
  out.append((follow, scheduler.submit(follow, BUDGET).result(timeout=600)))


# Qwen3.5 holds both cache kinds (attention layers restored by validity, delta-rule layers
# from the snapshot); Qwen2.5-VL's run is in slow-tests.
@pytest.mark.parametrize("family", [pytest.param("qwen2_5_vl", marks=pytest.mark.slow),
                                    "qwen3_5"])
def test_conversations_reuse_their_slots_while_batched(family, policy):
  """Two conversations (one keeping its replies, one rewriting them) and a turn that
  repeats its reply's tokens run at once on three slots; every turn equals the whole
  prompt's generation and every later turn appended to its slot."""
  engine, builder = policy if family == "qwen2_5_vl" else _policy(family)
  scheduler = Scheduler(engine, slots=3, capacity=1024, steps=4)
  results = [[], [], []]
  generated = {}

  def reply_ids(prompt, reply):  # pylint: disable=unused-argument
    return generated[prompt.ids.tobytes()]

  solo = _prompt(builder, [{"role": "user", "content": "Name three colours of chairs."}])
  original = scheduler.submit
  def recording(prompt, max_tokens, *args, **kwargs):  # the tokens each reply wrote
    future = original(prompt, max_tokens, *args,
                      on_tokens=lambda ids, *_: generated.setdefault(prompt.ids.tobytes(),
                                                                    []).extend(ids), **kwargs)
    return future
  scheduler.submit = recording
  try:
    threads = [threading.Thread(target=_conversation,
                                args=(scheduler, engine, builder, 10, False, results[0])),
               threading.Thread(target=_conversation,
                                args=(scheduler, engine, builder, 20, True, results[1])),
               threading.Thread(target=_replay_exactly,
                                args=(scheduler, solo,
                                      lambda p, r: np.asarray(reply_ids(p, r), np.int32),
                                      results[2]))]
    for thread in threads:
      thread.start()
    for thread in threads:
      thread.join(timeout=900)
    stats = scheduler.stats()
  finally:
    scheduler.close()
  assert [len(r) for r in results] == [2, 2, 2]
  for prompt, reply in sum(results, []):
    assert reply == _reference(engine, prompt)
  assert stats["prefills"] == 3 and stats["appends"] == 3
  # Each appended turn ran only its new tokens: every earlier prompt token was reused.
  total = sum(len(p.ids) for p, _ in sum(results, []))
  assert stats["prefilled_tokens"] + stats["reused_tokens"] == total
  assert stats["reused_tokens"] >= sum(len(r[0][0].ids) for r in results)


def _compiled():
  """Programs compiled so far, the serving programs' caches summed."""
  return sum(program._cache_size() for program in (  # pylint: disable=protected-access
      slot_programs.decode_steps, slot_programs.prefill_into, slot_programs.encode_image,
      slot_programs.write_tokens))


def test_sampling_settings_and_image_sizes_are_data_and_a_cancel_frees_its_slot(policy):
  engine, builder = policy
  prompt = _mixed(builder)[0]
  sizes = [(56, 56), (56, 112), (112, 56), (112, 112), (84, 140)]
  pictures = [_prompt(builder, [{"role": "user", "content": [
      {"type": "image", "image": _image(k, size)}, {"type": "text", "text": "Which?"}]}])
              for k, size in enumerate(sizes)]
  assert len({p.images[0].shape for p in pictures}) == 5
  scheduler = Scheduler(engine, slots=2, capacity=256, steps=2)
  try:
    for picture in pictures:  # warm-up: each image size's encoder, the prefill, the decode
      scheduler.generate(picture, 2)
    scheduler.generate(prompt, 2)
    compiled = _compiled()
    settings = [Sampling(t, p, k) for t in (0.0, 0.5, 1.3) for p in (1.0, 0.9)
                for k in (0, 1, 7, 50)]
    futures = [scheduler.submit(pictures[i % 5], 2 + i % 3, s, seed=i)
               for i, s in enumerate(settings)]
    assert len(settings) == 24
    for future in futures:
      assert future.result(timeout=600).completion_tokens >= 1
    assert _compiled() == compiled, scheduler.stats()["program_list"]
    # A seeded request draws the same tokens whatever runs beside it.
    hot = Sampling(1.0)
    alone = scheduler.generate(prompt, 12, hot, seed=7)
    crowd = [scheduler.submit(prompt, 12, hot, seed=s) for s in (1, 7, 2)]
    assert crowd[1].result(timeout=600) == alone
    for future in crowd:
      future.result(timeout=600)
    # A long request, cancelled while it runs, gives its slot back at once.
    started = threading.Event()
    long = scheduler.submit(prompt, 200, on_tokens=lambda *_: started.set())
    assert started.wait(600)
    assert scheduler.stats()["running"] == 1
    assert long.cancel()
    assert scheduler.generate(prompt, 3).completion_tokens == 3
    stats = scheduler.stats()
    assert stats["running"] == 0 and stats["cancelled"] == 1
    assert stats["decode_steps"] < 200 + 24 * 4 + 4 * 12 + 20
    # A stream consumer that fails ends its own request; the one beside it completes.
    def broken(*_):
      raise BrokenPipeError("the client went away")
    bad = scheduler.submit(prompt, 20, on_tokens=broken)
    good = scheduler.submit(prompt, 20)
    with pytest.raises(BrokenPipeError):
      bad.result(timeout=600)
    assert good.result(timeout=600) == _reference(engine, prompt, 20)
  finally:
    scheduler.close()


def test_a_prompt_past_the_slot_capacity_is_refused_up_front(policy):
  engine, builder = policy
  scheduler = Scheduler(engine, slots=1, capacity=64)
  try:
    prompt = _mixed(builder)[4]
    with pytest.raises(ValueError, match=r"exceed a slot's capacity of 64 tokens"):
      scheduler.submit(prompt, 8)
  finally:
    scheduler.close()
