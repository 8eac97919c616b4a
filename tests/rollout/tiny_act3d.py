"""A tiny policy of one family set up for Act3D episodes, as the rollout tests use it."""

import types

from data_pipelines.synthetic import episodes
from jaxspatial.rollout import episode, observation, tiny
from jaxspatial.rollout import token_table as am


def act3d_policy(agent, family: str, model_seed: int, batch: int, task_seed: int):
  """tok, model, automaton, template, tasks, ids, mask: a tiny `family` policy (seed
  `model_seed`), `agent`'s automaton and observation template, and `batch` synthetic Act3D
  tasks (seed `task_seed`) with their first prompts."""
  tok = tiny.tokenizer()
  model = tiny.model(tok, family, seed=model_seed)
  automaton = am.compile_token_automaton(agent.grammar, tok, model.config.text.vocab_size)
  n_image = episode.image_tokens(model, agent.image_size)
  template = observation.compile_template(tok, agent.observation, n_image)
  tasks, questions = episodes.act3d_tasks(batch, seed=task_seed)
  ids, mask = episodes.act3d_prompts(tok, questions, n_image)
  return types.SimpleNamespace(tok=tok, model=model, automaton=automaton, template=template,
                               tasks=tasks, ids=ids, mask=mask)
