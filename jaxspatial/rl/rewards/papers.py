"""Every paper's reward, on device from episode records, with the same rule on strings.

Think3D    w_acc * [letter == truth] + w_fmt * [the last turn has <answer>...</answer>]
           (public code: 1.0 and 1.0; the paper calls the format term a small bonus)
Act3D      0.3 R_judge + 0.2 R_EM + 0.05 R_judge c(tau) - 0.2 R_fmt  (eqs. 8, 9)
           c = N_max (12) when grounded, else min(n_int, N_max); R_fmt = 1 for a missing or
           empty answer (`format_rule="grammar"`: also for any grammar slip); R_EM against
           any reference answer. The judge is `text.rule_judge` (normalised EM or token
           F1 >= 0.5) unless a host judge is given to the rollout.
3DThinker  format + [letter == truth] + (cos + 1) / 2, cos per token over channels
           averaged (or, `token_axis_quirk=True`, the reference code's cosine along the
           token axis), between the projected latents and the VGGT target. The letter is
           the public reward's: found anywhere in the stripped answer by a priority of
           patterns (the last "X.", then "answer is X" forms, a lone X, ...;
           `text.thinker3d_option`), not Think3D's leading letter.
PERIA      R_rep + R_format + R_correct; R_rep counts consecutive repeats of characters,
           words and phrases, and repeated sentences (`text.peria_repetition`); R_format and
           R_correct are the public reward manager's rules (`text.peria_format`,
           `text.peria_correct`: equal, yes / no / n-a, comma sets, numbers, ranges after
           normalisation; the LLM judge only where its gate lets it); MapTrace's NDTW d ->
           reward with the paper's mapping clip((0.8 - d) / 0.5, 0, 1) or the code's (1 if
           d <= 0.5, 1.5 - d up to 1, 0 after).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxspatial.rl.rewards import device_text, text

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Think3DRewardConfig:
  accuracy_weight: float = 1.0
  format_weight: float = 1.0  # the public code's; the paper calls it a small bonus


def think3d_reward(last_turn_bytes_L: Array, answer_choice: Array,
                   config: Think3DRewardConfig = Think3DRewardConfig()) -> Array:
  """On device, from the last turn's byte ids and the true option index."""
  has_tag, letter = device_text.answer_letter(last_turn_bytes_L)
  correct = (letter >= 0) & (letter == answer_choice)
  return config.accuracy_weight * correct + config.format_weight * has_tag


def think3d_reward_text(last_turn: str, answer_letter: str,
                        config: Think3DRewardConfig = Think3DRewardConfig()) -> float:
  answer = text.answer_text(last_turn)
  correct = text.option_letter(answer) == answer_letter
  return config.accuracy_weight * correct + config.format_weight * (answer is not None)


@dataclasses.dataclass(frozen=True)
class Act3DRewardConfig:
  judge_weight: float = 0.3
  exact_match_weight: float = 0.2
  interaction_weight: float = 0.05
  format_weight: float = 0.2
  max_interactions: int = 12
  # "paper": R_fmt = 1 for a missing or empty answer, and a non-empty answer is scored even
  # when its turn slipped from the grammar; "grammar": only a well-formed answer counts.
  format_rule: str = "paper"
  # R_gnd: the paper's "the annotated answer object is visible in some rendered view" (the
  # initial render included); "all": every annotated answer object, "any": one of them.
  grounding: str = "all"


def act3d_reward(judge: Array, exact_match: Array, malformed: Array, num_interactions: Array,
                 grounded: Array, config: Act3DRewardConfig = Act3DRewardConfig()) -> Array:
  """Eqs. 8 and 9 on device from the episode's flags and counts."""
  credit = jnp.where(grounded, config.max_interactions,
                     jnp.minimum(num_interactions, config.max_interactions))
  judge = judge.astype(jnp.float32)
  return (config.judge_weight * judge + config.exact_match_weight * exact_match
          + config.interaction_weight * judge * credit - config.format_weight * malformed)


