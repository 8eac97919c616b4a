"""The loops' vision preprocessing (rollout/vision.py) against transformers' Qwen image
processor: the first prompt's N views per sequence and an observation's one view per
sequence reach the encoder as the processor's pixel_values and grids, in token order
(sequence by sequence, view by view). Tiny local configs; nothing is downloaded."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspatial.models.policy import policy_class
from jaxspatial.rollout import vision

transformers = pytest.importorskip("transformers")
PIL = pytest.importorskip("PIL.Image")


def _model(family):
  cls = policy_class(family)
  return cls(cls.config_class.tiny(256), rngs=nnx.Rngs(0))


def _processor(model):
  """transformers' processor with the policy's vision settings (the PIL backend)."""
  config = model.config.vision
  options = dict(patch_size=config.patch_size, merge_size=config.spatial_merge_size,
                 temporal_patch_size=config.temporal_patch_size)
  if hasattr(config, "min_pixels"):   # Qwen3-VL: its released preprocessor_config.json
    options.update(image_mean=[0.5] * 3, image_std=[0.5] * 3,
                   size={"shortest_edge": config.min_pixels,
                         "longest_edge": config.max_pixels})
  return transformers.Qwen2VLImageProcessorPil(**options)


def _expected(processor, images_NxHxWx3):
  out = processor(images=[PIL.fromarray(np.asarray(im)) for im in images_NxHxWx3],
                  return_tensors="np")
  return out["pixel_values"], tuple(map(tuple, out["image_grid_thw"]))


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_prompt_and_observation_views_are_the_processors(family):
  model = _model(family)
  processor = _processor(model)
  factor = model.config.vision.patch_size * model.config.vision.spatial_merge_size
  height, width = 2 * factor, 3 * factor   # rendered at the smart-resized size
  rng = np.random.default_rng(0)
  prompt_BxNxHxWx3 = rng.integers(0, 256, (2, 3, height, width, 3), dtype=np.uint8)

  # An agent's reset returns N views (Think3D) or one (the others): both become [B, N, ...].
  assert vision.prompt_views(prompt_BxNxHxWx3).shape == (2, 3, height, width, 3)
  assert vision.prompt_views(prompt_BxNxHxWx3[:, 0]).shape == (2, 1, height, width, 3)
  assert vision.prompt_views(jnp.asarray(prompt_BxNxHxWx3[:, 0])).shape[1] == 1

  pixels, grids, sequence_grids = vision.prompt_inputs(model, jnp.asarray(prompt_BxNxHxWx3))
  want_pixels, want_grids = _expected(processor, prompt_BxNxHxWx3.reshape(6, height, width, 3))
  assert tuple(map(tuple, grids)) == want_grids
  np.testing.assert_array_equal(np.asarray(sequence_grids),
                                np.asarray(want_grids).reshape(2, 3, 3))
  np.testing.assert_allclose(np.asarray(pixels), want_pixels, atol=1e-5)

  views_BxHxWx3 = prompt_BxNxHxWx3[:, 1]
  pixels, grids, sequence_grids = vision.view_inputs(model, jnp.asarray(views_BxHxWx3))
  want_pixels, want_grids = _expected(processor, views_BxHxWx3)
  assert tuple(map(tuple, grids)) == want_grids and sequence_grids.shape == (2, 1, 3)
  np.testing.assert_allclose(np.asarray(pixels), want_pixels, atol=1e-5)
  # One view's tokens in the prompt: the merged patches of its grid.
  _, gh, gw = want_grids[0]
  assert vision.image_tokens(model, (height, width)) == gh * gw // 4


def test_a_view_that_needs_a_resize_is_close_to_the_processors():
  """Off the smart-resized size the device resizes floats where the processor resizes
  uint8 with PIL: within about a uint8 level."""
  model = _model("qwen2_5_vl")
  yy, xx = np.mgrid[0:75, 0:100]
  smooth = np.stack([128 + 100 * np.sin(xx / 9.0), 128 + 100 * np.cos(yy / 7.0),
                     (xx + yy) % 256], -1).astype(np.uint8)
  pixels, grids, _ = vision.view_inputs(model, jnp.asarray(smooth[None]))
  want_pixels, want_grids = _expected(_processor(model), smooth[None])
  assert tuple(map(tuple, grids)) == want_grids
  levels = np.abs(np.asarray(pixels) - want_pixels) * 0.27 * 255
  assert np.median(levels) < 0.5 and levels.max() < 1.5
