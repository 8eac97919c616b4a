"""A scripted Think3D episode through the compiled loop equals the view tool stepped by hand."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from data_pipelines.synthetic import episodes
from jaxspatial.envs import think3d
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.rollout import agents, automaton as am, episode, observation, prompts, tiny


def _view(camera, azimuth, elevation, ego):
  return ('<think>v</think><tool_call>{"name": "pi3_tool", "arguments": '
          f'{{"rotation_reference_camera": {camera}, "azimuth_angle": {azimuth}, '
          f'"elevation_angle": {elevation}, "camera_view": {str(ego).lower()}}}}}</tool_call>')


def test_scripted_think3d_episode_equals_the_view_tool_by_hand():
  agent = agents.Think3DAgent(think3d.Think3DParams(width=56, height=56, max_rounds=2))
  tok = tiny.tokenizer()
  model = Qwen25VL(tiny.model_config(tok), rngs=nnx.Rngs(1))
  automaton = am.compile_token_automaton(agent.grammar, tok, model.config.text.vocab_size)
  n_image = episode.image_tokens(model, agent.image_size)
  template = observation.compile_template(tok, agent.observation, n_image)
  tasks, _ = episodes.act3d_tasks(2, seed=4)
  tasks = tasks.replace(answer_choice=np.asarray([1, 2], np.int32))
  texts = [prompts.chat_prompt(prompts.THINK3D_SYSTEM, "Which is left? (A) a (B) b (C) c",
                               n_image)] * 2
  ids, mask = prompts.left_padded(tok, texts)
  config = episode.RolloutConfig(max_turns=3, max_turn_tokens=64, temperature=1.0,
                                 pad_token=tok.pad_token_id)
  views = [(2, -45, 10, True), (1, 30.5, 60, False)]
  scripts = [[_view(*views[0]), _view(*views[1]), "<think>ok</think><answer>(B) b</answer>"],
             [_view(6, 0, 0, True), "<think>ok</think><answer>A</answer>"]]  # 6 of 4 cameras
  forced = episode.forced_tokens(tok, scripts, config)
  run = episode.compile_rollout(agent, template, config)
  traj = jax.device_get(run(model, automaton, tasks, jnp.asarray(ids), jnp.asarray(mask),
                            jax.random.PRNGKey(0), jnp.asarray(forced)))
  task = jax.tree.map(lambda x: jnp.asarray(x[0]), tasks)
  obs, state = think3d.reset(jax.random.PRNGKey(0), task, agent.params)
  np.testing.assert_array_equal(traj.images[0, 0], obs.image)
  for t, (camera, azimuth, elevation, ego) in enumerate(views):
    action = think3d.Think3DAction.view(camera - 1, azimuth, elevation, "ego" if ego else "global")
    obs, state, _, _, info = think3d.step(jax.random.PRNGKey(0), state, action, agent.params)
    assert not info["invalid"]
    np.testing.assert_array_equal(traj.images[0, t + 1], obs.image)
    np.testing.assert_allclose(traj.observation_numbers[0, t + 1], [camera, azimuth, elevation])
  # Episode 0 answers B correctly: accuracy + format. Episode 1 names camera 6 of 4 (the grammar allows 8):
  # the environment rejects it (the view does not change) and the answer A is wrong.
  np.testing.assert_allclose(traj.reward, [2.0, 1.0])
  assert traj.env_invalid[1, 0] and not traj.env_invalid[0].any()
  np.testing.assert_array_equal(traj.images[1, 1], traj.images[1, 0])
