"""3DThinker's latent tokens and embedding growth."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspatial.models.latent3d import (LATENT_END, LATENT_PAD, LATENT_START, add_latent_tokens,
                                        expand_output_3d, grow_embeddings, latent_label_mask)
from jaxspatial.models.qwen2_5_vl import Qwen25VLConfig, TextModel, text_position_ids

pytest.importorskip("transformers")


def test_tokens_expansion_and_labels():
  from jaxspatial.models.qwen2_5_vl.tokenizer import train_tokenizer
  tokenizer = train_tokenizer(["imagine the room, then think and answer"] * 10, vocab_size=300)
  before = len(tokenizer)
  ids = add_latent_tokens(tokenizer)
  assert len(tokenizer) == before + 3 and len(set(ids.values())) == 3
  text = expand_output_3d("<output_3D>\n<think>left</think><answer>B</answer>")
  encoded = tokenizer(text)["input_ids"]
  assert encoded[0] == ids[LATENT_START] and encoded[13] == ids[LATENT_END]
  assert encoded[1:13] == [ids[LATENT_PAD]] * 12
  mask = latent_label_mask(jnp.asarray(encoded), ids[LATENT_PAD])
  assert int(mask.sum()) == len(encoded) - 12
  with pytest.raises(ValueError, match="expected one <output_3D> placeholder, found 0"):
    expand_output_3d("no placeholder")


def test_grow_embeddings_keeps_old_rows_and_outputs():
  config = Qwen25VLConfig.tiny(vocab_size=64).text
  config = config.__class__(**{**config.__dict__, "tie_word_embeddings": False})
  model = TextModel(config, rngs=nnx.Rngs(0))
  ids = jnp.asarray([[1, 2, 3, 4]])
  mask = jnp.ones_like(ids)
  before = model(ids, text_position_ids(mask), mask)
  grow_embeddings(model, 67, rngs=nnx.Rngs(1))
  after = model(ids, text_position_ids(mask), mask)
  assert after.shape[-1] == 67
  np.testing.assert_allclose(after[..., :64], before, atol=1e-6)
  model(jnp.asarray([[66, 65]]), text_position_ids(jnp.ones((1, 2))), jnp.ones((1, 2)))
