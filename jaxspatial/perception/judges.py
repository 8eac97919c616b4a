"""`make_judge`: a config's judge block -> the judge a rollout calls.

    block = dict(url="", model="", checkpoint="", api_key_env="auto",
                 timeout_s=60.0, retries=3, concurrency=16, max_requests=0)
    judge = make_judge(block, "act3d_training")

  url + model   an OpenAI-compatible endpoint (vLLM, SGLang, any server): `judge.LLMJudge`,
                called once per rollout batch on the host, requests concurrent
  checkpoint    a jaxspatial policy folder: `PolicyJudge`, on device inside the rollout's
                program (no host round trip)
  neither       None: the agent's rule judge on device (the offline default)

Both kinds are `judge(questions, predictions, references) -> bool [B]` on -1-padded byte
ids. The preset fixes the prompt and the sampling (the papers'): Act3D trains with a judge
at temperature 0.1 and 64 tokens ("act3d" prompt) and evaluates with one at 0 and 4 and
its shorter prompt that accepts terse answer fragments ("act3d_eval"; `prompt="act3d"`
evaluates with the training prompt); PERIA's fallback judge is greedy with 16.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

PRESETS = {  # prompt, temperature, max_tokens
    "act3d_training": ("act3d", 0.1, 64),
    "act3d_eval": ("act3d_eval", 0.0, 4),
    "peria": ("peria", 0.0, 16),
    # HR-Bench's scorer samples at 0.2 (with top_p 0.8, top_k 40: not sent).
    "hrbench": ("hrbench", 0.2, 8),
}


def _field(block, name: str, default=None):
  getter = getattr(block, "get", None)
  return getter(name, default) if getter else getattr(block, name, default)


@functools.lru_cache(maxsize=4)
def _load_policy(checkpoint: str, dtype: str, param_dtype: str) -> tuple[Any, Any]:
  """(tokenizer, model) of a judge checkpoint, loaded once per process and settings (the
  training and the evaluation judge share it)."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from jaxspatial import models  # pylint: disable=import-outside-toplevel
  processor, model = models.load_policy(checkpoint, dtype=jnp.dtype(dtype),
                                        param_dtype=jnp.dtype(param_dtype))
  return getattr(processor, "tokenizer", processor), model


def make_endpoint(block: Mapping | Any):
  """The block's OpenAI-compatible endpoint (`judge.ChatEndpoint`)."""
  from jaxspatial.perception import judge  # pylint: disable=import-outside-toplevel
  url, model_name = _field(block, "url", ""), _field(block, "model", "")
  if not model_name:
    raise ValueError(f"judge.url is {url!r} but judge.model is empty: name the model the "
                     "endpoint serves")
  return judge.ChatEndpoint(url, model_name,
                            api_key_env=_field(block, "api_key_env", judge.AUTO_KEY_ENV),
                            timeout_s=_field(block, "timeout_s", 60.0),
                            retries=_field(block, "retries", 3),
                            concurrency=_field(block, "concurrency", 16),
                            max_requests=_field(block, "max_requests", 0) or None,
                            role="judge")


def make_judge(block: Mapping | Any, preset: str, endpoint=None, prompt: str | None = None):
  """The judge of a config block (`url` / `model` / `api_key_env` / `timeout_s` /
  `retries` / `concurrency` / `max_requests` for an endpoint; `checkpoint` (and optional
  `dtype`, `param_dtype`, `cache_dtype`) for a policy) with a `PRESETS` setting; None for
  the rule judge. `endpoint`: one `make_endpoint(block)` several judges share (one
  connection pool, one request budget). `prompt`: a `judge.PROMPTS` name in place of the
  preset's (e.g. "act3d" to evaluate with the training prompt)."""
  if preset not in PRESETS:
    raise ValueError(f"make_judge: unknown preset {preset!r}; known: {sorted(PRESETS)}")
  preset_prompt, temperature, max_tokens = PRESETS[preset]
  prompt = prompt or preset_prompt
  url, checkpoint = _field(block, "url", ""), _field(block, "checkpoint", "")
  if url and checkpoint:
    raise ValueError(f"judge: both url {url!r} and checkpoint {checkpoint!r} are set; a judge "
                     "is an endpoint or a jaxspatial policy, not both")
  if checkpoint:
    from jaxspatial.perception.policy_judge import PolicyJudge  # pylint: disable=import-outside-toplevel
    tokenizer, model = _load_policy(str(checkpoint), _field(block, "dtype", "float32"),
                                    _field(block, "param_dtype", "float32"))
    return PolicyJudge.create(tokenizer, model, prompt, temperature=temperature,
                              max_tokens=max_tokens,
                              cache_dtype=_field(block, "cache_dtype", "float32"))
  if not url:
    return None
  from jaxspatial.perception import judge  # pylint: disable=import-outside-toplevel
  return judge.LLMJudge(endpoint or make_endpoint(block), prompt, temperature=temperature,
                        max_tokens=max_tokens)
