r"""On-device multi-turn rollouts: grammar automata, the compiled episode loop, Trajectory.

Modules:
- regex_ast.py (the grammar tree: nodes, builders, field and literal walks), nfa.py (Thompson
  construction with labelled byte edges; Aho-Corasick for `TextWithout`: free text without a set
  of patterns, optionally n non-space bytes; `Text`: the same as a labelled field whose bytes are
  its value), automaton.py (the minimal byte DFA, determinize / intersect / minimize; `Grammar`;
  an enum's options share equal continuations, built once, their fields held once;
  `Grammar.after(prefix)`: the automata started after a prompt-written prefix), token_table.py
  (the DFA walked through the vocabulary into device tables: `token_bytes`, `byte_table`,
  `single_byte_tokens`, also the observation template's and the on-device judge's;
  `TokenAutomaton`, `compile_token_automaton`, constrained-decoding masks, `min_turn_tokens`)
- contract.py (`Agent`: every member the three loops use, declared, with defaults for the
  optional ones; `Judge`, `DeviceJudge`, `on_device`), rules.py (the episode rules once, for the
  compiled, host and API loops: turn budget, keys, last turn, call stop, answer kind, turn
  outcome, stepping, observation variants, judge gate, reward composition; jnp inside jit, numpy
  or Python values on the host), vision.py (the prompt's views and each observation's vision
  inputs, checked against transformers' processor)
- grammars.py (Think3D, Act3D, PERIA, 3DThinker turns; PERIA's perception calls' text
  arguments), host_parse.py (the same grammars as host regexes: test reference and host-loop
  parser),
- parse.py (the action read from the automaton on device; `ParsedTurn.texts`: each text field's
  first TEXT_BYTES = 256 bytes, -1 padded, its value the whole length), observation.py
  (observation messages: static text + numbers formatted on device, `{}` two decimals, `{:d}`
  integers; variants padded to one length), agents.py (Act3DAgent, Think3DAgent: grammar,
  messages, parse -> env action, reward; the tool budget; system prompt, first prompts, accuracy
  key, from_config; Think3DAgent.with_reconstruction: the scene reconstructed online at reset;
  call_turn / answer_turn: a turn written from fields, used by the teachers, tiny.py's corpus
  and the demo's expert), turns.py (the shared writing of turns), peria_agent.py (PeriaAgent,
  the public messages; R_rep as a host reward),
- registry.py (AGENTS by name, make_agent), runner.py (AgentRollout: an agent's automaton,
  template, RolloutConfig and first prompts; one call compiles and runs the rollout, over the
  mesh when given),
- episode.py (the compiled episode loop; forced tokens; teacher replay by segment and its
  checks; group-shared prompts),
- trajectory.py (Trajectory), host_loop.py (host-driven reference and baseline), api_agent.py
  (`api_rollout(endpoint, agent, tasks, key)`: an OpenAI-compatible chat endpoint
  (`perception.ChatEndpoint`: concurrency, retries, request budget, key from an environment
  variable) as the policy of the same environments from a host loop: the agent's own first
  prompt and observation variants cut at the chat markers into messages, views as PNG data URLs,
  one request per running episode per turn (`complete_many`), replies cut at the first closing
  tag and walked through the grammar's byte DFA on the host (`parse_reply`, the device parse's
  twin), the episode rules and reset / step keys of `episode.rollout`, the device reward on the
  answer bytes (a host judge optional; PERIA's text reward as `host_reward`); `on_error` "raise"
  or "end"; per-episode records: messages, views, replies, actions, answer, reward components,
  requests; no perception tools),
- prompts.py (Act3D's verbatim, Think3D's multi-view, PERIA's),
- viewer.py (HTML of episodes), profile.py (profile_compiled: lower / compile time, cost and
  memory analysis, run time, a profiler trace),
- tiny.py (tiny policy + tokenizer for CPU),
- thinker3d.py (3DThinker's single-turn rollout: the sampler's latent mode, format / answer /
  latent-similarity rewards on device; the vision encoder runs once, its tokens feed the prompt
  and the projector)

One compiled program per (agent, template, config, replay, group): `episode.compile_rollout`
returns f(model, automaton, tasks, prompt_ids, prompt_mask, key, forced=None) -> `Trajectory`.
`group` G: each G consecutive rows repeat one task (GRPO's groups); reset, vision encoder and
prefill run once per group and the cache is repeated to its rows (the recipes' default,
`rl.share_prompts`; the trajectories equal every row prefilled, log-probabilities within
float32 rounding). `replay`: teacher SFT; each forced turn is written as one segment (one
forward over the turn) instead of one decode step per token, with the tokens, masks and
log-probabilities of the token-by-token replay.
An episode ends with an answer, a malformed turn, a tool call in its last turn, or when
the environment says done (it accepts no further action: it stopped, or a call came past
its budget). The loop's `max_turns` must be the agent's `max_calls` + 1: the tool budget,
then one turn to answer (`check_turn_budget` refuses anything else; Act3D's 12
interactions need 13 turns). The first prompt holds the N views `agent.reset` returns
(Think3D: the task's input views, padding views masked; the others: one render), so a
trajectory's images are [N prompt views, the view after each turn].
Rules the grammars, the device parse and the host regexes share (tests hold them equal):
- A turn ends at its first closing tag (`</tool_call>`, `</answer>`, PERIA's `</action>`),
  an EOS token, or `max_turn_tokens`; bytes after the tag in the same token are ignored.
  Thinking ends at the first `</think>`. JSON keys come in the documented order with JSON
  whitespace anywhere; numbers are JSON numbers inside the field's range (integer bounds,
  at most two decimals). A text argument (PERIA's `text_prompt` / `question`) is a JSON
  string body without `"` or backslash (no escapes) holding a byte that is not ASCII
  whitespace (raw control bytes pass, as in image_label's text); the device keeps its
  first 256 bytes.
- Parse-only mode (default): the model is free; a malformed turn ends the episode with the
  format flag. Constrained mode: the automaton masks tokens that would kill the grammar or
  could not close within the turn's remaining tokens, so every turn is a valid call or
  answer; special tokens the grammar never spells are masked.
- A tool call in the last turn ends the episode as malformed; an answer counts only in a
  well-formed turn (Act3D's `format_rule="paper"` scores any non-empty answer of the final
  turn). The Act3D judge is the on-device `rule_judge` over every reference answer unless
  a host judge is given (`compile_rollout(judge=fn)`, `fn(question [B, Lq], answer [B, A],
  references [B, R, La]) -> bool [B]`, `io_callback`, one call per batch) or an on-device
  one (`perception.PolicyJudge`, `on_device`: its `verdicts` run inside the program, its
  model and token table come in as `judge_state`, no callback); its verdict counts only
  for an episode with a prediction.
- Turns are packed: turn t + 1 starts after the batch's longest turn-t reply and the
  message; `Trajectory.turn_start` / `turn_end` hold each turn's slot range
  (`grpo.token_turns` reads them).
- `observation_hashes` are OR-GIGPO's step keys: the pixel hash of the view a call
  produced; an answer, a malformed turn and a rejected call each get their own constant
  key (`episode.ANSWER_KEY`, `MALFORMED_KEY`, `REJECTED_KEY`), so they never pool with a
  view or with each other.
- Teacher SFT replay (`episode.check_replay`) refuses a trajectory it cannot play whole:
  a turn the grammar rejects, a turn never reached, text after a closing tag; the error
  names the file, scene, question, turn and text.
- Observation messages: static text tokenised once, numbers formatted on device into
  single-byte tokens in fixed slots (masked padding), the view's vision tokens. Every
  running episode's message is written in the same slots; episodes that ended get it
  masked. A template may have variants (`agent.observation` a tuple; the agent's
  `observation_variant(invalid, format_error, next_is_final, env_state)` picks one per
  episode and turn: Think3D's stage-aware intermediate / final / rejected messages,
  PERIA's tool result, per-error messages and format error), padded to one length with
  masked tokens before the text (the next turn samples from the message's last slot,
  which must be real); a variant without the image carries the image group masked. With
  the agent's `continue_on_format_error` a malformed turn that stopped at the call's
  closing tag gets a format-error message and the episode goes on (the environment is not
  stepped), as an agent server sees it; one ending at EOS, the token limit or `</answer>`
  ends the episode.
- logprobs are those of the distribution sampled from (repetition penalty, temperature,
  top-k / top-p, the grammar mask when constrained); forced tokens keep the policy's
  log-probability. `RolloutConfig.repetition_penalty` is Hugging Face's (every token in
  context, prompt and observations included, as `generate` and vLLM count them); the
  trainer's recomputed log-probabilities are the policy's own at the rollout's temperature,
  as TRL / ms-swift compute them, so with a penalty the recorded and the recomputed old
  log-probabilities differ by design. The
  token at step k of turn t uses `fold_in(fold_in(key, t), k)`; reset and step keys fold
  in 2^20 and 2^21. The key is one for the batch ([2]; training) or one per row ([B, 2],
  `rules.row_keys`; evaluation: a row's draws then do not depend on its batch or group).
- The trainer recomputes positions with `model.position_ids` over the whole slot layout;
  a full forward pass reproduces the sampled log-probabilities (tested).
- Chat formats (`models.ChatFormat`, from a checkpoint's chat template and
  generation_config.json, or `model.chat_format`): a thinking template's prefill
  (`<think>\n`) ends the first prompt and every observation message (the agent's
  `prefill`); the grammar starts after it (`Grammar.after`), so the model's tokens are the
  rest of the turn and the host regexes read prefill + text; teachers' written turns drop
  it (`ChatFormat.generated`). Any of the stop ids ends a turn. The context only grows:
  what was sampled stays in it, reasoning included, as on-policy multi-turn RL needs
  (tokens trained are tokens sampled). Qwen's Thinking template renders the same for tool
  results (reasoning after the last real user query is kept: tested against a template
  written to that layout); for PERIA, whose observations are user turns, re-rendering the
  history through the template would drop earlier turns' reasoning: we do not.
"""