def act3d_flags_text(final_turn: str, references, well_formed: bool = True,
                     format_rule: str = "paper") -> tuple[bool, bool, bool]:
  """(judge, exact match, malformed) of an episode's final turn, on strings. `well_formed`:
  the turn matched the grammar (only read by `format_rule="grammar"`)."""
  think_end = final_turn.find("</think>")
  answer = text.answer_text(final_turn[think_end + len("</think>"):] if think_end >= 0
                            else final_turn)
  present = answer is not None and bool(answer.strip(" \t\n\r\x0b\x0c"))  # ASCII, as on device
  if format_rule == "grammar":
    present = present and well_formed
  elif format_rule != "paper":
    raise ValueError(f"act3d_flags_text: format_rule must be 'paper' or 'grammar', got "
                     f"{format_rule!r}")
  prediction = answer if present else None
  return (text.rule_judge(prediction, references), text.exact_match(prediction, references),
          not present)


def act3d_reward_text(final_turn: str, references, num_interactions: int, grounded: bool,
                      config: Act3DRewardConfig = Act3DRewardConfig(),
                      well_formed: bool = True) -> float:
  judge, em, malformed = act3d_flags_text(final_turn, references, well_formed,
                                          config.format_rule)
  credit = config.max_interactions if grounded else min(num_interactions,
                                                        config.max_interactions)
  return (config.judge_weight * judge + config.exact_match_weight * em
          + config.interaction_weight * judge * credit - config.format_weight * malformed)


def latent_similarity(predicted_NxTxC: Array, target_NxTxC: Array,
                      token_axis_quirk: bool = False) -> Array:
  """(cos + 1) / 2 averaged. Per token over channels by default; the reference code's
  quirk normalises over channels, then takes the cosine along the token axis."""
  predicted = predicted_NxTxC.astype(jnp.float32)
  target = target_NxTxC.astype(jnp.float32)

  def unit(x, axis):
    return x / jnp.maximum(jnp.linalg.norm(x, axis=axis, keepdims=True), 1e-8)

  if token_axis_quirk:
    predicted, target = unit(predicted, -1), unit(target, -1)
    cos = jnp.sum(unit(predicted, 1) * unit(target, 1), axis=1)
  else:
    cos = jnp.sum(unit(predicted, -1) * unit(target, -1), axis=-1)
  return (jnp.mean(cos) + 1.0) / 2.0


def thinker3d_format_text(completion: str) -> bool:
  return text.THINKER3D_FORMAT.search(completion) is not None


def thinker3d_reward(format_ok: Array, completion_bytes_L: Array, answer_choice: Array,
                     predicted_NxTxC: Array, target_NxTxC: Array,
                     token_axis_quirk: bool = False) -> Array:
  """format + option correctness + latent similarity (the reference's unweighted sum).
  `format_ok` comes from the rollout's grammar automaton (the latent block then think
  then answer); the letter is 3DThinker's (`device_text.thinker3d_answer_letter`)."""
  letter = device_text.thinker3d_answer_letter(completion_bytes_L)
  correct = (letter >= 0) & (letter == answer_choice)
  return (format_ok.astype(jnp.float32) + correct
          + latent_similarity(predicted_NxTxC, target_NxTxC, token_axis_quirk))


def thinker3d_letter_text(completion: str) -> int:
  """-1..4: the option index 3DThinker's reward reads from the first answer, on strings."""
  letter = text.thinker3d_option(text.thinker3d_answer(completion))
  return -1 if letter is None else "ABCDE".index(letter)


def maptrace_reward(ndtw_distance: Array, mapping: str = "paper") -> Array:
  """MapTrace's normalised DTW distance d -> reward, the paper's or the public code's map."""
  d = jnp.asarray(ndtw_distance, jnp.float32)
  if mapping == "paper":
    return jnp.clip((0.8 - d) / (0.8 - 0.3), 0.0, 1.0)
  if mapping == "code":
    return jnp.where(d <= 0.5, 1.0, jnp.where(d <= 1.0, 1.5 - d, 0.0))
  raise ValueError(f"maptrace_reward: mapping must be 'paper' or 'code', got {mapping!r}")


