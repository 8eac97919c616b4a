"""A scripted Think3D episode through the compiled loop equals the view tool stepped by
hand: the input views in the first prompt, the views, the stage-aware messages."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from data_pipelines.synthetic import episodes
from jaxspatial.envs import think3d
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.rollout import agents, token_table as am, episode, observation, prompts, tiny
from jaxspatial.train import TrainBatch, token_logprobs

VIEWS = 4  # input views in the first prompt


def _view(camera, azimuth, elevation, ego):
  return ('<think>v</think><tool_call>{"name": "pi3_tool", "arguments": '
          f'{{"rotation_reference_camera": {camera}, "azimuth_angle": {azimuth}, '
          f'"elevation_angle": {elevation}, "camera_view": {str(ego).lower()}}}}}</tool_call>')


@pytest.fixture(scope="module")
def run():
  agent = agents.Think3DAgent(think3d.Think3DParams(width=56, height=56, max_rounds=2,
                                                    num_prompt_images=VIEWS))
  tok = tiny.tokenizer()
  model = Qwen25VL(tiny.model_config(tok), rngs=nnx.Rngs(1))
  automaton = am.compile_token_automaton(agent.grammar, tok, model.config.text.vocab_size)
  n_image = episode.image_tokens(model, agent.image_size)
  template = observation.compile_template(tok, agent.observation, n_image)
  tasks, _ = episodes.act3d_tasks(2, seed=4)
  # Episode 1's task has two real input cameras of its four slots: the prompt masks two.
  tasks = tasks.replace(answer_choice=np.asarray([1, 2], np.int32),
                        num_input_cameras=np.asarray([4, 2], np.int32))
  ids, mask = prompts.left_padded_views(tok, prompts.THINK3D_SYSTEM,
                                        ["Which is left? (A) a (B) b (C) c"] * 2, n_image,
                                        VIEWS, tasks.num_input_cameras)
  config = episode.RolloutConfig(max_turns=3, max_turn_tokens=64, temperature=1.0,
                                 pad_token=tok.pad_token_id)
  views = [(2, -45, 10, True), (1, 30.5, 60, False)]
  scripts = [[_view(*views[0]), _view(*views[1]), "<think>ok</think><answer>(B) b</answer>"],
             [_view(6, 0, 0, True), "<think>ok</think><answer>A</answer>"]]  # 6 of 4 cameras
  forced = episode.forced_tokens(tok, scripts, config)
  rollout = episode.compile_rollout(agent, template, config)
  traj = jax.device_get(rollout(model, automaton, tasks, jnp.asarray(ids), jnp.asarray(mask),
                                jax.random.PRNGKey(0), jnp.asarray(forced)))
  return dict(agent=agent, tok=tok, model=model, tasks=tasks, traj=traj, views=views,
              mask=mask, n_image=n_image, template=template)


@pytest.mark.slow
@pytest.mark.xla_default
def test_scripted_think3d_episode_equals_the_view_tool_by_hand(run):
  agent, tasks, traj = run["agent"], run["tasks"], run["traj"]
  task = jax.tree.map(lambda x: jnp.asarray(x[0]), tasks)
  obs, state = think3d.reset(jax.random.PRNGKey(0), task, agent.params)
  np.testing.assert_array_equal(traj.images[0, :VIEWS], obs.input_images)
  assert traj.num_prompt_images == VIEWS
  for t, (camera, azimuth, elevation, ego) in enumerate(run["views"]):
    action = think3d.Think3DAction.view(camera - 1, azimuth, elevation, "ego" if ego else "global")
    obs, state, _, _, info = think3d.step(jax.random.PRNGKey(0), state, action, agent.params)
    assert not info["invalid"]
    np.testing.assert_array_equal(traj.images[0, VIEWS + t], obs.image)
    np.testing.assert_allclose(traj.observation_numbers[0, t + 1],
                               [camera, azimuth, elevation, 1 - t])
  # Episode 0 answers B correctly: accuracy + format. Episode 1 names camera 6 of 4 (the
  # grammar allows 8): the environment rejects it (the view does not change) and the
  # answer A is wrong.
  np.testing.assert_allclose(traj.reward, [2.0, 1.0])
  assert traj.env_invalid[1, 0] and not traj.env_invalid[0].any()
  np.testing.assert_array_equal(traj.images[1, VIEWS], traj.images[1, 0])


def test_messages_are_stage_aware_and_number_the_camera_as_an_integer(run):
  """After a view: the views left and 'call again or answer'; before the last turn:
  'answer now, no tools'; after a rejected request: the rejection (the public code's
  continuation prompts, in short)."""
  traj, tok, template = run["traj"], run["tok"], run["template"]
  assert traj.observation_variant[0, :2].tolist() == [agents.THINK3D_INTERMEDIATE,
                                                      agents.THINK3D_FINAL]
  assert traj.observation_variant[1, 0] == agents.THINK3D_REJECTED
  pieces = {i: tok.decode([i]) for i in range(len(tok))}

  def message(b, t):  # the attended text between turn t's reply and turn t + 1
    start = traj.turn_end[t]
    ids = traj.tokens[b, start:start + template.length]
    shown = traj.attention_mask[b, start:start + template.length]
    return "".join(pieces[i] for i in ids[shown]).replace("<|image_pad|>", "")

  assert ("View of camera 2 at azimuth -45.00, elevation 10.00. Views left: 1. Call pi3_tool"
          in message(0, 0))
  assert ("View of camera 1 at azimuth 30.50, elevation 60.00. This is the final turn: do not "
          "call pi3_tool" in message(0, 1))
  assert "The request for camera 6 at azimuth 0.00, elevation 0.00 was rejected" in message(1, 0)


def test_masked_prompt_views_are_invisible_and_the_trainer_reproduces_the_logprobs(run):
  """Episode 1's two padding views hold slots in the prompt but are masked; a forward
  pass over the trajectory as the trainer does it reproduces the sampled
  log-probabilities, and changing a masked view's pixels changes none of them."""
  traj, model = run["traj"], run["model"]
  image = model.config.image_token_id
  group = run["n_image"]
  shown = (traj.tokens[1] == image) & traj.attention_mask[1]
  prompt_len = run["mask"].shape[1]
  assert shown[:prompt_len].sum() == 2 * group and (traj.tokens[1, :prompt_len] == image).sum() \
      == VIEWS * group
  batch = TrainBatch.from_trajectory(traj)
  logp = np.asarray(token_logprobs(model, jnp.asarray(batch.tokens),
                                   jnp.asarray(batch.attention_mask), jnp.asarray(batch.images)))
  generated = np.asarray(traj.loss_mask)
  np.testing.assert_allclose(logp[generated], traj.logprobs[generated], atol=2e-4)
  scrambled = np.asarray(batch.images).copy()
  scrambled[1, 2:VIEWS] = 255 - scrambled[1, 2:VIEWS]
  again = np.asarray(token_logprobs(model, jnp.asarray(batch.tokens),
                                    jnp.asarray(batch.attention_mask), jnp.asarray(scrambled)))
  np.testing.assert_allclose(again[1][generated[1]], logp[1][generated[1]], atol=1e-5)


def test_preset_views_allow_only_the_three_public_angles():
  """The paper-era RL prompt's action space: (-45, 0), (45, 0), (0, 60)."""
  from jaxspatial.rollout import host_parse
  agent = agents.Think3DAgent(views="preset")
  tok = tiny.tokenizer()
  automaton = am.compile_token_automaton(agent.grammar, tok)
  for azimuth, elevation, ok in ((-45, 0, True), (45, 0, True), (0, 60, True), (45, 60, False),
                                 (30, 0, False), (0, 0, False)):
    turn = _view(1, azimuth, elevation, False).encode()
    assert (host_parse.parse_think3d(turn, views="preset") is not None) == ok
    state = automaton.grammar.dfa.walk(turn)
    assert bool(automaton.grammar.dfa.accepting[state]) == ok, (azimuth, elevation)
