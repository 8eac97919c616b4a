"""3DThinker's stage-2 rollout: one compiled program from the prompt to the reward.

  prefill the prompt (K views)
  decode with the sampler's latent mode: after `<|latent_start|>` the final hidden state is
    fed back as the next input for `num_latents` steps (emitting pads), then
    `<|latent_end|>` is forced; then think and answer until `<|im_end|>`
  rewards, on device (the reference's unweighted sum):
    format          the completion walks the 3DThinker grammar automaton to acceptance
                    (latent block, <think>, <answer>); the reference's regex does not
                    check the pad count nor the answer body, the grammar does (12 pads,
                    a non-empty, tag-free answer: stricter than the reference); and its
                    latent block is a real one, read by token id (`real_latent_block`):
                    the same text spelled with ordinary tokens is a block the sampler
                    never entered latent mode for, and earns no format reward
    correct         the option letter the reference reads from the answer (the last
                    "X.", else "answer is X", a lone X, ... in its priority:
                    `device_text.thinker3d_option`) equals the task's
    latent_sim      (cos + 1) / 2 between the projector's output on the scored latents and
                    this sample's image embeddings, and the target features (per token
                    over channels; the reference's token-axis quirk behind a flag)

The latents scored, when a latent block was generated (a start token, then an end token
after it, as the reference looks for them): the generated ones (inference mode). The
reference instead re-runs a teacher-forced pass over the sampled ids and reads the hidden
states one position later (start + 1 .. start + T); scoring what the policy actually
produced needs no second pass. Without a block the reference falls back to the T hidden
states at the positions from the one after `<|im_start|>assistant` on; `latent_fallback`:
  "after_header"  (default, the reference's) the template's "\n" ending the prompt (one
                  token in Qwen's vocabulary), then the first T - 1 generated positions
  "generated"     the first T generated positions
  "none"          0 (no fallback)
the final hidden state *at* each position (the sampler records them while decoding), 0
when the completion is too short to hold the window (the reference's projector then
fails on the short input and its reward is 0). A prompt that ends with
`<|latent_start|>` enters latent mode at once (evaluation of the latents of a policy
that would not open the block itself).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import struct

from jaxspatial.models.reading_jit import reading_jit
from jaxspatial.models.sampler import SamplingConfig, decode, prefill
from jaxspatial.rl.rewards import device_text
from jaxspatial.rl.rewards.papers import latent_similarity
from jaxspatial.rollout.automaton import START
from jaxspatial.rollout.regex_ast import JSON_WS
from jaxspatial.rollout.token_table import TokenAutomaton

Array = jax.Array
FALLBACKS = ("after_header", "generated", "none")


@dataclasses.dataclass(frozen=True)
class Thinker3DRolloutConfig:
  latent_tokens: tuple[int, int, int]   # (<|latent_start|>, <|latent_pad|>, <|latent_end|>)
  stop_tokens: tuple[int, ...]          # <|im_end|>
  num_latents: int = 12
  max_new_tokens: int = 64
  # The reference's trainer samples at temperature 1 (its config's 0.9 is unused) and
  # scores log-probabilities on raw logits.
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  pad_token: int = 0
  token_axis_quirk: bool = False
  latent_fallback: str = "after_header"  # or "generated", "none" (see the module docstring)
  cache_dtype: str = "float32"

  def __post_init__(self):
    ids = self.latent_tokens
    if (not isinstance(ids, tuple) or len(ids) != 3 or len(set(ids)) != 3
        or any(not _is_id(t) for t in ids)):
      raise ValueError(f"Thinker3DRolloutConfig.latent_tokens: expected 3 distinct token ids "
                       f"(<|latent_start|>, <|latent_pad|>, <|latent_end|>), got {ids!r}")
    if not isinstance(self.stop_tokens, tuple) or any(not _is_id(t) for t in self.stop_tokens):
      raise ValueError(f"Thinker3DRolloutConfig.stop_tokens: expected a tuple of token ids, "
                       f"got {self.stop_tokens!r}")
    for name in ("num_latents", "max_new_tokens"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"Thinker3DRolloutConfig.{name}: expected an int >= 1, got {value!r}")
    if not _is_id(self.pad_token):
      raise ValueError(f"Thinker3DRolloutConfig.pad_token: expected a token id >= 0, got "
                       f"{self.pad_token!r}")
    if self.latent_fallback not in FALLBACKS:
      raise ValueError(f"Thinker3DRolloutConfig.latent_fallback: expected one of {FALLBACKS}, "
                       f"got {self.latent_fallback!r}")

  @property
  def sampling(self) -> SamplingConfig:
    return SamplingConfig(max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                          top_k=self.top_k, top_p=self.top_p, stop_tokens=self.stop_tokens,
                          pad_token=self.pad_token, cache_dtype=self.cache_dtype,
                          latent_tokens=self.latent_tokens, num_latents=self.num_latents)


def _is_id(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2 ** 31


@struct.dataclass
class Thinker3DRollout:
  """tokens, attention_mask, loss_mask, logprobs [B, L + N]: the left-padded prompt, then the
  completion (loss mask 1 on every generated token, latent pads included, as the reference);
  images [B, K, H, W, 3]; latents [B, T, C]: the latents scored (generated, inference mode,
  with a latent block; else the fallback window's hidden states, zeros when none);
  lengths [B]; reward [B]; reward_components: format, correct, latent_sim, latent_block,
  latent_fallback (1 where the fallback window was scored) -> [B]."""
  tokens: Array
  attention_mask: Array
  loss_mask: Array
  logprobs: Array
  images: Array
  latents: Array
  lengths: Array
  reward: Array
  reward_components: dict


def completion_format(automaton: TokenAutomaton, tokens_N: Array, length: Array,
                      start_state: Array) -> Array:
  """Whether the completion's tokens (before `length`) walk the grammar to acceptance."""

  def step(state, inputs):
    token, used = inputs
    following = automaton.token_next[state, token].astype(jnp.int32)
    keep = ~used | automaton.accepting[state]  # once accepted, trailing tokens are ignored
    return jnp.where(keep, state, following), None

  used = jnp.arange(tokens_N.shape[0]) < length
  final, _ = jax.lax.scan(step, start_state, (tokens_N, used))
  return automaton.accepting[final]


def real_latent_block(automaton: TokenAutomaton, tokens_N: Array, length: Array,
                      primed: Array, latent_tokens: tuple[int, int, int],
                      num_latents: int) -> Array:
  """Whether the completion opens with a latent block of the special token ids: only
  whitespace tokens (the grammar's leading space) before the first `<|latent_start|>` id
  (or the prompt ends with it: `primed`), then `num_latents` `<|latent_pad|>` ids and the
  `<|latent_end|>` id, all before `length`. With the grammar walk accepting, this is the
  block the grammar read: ordinary tokens spelling the same text do not count."""
  start_id, pad_id, end_id = latent_tokens
  size = tokens_N.shape[0]
  positions = jnp.arange(size)
  used = positions < length
  first = jnp.where(primed, -1, jnp.min(jnp.where(used & (tokens_N == start_id), positions,
                                                  size)))
  pieces = automaton.token_bytes[tokens_N]  # [N, Lmax], -1 padded
  space = jnp.asarray(sorted(JSON_WS.item.values), jnp.int32)
  blank = jnp.all((pieces < 0) | jnp.any(pieces[..., None] == space, -1), -1) & (
      automaton.token_length[tokens_N] > 0)
  prefix_ok = jnp.all(jnp.where(positions < first, blank, True))
  offset = positions - first
  in_pads = (offset >= 1) & (offset <= num_latents)
  pads_ok = jnp.all(jnp.where(in_pads, used & (tokens_N == pad_id), True))
  end_at = first + num_latents + 1
  end_ok = (end_at < length) & (tokens_N[jnp.clip(end_at, 0, size - 1)] == end_id)
  return (first < size) & prefix_ok & pads_ok & end_ok


def format_reward(automaton: TokenAutomaton, tokens_BxN: Array, lengths_B: Array,
                  primed_B: Array, config: Thinker3DRolloutConfig) -> Array:
  """[B] bool: the completions (their first `lengths` tokens, the stop token left out) walk
  the grammar to acceptance, from after `<|latent_start|>` where the prompt ends with it
  (`primed`), and their latent block is made of the latent token ids (`real_latent_block`:
  the grammar reads bytes, which ordinary tokens can spell too)."""
  start_id = config.latent_tokens[0]
  start_state = jnp.where(primed_B, automaton.token_next[START, start_id].astype(jnp.int32),
                          START)
  walks = jax.vmap(lambda t, n, s: completion_format(automaton, t, n, s))(
      tokens_BxN, lengths_B, start_state)
  real = jax.vmap(lambda t, n, p: real_latent_block(
      automaton, t, n, p, config.latent_tokens, config.num_latents))(
          tokens_BxN, lengths_B, primed_B)
  return walks & real


def completion_bytes(automaton: TokenAutomaton, tokens_N: Array, length: Array) -> Array:
  """The completion's bytes, compacted (-1 after)."""
  used = jnp.arange(tokens_N.shape[0]) < length
  data = jnp.where(used[:, None], automaton.token_bytes[tokens_N], -1).reshape(-1)
  return device_text.span(data, 0, data.shape[0])


def has_latent_block(tokens_BxN: Array, lengths_B: Array, primed_B: Array,
                     latent_tokens: tuple[int, int, int]) -> Array:
  """[B] whether a latent block was made, as the reference finds one: a start token (in
  the generated tokens, or ending the prompt) and the first end token after the first
  start."""
  start_id, _, end_id = latent_tokens
  positions = jnp.arange(tokens_BxN.shape[1])[None]
  generated = positions < lengths_B[:, None]
  never = tokens_BxN.shape[1]
  first_start = jnp.where(primed_B, -1, jnp.min(
      jnp.where(generated & (tokens_BxN == start_id), positions, never), -1))
  first_end = jnp.min(jnp.where(generated & (tokens_BxN == end_id), positions, never), -1)
  return (first_start < never) & (first_end < never) & (first_end > first_start)


def fallback_latents(prompt_last_hidden_BxC: Array, first_hidden_BxTxC: Array,
                     lengths_B: Array, mode: str) -> tuple[Array, Array]:
  """(hidden states [B, T, C] of the fallback window, [B] whether the completion holds the
  whole window): "after_header" the last prompt position then the first T - 1 generated
  ones, "generated" the first T generated ones, "none" never fits."""
  steps = first_hidden_BxTxC.shape[1]
  if mode == "after_header":
    window = jnp.concatenate([prompt_last_hidden_BxC[:, None].astype(jnp.float32),
                              first_hidden_BxTxC[:, :-1]], 1)
    return window, lengths_B >= steps - 1
  if mode == "generated":
    return first_hidden_BxTxC, lengths_B >= steps
  return jnp.zeros_like(first_hidden_BxTxC), jnp.zeros(lengths_B.shape, bool)


def rollout(policy, automaton: TokenAutomaton, prompt_ids_BxL: Array, prompt_mask_BxL: Array,
            images_BxKxHxWx3: Array, features_BxKxFxH: Array, answer_choice_B: Array,
            key: Array, config: Thinker3DRolloutConfig) -> Thinker3DRollout:
  """B samples of the 3DThinker policy (`Thinker3DPolicy`) on prompts with K views each."""
  model = policy.model
  batch, prompt_length = prompt_ids_BxL.shape
  num_images = images_BxKxHxWx3.shape[1]
  start_id = config.latent_tokens[0]
  pixels, grids, sequence_grids = model.vision_inputs(images_BxKxHxWx3)
  # The encoder runs once: its tokens go into the prompt and, per image, to the projector.
  vision = model.encode_images(pixels, grids)
  dstate, logits = prefill(model, prompt_ids_BxL, prompt_mask_BxL,
                           prompt_length + config.max_new_tokens,
                           jnp.dtype(config.cache_dtype), pixels, grids, sequence_grids,
                           vision=vision)
  generation = decode(model, dstate, logits, key, config.sampling)
  tokens_N, lengths = generation.tokens, generation.lengths

  # Rewards. A prompt ending in the start token begins the grammar after it.
  primed = prompt_ids_BxL[:, -1] == start_id
  stops = jnp.asarray(config.stop_tokens, jnp.int32)
  ends_with_stop = jnp.any(
      jnp.take_along_axis(tokens_N, jnp.maximum(lengths - 1, 0)[:, None], 1) == stops[None], -1)
  content_length = lengths - ends_with_stop.astype(jnp.int32)
  format_ok = format_reward(automaton, tokens_N, content_length, primed, config)
  text = jax.vmap(lambda t, n: completion_bytes(automaton, t, n))(tokens_N, content_length)
  letter = jax.vmap(device_text.thinker3d_answer_letter)(text)
  correct = (letter >= 0) & (letter == answer_choice_B)
  latent_block = has_latent_block(tokens_N, lengths, primed, config.latent_tokens)
  fallback_BxTxC, fallback_fits = fallback_latents(dstate.last_hidden, generation.first_hidden,
                                                   lengths, config.latent_fallback)
  fallback = ~latent_block & fallback_fits
  latents = jnp.where(latent_block[:, None, None], generation.latents,
                      jnp.where(fallback[:, None, None], fallback_BxTxC, 0.0))
  tokens = vision.tokens_NxC
  image_embeds = tokens.reshape(batch, num_images, -1, tokens.shape[-1])  # in prompt order
  predicted = policy.project(latents, image_embeds)
  similarity = jax.vmap(lambda p, t: latent_similarity(p, t, config.token_axis_quirk))(
      predicted, features_BxKxFxH)
  latent_sim = jnp.where(latent_block | fallback, similarity, 0.0)
  reward = format_ok.astype(jnp.float32) + correct.astype(jnp.float32) + latent_sim

  generated = jnp.arange(config.max_new_tokens)[None] < lengths[:, None]
  return Thinker3DRollout(
      tokens=jnp.concatenate([prompt_ids_BxL.astype(jnp.int32), tokens_N], 1),
      attention_mask=jnp.concatenate([prompt_mask_BxL.astype(bool), generated], 1),
      loss_mask=jnp.concatenate([jnp.zeros_like(prompt_mask_BxL, bool), generated], 1),
      logprobs=jnp.concatenate([jnp.zeros((batch, prompt_length), jnp.float32),
                                generation.logprobs], 1),
      images=images_BxKxHxWx3, latents=latents, lengths=lengths, reward=reward,
      reward_components={"format": format_ok.astype(jnp.float32),
                         "correct": correct.astype(jnp.float32), "latent_sim": latent_sim,
                         "latent_block": latent_block.astype(jnp.float32),
                         "latent_fallback": fallback.astype(jnp.float32)})


@functools.lru_cache(maxsize=8)
def compile_rollout(config: Thinker3DRolloutConfig):
  """`rollout` jitted: f(policy, automaton, prompt_ids, prompt_mask, images,
  features, answer_choice, key)."""

  def run(policy, automaton, prompt_ids, prompt_mask, images, features, answer_choice, key):
    return rollout(policy, automaton, prompt_ids, prompt_mask, images, features,
                   answer_choice, key, config)
  return reading_jit(run)
