"""Advantages: GRPO group normalisation, RLOO, and PERIA's OR-GIGPO step-level credit.

Rewards come grouped as [P, G]: P prompts, G rollouts each.

OR-GIGPO (PERIA, section 4 of ../shared/reference/peria.md):
  A = A_E + omega * A_S
  A_E: GRPO over the G episodes of a prompt.
  A_S: for step t of rollout i, its step group is every step (of any rollout of the same
       prompt) whose observation matches o_t: images by an exact hash of their pixels,
       texts by 2M / (|a| + |b|) >= delta with M the longest common subsequence of token
       ids. The group's discounted returns R_t = sum_k gamma^(k-t) r_k are normalised;
       a step whose group is itself alone, or whose group's returns are all equal, gets
       A_S = 0 (as `group_normalize`). Plain GiGPO is delta = 1.
The step group is the set of steps matching *this* step's observation (the paper's
G_S(q, o)), so it is order-independent; greedy clustering (the verl-agent skeleton)
is not.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array


def group_normalize(rewards_PxG: Array, ddof: int = 1, eps: float = 1e-6,
                    mean_only: bool = False, singleton: str = "zero") -> Array:
  """(r - mean) / (std + eps) within each group (row).

  A group of one gets 0 (`singleton="zero"`) or its raw score (`"passthrough"`,
  verl's mean 0 / std 1). A group whose rewards are all equal gets 0.
  """
  size = rewards_PxG.shape[-1]
  mean = jnp.mean(rewards_PxG, axis=-1, keepdims=True)
  centred = rewards_PxG - mean
  if size == 1:
    return jnp.zeros_like(rewards_PxG) if singleton == "zero" else rewards_PxG
  # Equal rewards give exactly 0: float rounding of the mean must not turn into a signal
  # once divided by a tiny std.
  all_equal = jnp.max(rewards_PxG, axis=-1, keepdims=True) == jnp.min(rewards_PxG, axis=-1,
                                                                        keepdims=True)
  centred = jnp.where(all_equal, 0.0, centred)
  if mean_only:
    return centred
  std = jnp.sqrt(jnp.sum(centred ** 2, axis=-1, keepdims=True) / (size - ddof))
  return centred / (std + eps)


def rloo_advantages(rewards_PxG: Array) -> Array:
  """Leave-one-out baseline: r_i - mean of the other rollouts of the prompt."""
  size = rewards_PxG.shape[-1]
  if size < 2:
    raise ValueError(f"rloo_advantages: needs at least 2 rollouts per prompt, got {size}")
  total = jnp.sum(rewards_PxG, axis=-1, keepdims=True)
  return rewards_PxG - (total - rewards_PxG) / (size - 1)


def discounted_returns(step_rewards_PxGxT: Array, valid_PxGxT: Array, gamma: float) -> Array:
  """R_t = sum_{k >= t} gamma^(k - t) r_k over the valid steps of each rollout."""
  rewards = jnp.where(valid_PxGxT, step_rewards_PxGxT, 0.0)

  def back(carry, r):
    carry = r + gamma * carry
    return carry, carry

  _, returns = lax.scan(back, jnp.zeros(rewards.shape[:-1], rewards.dtype),
                        jnp.moveaxis(rewards, -1, 0), reverse=True)
  return jnp.where(valid_PxGxT, jnp.moveaxis(returns, 0, -1), 0.0)


def lcs_length(a_ids: Array, a_len: Array, b_ids: Array, b_len: Array) -> Array:
  """Longest common subsequence of a[:a_len] and b[:b_len] (token ids).

  Bit-parallel (Crochemore et al. 2001): b's positions are bits of a few uint32 words;
  for each token of a, with M the bits where b equals it and U = V & M,
  V <- (V + U) | (V - U), and the LCS is the number of zero bits of V within b_len.
  La sequential steps of a few word operations instead of La * Lb table cells; the
  multi-word addition carries by hand (no 64-bit mode). Tokens past a length never match.
  """
  a_ids, b_ids = jnp.asarray(a_ids), jnp.asarray(b_ids)
  len_a, len_b = a_ids.shape[0], b_ids.shape[0]
  words = max(1, -(-len_b // 32))
  padded_b = jnp.pad(b_ids, (0, words * 32 - len_b))
  b_valid = jnp.arange(words * 32) < b_len
  a_valid = jnp.arange(len_a) < a_len
  equal = (a_ids[:, None] == padded_b[None, :]) & b_valid[None, :] & a_valid[:, None]
  powers = jnp.left_shift(jnp.uint32(1), jnp.arange(32, dtype=jnp.uint32))
  match_bits = jnp.sum(equal.reshape(len_a, words, 32).astype(jnp.uint32) * powers, axis=-1,
                       dtype=jnp.uint32)  # [La, W]

  def add(x, y):  # multi-word x + y, carrying from the low word up
    out, carry = [], jnp.uint32(0)
    for w in range(words):
      partial = x[w] + y[w]
      total = partial + carry
      carry = ((partial < x[w]) | (total < partial)).astype(jnp.uint32)
      out.append(total)
    return jnp.stack(out)

  def step(v, m):
    u = v & m
    return add(v, u) | (v & ~m), None

  ones = jnp.full((words,), jnp.uint32(0xFFFFFFFF))
  v, _ = lax.scan(step, ones, match_bits)
  in_b = jnp.sum(b_valid.reshape(words, 32).astype(jnp.uint32) * powers, axis=-1,
                 dtype=jnp.uint32)
  return jnp.sum(lax.population_count(~v & in_b)).astype(jnp.int32)


def text_similarity(a_ids: Array, a_len: Array, b_ids: Array, b_len: Array) -> Array:
  """2M / (|a| + |b|), M the LCS length; 1 for two empty texts."""
  total = a_len + b_len
  return jnp.where(total > 0, 2.0 * lcs_length(a_ids, a_len, b_ids, b_len)
                   / jnp.maximum(total, 1), 1.0)


def image_hash(image_HxWxC: Array) -> Array:
  """An exact 32-bit hash of an image's pixels on device: equal images always collide,
  different ones almost never (a polynomial hash mod 2^32 with an odd base, computed in
  parallel rather than byte after byte, so hashing each rollout view costs little)."""
  data = image_HxWxC.reshape(-1).astype(jnp.uint32)
  powers = jnp.cumprod(jnp.full(data.shape, 16777619, jnp.uint32))  # base^1 .. base^n
  return jnp.sum((data + jnp.uint32(1)) * powers[::-1], dtype=jnp.uint32) ^ jnp.uint32(
      data.shape[0])


def step_match_matrix(image_hashes_GxT: Array | None, text_ids_GxTxN: Array | None,
                      text_lens_GxT: Array | None, valid_GxT: Array, delta: float) -> Array:
  """[G*T, G*T] bool: steps of one prompt whose observations match."""
  flat_valid = valid_GxT.reshape(-1)
  match = flat_valid[:, None] & flat_valid[None, :]
  if image_hashes_GxT is not None:
    hashes = image_hashes_GxT.reshape(-1)
    match &= hashes[:, None] == hashes[None, :]
  if text_ids_GxTxN is not None:
    ids = text_ids_GxTxN.reshape((-1,) + text_ids_GxTxN.shape[2:])
    lens = text_lens_GxT.reshape(-1)
    if delta >= 1.0:  # exact matching: equal lengths and equal tokens
      positions = jnp.arange(ids.shape[-1])
      masked = jnp.where(positions < lens[:, None], ids, -1)
      same = jnp.all(masked[:, None] == masked[None, :], axis=-1) & (lens[:, None] == lens[None])
    else:
      pair = jax.vmap(jax.vmap(text_similarity, (None, None, 0, 0)), (0, 0, None, None))
      same = pair(ids, lens, ids, lens) >= delta
    match &= same
  return match


def or_gigpo_advantages(episode_rewards_PxG: Array, step_rewards_PxGxT: Array,
                        step_valid_PxGxT: Array, image_hashes_PxGxT: Array | None = None,
                        text_ids_PxGxTxN: Array | None = None,
                        text_lens_PxGxT: Array | None = None, *, gamma: float = 0.99,
                        omega: float = 1.0, delta: float = 0.9, ddof: int = 1,
                        eps: float = 1e-6) -> Array:
  """Per-step advantages [P, G, T] = A_E + omega * A_S (0 on invalid steps).

  Observations are the ones each step produced: image hashes, text token ids, or both
  (then both must match).
  """
  if image_hashes_PxGxT is None and text_ids_PxGxTxN is None:
    raise ValueError("or_gigpo_advantages: give image hashes, text observations or both")
  episode = group_normalize(episode_rewards_PxG, ddof=ddof, eps=eps)
  returns = discounted_returns(step_rewards_PxGxT, step_valid_PxGxT, gamma)

  def per_prompt(returns_GxT, valid_GxT, hashes, ids, lens):
    match = step_match_matrix(hashes, ids, lens, valid_GxT, delta)
    values = returns_GxT.reshape(-1)
    members = jnp.where(match, values[None, :], 0.0)
    count = jnp.sum(match, axis=-1).astype(values.dtype)
    # Group sums elementwise, never as `match @ values`: a matmul runs in bf16 passes on TPU
    # and TF32 on H100/H200 by default, and its rounding would become a signal.
    mean = jnp.sum(members, axis=-1) / jnp.maximum(count, 1.0)
    highest = jnp.max(jnp.where(match, values[None, :], -jnp.inf), axis=-1)
    lowest = jnp.min(jnp.where(match, values[None, :], jnp.inf), axis=-1)
    centred = jnp.where(highest == lowest, 0.0, values - mean)  # equal returns: exactly 0
    var = jnp.sum(jnp.where(match, (values[None, :] - mean[:, None]) ** 2, 0.0),
                  axis=-1) / jnp.maximum(count - ddof, 1.0)
    step_adv = jnp.where(count > 1, centred / (jnp.sqrt(var) + eps), 0.0)
    return step_adv.reshape(returns_GxT.shape)

  none_or = lambda x: 0 if x is not None else None
  step = jax.vmap(per_prompt, in_axes=(0, 0, none_or(image_hashes_PxGxT),
                                       none_or(text_ids_PxGxTxN), none_or(text_lens_PxGxT)))(
      returns, step_valid_PxGxT, image_hashes_PxGxT, text_ids_PxGxTxN, text_lens_PxGxT)
  return jnp.where(step_valid_PxGxT, episode[..., None] + omega * step, 0.0)


def token_advantages(step_advantages_BxT: Array, token_step_BxL: Array) -> Array:
  """Each generated token gets its step's advantage; token_step is -1 on prompt and
  observation tokens, which get 0."""
  gathered = jnp.take_along_axis(step_advantages_BxT, jnp.maximum(token_step_BxL, 0), axis=-1)
  return jnp.where(token_step_BxL >= 0, gathered, 0.0)
