"""A scripted PERIA episode through the compiled loop equals the image tools applied by hand,
and its reward follows PERIA's format and correctness rules."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from data_pipelines.synthetic import episodes
from jaxspatial.envs import image_tools, peria
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.rollout import agents, automaton as am, episode, observation, prompts, tiny


def _call(tool, image, box):
  return ('<think>t</think><action>{"name": "' + tool + '", "arguments": {"image": '
          f'{image}, "bbox": [{", ".join(str(b) for b in box)}]}}}}</action>')


def test_scripted_peria_episode_equals_the_tools_by_hand():
  params = peria.PeriaParams(width=56, height=56, max_images=3, max_turns=4)
  agent = agents.PeriaAgent(params)
  tok = tiny.tokenizer()
  model = Qwen25VL(tiny.model_config(tok), rngs=nnx.Rngs(1))
  automaton = am.compile_token_automaton(agent.grammar, tok, model.config.text.vocab_size)
  n_image = episode.image_tokens(model, agent.image_size)
  template = observation.compile_template(tok, agent.observation, n_image)
  assert template.integers == (True,)
  tasks, _ = episodes.act3d_tasks(4, seed=4, points=4000)
  tasks = tasks.replace(answer_choice=np.asarray([1, -1, -1, 0], np.int32))
  ids, mask = prompts.left_padded(tok, [prompts.chat_prompt("s", "q", n_image)] * 4)
  config = episode.RolloutConfig(max_turns=4, max_turn_tokens=64, pad_token=tok.pad_token_id)
  answer_name = bytes(np.asarray(tasks.answer_ids[1])[np.asarray(tasks.answer_ids[1]) >= 0]
                      .astype(np.uint8).tolist()).decode()
  calls = [("image_crop", 0, (250, 250, 750, 750)), ("bounding_box", 1, (100, 200, 900, 800)),
           ("draw_line", 2, (0, 0, 1000, 1000))]  # the list (3 images) is full by then
  scripts = [
      [_call(*c) for c in calls] + ["<think>ok</think><answer>B</answer>"],
      [_call("image_highlight", 2, (0, 0, 10, 10)),  # no image 2 yet: invalid
       f"<think>ok</think><answer>{answer_name}</answer>"],
      [_call("image_crop", 0, (0, 0, 500, 500))] * 4,   # truncated: calls, no answer
      ["<think>ok</think><answer>B</answer>"],          # wrong letter (truth A)
  ]
  forced = episode.forced_tokens(tok, scripts, config)
  run = episode.compile_rollout(agent, template, config)
  traj = jax.device_get(run(model, automaton, tasks, jnp.asarray(ids), jnp.asarray(mask),
                            jax.random.PRNGKey(0), jnp.asarray(forced)))

  task = jax.tree.map(lambda x: jnp.asarray(x[0]), tasks)
  obs, state = peria.reset(jax.random.PRNGKey(0), task, params)
  np.testing.assert_array_equal(traj.images[0, 0], obs.image)
  crop, ok = image_tools.image_crop(obs.image, (250, 250, 750, 750), 56, 56, scale=1000)
  assert ok
  boxed, ok = image_tools.bounding_box(crop, (100, 200, 900, 800), scale=1000)
  assert ok
  # The crop's bilinear weights fuse differently inside the compiled loop: a level of rounding.
  same = lambda a, b: np.testing.assert_allclose(np.int32(a), np.int32(b), atol=1)
  for t, (tool, image, box) in enumerate(calls):
    action = peria.PeriaAction.create(peria.TOOL, peria.TOOLS.index(tool), image, box)
    obs, state, _, _, info = peria.step(jax.random.PRNGKey(0), state, action, params)
    same(traj.images[0, t + 1], obs.image)
    assert traj.observation_numbers[0, t + 1, 0] == (t + 1 if t < 2 else -1)
    assert bool(info["invalid"]) == (t == 2)
  same(traj.images[0, 1], crop)
  same(traj.images[0, 2], boxed)
  assert (boxed != crop).any() and (np.abs(np.int32(crop) - np.int32(traj.images[0, 0])) > 8).any()
  assert list(traj.env_invalid[0, :3]) == [False, False, True]
  assert traj.env_invalid[1, 0]
  # format + correct: +1 +1 (letter B); +1 +1 (the phrase); 0 + 0 (truncated); +1 + 0.
  np.testing.assert_allclose(traj.reward, [2.0, 2.0, 0.0, 1.0])
  np.testing.assert_allclose(traj.reward_components["interactions"], [3, 1, 4, 0])
