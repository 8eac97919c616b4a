"""An HTML page of a batch of episodes: per episode, each turn's text beside the view the
agent saw before it, the parsed action, and the reward with its components."""

from __future__ import annotations

import base64
import html
import io

import numpy as np
from PIL import Image

from jaxspatial.rollout.token_table import token_bytes


def _png(image) -> str:
  buffer = io.BytesIO()
  Image.fromarray(np.asarray(image, np.uint8)).save(buffer, format="PNG")
  return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def turn_texts(trajectory, tokenizer) -> list[list[str]]:
  """Each episode's generated turns as text."""
  pieces, _ = token_bytes(tokenizer)
  tokens = np.asarray(trajectory.tokens)
  starts = np.asarray(trajectory.turn_start)
  lengths = np.asarray(trajectory.turn_length)
  active = np.asarray(trajectory.turn_active)
  out = []
  for b in range(tokens.shape[0]):
    turns = []
    for t in range(lengths.shape[1]):
      if not active[b, t]:
        break
      ids = tokens[b, starts[t]:starts[t] + lengths[b, t]]
      turns.append(b"".join(pieces[i] if i < len(pieces) else b"<?>" for i in ids).decode(
          "utf-8", "replace"))
    out.append(turns)
  return out


def trajectory_html(trajectory, tokenizer, grammar, title: str = "rollouts") -> str:
  texts = turn_texts(trajectory, tokenizer)
  images = np.asarray(trajectory.images)
  given = np.asarray(trajectory.image_given)
  views = trajectory.num_prompt_images
  valid = np.asarray(trajectory.turn_valid)
  answer = np.asarray(trajectory.turn_answer)
  values = np.asarray(trajectory.action_values)
  present = np.asarray(trajectory.action_present)
  reward = np.asarray(trajectory.reward)
  components = {k: np.asarray(v) for k, v in trajectory.reward_components.items()}
  parts = [f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>",
           "<style>body{font-family:sans-serif;margin:1em} .turn{display:flex;gap:1em;"
           "margin:.4em 0;border-top:1px solid #ddd;padding-top:.4em} pre{white-space:"
           "pre-wrap;max-width:60em;margin:0} .bad{color:#b00} .ok{color:#070} img{"
           "image-rendering:pixelated;width:224px}</style>",
           f"<h1>{html.escape(title)}</h1>"]
  metrics = {k: float(v) for k, v in trajectory.metrics().items()}
  parts.append("<p>" + ", ".join(f"{k} {v:.3f}" for k, v in metrics.items()) + "</p>")
  for b, turns in enumerate(texts):
    score = ", ".join(f"{k} {v[b]:.2f}" for k, v in components.items())
    parts.append(f"<h2>episode {b}: reward {reward[b]:.3f}</h2><p>{html.escape(score)}</p>")
    for t, text in enumerate(turns):
      shown = range(views) if t == 0 else [views + t - 1]  # what the policy saw before turn t
      view = "".join(f"<img src='{_png(images[b, k])}'>" for k in shown if given[b, k])
      if not valid[b, t]:
        status = "<span class='bad'>malformed</span>"
      elif answer[b, t]:
        status = "<span class='ok'>answer</span>"
      else:
        fields = []
        for i, spec in enumerate(grammar.fields):
          if present[b, t, i] and spec.name != "kind":
            value = values[b, t, i]
            shown = (spec.options[int(value)].decode() if hasattr(spec, "options")
                     else f"{value:g}")
            fields.append(f"{spec.name}={shown}")
        status = f"<span class='ok'>call {html.escape(', '.join(fields))}</span>"
      parts.append(f"<div class='turn'><div>{view}</div><div><b>turn {t}</b> {status}"
                   f"<pre>{html.escape(text)}</pre></div></div>")
  return "\n".join(parts)


def completions_html(images_BxKxHxWx3, prompts: list[str], completions: list[str], reward,
                     components: dict, title: str = "completions") -> str:
  """Single-turn samples (3DThinker): the views, the question, the completion, the reward."""
  images = np.asarray(images_BxKxHxWx3)
  reward = np.asarray(reward)
  components = {k: np.asarray(v) for k, v in components.items()}
  parts = [f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>",
           "<style>body{font-family:sans-serif;margin:1em} pre{white-space:pre-wrap;"
           "max-width:60em} img{image-rendering:pixelated;width:168px;margin-right:4px}"
           "</style>", f"<h1>{html.escape(title)}</h1>",
           "<p>" + ", ".join(f"mean {k} {v.mean():.3f}" for k, v in
                             {"reward": reward, **components}.items()) + "</p>"]
  for b, (prompt, completion) in enumerate(zip(prompts, completions)):
    score = ", ".join(f"{k} {v[b]:.2f}" for k, v in components.items())
    views = "".join(f"<img src='{_png(view)}'>" for view in images[b])
    parts.append(f"<h2>sample {b}: reward {reward[b]:.3f}</h2><p>{html.escape(score)}</p>"
                 f"<div>{views}</div><p>{html.escape(prompt)}</p>"
                 f"<pre>{html.escape(completion)}</pre>")
  return "\n".join(parts)
