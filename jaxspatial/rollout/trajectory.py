"""The fixed-shape record of a batch of episodes, as the trainer consumes it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

Array = jax.Array


@struct.dataclass
class Trajectory:
  """B episodes of at most T turns, laid out in the KV cache's S slots.

  tokens, attention_mask, loss_mask, logprobs: [B, S]. Slots hold the left-padded prompt,
    then per turn its decode slots (as many as the batch's longest reply of that turn, at
    most `max_turn_tokens`; the unused ones at the end of the cache) and one observation
    message. Attention
    mask 0 marks padding and slots an episode did not use; loss mask 1 marks the tokens
    the policy generated (observations and prompts are 0). logprobs are those of the
    distribution sampled from (after temperature, top-k / top-p and, in constrained mode,
    the grammar mask), 0 elsewhere. M-RoPE positions follow from the tokens, the attention
    mask and the image grids (`model.position_ids`), as in the rollout.
  images [B, N + T, H, W, 3] uint8: the prompt's N views, then the view after each turn
    (only those with `image_given` were shown). The tokens always hold N + T - 1 image
    groups (the prompt's and T - 1 messages, masked where not shown), which are
    images[:, :-1]: a forward pass takes those (`jaxspatial.train.token_logprobs`).
  turn_start, turn_end [T]: each turn's decode slots are turn_start <= slot < turn_end
    (shared by the batch; turns are packed, so a turn spans the batch's longest reply);
    0, 0 for turns no episode reached.
  turn_length, turn_active, turn_valid, turn_answer, env_invalid [B, T]: tokens generated,
    whether the episode was still running, the turn was well formed, it answered, the
    environment rejected the call.
  action_values, action_present [B, T, F]: the parsed fields (grammar order).
  observation_numbers [B, T + 1, K]: the numbers each observation message carried (Act3D:
    camera position and look-at point), the first view's included.
  observation_variant [B, T]: the message variant shown after each turn (the template's).
  observation_hashes [B, T + 1] uint32: the key of the observation each turn produced
    (OR-GIGPO's step groups): the hash of the view a call produced; distinct constant keys
    for answers, malformed turns and rejected calls (`episode.ANSWER_KEY`, ...); 0 for turns
    not taken. Index 0 is the first prompt view's hash.
  observation_text, observation_text_length [B, T, W], [B, T]: a host tool's text result
    after each turn (its token ids, first `length` real; W is the template's text slot,
    0 without one): OR-GIGPO matches text steps by their similarity.
  answer [B, A] int32: the answer's bytes (-1 padded), as scored.
  reward [B], reward_components: name -> [B].
  """
  tokens: Array
  attention_mask: Array
  loss_mask: Array
  logprobs: Array
  images: Array
  image_given: Array
  turn_start: Array
  turn_end: Array
  turn_length: Array
  turn_active: Array
  turn_valid: Array
  turn_answer: Array
  env_invalid: Array
  action_values: Array
  action_present: Array
  observation_numbers: Array
  observation_variant: Array
  observation_hashes: Array
  answer: Array
  reward: Array
  reward_components: dict
  observation_text: Array = None
  observation_text_length: Array = None

  @property
  def answered(self) -> Array:
    return jnp.any(self.turn_answer, axis=-1)

  @property
  def num_prompt_images(self) -> int:
    return self.images.shape[1] - self.turn_start.shape[-1]

  @property
  def turns_used(self) -> Array:
    return jnp.sum(self.turn_active, axis=-1)

  def metrics(self) -> dict:
    """Batch means: turns used, valid-call rate (well-formed, accepted tool calls among
    turns that were not answers), answer rate, reward and its components."""
    calls = self.turn_active & ~self.turn_answer
    good_calls = calls & self.turn_valid & ~self.env_invalid
    out = {
        "turns_used": jnp.mean(self.turns_used.astype(jnp.float32)),
        "valid_call_rate": jnp.sum(good_calls) / jnp.maximum(jnp.sum(calls), 1),
        "answer_rate": jnp.mean(self.answered.astype(jnp.float32)),
        "generated_tokens": jnp.mean(jnp.sum(self.loss_mask, -1).astype(jnp.float32)),
        "reward": jnp.mean(self.reward),
    }
    out.update({f"reward/{k}": jnp.mean(v) for k, v in self.reward_components.items()})
    return out
