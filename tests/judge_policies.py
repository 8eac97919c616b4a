"""Tiny judge policies for the on-device judge's tests (`perception.PolicyJudge`): a
tokenizer whose CORRECT and INCORRECT are single tokens, and a policy that replies CORRECT
to everything (every token embeds to one vector and no layer writes to the residual
stream, so the last hidden state, and the reply, never depend on the case)."""

import dataclasses

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspatial import models
from jaxspatial.models.qwen2_5_vl.tokenizer import save_processor, train_tokenizer
from jaxspatial.perception.judge import PROMPTS
from jaxspatial.rollout import tiny


def judge_tokenizer():
  corpus = [PROMPTS["act3d"].system] * 40 + ["INCORRECT " * 50, "CORRECT " * 50] * 40 + \
      tiny.example_turns(100)
  tok = train_tokenizer(corpus, vocab_size=600)
  for word in ("CORRECT", "INCORRECT"):
    assert len(tok.encode(word)) == 1, word
  return tok


def untied_policy(tok, seed: int = 5):
  """A tiny Qwen2.5-VL with its own LM head (the tests set its weights)."""
  base = tiny.model_config(tok)
  config = dataclasses.replace(base, text=dataclasses.replace(base.text,
                                                              tie_word_embeddings=False))
  return models.policy_class("qwen2_5_vl")(config, rngs=nnx.Rngs(seed))


def always_correct(folder) -> None:
  """Writes a policy folder (weights, tokenizer) whose greedy reply is CORRECT."""
  tok = judge_tokenizer()
  model = untied_policy(tok)
  text = model.language_model
  rng = np.random.default_rng(0)
  vector = rng.normal(size=text.embed_tokens.embedding[...].shape[1]).astype(np.float32)
  text.embed_tokens.embedding[...] = jnp.broadcast_to(vector, text.embed_tokens.embedding[...].shape)
  for layer in text.layers:
    layer.self_attn.o_proj.kernel[...] = jnp.zeros_like(layer.self_attn.o_proj.kernel[...])
    layer.mlp.down_proj.kernel[...] = jnp.zeros_like(layer.mlp.down_proj.kernel[...])
  head = np.zeros(text.lm_head.kernel[...].shape, np.float32)
  head[:, tok.convert_tokens_to_ids("CORRECT")] = vector
  text.lm_head.kernel[...] = jnp.asarray(head)
  models.export(model, folder)
  save_processor(folder, tok, model)
