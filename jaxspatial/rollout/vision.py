"""The views an episode shows the policy, as its vision inputs: one helper for the compiled
and the host loop, so both feed the encoder the same pixels (tests/rollout/test_vision.py
checks them against transformers' processor).

The first prompt holds the N views `agent.reset` returns; every observation message one
view per sequence. `model.vision_inputs` is the policy family's preprocessing (smart
resize, normalise, patchify in the processor's layout).
"""

from __future__ import annotations

import jax

Array = jax.Array


def prompt_views(images):
  """[B, N, H, W, 3]: an agent's reset may return one view per episode [B, H, W, 3] or N
  (numpy or jnp)."""
  return images if images.ndim == 5 else images[:, None]


def prompt_inputs(model, images_BxNxHxWx3: Array):
  """(pixels, grids, sequence_grids) of the first prompts' N views per sequence."""
  return model.vision_inputs(images_BxNxHxWx3)


def view_inputs(model, images_BxHxWx3: Array):
  """(pixels, grids, sequence_grids) of one view per sequence (an observation's)."""
  return model.vision_inputs(images_BxHxWx3[:, None])


def image_tokens(model, image_size) -> int:
  """The tokens one view of `image_size` (H, W) takes in the prompt."""
  return model.image_tokens(image_size)
