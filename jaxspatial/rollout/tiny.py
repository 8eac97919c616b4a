"""A tiny random policy and its tokenizer, for tests, benchmarks and CPU demos.

No weights or vocabularies can be downloaded here, so the tokenizer is a byte-level BPE
trained on the agents' prompts and example turns, with Qwen's special tokens; the model
(`model`) is a family's tiny config with its special ids set to the tokenizer's.
"""

from __future__ import annotations

import dataclasses
import random

from jaxspatial.envs.act3d import PRIMITIVES
from jaxspatial.rollout import prompts
from jaxspatial.rollout.agents import Act3DAgent, Think3DAgent

LATENT_TOKENS = ("<|latent_start|>", "<|latent_pad|>", "<|latent_end|>")


def example_turns(count: int = 400, seed: int = 0) -> list[str]:
  """Well-formed Act3D and Think3D turns and answers (tokenizer training text)."""
  act3d, think3d = Act3DAgent(), Think3DAgent()
  rng = random.Random(seed)
  words = ("the chair is left of the table", "move closer", "I see a sofa", "look around")
  out = []
  for _ in range(count):
    thought = rng.choice(words)
    out.append(act3d.call_turn(thought, rng.choice(PRIMITIVES), round(rng.uniform(0, 9), 1)))
    camera, azimuth = rng.randint(1, 4), rng.randint(-180, 180)
    out.append(think3d.call_turn(thought, camera, azimuth, rng.randint(-90, 90),
                                 ego=rng.choice((True, False))))
    out.append(act3d.answer_turn(thought, rng.choice(("A", "red chair", "two", "left"))))
  return out


def tokenizer(vocab_size: int = 700):
  from jaxspatial.models.qwen2_5_vl.tokenizer import train_tokenizer  # pylint: disable=import-outside-toplevel
  corpus = example_turns() + [prompts.ACT3D_SYSTEM, prompts.THINK3D_SYSTEM] * 20
  return train_tokenizer(corpus, vocab_size=vocab_size, extra_special_tokens=LATENT_TOKENS)


def model_config(tok, base=None, family: str = "qwen2_5_vl", keep_vocab: bool = False):
  """The family's tiny config (`Qwen25VLConfig.tiny`, `Qwen3VLConfig.tiny`), or `base`,
  with the tokenizer's special ids and vocabulary size (rounded up to a multiple of 64;
  `keep_vocab`: base's, whose rows past the tokenizer's ids are never a prompt token)."""
  from jaxspatial.models.policy import policy_class  # pylint: disable=import-outside-toplevel
  vocab = (len(tok) + 63) // 64 * 64
  config = base or policy_class(family).config_class.tiny(vocab)
  if keep_vocab and config.text.vocab_size < vocab:
    raise ValueError(f"model_config: the base vocabulary {config.text.vocab_size} is smaller "
                     f"than the tokenizer's {len(tok)} ids")
  text = config.text if keep_vocab else dataclasses.replace(config.text, vocab_size=vocab)
  ids = tok.convert_tokens_to_ids
  return dataclasses.replace(config, text=text, image_token_id=ids("<|image_pad|>"),
                             video_token_id=ids("<|video_pad|>"),
                             vision_start_token_id=ids("<|vision_start|>"),
                             vision_end_token_id=ids("<|vision_end|>"))


def model(tok, family: str = "qwen2_5_vl", seed: int = 0, shape: str = "", layers: int = 0,
          **options):
  """A random policy for the tokenizer: `family`'s tiny one, or (`shape`, one of
  `jaxspatial.models.shapes.PUBLISHED`) a released checkpoint's shape and vocabulary, its
  decoder cut to `layers` when given (`options`: the model class's dtype, param_dtype,
  attention, remat)."""
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from jaxspatial.models import shapes  # pylint: disable=import-outside-toplevel
  from jaxspatial.models.policy import policy_class  # pylint: disable=import-outside-toplevel
  if shape:
    family = shapes.published_family(shape)
    base = shapes.published_config(shape)
    config = model_config(tok, shapes.with_layers(base, layers) if layers else base,
                          keep_vocab=True)
  else:
    config = model_config(tok, family=family)
  return policy_class(family)(config, rngs=nnx.Rngs(seed), **options)


MOVES = (("turn_left", 60), ("forward", 1.5), ("turn_right", 30), ("up", None), ("left", 1.2),
         ("turn_down", 30), ("backward", 2))


def scripted_act3d_turns(batch: int, turns: int, answer: str = "red chair") -> list[list[str]]:
  """Per episode, `turns - 1` Act3D camera moves then an answer (for forced tokens)."""
  agent = Act3DAgent()
  return [[agent.call_turn("look", *MOVES[(b + t) % len(MOVES)]) for t in range(turns - 1)]
          + [agent.answer_turn("seen", answer)] for b in range(batch)]
