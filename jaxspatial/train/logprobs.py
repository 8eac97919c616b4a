"""Log-probabilities of a trajectory's tokens under a model: one forward pass over the
rollout's slot layout (left-padded prompt, turns, observation messages with their views)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


Array = jax.Array


def token_logprobs(model, tokens_BxS: Array, attention_mask_BxS: Array,
                   images_BxKxHxWx3: Array | None = None, temperature: float = 1.0,
                   with_entropy: bool = False):
  """[B, S] log p(token_j | tokens_<j) (0 at j = 0) at `temperature` (as the rollout
  sampled), and the entropy of each position's distribution when asked."""
  if images_BxKxHxWx3 is not None:
    pixels, grids, sequence_grids = model.vision_inputs(images_BxKxHxWx3)
    # By row: a batch whose episodes all stopped early holds views its tokens never show.
    logits = model(tokens_BxS, attention_mask_BxS, pixels, grids, sequence_grids,
                   images_by_row=True)
  else:
    logits = model(tokens_BxS, attention_mask_BxS)
  logits = logits[:, :-1].astype(jnp.float32) / (temperature if temperature > 0 else 1.0)
  logp_all = jax.nn.log_softmax(logits, -1)
  logp = jnp.take_along_axis(logp_all, tokens_BxS[:, 1:, None], -1)[..., 0]
  logp = jnp.pad(logp, ((0, 0), (1, 0)))
  if not with_entropy:
    return logp
  entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, -1)
  return logp, jnp.pad(entropy, ((0, 0), (1, 0)))
