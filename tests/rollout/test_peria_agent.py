"""A scripted PERIA episode through the compiled loop equals the environment stepped by hand
with the public tools' calls, its reward follows PERIA's format and correctness rules, and
its messages are the public environment's (PEDIA's train_tool_server, written out here)."""

import random
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from data_pipelines.synthetic import episodes
from jaxspatial.envs import peria
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.rl.rewards import peria_reward_text
from jaxspatial.rollout import (agents, api_agent, episode, host_parse, observation, peria_agent,
                                prompts, tiny)
from jaxspatial.rollout import token_table as am
from tests.rollout import turn_strings

PARAMS = peria.PeriaParams(width=56, height=56, max_images=4, max_turns=4, max_path_points=4)
# The public server's strings (pedia_base.conduct_action and the tools' error returns).
SUCCESS = "Tool executed successfully.\nObservation {:d}:\n"
UNPARSEABLE = ('Error: Could not parse action. Expected format: <action>{"name": "tool_name", '
               '"arguments": {...}}</action>')
BAD_INDEX = "Error: Invalid image index."
FEW_POINTS = "Error: Need at least 2 points (4 coordinate values) and an even number of values."


def _call(tool, image, key, coords, label=None):
  value = f"[{', '.join(str(c) for c in coords)}]"
  if label is not None:
    value = f'"{label}", "position": {value}'
  return ('<think>t</think><action>{"name": "' + tool + '", "arguments": {"image_index": '
          f'{image}, "{key}": {value}}}}}</action>')


@pytest.fixture(scope="module")
def policy():
  tok = tiny.tokenizer()
  return tok, Qwen25VL(tiny.model_config(tok), rngs=nnx.Rngs(1))


@pytest.mark.slow
@pytest.mark.xla_default
def test_scripted_peria_episode_equals_the_environment_by_hand(policy):
  tok, model = policy
  agent = agents.PeriaAgent(PARAMS)
  assert agent.continue_on_format_error and agent.max_calls == 3
  automaton = am.compile_token_automaton(agent.grammar, tok, model.config.text.vocab_size)
  n_image = episode.image_tokens(model, agent.image_size)
  template = observation.compile_template(tok, agent.observation, n_image)
  assert template.integers == (True,)
  tasks, _ = episodes.act3d_tasks(4, seed=4, points=4000)
  tasks = tasks.replace(answer_choice=np.asarray([1, -1, -1, 0], np.int32))
  ids, mask = prompts.left_padded(tok, [prompts.peria_prompt("s", "q", n_image)] * 4)
  config = episode.RolloutConfig(max_turns=4, max_turn_tokens=72, pad_token=tok.pad_token_id)
  answer_name = bytes(np.asarray(tasks.answer_ids[1])[np.asarray(tasks.answer_ids[1]) >= 0]
                      .astype(np.uint8).tolist()).decode()
  calls = [("image_crop", 0, "bounding_box", (0, 0, 1000, 1000)),
           ("draw_path", 1, "points", (0, 0, 500, 1000, 1000, 0)),
           ("image_label", 2, "text", (1000, 1000), "door")]
  scripts = [
      [_call(*c) for c in calls] + ["<think>ok</think><answer>B</answer>"],
      [_call("image_highlight", 2, "bounding_box", (0, 0, 10, 10)),  # no image 2 yet
       '<think>hm</think><action>{"name": "zoom"}</action>',          # unparseable: retried
       f"<think>ok</think><answer>{answer_name}</answer>"],
      [_call("image_crop", 0, "bounding_box", (0, 0, 500, 500))] * 4,  # truncated
      ["<think>ok</think><answer>B</answer>"],                          # wrong letter (A)
  ]
  forced = episode.forced_tokens(tok, scripts, config)
  run = episode.compile_rollout(agent, template, config)
  traj = jax.device_get(run(model, automaton, tasks, jnp.asarray(ids), jnp.asarray(mask),
                            jax.random.PRNGKey(0), jnp.asarray(forced)))

  task = jax.tree.map(lambda x: jnp.asarray(x[0]), tasks)
  obs, state = peria.reset(jax.random.PRNGKey(0), task, PARAMS)
  np.testing.assert_array_equal(traj.images[0, 0], obs.image)
  images = [obs.image]
  for t, (tool, image, _, coords, *_) in enumerate(calls):
    action = peria.PeriaAction.create(peria.TOOL, peria.TOOLS.index(tool), image, coords,
                                      max_points=PARAMS.max_path_points)
    obs, state, _, _, info = peria.step(jax.random.PRNGKey(0), state, action, PARAMS)
    assert not bool(info["invalid"]) and int(obs.index) == t + 1
    np.testing.assert_allclose(np.int32(traj.images[0, t + 1]), np.int32(obs.image), atol=1)
    assert traj.observation_numbers[0, t + 1, 0] == t + 1
    images.append(obs.image)
  np.testing.assert_array_equal(images[1], images[0])  # the whole image, at its own size
  assert all((np.asarray(a) != np.asarray(b)).any() for a, b in zip(images[1:], images[2:]))
  assert not traj.env_invalid[0].any() and traj.env_invalid[1, 0] and traj.env_invalid[2, 3]
  assert traj.observation_numbers[1, 1, 0] == -1
  # The loop shows each episode the message of what happened: a new image, the error the
  # environment found (here an index not yet in the list), the format error.
  assert traj.observation_variant[0, :3].tolist() == [peria_agent.SUCCESS_VARIANT] * 3
  assert traj.observation_variant[1, :2].tolist() == [peria_agent.INDEX_VARIANT,
                                                      peria_agent.FORMAT_ERROR_VARIANT]
  assert not traj.image_given[1, 1:3].any() and traj.image_given[0, 1:4].all()
  # format + correct: +1 +1 (letter B); +1 +1 (the phrase, after a rejected call and an
  # unparseable turn); 0 + 0 (truncated); +1 + 0.
  np.testing.assert_allclose(traj.reward, [2.0, 2.0, 0.0, 1.0])
  np.testing.assert_allclose(traj.reward_components["interactions"], [3, 1, 4, 0])


