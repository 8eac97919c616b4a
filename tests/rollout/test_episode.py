"""The compiled episode loop against a host-driven reference and against stepping the
environment by hand."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from data_pipelines.synthetic import episodes
from jaxspatial.envs import act3d
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.models.qwen2_5_vl.preprocess import batch_vision_inputs
from jaxspatial.rollout import agents, token_table as am, episode, host_loop, observation, tiny
from jaxspatial.rollout import vision
from jaxspatial.train import TrainBatch
from tests.rollout.test_group_prefill import assert_same_trajectories
from tests.rollout.tiny_act3d import act3d_policy
from tests.rollout.test_replay import assert_replays_equal

BATCH = 4
AGENT = agents.Act3DAgent(act3d.Act3DParams(width=56, height=56, grounding_min_pixels=5,
                                            max_interactions=2))


@pytest.fixture(scope="module")
def setup():
  tok = tiny.tokenizer()
  model = Qwen25VL(tiny.model_config(tok), rngs=nnx.Rngs(0))
  automaton = am.compile_token_automaton(AGENT.grammar, tok, model.config.text.vocab_size)
  n_image = episode.image_tokens(model, AGENT.image_size)
  template = observation.compile_template(tok, AGENT.observation, n_image)
  tasks, questions = episodes.act3d_tasks(BATCH, seed=3)
  ids, mask = episodes.act3d_prompts(tok, questions, n_image)
  return dict(tok=tok, model=model, automaton=automaton, template=template, tasks=tasks,
              ids=ids, mask=mask)


def _config(tok, **kw):
  base = dict(max_turns=3, max_turn_tokens=40, eos_tokens=(tok.convert_tokens_to_ids("<|im_end|>"),),
              pad_token=tok.pad_token_id)
  base.update(kw)
  return episode.RolloutConfig(**base)


def test_greedy_compiled_rollout_equals_the_host_reference(setup):
  s = setup
  config = _config(s["tok"], temperature=0.0)
  key = jax.random.PRNGKey(7)
  run = episode.compile_rollout(AGENT, s["template"], config)
  traj = jax.device_get(run(s["model"], s["automaton"], s["tasks"], jnp.asarray(s["ids"]),
                            jnp.asarray(s["mask"]), key))
  ref = host_loop.host_rollout(s["model"], AGENT, s["tok"], s["template"], s["tasks"], s["ids"],
                               s["mask"], key, config)
  np.testing.assert_array_equal(traj.attention_mask, ref["attention_mask"])
  np.testing.assert_array_equal(np.where(traj.attention_mask, traj.tokens, -1),
                                np.where(ref["attention_mask"], ref["tokens"], -1))
  np.testing.assert_array_equal(traj.loss_mask, ref["loss_mask"])
  np.testing.assert_allclose(traj.logprobs, ref["logprobs"], atol=1e-4)
  for name in ("turn_length", "turn_active", "turn_valid", "turn_answer", "action_values",
               "action_present"):
    np.testing.assert_array_equal(getattr(traj, name), ref[name], err_msg=name)
  np.testing.assert_allclose(traj.reward, ref["reward"], atol=1e-6)


# Each family compiles two programs, 75-100 s on 2 cores: `make slow-tests` (Qwen2.5-VL above; the
# group-prefill and replay equalities run every family there too).
@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3_vl", "qwen3_5"])
@pytest.mark.xla_default
def test_other_policy_families_roll_out_as_the_host_reference(family):
  """The rollout is written against the policy interface: a Qwen3-VL policy (DeepStack
  features added inside the decoder at every observation's image tokens) and a Qwen3.5
  policy (Gated DeltaNet layers carrying a recurrent state through the episode, ended
  episodes' slots skipped) run the same compiled episodes as the host loop, token for
  token. Forced first turns take the episodes into multi-turn play; later turns are
  sampled. For Qwen3.5, one forward pass over the recorded slots (what the trainer runs,
  holes and all) also gives the sampled log-probabilities."""
  p = act3d_policy(AGENT, family, 1, BATCH, 4)
  tok, model, automaton, template, tasks, ids, mask = (
      p.tok, p.model, p.automaton, p.template, p.tasks, p.ids, p.mask)
  config = _config(tok, temperature=1.0)
  scripts = [[_call("turn_left", 60), _call("forward")], [_call("up"), None],
             [_call("turn_right", 30)], [None]]
  forced = episode.forced_tokens(tok, scripts, config)
  key = jax.random.PRNGKey(8)
  run = episode.compile_rollout(AGENT, template, config)
  traj = jax.device_get(run(model, automaton, tasks, jnp.asarray(ids), jnp.asarray(mask), key,
                            jnp.asarray(forced)))
  ref = host_loop.host_rollout(model, AGENT, tok, template, tasks, ids, mask, key, config,
                               forced)
  assert traj.turn_active.sum() >= 6  # observations (with DeepStack residuals) appended
  np.testing.assert_array_equal(traj.attention_mask, ref["attention_mask"])
  np.testing.assert_array_equal(np.where(traj.attention_mask, traj.tokens, -1),
                                np.where(ref["attention_mask"], ref["tokens"], -1))
  np.testing.assert_allclose(traj.logprobs, ref["logprobs"], atol=1e-4)
  for name in ("turn_length", "turn_valid", "turn_answer", "action_values", "action_present"):
    np.testing.assert_array_equal(getattr(traj, name), ref[name], err_msg=name)
  np.testing.assert_allclose(traj.reward, ref["reward"], atol=1e-6)
  if family == "qwen3_5":
    assert not np.asarray(traj.attention_mask).all()  # holes the recurrence must skip
    images_per_row = int(np.sum(np.asarray(traj.tokens[0]) == model.config.image_token_id)
                         // episode.image_tokens(model, AGENT.image_size))
    views = traj.images[:, :images_per_row].reshape((-1,) + traj.images.shape[2:])
    pixels, grids, _ = vision.view_inputs(model, jnp.asarray(views))
    sequence_grids = jnp.broadcast_to(jnp.asarray(grids[0], jnp.int32),
                                      (BATCH, images_per_row, 3))
    logits = nnx.jit(lambda m, t, a, p, s: m(t, a, p, grids, s))(
        model, jnp.asarray(traj.tokens), jnp.asarray(traj.attention_mask), pixels,
        sequence_grids)
    logp = jax.nn.log_softmax(logits[:, :-1], -1)
    expected = jnp.take_along_axis(logp, jnp.asarray(traj.tokens)[:, 1:, None], -1)[..., 0]
    generated = np.asarray(traj.loss_mask[:, 1:])
    # Float32 recurrent (rollout) against chunked (forward) delta rule: a log-probability
    # near -8 differs by up to 3e-4 on some CPUs (3e-5 relative).
    np.testing.assert_allclose(np.asarray(expected)[generated],
                               np.asarray(traj.logprobs[:, 1:])[generated], atol=2e-4,
                               rtol=1e-4)


def _call(action, distance=None):
  args = f'"action": "{action}"' + ("" if distance is None else f', "distance": {distance}')
  return ('<think>move</think><tool_call>{"name": "render_view_tool", "arguments": {' + args
          + '}}</tool_call>')


def _answer_of(tasks, b):
  ids = np.asarray(tasks.answer_ids[b])
  return bytes(ids[ids >= 0].astype(np.uint8)).decode()


SCRIPTS = [
    [_call("turn_left", 60), _call("forward", 1.5), "<think>done</think><answer>{answer}</answer>"],
    [_call("up"), "<think>x</think><answer></answer>"],       # empty answer: malformed
    ["<think>a</think><tool_call>{\"name\": oops}</tool_call>"],  # malformed call
    [_call("turn_right", 30), _call("backward", 2), _call("left")],  # a call in the last turn
]


@pytest.mark.slow
@pytest.mark.xla_default
def test_scripted_episode_equals_stepping_the_environment_by_hand(setup):
  s = setup
  config = _config(s["tok"], temperature=1.0)
  scripts = [[t.replace("{answer}", "The " + _answer_of(s["tasks"], 0).upper()) for t in turns]
             for turns in SCRIPTS]
  forced = episode.forced_tokens(s["tok"], scripts, config)
  run = episode.compile_rollout(AGENT, s["template"], config)
  traj = jax.device_get(run(s["model"], s["automaton"], s["tasks"], jnp.asarray(s["ids"]),
                            jnp.asarray(s["mask"]), jax.random.PRNGKey(0), jnp.asarray(forced)))
  actions = {0: [("turn_left", 60.0), ("forward", 1.5)], 1: [("up", None)], 2: [],
             3: [("turn_right", 30.0), ("backward", 2.0)]}
  params = AGENT.params
  for b, moves in actions.items():
    task = jax.tree.map(lambda x, b=b: jnp.asarray(x[b]), s["tasks"])
    obs, state = act3d.reset(jax.random.PRNGKey(0), task, params)
    np.testing.assert_array_equal(traj.images[b, 0], obs.image)
    for t, (name, distance) in enumerate(moves):
      obs, state, _, _, info = act3d.step(jax.random.PRNGKey(0), state,
                                          act3d.Act3DAction.navigate(name, distance), params)
      assert not info["invalid"]
      np.testing.assert_array_equal(traj.images[b, t + 1], obs.image)
      np.testing.assert_allclose(traj.observation_numbers[b, t + 1],
                                 np.concatenate([obs.position, obs.look_at]))
      g = AGENT.grammar
      assert traj.action_values[b, t, g.field_id("action") - 1] == act3d.PRIMITIVES.index(name)
      assert traj.action_present[b, t, g.field_id("distance") - 1] == (distance is not None)
      if distance is not None:
        assert traj.action_values[b, t, g.field_id("distance") - 1] == np.float32(distance)
    assert traj.image_given[b, 1:len(moves) + 1].all()
    # Episode 0 answers after its moves: the reward of eqs. 8-9 by hand.
    if b == 0:
      grounded = bool(np.all(np.asarray(state.objects_seen) | (np.asarray(task.answer_objects) < 0)))
      # "The RED CHAIR" normalises to the reference: judge and exact match are 1.
      expected = 0.3 + 0.2 + 0.05 * (12 if grounded else 2)
      assert traj.reward[b] == pytest.approx(expected)
      assert traj.turn_answer[b].tolist() == [False, False, True]
  # Flags: empty answer and malformed call end badly; a call in the last turn is malformed.
  assert traj.reward_components["malformed"].tolist() == [0.0, 1.0, 1.0, 1.0]
  assert traj.reward[1] == pytest.approx(-0.2) and traj.reward[2] == pytest.approx(-0.2)
  assert traj.turn_active.sum(1).tolist() == [3, 2, 1, 3]
  assert not traj.turn_valid[2, 0] and traj.turn_valid[3].all()
  # Observation tokens never carry loss; generated tokens do.
  given = traj.attention_mask & ~traj.loss_mask
  prompt_len = s["ids"].shape[1]
  assert not traj.loss_mask[:, :prompt_len].any()
  for b in range(BATCH):
    for t in range(config.max_turns):
      start, length = traj.turn_start[t], traj.turn_length[b, t]
      assert traj.loss_mask[b, start:start + length].all()
      assert not traj.loss_mask[b, start + length:start + config.max_turn_tokens].any()
  assert given[:, prompt_len:].any()  # observation messages are attended, without loss


@pytest.mark.slow
@pytest.mark.xla_default
def test_partly_scripted_rollout_equals_the_host_reference(setup):
  """Forced first turns take every episode into multi-turn play; later turns are sampled."""
  s = setup
  config = _config(s["tok"], temperature=1.0)
  scripts = [[_call("turn_left", 60), _call("forward")], [_call("up"), None],
             [_call("turn_right", 30)], [None]]
  forced = episode.forced_tokens(s["tok"], scripts, config)
  key = jax.random.PRNGKey(11)
  run = episode.compile_rollout(AGENT, s["template"], config)
  traj = jax.device_get(run(s["model"], s["automaton"], s["tasks"], jnp.asarray(s["ids"]),
                            jnp.asarray(s["mask"]), key, jnp.asarray(forced)))
  ref = host_loop.host_rollout(s["model"], AGENT, s["tok"], s["template"], s["tasks"], s["ids"],
                               s["mask"], key, config, forced)
  assert traj.turn_active.sum() >= 6  # multi-turn play happened
  np.testing.assert_array_equal(traj.attention_mask, ref["attention_mask"])
  # Masked slots may hold different filler (messages nobody was shown).
  np.testing.assert_array_equal(np.where(traj.attention_mask, traj.tokens, -1),
                                np.where(ref["attention_mask"], ref["tokens"], -1))
  np.testing.assert_allclose(traj.logprobs, ref["logprobs"], atol=1e-4)
  for name in ("turn_length", "turn_valid", "turn_answer", "action_values", "action_present"):
    np.testing.assert_array_equal(getattr(traj, name), ref[name], err_msg=name)
  np.testing.assert_allclose(traj.reward, ref["reward"], atol=1e-6)


def test_bad_model_output_ends_the_episode_with_the_format_flag(setup):
  s = setup
  config = _config(s["tok"], temperature=1.0)
  tok = s["tok"]
  filler = tok.encode("a", add_special_tokens=False)[0]

  def filled(text):  # never closes: the turn runs into its token limit
    ids = tok.encode(text, add_special_tokens=False)
    return ids + [filler] * (config.max_turn_tokens - len(ids))

  forced = np.full((BATCH, config.max_turns, config.max_turn_tokens), -1, np.int32)
  forced[0, 0] = filled("}}{{ garbage <<")
  forced[1, 0] = filled('<think>abc</think><tool_call>{"name": "render_view_tool"')
  out_of_range = tok.encode(_call("forward", 999), add_special_tokens=False)
  forced[2, 0, :len(out_of_range)] = out_of_range
  eos = tok.encode("<think>x</think><|im_end|>", add_special_tokens=False)
  forced[3, 0, :len(eos)] = eos
  run = episode.compile_rollout(AGENT, s["template"], config)
  traj = jax.device_get(run(s["model"], s["automaton"], s["tasks"], jnp.asarray(s["ids"]),
                            jnp.asarray(s["mask"]), jax.random.PRNGKey(2), jnp.asarray(forced)))
  assert traj.turn_active.tolist() == [[True, False, False]] * BATCH
  assert not traj.turn_valid.any()
  assert traj.turn_length[:, 0].tolist() == [40, 40, len(out_of_range), len(eos)]
  np.testing.assert_allclose(traj.reward, -0.2)
  np.testing.assert_array_equal(traj.reward_components["malformed"], 1.0)
  assert not traj.action_present.any()


@pytest.mark.slow
def test_constrained_decoding_makes_every_turn_a_valid_call_or_answer(setup):
  s = setup
  config = _config(s["tok"], temperature=1.0, constrained=True)
  run = episode.compile_rollout(AGENT, s["template"], config)
  traj = jax.device_get(run(s["model"], s["automaton"], s["tasks"], jnp.asarray(s["ids"]),
                            jnp.asarray(s["mask"]), jax.random.PRNGKey(5)))
  np.testing.assert_array_equal(traj.turn_valid, traj.turn_active)
  assert traj.turn_active[:, 0].all()
  chex.assert_trees_all_equal(np.isfinite(traj.logprobs).all(), True)
  # Only a call in the last turn can end an episode badly.
  late_call = traj.turn_active[:, -1] & ~traj.turn_answer[:, -1]
  np.testing.assert_array_equal(traj.reward_components["malformed"] > 0,
                                late_call | (traj.answer[:, 0] < 0) | _blank(traj.answer))


def _blank(answer):
  return np.asarray([not bytes(a[a >= 0].astype(np.uint8)).strip() for a in answer])


@pytest.mark.slow
def test_a_host_judge_sees_the_question_and_every_reference_and_counts_only_answers(setup):
  """Act3D's judge decides, given the question, whether the prediction matches the ground
  truth (paper eq. 8): the host judge gets the question, the answer and all references,
  and its verdict earns credit (judge and interaction terms) only for an episode that
  produced an answer. This judge says yes to everything, so any credit a malformed
  episode got would show."""
  s = setup
  config = _config(s["tok"], temperature=1.0)
  calls = []

  def judge(question, answer, references):
    calls.append((np.asarray(question).copy(), np.asarray(answer).copy(),
                  np.asarray(references).copy()))
    return np.ones(answer.shape[0], bool)

  scripts = [["<think>t</think><answer>blue sofa</answer>"],
             [_call("up"), "<think>t</think><answer>blue sofa</answer>"],
             ["<think>a</think><tool_call>{\"name\": oops}</tool_call>"],   # malformed call
             [_call("left"), _call("right"), _call("up")]]  # a call in the last turn
  forced = episode.forced_tokens(s["tok"], scripts, config)
  run = episode.compile_rollout(AGENT, s["template"], config, judge=judge)
  traj = jax.device_get(run(s["model"], s["automaton"], s["tasks"], jnp.asarray(s["ids"]),
                            jnp.asarray(s["mask"]), jax.random.PRNGKey(0), jnp.asarray(forced)))
  assert len(calls) == 1
  question, answer, references = calls[0]
  np.testing.assert_array_equal(question, np.asarray(s["tasks"].question_ids))
  assert bytes(answer[0][answer[0] >= 0].astype(np.uint8)) == b"blue sofa"
  np.testing.assert_array_equal(references, np.asarray(s["tasks"].answer_ids))  # [B, R, La]
  np.testing.assert_array_equal(traj.reward_components["judge"], [1.0, 1.0, 0.0, 0.0])
  np.testing.assert_array_equal(traj.reward_components["exact_match"], 0.0)
  credit = np.where(traj.reward_components["grounded"] > 0, 12, [0, 1, 0, 0])
  np.testing.assert_allclose(traj.reward, np.where(np.arange(4) < 2, 0.3 + 0.05 * credit, -0.2),
                             atol=1e-6)


def test_tokens_take_the_turn_whose_slots_hold_them(setup):
  """Turns are packed: turn t + 1 starts after the batch's longest turn-t reply and the
  observation, not after `max_turn_tokens` slots. Each generated token's turn
  (`grpo.token_turns`, what OR-GIGPO's per-turn advantages follow) must be the turn whose
  forced tokens it is (here every reply is far shorter than the 40-token limit)."""
  from jaxspatial.train import grpo
  s = setup
  config = _config(s["tok"], temperature=1.0)
  scripts = [[_call("turn_left", 60), "<think>x</think><answer>a chair</answer>"],
             [_call("up"), _call("down"), "<think>y</think><answer>no</answer>"],
             ["<think>z</think><answer>the red chair</answer>"],
             [_call("right"), "<think>w</think><answer>two</answer>"]]
  forced = episode.forced_tokens(s["tok"], scripts, config)
  run = episode.compile_rollout(AGENT, s["template"], config)
  traj = jax.device_get(run(s["model"], s["automaton"], s["tasks"], jnp.asarray(s["ids"]),
                            jnp.asarray(s["mask"]), jax.random.PRNGKey(0), jnp.asarray(forced)))
  turns = np.asarray(grpo.token_turns(traj))
  for b, script in enumerate(scripts):
    for t, text in enumerate(script):
      expected = s["tok"].encode(text, add_special_tokens=False)
      assert traj.tokens[b][turns[b] == t].tolist() == expected, (b, t)
    assert not (turns[b] >= len(script)).any()
  assert (turns >= 0).sum() == traj.loss_mask.sum()


def test_each_turn_kind_has_its_own_step_key(setup):
  """OR-GIGPO pools steps by the observation each produced: a call's view (its pixel
  hash); an answer, a malformed turn and a rejected call produce no view, so each kind
  gets its own key instead of the hash of whatever image the environment handed back."""
  from jaxspatial.rl.advantages import image_hash
  s = setup
  config = _config(s["tok"], temperature=1.0)
  scripts = [[_call("turn_left", 60), "<think>x</think><answer>a chair</answer>"],
             ["<think>z</think><answer>two</answer>"],
             ["<think>a</think><tool_call>{\"name\": oops}</tool_call>"],
             [_call("right"), _call("left"), _call("up")]]  # the third is past the budget
  forced = episode.forced_tokens(s["tok"], scripts, config)
  run = episode.compile_rollout(AGENT, s["template"], config)
  traj = jax.device_get(run(s["model"], s["automaton"], s["tasks"], jnp.asarray(s["ids"]),
                            jnp.asarray(s["mask"]), jax.random.PRNGKey(0), jnp.asarray(forced)))
  keys = traj.observation_hashes[:, 1:]
  views = traj.num_prompt_images
  view_hash = lambda b, t: int(image_hash(jnp.asarray(traj.images[b, views + t])))
  assert keys[0, 0] == view_hash(0, 0) and keys[3, 0] == view_hash(3, 0)
  assert keys[3, 1] == view_hash(3, 1) and keys[3, 0] != keys[3, 1]
  answer, malformed, rejected = keys[0, 1], keys[2, 0], keys[3, 2]
  assert keys[1, 0] == answer
  assert len({int(answer), int(malformed), int(rejected)}) == 3
  assert traj.env_invalid[3, 2] and traj.reward_components["malformed"][3] == 1.0
  image_keys = {view_hash(b, t) for b in range(BATCH) for t in range(config.max_turns)}
  assert not image_keys & {int(answer), int(malformed), int(rejected)}
  assert (keys[1, 1:] == 0).all() and (keys[2, 1:] == 0).all()  # turns never taken


def test_turns_and_the_environments_budget_must_agree(setup):
  """Act3D allows N moves, then the answer: a loop of fewer turns would silently cut the
  budget (the old README example: 12 turns gave 11 moves)."""
  s = setup
  for turns in (2, 4):
    config = _config(s["tok"], max_turns=turns)
    with pytest.raises(ValueError, match="max_turns must be 3"):
      episode.rollout(s["model"], AGENT, s["automaton"], s["template"], s["tasks"],
                      jnp.asarray(s["ids"]), jnp.asarray(s["mask"]), jax.random.PRNGKey(0),
                      config)


@dataclasses.dataclass(frozen=True)
class _DoneAfterOneCall(agents.Act3DAgent):
  """An Act3D agent whose environment declares the episode over after any first call."""

  def step(self, key, state, parsed, answered):
    image, numbers, state, invalid, done = super().step(key, state, parsed, answered)
    return image, numbers, state, invalid, done | (state.num_interactions >= 1)


@pytest.mark.slow
def test_the_loop_ends_an_episode_when_the_environment_says_done(setup):
  s = setup
  agent = _DoneAfterOneCall(AGENT.params)
  config = _config(s["tok"], temperature=1.0)
  scripts = [[_call("up"), "<think>x</think><answer>a chair</answer>"]] * BATCH
  forced = episode.forced_tokens(s["tok"], scripts, config)
  run = episode.compile_rollout(agent, s["template"], config)
  traj = jax.device_get(run(s["model"], s["automaton"], s["tasks"], jnp.asarray(s["ids"]),
                            jnp.asarray(s["mask"]), jax.random.PRNGKey(0), jnp.asarray(forced)))
  assert traj.turn_active.tolist() == [[True, False, False]] * BATCH
  assert not traj.turn_answer.any() and not traj.image_given[:, 1:].any()
  np.testing.assert_array_equal(traj.reward_components["malformed"], 1.0)  # no answer


@pytest.mark.slow
def test_a_full_forward_pass_over_the_trajectory_gives_its_logprobs(setup):
  """What the trainer does: one forward pass over the recorded slots (tokens, attention
  mask, every message's view) reproduces the sampled log-probabilities."""
  s = setup
  config = _config(s["tok"], temperature=1.0)
  scripts = [[_call("turn_left", 60), _call("forward")], [_call("up"), None],
             [_call("turn_right", 30)], [None]]
  forced = episode.forced_tokens(s["tok"], scripts, config)
  run = episode.compile_rollout(AGENT, s["template"], config)
  traj = run(s["model"], s["automaton"], s["tasks"], jnp.asarray(s["ids"]),
             jnp.asarray(s["mask"]), jax.random.PRNGKey(3), jnp.asarray(forced))
  model = s["model"]
  images_per_row = int(np.sum(np.asarray(traj.tokens[0]) == model.config.image_token_id)
                       // episode.image_tokens(model, AGENT.image_size))
  assert images_per_row == config.max_turns  # the layout is static
  views = traj.images[:, :images_per_row].reshape((-1,) + traj.images.shape[2:])
  pixels, grids, _ = vision.view_inputs(model, views)
  grid = jnp.asarray(grids[0], jnp.int32)
  sequence_grids = jnp.broadcast_to(grid, (BATCH, images_per_row, 3))
  logits = model(traj.tokens, traj.attention_mask, pixels, grids, sequence_grids)
  logp = jax.nn.log_softmax(logits[:, :-1], -1)
  expected = jnp.take_along_axis(logp, traj.tokens[:, 1:, None], -1)[..., 0]
  generated = np.asarray(traj.loss_mask[:, 1:])
  assert generated.sum() > 100
  np.testing.assert_allclose(np.asarray(expected)[generated],
                             np.asarray(traj.logprobs[:, 1:])[generated], atol=2e-4)


def test_rollout_logprobs_give_the_recomputed_loss_and_gradient(setup):
  """`Phase.old_logprobs` "rollout" (an on-policy update sampled without filters): the
  rollout's log-probabilities as the old ones give the GRPO loss and gradient of the
  recompute path (a forward over the batch before the update) within float32 rounding.
  Every episode here ends in its first turn, so the batch holds views its tokens never
  show: the trainer's forward places each row's own views (`images_by_row`); placed in
  batch order, rows 1-3 read row 0's unshown views and the loss was 5% off."""
  from flax import nnx
  from jaxspatial.rl.objectives import PolicyLossConfig
  from jaxspatial.train import StepConfig, TrainBatch
  from jaxspatial.train.steps import batch_logprobs, loss_parts
  s = setup
  config = _config(s["tok"], temperature=1.0)
  assert not episode.reshaped_by(config)
  forced = jnp.asarray(episode.forced_tokens(s["tok"], [[None]] * BATCH, config))  # sampled
  traj = episode.compile_rollout(AGENT, s["template"], config)(
      s["model"], s["automaton"], s["tasks"], jnp.asarray(s["ids"]), jnp.asarray(s["mask"]),
      jax.random.PRNGKey(4), forced)
  assert not np.asarray(traj.turn_active)[:, 1:].any()
  batch = TrainBatch.from_trajectory(traj, advantages=jnp.asarray([1.0, -1.0, 0.5, -0.5]))
  assert int(batch.loss_mask.sum()) > 40
  step = StepConfig(objective="grpo", temperature=1.0,
                    loss=PolicyLossConfig(epsilon_low=0.2, epsilon_high=0.28,
                                          aggregation="token-mean"))
  graphdef, params, rest = nnx.split(s["model"], nnx.Param, ...)

  @jax.jit
  def loss_and_grad(params, batch):
    def loss(params):
      total, (denominator, _) = loss_parts(nnx.merge(graphdef, params, rest), batch, step)
      return total / denominator
    return jax.value_and_grad(loss)(params)

  recomputed = batch.replace(old_logprobs=batch_logprobs(s["model"], batch, 1.0))
  want_loss, want_grad = loss_and_grad(params, recomputed)
  got_loss, got_grad = loss_and_grad(params, batch.replace(old_logprobs=traj.logprobs))
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5, atol=1e-6)
  for got, want in zip(jax.tree.leaves(got_grad), jax.tree.leaves(want_grad)):
    scale = float(jnp.max(jnp.abs(want))) + 1e-12
    np.testing.assert_allclose(got / scale, want / scale, atol=1e-4)
  assert any(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(want_grad))


def test_a_replay_names_the_teacher_turn_it_cannot_play(setup):
  """Teacher SFT replays every turn of a trajectory file; a turn the grammar rejects would
  end the episode and silently drop the rest. The check names the record, the turn and its
  text, for each way a replay can go wrong."""
  s = setup
  config = _config(s["tok"], temperature=1.0)
  good = [_call("up"), "<think>x</think><answer>a chair</answer>"]
  cases = {
      "turn 1 is not a well-formed": [_call("up"), '<think>x</think><tool_call>{"nam']
      + ["<think>y</think><answer>b</answer>"],
      "turn 1 was never played": ["<think>x</think><answer>a chair</answer>", _call("up")],
      "turn 0 closes after": [_call("up") + " and more text", good[1]],
      "the episode went on after the teacher's last turn": [_call("up")],
  }
  names = [f"teachers.jsonl: scene {b}" for b in range(BATCH)]
  run = episode.compile_rollout(AGENT, s["template"], config, replay=True)
  for message, bad in cases.items():
    scripts = [good, bad, good, good]
    forced = episode.forced_tokens(s["tok"], scripts, config)
    traj = jax.device_get(run(s["model"], s["automaton"], s["tasks"], jnp.asarray(s["ids"]),
                              jnp.asarray(s["mask"]), jax.random.PRNGKey(0),
                              jnp.asarray(forced)))
    with pytest.raises(ValueError, match=f"teachers.jsonl: scene 1: {message}"):
      episode.check_replay(traj, forced, names, s["tok"])
  forced = episode.forced_tokens(s["tok"], [good] * BATCH, config)
  traj = jax.device_get(run(s["model"], s["automaton"], s["tasks"], jnp.asarray(s["ids"]),
                            jnp.asarray(s["mask"]), jax.random.PRNGKey(0), jnp.asarray(forced)))
  episode.check_replay(traj, forced, names, s["tok"])  # a clean replay passes


def test_segment_replay_equals_token_replay(setup):
  """Teacher replay writes each forced turn as one segment: the trajectory of the same
  turns forced one decode step at a time (the other families, the repetition penalty and
  constrained decoding: tests/rollout/test_replay.py, `make slow-tests`)."""
  s = setup
  config = _config(s["tok"], temperature=1.0)
  scripts = [[t.replace("{answer}", "a chair") for t in turns] for turns in SCRIPTS]
  forced = jnp.asarray(episode.forced_tokens(s["tok"], scripts, config))
  inputs = (s["model"], s["automaton"], s["tasks"], jnp.asarray(s["ids"]),
            jnp.asarray(s["mask"]), jax.random.PRNGKey(0), forced)
  by_token = episode.compile_rollout(AGENT, s["template"], config)(*inputs)
  by_segment = episode.compile_rollout(AGENT, s["template"], config, replay=True)(*inputs)
  assert_replays_equal(jax.device_get(by_segment), jax.device_get(by_token))


def test_a_group_prefilled_once_equals_every_row_prefilled(setup):
  """GRPO's groups (rows 0-1 and 2-3 repeat one task each): `group=2` prefills each prompt
  once and repeats its cache; the trajectories equal every row prefilled on its own, the
  sampled turns and the forced ones (the other families: tests/rollout/test_group_prefill.py,
  `make slow-tests`)."""
  s = setup
  config = _config(s["tok"], temperature=1.0)
  take = lambda x: np.asarray(x)[np.asarray([0, 0, 1, 1])]
  scripts = [[None], [None], [_call("up"), None], [_call("up"), None]]
  forced = jnp.asarray(episode.forced_tokens(s["tok"], scripts, config))
  inputs = (s["model"], s["automaton"], jax.tree.map(take, s["tasks"]),
            jnp.asarray(take(s["ids"])), jnp.asarray(take(s["mask"])), jax.random.PRNGKey(5),
            forced)
  per_row = episode.compile_rollout(AGENT, s["template"], config)(*inputs)
  shared = episode.compile_rollout(AGENT, s["template"], config, group=2)(*inputs)
  assert_same_trajectories(jax.device_get(shared), jax.device_get(per_row), group=2)


@pytest.mark.slow
def test_repetition_penalty_equals_transformers_and_logprobs_follow_it(setup):
  """Think3D-RL samples with Hugging Face's repetition penalty (1.1 in the public script).
  The penalty equals transformers' RepetitionPenaltyLogitsProcessor over every token in
  context, and the rollout's log-probabilities are those of the penalised distribution it
  sampled from: recomputed here from one forward pass over the trajectory and the
  processor applied at each position to the attended tokens before it."""
  import torch
  from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

  from jaxspatial.models import sampler
  rng = np.random.default_rng(0)
  logits = rng.normal(0, 3, (3, 50)).astype(np.float32)
  context = rng.integers(0, 50, (3, 12))
  seen = sampler.mark_seen(jnp.zeros((3, 50), bool), jnp.asarray(context),
                           jnp.ones((3, 12), bool))
  ours = np.asarray(sampler.repetition_penalty(jnp.asarray(logits), seen, 1.3))
  theirs = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor(context), torch.tensor(logits))
  np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6)

  s = setup
  penalty = 1.3
  config = _config(s["tok"], temperature=1.0, repetition_penalty=penalty)
  scripts = [[_call("turn_left", 60), None], [None], [_call("up"), None], [None]]
  forced = episode.forced_tokens(s["tok"], scripts, config)
  run = episode.compile_rollout(AGENT, s["template"], config)
  traj = jax.device_get(run(s["model"], s["automaton"], s["tasks"], jnp.asarray(s["ids"]),
                            jnp.asarray(s["mask"]), jax.random.PRNGKey(3), jnp.asarray(forced)))
  model = s["model"]
  batch = TrainBatch.from_trajectory(traj)
  pixels, grids, sequence_grids = batch_vision_inputs(model.config.vision,
                                                      jnp.asarray(batch.images))
  full = np.asarray(model(jnp.asarray(traj.tokens), jnp.asarray(traj.attention_mask), pixels,
                          grids, sequence_grids), np.float32)
  processor = RepetitionPenaltyLogitsProcessor(penalty)
  checked = 0
  for b in range(BATCH):
    for j in np.nonzero(traj.loss_mask[b])[0]:
      before = traj.tokens[b, :j][traj.attention_mask[b, :j]]
      scores = processor(torch.tensor(before[None]), torch.tensor(full[b, j - 1][None]))
      expected = torch.log_softmax(scores, -1)[0, traj.tokens[b, j]].item()
      assert traj.logprobs[b, j] == pytest.approx(expected, abs=2e-4)
      checked += 1
  assert checked > 100


def test_a_forced_token_the_grammar_rules_out_has_probability_zero():
  """A forced turn the grammar rejects leaves every logit masked: the forced token's
  log-probability is -inf (probability 0), never NaN; elsewhere numpy's log-softmax."""
  logits = np.array([[0.5, -1.0, 2.0, 0.0], [-np.inf] * 4], np.float32)
  config = episode.RolloutConfig(max_turns=1, max_turn_tokens=4, temperature=0.7)
  token, logp = episode.force(jnp.asarray(logits), jnp.zeros(2, jnp.int32),
                              jnp.zeros(2, jnp.float32), jnp.asarray([2, 1]), config)
  scaled = logits[0] / 0.7
  expected = scaled[2] - np.log(np.exp(scaled).sum())
  np.testing.assert_array_equal(token, [2, 1])
  np.testing.assert_allclose(logp[0], expected, rtol=1e-6)
  assert logp[1] == -np.inf
