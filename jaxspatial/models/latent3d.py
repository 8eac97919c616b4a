"""3DThinker's latent block: special tokens, the `<output_3D>` expansion, embedding rows for
new tokens, the policy (Qwen2.5-VL + 3D projector) and where its latents are read.

Latents, training mode (teacher forcing, as the reference's stage 1): the latent slots hold
the `<|latent_pad|>` embedding; the latents are the last-layer hidden states at the
positions just before each pad (the start token and pads 1..T-1). Inference mode is the
sampler's latent mode (`SamplingConfig.latent_tokens`): after the start token each step
feeds the previous hidden state back as the next input, so latent k is the hidden state
fed into slot k: the same positions, but from fed-back inputs instead of pad embeddings.

Targets are VGGT features (the last aggregator block's tokens): `jaxspatial.perception.vggt`
extracts them on the host; on synthetic scenes, where VGGT cannot be downloaded,
`data_pipelines.synthetic.stand_in_features` computes a geometric stand-in.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspatial.models.projector3d import Projector3D, Projector3DConfig

LATENT_PAD, LATENT_START, LATENT_END = "<|latent_pad|>", "<|latent_start|>", "<|latent_end|>"
OUTPUT_3D = "<output_3D>"


def add_latent_tokens(tokenizer) -> dict[str, int]:
  """Adds the three latent tokens as special tokens; returns their ids."""
  tokenizer.add_special_tokens({"additional_special_tokens": [LATENT_PAD, LATENT_START,
                                                               LATENT_END]})
  return {t: tokenizer.convert_tokens_to_ids(t) for t in (LATENT_PAD, LATENT_START, LATENT_END)}


def expand_output_3d(text: str, num_latents: int = 12) -> str:
  """Replaces the `<output_3D>` placeholder with start + num_latents pads + end."""
  if text.count(OUTPUT_3D) != 1:
    raise ValueError(f"expand_output_3d: expected one {OUTPUT_3D} placeholder, found "
                     f"{text.count(OUTPUT_3D)} in {text[:60]!r}")
  return text.replace(OUTPUT_3D, LATENT_START + LATENT_PAD * num_latents + LATENT_END)


def latent_label_mask(input_ids_BxL: jax.Array, pad_id: int) -> jax.Array:
  """False at latent-pad positions: they take no cross-entropy (start, end and text do)."""
  return input_ids_BxL != pad_id


def grow_embeddings(text_model, vocab_size: int, *, rngs: nnx.Rngs) -> None:
  """Adds rows to the token embedding (and an untied LM head) for new tokens; existing
  rows are kept, new rows drawn like the originals' initialisation."""
  embedding = text_model.embed_tokens.embedding
  old = embedding[...]
  if vocab_size < old.shape[0]:
    raise ValueError(f"grow_embeddings: {vocab_size} is smaller than the vocabulary "
                     f"{old.shape[0]}")
  extra = vocab_size - old.shape[0]
  new_rows = jax.random.normal(rngs.params(), (extra, old.shape[1]), old.dtype) * old.std()
  embedding.set_value(jnp.concatenate([old, new_rows]))
  text_model.embed_tokens.num_embeddings = vocab_size
  if text_model.lm_head is not None:
    kernel = text_model.lm_head.kernel
    head = kernel[...]
    new_cols = jax.random.normal(rngs.params(), (head.shape[0], extra), head.dtype) * head.std()
    kernel.set_value(jnp.concatenate([head, new_cols], axis=1))
    text_model.lm_head.out_features = vocab_size


def latent_positions(tokens_BxS: jax.Array, start_id: int, num_latents: int = 12):
  """(positions [B, T], found [B]): the start token's position and the next T - 1, whose
  hidden states are the training-mode latents."""
  is_start = tokens_BxS == start_id
  first = jnp.argmax(is_start, axis=-1)
  positions = jnp.clip(first[:, None] + jnp.arange(num_latents)[None], 0,
                       tokens_BxS.shape[1] - 1)
  return positions, jnp.any(is_start, axis=-1)


def image_token_rows(x_BxSxC: jax.Array, tokens_BxS: jax.Array, image_token_id: int,
                     num_images: int, tokens_per_image: int) -> jax.Array:
  """The rows of x at each sequence's image tokens, in order, as [B, K, P, C] (every
  sequence holds K images of P tokens)."""
  count = num_images * tokens_per_image
  is_image = tokens_BxS == image_token_id
  order = jnp.argsort(~is_image, axis=-1, stable=True)[:, :count]  # image positions first
  rows = jnp.take_along_axis(x_BxSxC, order[..., None], axis=1)
  return rows.reshape(x_BxSxC.shape[0], num_images, tokens_per_image, x_BxSxC.shape[-1])


class Thinker3DPolicy(nnx.Module):
  """The policy (Qwen2.5-VL) with 3DThinker's 3D projector beside it."""

  def __init__(self, model, projector_config: Projector3DConfig, *, rngs: nnx.Rngs):
    text = model.config.text
    if projector_config.mm_hidden_size != text.hidden_size:
      raise ValueError(f"Thinker3DPolicy: projector mm_hidden_size "
                       f"{projector_config.mm_hidden_size} must equal the model's hidden size "
                       f"{text.hidden_size}")
    self.model = model
    self.projector = Projector3D(projector_config, rngs=rngs)

  def teacher_forced(self, tokens_BxS, attention_mask_BxS, images_BxKxHxWx3):
    """One forward pass: (logits [B, S, V], final hidden states [B, S, C], input
    embeddings [B, S, C] with the vision tokens placed)."""
    model = self.model
    pixels, grids, sequence_grids = model.vision_inputs(images_BxKxHxWx3)
    embeds, residuals = model.decoder_inputs(tokens_BxS, pixels, grids)
    positions = model.position_ids(tokens_BxS, attention_mask_BxS, sequence_grids)
    hidden = model.language_model.hidden_states(embeds, positions, attention_mask_BxS,
                                                residuals)
    return model.language_model.logits(hidden), hidden, embeds

  def image_embeddings(self, embeds_BxSxC, tokens_BxS, num_images: int):
    return image_token_rows(embeds_BxSxC, tokens_BxS, self.model.config.image_token_id,
                            num_images, self.projector.config.fusion_input)

  def project(self, latents_BxTxC, image_embeds_BxKxPxC):
    """[B, K, F, H]: the projector per sample (float32, as the reference's reward)."""
    return jax.vmap(self.projector)(latents_BxTxC.astype(jnp.float32),
                                    image_embeds_BxKxPxC.astype(jnp.float32))