def test_messages_are_the_public_environments(policy):
  tok, _ = policy
  texts = agents.PeriaAgent(PARAMS).observation
  chat = lambda text: f"<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
  assert texts[peria_agent.SUCCESS_VARIANT] == chat(
      SUCCESS + "<|vision_start|><|image_pad|><|vision_end|>")
  assert texts[peria_agent.FORMAT_ERROR_VARIANT] == chat(UNPARSEABLE)
  assert texts[peria_agent.INDEX_VARIANT] == chat(BAD_INDEX)
  assert texts[peria_agent.PATH_POINTS_VARIANT] == chat(FEW_POINTS)
  for k, tool in enumerate(peria.TOOLS):
    # The server appends Python's exception text; ours is fixed.
    assert f"user\nError executing {tool}: " in texts[peria_agent.ARGUMENTS_VARIANT + k]
  template = observation.compile_template(tok, texts, 4)
  assert [v.has_image for v in template.variants] == [True] + [False] * (len(texts) - 1)


def test_observation_variant_names_the_error_the_environment_found():
  agent = agents.PeriaAgent(PARAMS)
  tasks, _ = episodes.act3d_tasks(1, seed=4, points=2000)
  _, state = peria.reset(jax.random.PRNGKey(0), jax.tree.map(lambda x: x[0], tasks), PARAMS)
  create = lambda tool, image, points, **kw: peria.PeriaAction.create(
      peria.TOOL, peria.TOOLS.index(tool), image, points, max_points=4, **kw)
  cases = [
      (create("image_crop", 0, (0, 0, 500, 500)), peria_agent.SUCCESS_VARIANT),
      (create("image_crop", 3, (0, 0, 500, 500)), peria_agent.INDEX_VARIANT),
      (create("draw_path", 0, (5, 5)), peria_agent.PATH_POINTS_VARIANT),
      (create("draw_line", 0, (9, 9, 1, 1), argument=0),
       peria_agent.ARGUMENTS_VARIANT + peria.TOOLS.index("draw_line")),
  ]
  step = jax.jit(peria.step, static_argnums=3)
  for action, variant in cases:
    _, new, _, _, info = step(jax.random.PRNGKey(0), state, action, PARAMS)
    assert int(agent.observation_variant(info["invalid"], False, False, new)) == variant
    assert int(agent.observation_variant(info["invalid"], True, False, new)) == (
        peria_agent.FORMAT_ERROR_VARIANT)
  assert int(agent.observation_variant(True, False, False)) == peria_agent.INVALID_CALL_VARIANT


