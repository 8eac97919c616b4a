"""A Qwen2-style byte-level BPE trained on the grammars' turns, with Qwen's special tokens
and 3DThinker's latent tokens."""

import pytest

from tests.rollout import turn_strings

LATENT_TOKENS = ("<|latent_start|>", "<|latent_pad|>", "<|latent_end|>")


@pytest.fixture(scope="session")
def tokenizer():
  from jaxspatial.models.qwen2_5_vl.tokenizer import train_tokenizer
  return train_tokenizer(turn_strings.corpus(), vocab_size=700,
                         extra_special_tokens=LATENT_TOKENS)
