"""3DThinker stage 1: SFT with the latent-alignment loss, on the trainer's `train_step`.

Per sample, `ce_weight * CE + alignment_weight * alignment`: CE is the mean over the
sample's target tokens (latent pads excluded, as the reference's labels); alignment is
the mean over its images' tokens of the squared error summed over channels between the
projected training-mode latents and the target features (detached). The batch loss is the
mean over samples: the reference trains with batch 1 per device and averages the devices'
and accumulation steps' losses, which this equals, micro-batches included.

`stage1_batch` lays out examples: the left-padded prompt (K images), then the target
(`<output_3D>` expanded to the latent block, think, answer, end of turn), right-padded.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxspatial.models.latent3d import LATENT_PAD, expand_output_3d, latent_positions
from jaxspatial.models.projector3d import alignment_loss
from jaxspatial.train.losses import register_loss

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Stage1Config:
  start_token: int                 # <|latent_start|>
  pad_token: int                   # <|latent_pad|>
  num_latents: int = 12
  ce_weight: float = 0.1
  alignment_weight: float = 0.0005
  mode: str = "mse"                # or "cosine" (both L2-normalised first)


def stage1_terms(policy, batch, config: Stage1Config):
  """Per sample: (cross-entropy [B], alignment [B], predicted features [B, K, F, H])."""
  logits, hidden, embeds = policy.teacher_forced(batch.tokens, batch.attention_mask,
                                                 batch.images)
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), -1)
  logp = jnp.take_along_axis(logp, batch.tokens[:, 1:, None], -1)[..., 0]
  mask = batch.loss_mask[:, 1:].astype(jnp.float32)
  cross_entropy = -jnp.sum(logp * mask, -1) / jnp.maximum(jnp.sum(mask, -1), 1.0)
  positions, _ = latent_positions(batch.tokens, config.start_token, config.num_latents)
  latents = jnp.take_along_axis(hidden, positions[..., None], axis=1)
  images = policy.image_embeddings(embeds, batch.tokens, batch.images.shape[1])
  predicted = policy.project(latents, images)
  alignment = jax.vmap(lambda p, t: alignment_loss(p, t, config.mode))(predicted,
                                                                       batch.features)
  return cross_entropy, alignment, predicted


@register_loss("thinker3d_stage1")
def stage1_objective(policy, batch, config):
  """The registered objective: `StepConfig.options` is the Stage1Config; the model is a
  Thinker3DPolicy and the batch carries target features."""
  if not isinstance(config.options, Stage1Config) or batch.features is None:
    raise ValueError("StepConfig: objective 'thinker3d_stage1' needs options=Stage1Config(...) "
                     "and a batch with target features")
  return stage1_loss_parts(policy, batch, config.options)


def stage1_loss_parts(policy, batch, config: Stage1Config):
  """(loss sum over samples, (samples, metrics)) for `train_step`'s accumulation."""
  cross_entropy, alignment, _ = stage1_terms(policy, batch, config)
  per_sample = config.ce_weight * cross_entropy + config.alignment_weight * alignment
  count = jnp.asarray(per_sample.shape[0], jnp.float32)
  return jnp.sum(per_sample), (count, {"cross_entropy": jnp.mean(cross_entropy),
                                       "alignment": jnp.mean(alignment)})


def stage1_batch(tokenizer, prompts: list[str], targets: list[str], num_latents: int = 12,
                 target_length: int | None = None):
  """(tokens, attention_mask, loss_mask) [B, L + T] int32 / bool: left-padded prompts, then
  targets holding one `<output_3D>` each, expanded and ended with `<|im_end|>`. The loss
  mask covers the target tokens except the latent pads."""
  # Imported here: importing jaxspatial.rollout at module load touches the XLA backend,
  # which must stay untouched until jax.distributed.initialize has run.
  from jaxspatial.rollout.prompts import left_padded  # pylint: disable=import-outside-toplevel
  ids, mask = left_padded(tokenizer, prompts)
  encoded = [tokenizer.encode(expand_output_3d(t, num_latents) + "<|im_end|>",
                              add_special_tokens=False) for t in targets]
  longest = max(len(e) for e in encoded)
  target_length = target_length or longest
  if longest > target_length:
    raise ValueError(f"stage1_batch: a target has {longest} tokens, more than "
                     f"target_length {target_length}")
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  latent_pad = tokenizer.convert_tokens_to_ids(LATENT_PAD)
  out = np.full((len(prompts), target_length), pad, np.int32)
  used = np.zeros((len(prompts), target_length), bool)
  for row, e in enumerate(encoded):
    out[row, :len(e)] = e
    used[row, :len(e)] = True
  tokens = np.concatenate([ids, out], 1)
  attention = np.concatenate([mask, used], 1)
  loss = np.concatenate([np.zeros_like(mask), used & (out != latent_pad)], 1)
  return tokens, attention, loss