def test_first_prompt_and_configuration():
  prompt = prompts.peria_prompt("sys", "Which is left?", 2)
  assert ("<|im_start|>user\nObservation 0:\n<|vision_start|><|image_pad|><|image_pad|>"
          "<|vision_end|>\nWhich is left?<|im_end|>") in prompt
  for name in ("image_index", "bounding_box", "coordinates", "points", "position"):
    assert name in prompts.PERIA_SYSTEM
  with pytest.raises(ValueError, match=r"max_images \(3\) must be at least max_turns \(4\)"):
    agents.PeriaAgent(peria.PeriaParams(max_images=3, max_turns=4))
  # The automaton stays small: 192 states before draw_path and image_label, 344 with the
  # default 8 path points (each point adds 14).
  assert agents.PeriaAgent(PARAMS).grammar.dfa.num_states < 300


@pytest.mark.parametrize("coordinates", ["boxed"])  # "list" runs in test_automaton.py
def test_boxed_coordinates_parse_as_the_host_regex_does(policy, coordinates):
  """The public declarations' strings: the automaton's parse against the host regex."""
  tok, _ = policy
  agent = agents.PeriaAgent(PARAMS, coordinate_format=coordinates)
  automaton = am.compile_token_automaton(agent.grammar, tok)
  rng = random.Random(2)
  texts = [turn_strings.peria_turn(rng, coordinates) for _ in range(500)]
  parsed = turn_strings.parse_batch(
      automaton, [tok.encode(t, add_special_tokens=False) for t in texts])
  field = lambda row, name: parsed.values[row, agent.grammar.field_id(name) - 1]
  calls = 0
  for row, text in enumerate(texts):
    host = host_parse.parse_peria(text.encode(), PARAMS.max_images, 1000,
                                  PARAMS.max_path_points, coordinates)
    assert bool(parsed.valid[row]) == (host is not None), text
    if host is None or "answer" in host:
      continue
    calls += 1
    assert (field(row, "tool"), field(row, "image_index"), field(row, "argument")) == (
        host["tool"], host["image_index"], host["argument"]), text
    xs = [parsed.present[row, agent.grammar.field_id(f"x{k}") - 1] for k in range(4)]
    assert sum(xs) == len(host["points"]), text
    for k, (x, y) in enumerate(host["points"]):
      assert (field(row, f"x{k}"), field(row, f"y{k}")) == (x, y), text
  assert calls > 40  # many exceed PARAMS (4 images, 4 points): rejected alike


def test_text_rewards_follow_the_public_format_rules(policy):
  """R_rep + R_format + R_correct from the model text (the public reward manager's rules):
  a retried turn that called a tool without `</think>` breaks the format (-1), which the
  grammar-based device R_format cannot see; a clean episode scores +1."""
  tok, _ = policy
  texts = ['<think>a</think><action>{"name": "image_crop"}</action>'
           '<think>b</think><answer>B</answer>',
           '<action>{"name": "image_crop"}</action><think>b</think><answer>B</answer>',
           '<think>a</think><action>{"name": "image_crop"}</action>']
  ids = [tok.encode(t, add_special_tokens=False) for t in texts]
  tokens = np.zeros((3, max(map(len, ids))), np.int32)
  loss = np.zeros(tokens.shape, bool)
  for row, i in enumerate(ids):
    tokens[row, :len(i)], loss[row, :len(i)] = i, True
  rewards = peria_agent.text_rewards(tokens, loss, np.asarray([2, 2, 1]),
                                     np.asarray([1.0, 1.0, 0.0]), tok)
  # +1 format +1 correct; -1 (an action with no </think> before it) +1; 0 (truncated) + 0.
  np.testing.assert_allclose(rewards, [2.0, 0.0, 0.0])


def _answer_ids(texts, width):
  out = np.full((len(texts), width), -1, np.int32)
  for row, value in enumerate(texts):
    out[row, :len(value.encode())] = list(value.encode())
  return out


