"""Row keys (`rules.row_keys`: a key per row, [B, 2]): a row samples the same episode
whatever rows share its batch, so an evaluation's seeds run as one group-shared rollout
(each question's prompt prefilled once) and equal separate per-seed passes, and a batch
in another order gives each row its own episode back."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxspatial.envs import act3d
from jaxspatial.rollout import agents, episode, rules
from tests.rollout.tiny_act3d import act3d_policy

QUESTIONS, SEEDS = 2, (0, 5, 9)
QUESTION_IDS = [1234567, 42]   # stable per question (recipes.benchmark_run.question_key)
AGENT = agents.Act3DAgent(act3d.Act3DParams(width=56, height=56, grounding_min_pixels=5,
                                            max_interactions=1))


def test_seeds_as_one_group_equal_per_seed_passes_and_any_batch_order():
  p = act3d_policy(AGENT, "qwen2_5_vl", 4, QUESTIONS, 8)
  tok = p.tok
  config = episode.RolloutConfig(max_turns=2, max_turn_tokens=32, pad_token=tok.pad_token_id,
                                 eos_tokens=(tok.convert_tokens_to_ids("<|im_end|>"),),
                                 temperature=1.0)
  run = episode.compile_rollout(AGENT, p.template, config)
  inputs = lambda tasks, ids, mask: (p.model, p.automaton, tasks, jnp.asarray(ids),
                                     jnp.asarray(mask))
  passes = [jax.device_get(run(*inputs(p.tasks, p.ids, p.mask),
                               rules.row_keys(seed, QUESTION_IDS))) for seed in SEEDS]

  # Every seed of a question in one rollout, its prompt prefilled once: row (q, s).
  group = len(SEEDS)
  repeat = lambda x: np.repeat(np.asarray(x), group, axis=0)
  keys = jnp.stack([rules.row_keys(seed, QUESTION_IDS) for seed in SEEDS], 1).reshape(-1, 2)
  grouped = jax.device_get(episode.compile_rollout(AGENT, p.template, config, group=group)(
      *inputs(jax.tree.map(repeat, p.tasks), repeat(p.ids), repeat(p.mask)), keys))
  # Row (q, s) of the group against row q of seed s's pass, field by field; turn_start /
  # turn_end are the batch's turn boundaries in the cache ([T], the longest row's), so
  # they go with the batch, and each row's tokens and masks are compared in its own slots.
  rows = lambda field: jax.tree.map(
      lambda *x: np.stack(x, 1).reshape((QUESTIONS * group,) + x[0].shape[1:]),
      *[getattr(t, field) for t in passes])
  in_slots = ("tokens", "attention_mask", "loss_mask", "logprobs", "turn_start", "turn_end")
  for field in dataclasses.fields(grouped):
    if field.name not in in_slots:
      jax.tree.map(lambda got, want, name=field.name: np.testing.assert_array_equal(
          got, want, name), getattr(grouped, field.name), rows(field.name))
  for b in range(QUESTIONS * group):
    q, s = divmod(b, group)
    want, got = passes[s], grouped
    for t in range(2):
      n = int(want.turn_length[q, t])
      slots = lambda traj, row: slice(int(traj.turn_start[t]), int(traj.turn_start[t]) + n)
      np.testing.assert_array_equal(got.tokens[b, slots(got, b)], want.tokens[q, slots(want, q)])
      np.testing.assert_allclose(got.logprobs[b, slots(got, b)],
                                 want.logprobs[q, slots(want, q)], rtol=1e-5, atol=1e-5)
  assert len({bytes(rows("answer")[b]) for b in range(group)}) > 1 or len(
      {bytes(t.tokens[0]) for t in passes}) > 1  # the seeds sampled apart

  # The batch reversed, each row with its own key: each row's episode comes back.
  flip = lambda x: np.asarray(x)[::-1]
  reversed_run = jax.device_get(run(*inputs(jax.tree.map(flip, p.tasks), flip(p.ids),
                                            flip(p.mask)),
                                    rules.row_keys(SEEDS[0], QUESTION_IDS[::-1])))
  jax.tree.map(lambda got, want: np.testing.assert_array_equal(got, want[::-1]),
               (reversed_run.tokens, reversed_run.answer, reversed_run.reward),
               (passes[0].tokens, passes[0].answer, passes[0].reward))
