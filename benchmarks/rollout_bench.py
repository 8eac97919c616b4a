"""Compiled multi-turn rollouts against a host loop in the style of agent frameworks.

    python -m benchmarks.rollout_bench                      # batch 1, 8, 32 (CPU)
    python -m benchmarks.rollout_bench --batches 8 64 256   # on a GPU

Cost on a 2-core CPU: about 4 minutes. Both sides run the same tiny Qwen2.5-VL policy on
the same Act3D episodes: synthetic rooms, 112x84 renders (12 vision tokens each), four
turns of up to 48 tokens, three camera moves then an answer, scripted through forced
tokens so every episode plays all its turns (the policy still runs on every token, and
its log-probabilities are recorded). The compiled side is `episode.compile_rollout`: one
XLA program from prompt to reward. The host side is `host_loop.host_rollout`: a jitted
decode step per token with stop strings checked on the host, regex parsing, the
environment stepped from Python per episode, rewards from string rules. Episodes per
second and generated tokens per second; the target on CPU is 5x at batch 8.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks.timing import timed
from data_pipelines.synthetic import episodes
from jaxspatial.envs import act3d
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.rollout import agents, token_table as am, episode, host_loop, observation, tiny

def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
  parser.add_argument("--turns", type=int, default=4)
  parser.add_argument("--turn-tokens", type=int, default=48)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--skip-host-above", type=int, default=64,
                      help="batches above this run compiled only (the host loop is slow)")
  args = parser.parse_args()

  tok = tiny.tokenizer()
  model = Qwen25VL(tiny.model_config(tok), rngs=nnx.Rngs(0))
  agent = agents.Act3DAgent(act3d.Act3DParams(width=112, height=84, grounding_min_pixels=5,
                                              max_interactions=args.turns - 1))
  automaton = am.compile_token_automaton(agent.grammar, tok, model.config.text.vocab_size)
  n_image = episode.image_tokens(model, agent.image_size)
  template = observation.compile_template(tok, agent.observation, n_image)
  config = episode.RolloutConfig(
      max_turns=args.turns, max_turn_tokens=args.turn_tokens, temperature=1.0,
      eos_tokens=(tok.convert_tokens_to_ids("<|im_end|>"),), pad_token=tok.pad_token_id)
  run = episode.compile_rollout(agent, template, config)
  print(f"device: {jax.devices()[0].device_kind}; tiny policy, Act3D {agent.image_size[1]}x"
        f"{agent.image_size[0]} views ({n_image} vision tokens), {args.turns} turns x "
        f"{args.turn_tokens} tokens")
  print(f"{'batch':>5} | {'compiled ep/s':>13} | {'host ep/s':>9} | {'compiled tok/s':>14} | "
        f"{'host tok/s':>10} | {'speed-up':>8} | compile s")
  for batch in args.batches:
    tasks, questions = episodes.act3d_tasks(batch, seed=1)
    ids, mask = episodes.act3d_prompts(tok, questions, n_image)
    forced = jnp.asarray(episode.forced_tokens(tok, tiny.scripted_act3d_turns(batch, args.turns), config))
    tasks_d, ids_d, mask_d = jax.device_put((tasks, jnp.asarray(ids), jnp.asarray(mask)))
    key = jax.random.PRNGKey(0)
    start = time.perf_counter()
    traj = jax.block_until_ready(run(model, automaton, tasks_d, ids_d, mask_d, key, forced))
    compile_s = time.perf_counter() - start
    tokens = float(np.asarray(traj.loss_mask).sum())
    assert np.asarray(traj.turn_active).all(), "the scripted episodes should play every turn"
    compiled_s = timed(lambda: run(model, automaton, tasks_d, ids_d, mask_d, key, forced),
                       args.repeats)
    if batch <= args.skip_host_above:
      host_s = timed(lambda: host_loop.host_rollout(model, agent, tok, template, tasks, ids,
                                                    mask, key, config, forced)["reward"],
                     max(1, args.repeats - 1))
      host_eps, host_tps = f"{batch / host_s:9.2f}", f"{tokens / host_s:10.0f}"
      speedup = f"{host_s / compiled_s:7.1f}x"
    else:
      host_eps, host_tps, speedup = f"{'-':>9}", f"{'-':>10}", f"{'-':>8}"
    print(f"{batch:5d} | {batch / compiled_s:13.2f} | {host_eps} | {tokens / compiled_s:14.0f} | "
          f"{host_tps} | {speedup} | {compile_s:.1f}")


if __name__ == "__main__":
  main()