def test_device_reward_is_the_public_rule_with_a_gated_judge():
  """PeriaAgent.reward on real tasks: R_correct by the public rule ("12.5" is not "125",
  "12.0" is "12"; a multiple-choice task's reference is its letter), and a judge's YES
  counts only where the public manager would ask it (the rule failed, an answer, not both
  single words)."""
  agent = agents.PeriaAgent(PARAMS)
  #            answer       reference  choice judge  correct judged
  rows = [("12.5", "125", -1, False, 0, 0),
          ("12.0", "12", -1, False, 1, 0),
          ("blue car", "red car", -1, False, 0, 0),
          ("blue car", "red car", -1, True, 1, 1),  # the judge overturns the rule
          ("blue", "red", -1, True, 0, 0),          # both single words: no judge
          ("", "red", -1, True, 0, 0),              # no prediction: no judge
          ("12", "12", -1, True, 1, 0),             # the rule holds: no judge needed
          ("b.", "the sofa", 1, False, 1, 0),       # option B: the reference is "B"
          ("(B)", "the sofa", 1, False, 0, 0),      # not the letter by the public rule
          ("the sofa", "the sofa", 1, False, 0, 0)]  # nor the option's text
  tasks, _ = episodes.act3d_tasks(len(rows), seed=4, points=500)
  width = tasks.answer_ids.shape[-1]
  tasks = tasks.replace(answer_ids=_answer_ids([r[1] for r in rows], width)[:, None],
                        answer_choice=np.asarray([r[2] for r in rows], np.int32))
  keys = jax.random.split(jax.random.PRNGKey(0), len(rows))
  states = jax.jit(jax.vmap(lambda k, t: peria.reset(k, t, PARAMS)[1]))(keys, tasks)
  answers = _answer_ids([r[0] for r in rows], episode.ANSWER_BYTES)
  answered = np.ones(len(rows), bool)
  score = jax.jit(jax.vmap(agent.reward))
  reward, parts = jax.device_get(score(states, tasks, answers, answered, ~answered,
                                       np.asarray([r[3] for r in rows])))
  np.testing.assert_array_equal(parts["correct"], [r[4] for r in rows])
  np.testing.assert_array_equal(parts["judged"], [r[5] for r in rows])
  np.testing.assert_array_equal(reward, 1.0 + parts["correct"])  # answered: R_format +1
  # A judge saying YES to every row overturns exactly the gated ones.
  gate = jax.device_get(score(states, tasks, answers, answered, ~answered, answered))[1]["judged"]
  assert gate.tolist() == [0, 0, 1, 1, 0, 0, 0, 0, 0, 1]


def _rows(tok, pieces):
  """Trajectory rows of one episode from (text, generated) pieces: the tokens, the loss mask
  (generated) and the attention mask (every piece; two padding slots after)."""
  ids = [tok.encode(t, add_special_tokens=False) for t, _ in pieces]
  tokens = np.concatenate([np.asarray(i, np.int32) for i in ids] + [np.zeros(2, np.int32)])
  loss = np.concatenate([np.full(len(i), g) for i, (_, g) in zip(ids, pieces)]
                        + [np.zeros(2, bool)]).astype(bool)
  attention = np.concatenate([np.ones(len(tokens) - 2, bool), np.zeros(2, bool)])
  return tokens, loss, attention