from jaxspatial.rollout import grammars, host_parse
from jaxspatial.rollout.agents import Act3DAgent, PeriaAgent, Think3DAgent
from jaxspatial.rollout.api_agent import api_rollout
from jaxspatial.rollout.automaton import Grammar
from jaxspatial.rollout.token_table import (TokenAutomaton, allowed_tokens, compile_token_automaton,
                                            token_bytes)
from jaxspatial.rollout.episode import (RolloutConfig, check_replay, check_turn_budget,
                                        compile_rollout, forced_tokens, image_tokens, rollout)
from jaxspatial.rollout.host_loop import host_rollout
from jaxspatial.rollout.observation import ObservationTemplate, compile_template
from jaxspatial.rollout.parse import ParsedTurn, parse_turn, walk_states
from jaxspatial.rollout.registry import AGENTS, make_agent
from jaxspatial.rollout.runner import AgentRollout
from jaxspatial.rollout.prompts import chat_prompt, left_padded, left_padded_views
from jaxspatial.rollout.trajectory import Trajectory
from jaxspatial.rollout.viewer import trajectory_html

__all__ = ["AGENTS", "Act3DAgent", "AgentRollout", "Grammar", "ObservationTemplate", "ParsedTurn", "PeriaAgent",
           "RolloutConfig", "Think3DAgent", "TokenAutomaton", "Trajectory", "allowed_tokens",
           "api_rollout", "chat_prompt", "check_replay", "check_turn_budget", "compile_rollout",
           "compile_template", "compile_token_automaton", "forced_tokens", "grammars",
           "host_parse", "host_rollout", "image_tokens", "left_padded", "left_padded_views", "make_agent",
           "parse_turn", "rollout", "token_bytes", "trajectory_html", "walk_states"]
