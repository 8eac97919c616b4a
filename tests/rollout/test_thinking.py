"""A thinking policy (Qwen3-VL-*-Thinking's chat template: replies open with "<think>\\n";
generation_config.json's stop ids) in the compiled rollout: the context is what the
template renders for the same conversation, turns stop at either stop id, and the
compiled episodes equal the host loop's."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from data_pipelines.synthetic import episodes
from jaxspatial import models
from jaxspatial.envs import act3d
from jaxspatial.envs.task import decode_text
from jaxspatial.models.qwen2_5_vl.tokenizer import save_processor
from jaxspatial.rollout import AgentRollout, agents, host_loop, prompts, tiny
from tests import chat_templates

AGENT = agents.Act3DAgent(act3d.Act3DParams(width=56, height=56, grounding_min_pixels=5,
                                            max_interactions=2))


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
  """A tiny Qwen3-VL Thinking folder, loaded as a user's checkpoint is."""
  tok = tiny.tokenizer()
  folder = tmp_path_factory.mktemp("qwen3_vl_thinking")
  model = tiny.model(tok, "qwen3_vl", seed=2)
  models.export(model, folder)
  tok.chat_template = chat_templates.THINKING
  save_processor(folder, tok, model)
  stops = chat_templates.write_generation_config(folder, tok)
  processor, loaded = models.load_policy(folder)
  tokenizer = getattr(processor, "tokenizer", processor)
  return tokenizer, loaded, models.ChatFormat.from_folder(folder, tokenizer), stops


def _call(action, distance=None):
  arguments = f'"action": "{action}"' + ("" if distance is None else f', "distance": {distance}')
  return ('<think>\nmove\n</think>\n\n<tool_call>{"name": "render_view_tool", "arguments": {'
          + arguments + '}}</tool_call>')


@pytest.mark.slow
@pytest.mark.xla_default
def test_a_thinking_policy_rollout_is_the_templates_conversation_and_the_host_loops(policy):
  tok, model, chat, stops = policy
  assert chat.prefill == "<think>\n"
  run = AgentRollout.create(AGENT, tok, model, chat=chat, max_turns=3, max_turn_tokens=40,
                            temperature=1.0)
  assert run.config.eos_tokens == tuple(stops) and run.agent.prefill == "<think>\n"
  tasks, _ = episodes.act3d_tasks(4, seed=4)
  ids, mask = run.prompts(tasks)
  image = "<|vision_start|>" + "<|image_pad|>" * run.image_tokens + "<|vision_end|>"
  for b in range(len(ids)):
    user = prompts.act3d_user_text(decode_text(tasks.question_ids[b]), tasks.scene_min[b],
                                   tasks.scene_max[b])
    rendered = tok.apply_chat_template(
        [{"role": "system", "content": prompts.ACT3D_SYSTEM},
         {"role": "user", "content": image + user}], tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n<think>\n")
    assert ids[b][mask[b]].tolist() == tok.encode(rendered, add_special_tokens=False)

  # Episode 2 stops at <|endoftext|>, generation_config.json's second stop id: its turn
  # closes there (a malformed turn ends the episode).
  halted = "<think>\nhmm<|endoftext|>"
  scripts = [[_call("turn_left", 60), _call("forward")], [_call("up"), None], [halted], [None]]
  forced = run.forced(scripts)
  key = jax.random.PRNGKey(8)
  traj = jax.device_get(run(model, tasks, key, forced=jnp.asarray(forced)))
  ref = host_loop.host_rollout(model, run.agent, tok, run.template, tasks, ids, mask, key,
                               run.config, forced)
  np.testing.assert_array_equal(traj.attention_mask, ref["attention_mask"])
  np.testing.assert_array_equal(np.where(traj.attention_mask, traj.tokens, -1),
                                np.where(ref["attention_mask"], ref["tokens"], -1))
  np.testing.assert_allclose(traj.logprobs, ref["logprobs"], atol=1e-4)
  for name in ("turn_length", "turn_valid", "turn_answer", "action_values", "action_present"):
    np.testing.assert_array_equal(getattr(traj, name), ref[name], err_msg=name)
  np.testing.assert_allclose(traj.reward, ref["reward"], atol=1e-6)

  # The forced calls parse on device after the prefill the prompt holds.
  assert traj.turn_valid[0, :2].all() and traj.turn_valid[1, 0]
  assert traj.turn_length[2, 0] == len(tok.encode("hmm<|endoftext|>", add_special_tokens=False))
  assert not traj.turn_valid[2, 0] and not traj.turn_active[2, 1:].any()

  # Episode 0 up to its last turn is the template's rendering of the same conversation:
  # the calls as assistant messages, the observations as tool results, the reply opened.
  sequence = traj.tokens[0][traj.attention_mask[0]]
  before_last = tok.decode(sequence[:len(sequence) - traj.turn_length[0, 2]],
                           skip_special_tokens=False)
  results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", before_last, re.S)
  assert len(results) == 2
  user = prompts.act3d_user_text(decode_text(tasks.question_ids[0]), tasks.scene_min[0],
                                 tasks.scene_max[0])
  conversation = [{"role": "system", "content": prompts.ACT3D_SYSTEM},
                  {"role": "user", "content": image + user},
                  {"role": "assistant", "content": _call("turn_left", 60)},
                  {"role": "tool", "content": results[0]},
                  {"role": "assistant", "content": _call("forward")},
                  {"role": "tool", "content": results[1]}]
  assert before_last == tok.apply_chat_template(conversation, tokenize=False,
                                                add_generation_prompt=True)


def test_written_turns_must_open_as_the_template_does(policy):
  tok, model, chat, _ = policy
  run = AgentRollout.create(AGENT, tok, model, chat=chat, max_turns=3, max_turn_tokens=40)
  with pytest.raises(ValueError, match="must start with it"):
    run.forced([['<tool_call>{"name": "render_view_tool"}</tool_call>']])
  plain = AgentRollout.create(AGENT, tok, model, max_turns=3, max_turn_tokens=40)
  assert plain.agent.prefill == "" and plain.config.eos_tokens == (
      tok.convert_tokens_to_ids("<|im_end|>"),)
  # Teachers write "<think>...": the same turn forces the same tokens after each opening.
  turn = _call("up")
  np.testing.assert_array_equal(
      run.forced([[turn]])[0, 0][:len(tok.encode(turn[len("<think>\n"):]))],
      tok.encode(turn[len("<think>\n"):], add_special_tokens=False))