def test_host_training_reward_reads_the_text_as_the_public_manager(policy):
  """text_rewards / peria_reward_text: R_correct from the text by the public rule (not the
  device's value), R_format on the whole response with the observation messages (the
  format-error message holds a complete <action>...</action>: a cut-off episode after it
  scores 0, as the public manager scores it), never on the prompt."""
  tok, _ = policy
  assert peria_reward_text("<think>t</think><answer>12.5</answer>", 1, ["125"]) == 1.0
  assert peria_reward_text("<think>t</think><answer>12.0</answer>", 1, ["12"]) == 2.0
  prompt = prompts.peria_prompt(prompts.PERIA_SYSTEM, "How long?", 1)
  episodes_pieces = [
      [(prompt, False), ("<think>t</think><answer>12.5</answer>", True)],
      [(prompt, False), ("<think>t</think><answer>12.0</answer>", True)],
      [(prompt, False), ("<think>a</think>x</action>", True),
       (peria_agent.PERIA_FORMAT_ERROR, False), ("<think>b</think><answer>12", True)]]
  built = [_rows(tok, p) for p in episodes_pieces]
  width = max(len(t) for t, _, _ in built)
  pad = lambda x: np.pad(x, (0, width - len(x)))
  tokens, loss, attention = (np.stack([pad(b[k]) for b in built]) for k in range(3))
  device_correct = np.asarray([1.0, 0.0, 0.0])  # what the device said: the host ignores it
  references = [["125"], ["12"], ["12"]]
  host = peria_agent.text_rewards(tokens, loss, np.asarray([1, 1, 2]), device_correct, tok,
                                  attention_mask_BxS=attention, references=references)
  np.testing.assert_allclose(host, [1.0, 2.0, 0.0])
  model_only = peria_agent.text_rewards(tokens, loss, np.asarray([1, 1, 2]), device_correct,
                                        tok, references=references)
  np.testing.assert_allclose(model_only, [1.0, 2.0, -1.0])  # no complete action in the replies
  # host_rewards: the same from trajectory rows and their tasks (a judge's overturn counts
  # where the host's gate agrees: "12.5" vs "125" is two single words, no judge).
  rows = types.SimpleNamespace(tokens=tokens, loss_mask=loss, attention_mask=attention,
                               turn_active=np.asarray([[1, 0], [1, 0], [1, 1]]),
                               reward_components={"correct": device_correct,
                                                  "judged": np.asarray([1.0, 0.0, 0.0])})
  tasks = types.SimpleNamespace(answer_ids=_answer_ids(["125", "12", "12"], 8)[:, None],
                                answer_choice=np.asarray([-1, -1, -1]))
  agent = agents.PeriaAgent(PARAMS)
  np.testing.assert_allclose(agent.host_rewards(rows, tok, tasks), [1.0, 2.0, 0.0])
  np.testing.assert_allclose(agent.host_rewards(rows, tok), [2.0, 1.0, 0.0])  # the device's


def test_api_response_text_is_the_decoded_response():
  messages = [{"role": "system", "content": "s <think>x</think>"},
              {"role": "user", "content": [{"type": "text", "text": "Observation 0:\n"},
                                           {"type": "image", "view": 0}]},
              {"role": "assistant", "content": "<think>a</think><action>1</action>"},
              {"role": "user", "content": [{"type": "text", "text": "Observation 1:\n"},
                                           {"type": "image", "view": 1}]},
              {"role": "assistant", "content": "<think>b</think><answer>B</answer>"}]
  assert api_agent.peria_response_text(messages) == (
      "<think>a</think><action>1</action>\nuser\nObservation 1:\n\nassistant\n"
      "<think>b</think><answer>B</answer>")


@pytest.mark.slow
def test_api_rollout_asks_the_judge_only_about_gated_rows():
  """api_rollout with PERIA: the host judge sees only the rows whose verdict counts, and
  the host reward is the public manager's on the whole response (slow: it compiles the
  environment's step, about 20 s)."""
  answers = ["12.5", "blue car", "12.0"]  # vs "125": two single words; a phrase; the rule holds

  class Scripted:
    def complete_many(self, requests):
      out = []
      for request in requests:
        user = request["messages"][1]["content"]
        question = "".join(p.get("text", "") for p in user if isinstance(p, dict))
        out.append(f"<think>x</think><answer>{answers[int(question[-1])]}</answer>")
      return out

  asked = []

  def judge(question, answer, references):
    asked.append([bytes(a[a >= 0].astype(np.uint8)).decode() for a in np.asarray(answer)])
    return np.ones(len(answer), bool)

  tasks, _ = episodes.act3d_tasks(3, seed=4, points=2000)
  width = tasks.question_ids.shape[-1]
  tasks = tasks.replace(
      question_ids=_answer_ids([f"Q{b}" for b in range(3)], width),
      answer_ids=_answer_ids(["125", "red car", "12"], tasks.answer_ids.shape[-1])[:, None])
  records = api_agent.api_rollout(Scripted(), agents.PeriaAgent(PARAMS), tasks,
                                  jax.random.PRNGKey(0), judge=judge)
  assert asked == [["blue car"]]
  assert [r["reward_components"]["correct"] for r in records] == [0.0, 1.0, 1.0]
  assert [r["reward_components"]["judged"] for r in records] == [0.0, 1.0, 0.0]
  assert [r["host_reward"] for r in records] == [1.0, 2.0, 2.0]