def normalized_dtw(path_Nx2: Array, reference_Mx2: Array, path_len: Array,
                   reference_len: Array) -> Array:
  """DTW distance between two 2-D paths (Euclidean step cost) divided by the reference
  length in points, on device (padded paths with lengths)."""
  n, m = path_Nx2.shape[0], reference_Mx2.shape[0]
  cost = jnp.linalg.norm(path_Nx2[:, None] - reference_Mx2[None], axis=-1)
  big = jnp.float32(1e30)
  cols = jnp.arange(m)

  def row(previous, i):
    def cell(left, j):
      best = jnp.minimum(jnp.minimum(previous[j], left),
                         jnp.where(j > 0, previous[jnp.maximum(j - 1, 0)], big))
      best = jnp.where((i == 0) & (j == 0), 0.0, best)
      value = jnp.where(j < reference_len, cost[i, j] + best, big)
      return value, value
    _, current = jax.lax.scan(cell, big, cols)
    current = jnp.where(i < path_len, current, previous)
    return current, None

  last, _ = jax.lax.scan(row, jnp.full(m, big), jnp.arange(n))
  return last[jnp.clip(reference_len - 1, 0, m - 1)] / jnp.maximum(reference_len, 1)


def peria_reward(answered: Array, calls: Array, correct: Array) -> Array:
  """R_format + R_correct on device. R_format from the grammar: +1 for an episode that ended
  in a well-formed answer turn, 0 for one that made tool calls but no answer (truncated),
  -1 otherwise. R_rep needs the model's text (`text.peria_repetition`): the host adds it.
  R_correct: the public rule on the answer (`device_text.peria_correct`), or the judge."""
  format_reward = jnp.where(answered, 1.0, jnp.where(calls > 0, 0.0, -1.0))
  return format_reward + correct.astype(jnp.float32)


def peria_correct_text(response_text: str, references, judge: bool = False,
                       maptrace: bool = False) -> float:
  """PERIA's R_correct on strings (not MapTrace's NDTW): the public manager's rule check of
  the response's prediction (`text.peria_prediction`) against the references, overturned
  to 1 by `judge` (an LLM judge's YES) only where the manager would have asked the judge
  (`text.peria_judge_gate`)."""
  prediction = text.peria_prediction(response_text)
  rule = text.peria_correct(prediction, references)
  if judge and text.peria_judge_gate(prediction, references, rule, maptrace):
    return 1.0
  return rule


def peria_reward_text(model_text: str, num_turns: int, references=None, *,
                      response_text: str | None = None, judge: bool = False,
                      correct: float | None = None) -> float:
  """R_rep + R_format + R_correct on strings, PERIA's public reward manager (peria.md §9):
  R_rep on the model's text (user turns left out), R_format and the prediction on the whole
  response (`response_text`: the model's turns with the observation messages between
  them, as the decoded response holds them; default `model_text`), R_correct by
  `peria_correct_text` against `references` with the judge's verdict `judge`. `correct`
  stands in for R_correct where the references are unknown (None)."""
  response = model_text if response_text is None else response_text
  if references is None:
    if correct is None:
      raise ValueError("peria_reward_text: give the references (or R_correct as `correct`)")
    r_correct = float(correct)
  else:
    r_correct = peria_correct_text(response, references, judge)
  return text.peria_repetition(model_text, num_turns) + text.peria_format(response) + r_correct


def parse_letter_text(completion: str) -> int:
  """-1..4: the option index of the first answer by Think3D's leading-letter rule, for
  tests and evaluation."""
  letter = text.option_letter(text.answer_text(completion))
  return -1 if letter is None else "ABCDE".index(letter)


