"""A jaxspatial policy as the judge, inside the compiled program: its prompt is the host
judge's rendered prompt, its reply equals transformers' greedy reply on the same tokens,
its verdict is the host judge's rule (`judge_verdict`) on that reply, and an Act3D rollout
judged by it has no host callback and credits exactly those verdicts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from data_pipelines.synthetic import episodes
from jaxspatial import models
from jaxspatial.models import sampler
from jaxspatial.envs import act3d
from jaxspatial.models.qwen2_5_vl.tokenizer import save_processor
from jaxspatial.perception import judges
from jaxspatial.perception.judge import PROMPTS, decode_ids, judge_verdict, one_line
from jaxspatial.perception.policy_judge import (PolicyJudge, judge_byte_tables, render_chat,
                                                reply_bytes, reply_reading, reply_verdict)
from jaxspatial.rollout import agents, token_table as am, episode, observation, tiny
from tests import chat_templates, judge_policies

# Compile-heavy end to end: `make slow-tests` (not in `make test`).
pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

AGENT = agents.Act3DAgent(act3d.Act3DParams(width=56, height=56, grounding_min_pixels=5,
                                            max_interactions=1))


def _ids(texts, length):
  out = np.full((len(texts), length), -1, np.int32)
  for i, text in enumerate(texts):
    data = text.encode()[:length]
    out[i, :len(data)] = list(data)
  return out


@pytest.fixture(scope="module")
def judge_policy(tmp_path_factory):
  """A judge with its own tokenizer (CORRECT and INCORRECT single tokens) whose greedy
  first token is CORRECT or INCORRECT by the sign of one hidden unit: its verdicts vary
  with the case, so a judge wired to the wrong rows or a constant shows. Exported and
  loaded back as a user's checkpoint, and as transformers' model."""
  tok = judge_policies.judge_tokenizer()
  model = judge_policies.untied_policy(tok)
  correct, incorrect = (tok.convert_tokens_to_ids(t) for t in ("CORRECT", "INCORRECT"))
  # The hidden unit whose sign splits the tests' cases most evenly decides.
  probe = PolicyJudge.create(tok, model, "act3d", max_tokens=1)
  last_hidden = nnx.jit(lambda m, i, k: sampler.prefill(m, i, k, i.shape[1])[0].last_hidden)
  split = []
  for fields in (_fields(), _rollout_fields()):
    ids, mask, answerable = probe.prompt_ids(*map(jnp.asarray, fields))
    positive = np.asarray(last_hidden(model, ids, mask.astype(jnp.int32)))[
        np.asarray(answerable)] > 0
    split.append(np.minimum(positive.sum(0), (~positive).sum(0)))
  unit = int(np.argmax(np.minimum(*split)))
  text = model.language_model
  norm = np.zeros(text.norm.weight[...].shape, np.float32)
  norm[unit] = 1.0
  text.norm.weight[...] = jnp.asarray(norm)
  head = np.zeros(text.lm_head.kernel[...].shape, np.float32)  # [C, V]
  head[unit, correct], head[unit, incorrect] = 1.0, -1.0
  text.lm_head.kernel[...] = jnp.asarray(head)
  folder = tmp_path_factory.mktemp("judge_policy")
  models.export(model, folder)
  save_processor(folder, tok, model)
  processor, loaded = models.load_policy(folder)
  reference = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(folder).eval()
  return getattr(processor, "tokenizer", processor), loaded, reference, folder


CASES = dict(
    questions=["Which  object is\nleft of the sofa?", "How many chairs?", "Colour?",
               "Is the lamp on?", "What is behind me?", "Where is the door?"],
    answers=["the red chair", "  ", "blue", "yes", "a\tbig  table ", "left"],
    references=[["red chair", "a chair", ""], ["two", "", ""], ["", "", ""],
                [" \n", "yes", "it is"], ["table", "desk", "a table"], ["on the left", "", ""]])


def _fields():
  q = _ids(CASES["questions"], 48)
  a = _ids(CASES["answers"], 24)
  r = np.stack([_ids([refs[k] for refs in CASES["references"]], 16) for k in range(3)], 1)
  r[2, 0, 0] = -1  # a reference row marked unused
  return q, a, r


ROLLOUT_ANSWERS = ["blue sofa", "a chair", "the lamp", "two", "", "red"]  # 4: malformed


def _rollout_tasks():
  return episodes.act3d_tasks(len(ROLLOUT_ANSWERS), seed=3)


def _rollout_fields():
  tasks, _ = _rollout_tasks()
  return (np.asarray(tasks.question_ids), _ids(ROLLOUT_ANSWERS, 24),
          np.asarray(tasks.answer_ids))


def _host_case(q, a, r, b):
  refs = [decode_ids(x) for x in r[b] if x[0] >= 0]
  return decode_ids(q[b]), decode_ids(a[b]), [x for x in refs if one_line(x)]


@pytest.mark.parametrize("template", [None, chat_templates.INSTRUCT])
def test_the_prompt_is_the_host_judges_rendered_prompt(judge_policy, template):
  tok, model, *_ = judge_policy
  tok = tok.__class__.from_pretrained(judge_policy[3])
  tok.chat_template = template
  judge = PolicyJudge.create(tok, model, "act3d", max_tokens=1)
  q, a, r = _fields()
  ids, mask, answerable = jax.device_get(judge.prompt_ids(*map(jnp.asarray, (q, a, r))))
  assert ids.shape == mask.shape and ids.shape[0] == len(q)
  for b in range(len(q)):
    question, prediction, refs = _host_case(q, a, r, b)
    messages = PROMPTS["act3d"].messages(question, prediction, refs)
    expected = (tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                if template else render_chat(tok, messages))
    # The host judge sends no request without a prediction or a reference: no prompt.
    assert answerable[b] == bool(one_line(prediction) and refs), b
    if answerable[b]:
      assert tok.decode(ids[b][mask[b]].tolist()) == expected, b
  assert answerable.sum() == 4


def test_the_reply_verdict_is_act3ds_rule(judge_policy):
  tok, model, *_ = judge_policy
  replies = ["CORRECT", "INCORRECT", "The prediction is CORRECT.", "correct", "CORR", "",
             "CORRECT, not INCORRECT", "<|im_end|>CORRECT", "C O R R E C T", " INCORRECT\n",
             "not CORRECT", "<think>INCORRECT?</think> Correct", "caf\u00e9: correct"]
  encoded = [tok.encode(r, add_special_tokens=False) for r in replies]
  # "CORRECT" spelled byte by byte too: the rule reads bytes across token boundaries.
  byte_tokens = PolicyJudge.create(tok, model).byte_tokens
  replies.append("CORRECT")
  encoded.append([byte_tokens[c] for c in b"CORRECT"])
  width = max(map(len, encoded)) + 2
  tokens = np.full((len(encoded), width), -1, np.int32)
  for i, row in enumerate(encoded):
    tokens[i, :len(row)] = row
    tokens[i, len(row):] = tok.pad_token_id  # generated padding past the count is ignored
  _, table, lengths = judge_byte_tables(tok, model.config.text.vocab_size)
  count = np.asarray([len(e) for e in encoded], np.int32)
  text = reply_bytes(jnp.asarray(tokens), jnp.asarray(count), jnp.asarray(table),
                     jnp.asarray(lengths))
  served = [tok.decode(e, skip_special_tokens=True) for e in encoded]
  host = [judge_verdict(s) for s in served]
  np.testing.assert_array_equal(np.asarray(reply_verdict(text)), [v is True for v in host])
  np.testing.assert_array_equal(np.asarray(reply_reading(text)[1]), [v is None for v in host])
  assert (host.count(True), host.count(None)) == (7, 3)  # "correct" is True, "CORR" None


def test_verdicts_are_act3ds_rule_on_transformers_greedy_replies(judge_policy):
  tok, model, reference, _ = judge_policy
  judge = PolicyJudge.create(tok, model, "act3d", temperature=0.0, max_tokens=3)
  q, a, r = _fields()
  ids, mask, answerable = jax.device_get(judge.prompt_ids(*map(jnp.asarray, (q, a, r))))
  expected, readings = [], []
  for b in range(len(q)):
    real = torch.tensor(ids[b][mask[b]][None].astype(np.int64))
    with torch.no_grad():
      out = reference.generate(input_ids=real, attention_mask=torch.ones_like(real),
                               max_new_tokens=3, do_sample=False,
                               eos_token_id=list(judge.sampling.stop_tokens),
                               pad_token_id=judge.sampling.pad_token)
    reply = tok.decode(out[0, real.shape[1]:].tolist(), skip_special_tokens=True)
    assert judge.replies(q[b:b + 1], a[b:b + 1], r[b:b + 1])[0] == reply, b
    readings.append(judge_verdict(reply) if answerable[b] else "no_request")
    expected.append(readings[-1] is True)
  assert judge.stats() == dict.fromkeys(judge.stats(), 0)
  got = judge(q, a, r)
  np.testing.assert_array_equal(got, expected)
  named = {True: "correct", False: "incorrect", None: "unreadable", "no_request": "no_request"}
  stats = judge.stats()
  assert stats == {"rows": len(q), "requests": int(answerable.sum()),
                   **{key: [named[v] for v in readings].count(key)
                      for key in ("correct", "incorrect", "unreadable", "no_request")}}
  first = [reply.startswith("CORRECT") for reply in judge.replies(q, a, r)]
  assert any(first) and not all(first)  # the replies depend on the case


def test_make_judge_reads_the_config_block(judge_policy):
  tok, model, _, folder = judge_policy
  block = dict(url="", model="", checkpoint=str(folder), api_key_env="OPENAI_API_KEY",
               timeout_s=60.0, retries=3, concurrency=16, max_requests=0)
  trained, evaluated = (judges.make_judge(block, p) for p in ("act3d_training", "act3d_eval"))
  assert isinstance(trained, PolicyJudge) and trained.model is evaluated.model  # loaded once
  assert (trained.sampling.temperature, trained.sampling.max_new_tokens) == (0.1, 64)
  assert (evaluated.sampling.temperature, evaluated.sampling.max_new_tokens) == (0.0, 4)
  assert judges.make_judge(dict(block, checkpoint=""), "act3d_eval") is None  # rule judge
  with pytest.raises(ValueError, match="both"):
    judges.make_judge(dict(block, url="http://127.0.0.1:9/v1", model="m"), "act3d_eval")
  with pytest.raises(ValueError, match="preset"):
    judges.make_judge(block, "act3d")


def test_an_act3d_rollout_judged_on_device_credits_the_judges_verdicts(judge_policy):
  """The judge runs inside the rollout's program (no host callback in it), and its verdicts
  earn the judge reward only for episodes that answered."""
  jtok, jmodel, *_ = judge_policy
  tok = tiny.tokenizer()
  model = tiny.model(tok, seed=0)
  judge = PolicyJudge.create(jtok, jmodel, "act3d", max_tokens=1)
  automaton = am.compile_token_automaton(AGENT.grammar, tok, model.config.text.vocab_size)
  n_image = episode.image_tokens(model, AGENT.image_size)
  template = observation.compile_template(tok, AGENT.observation, n_image)
  tasks, questions = _rollout_tasks()
  ids, mask = episodes.act3d_prompts(tok, questions, n_image)
  config = episode.RolloutConfig(max_turns=2, max_turn_tokens=24, temperature=1.0,
                                 eos_tokens=(tok.convert_tokens_to_ids("<|im_end|>"),),
                                 pad_token=tok.pad_token_id)
  scripts = [[f"<think>t</think><answer>{x}</answer>"] for x in ROLLOUT_ANSWERS]
  scripts[4] = ["<think>a</think><tool_call>{\"name\": oops}</tool_call>"]  # malformed
  forced = jnp.asarray(episode.forced_tokens(tok, scripts, config))
  run = episode.compile_rollout(AGENT, template, config, judge)
  args = (model, automaton, tasks, jnp.asarray(ids), jnp.asarray(mask), jax.random.PRNGKey(0),
          forced, judge.state())
  hlo = run.lower(*args).as_text()
  assert "callback" not in hlo.lower()
  traj = jax.device_get(run(*args))
  expected = judge(np.asarray(tasks.question_ids), np.asarray(traj.answer),
                   np.asarray(tasks.answer_ids))
  answered = np.asarray([True] * 4 + [False, True])
  np.testing.assert_array_equal(traj.reward_components["judge"], expected & answered)
  assert expected[answered].any() and not expected[answered].all()
