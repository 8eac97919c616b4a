"""HTML pages of episodes, readable without the code: per episode the question, its options,
the reference answer, the prediction and the parsed answer beside the numbered, framed
views; then each turn's text (forced tokens marked), its parsed action and the view it
produced. recipes/benchmark_run.py's episodes.html is built from the same pieces.

All text is escaped: model output is hostile input."""

from __future__ import annotations

import base64
import html
import io
import re
from typing import Sequence

import numpy as np
from PIL import Image

from jaxspatial.rollout.token_table import token_bytes

# Long unbroken text (a model repeating one token) wraps instead of widening the page;
# min-width:0 lets flex children shrink below their content's width, so it can wrap.
STYLE = (
    "<style>body{font-family:sans-serif;margin:1em;background:#f4f4f4;color:#222;"
    "max-width:100%;overflow-wrap:anywhere} "
    "pre,.text{white-space:pre-wrap;overflow-wrap:anywhere;margin:0;font-size:.9em} "
    ".episode,.q{background:#fff;border:1px solid #999;border-radius:6px;padding:.5em 1em;"
    "margin:1em 0} .q .episode{margin:.6em 0;border-color:#ccc} "
    ".summary,.turn{display:flex;gap:1em;flex-wrap:wrap;align-items:flex-start} "
    ".summary>*,.turn>*{min-width:0;flex:1 1 20em} .summary>.views,.turn>.views{flex:0 1 auto} "
    ".turn{border-top:1px solid #ddd;margin-top:.4em;padding:.4em .3em 0} "
    ".facts{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:.25em .8em;"
    "margin:0} .facts dt{font-weight:bold} .facts dd{margin:0;min-width:0} "
    ".options{margin:0;padding-left:1.2em} "
    ".views{display:flex;flex-wrap:wrap;gap:.5em} "
    "figure.view{margin:0;padding:3px;border:2px solid #333;background:#ccc;border-radius:3px} "
    "figure.view img{display:block;width:192px;image-rendering:pixelated;"
    "outline:1px solid #000} "
    "figure.view figcaption{font-size:.85em;font-weight:bold;text-align:center;"
    "padding-top:2px} "
    ".turn.forced{background:#fff4d0} .forced-text{background:#ffe08a} "
    ".label{display:inline-block;font-size:.8em;font-weight:bold;padding:0 .4em;"
    "border-radius:3px;margin-left:.4em} .label.forced{background:#c77a00;color:#fff} "
    ".ok{color:#070} .bad{color:#b00} .none{color:#777;font-style:italic}</style>")

LETTERS = "ABCDEFGHIJ"


def page_head(title: str, legend: str = "") -> list[str]:
  """The page's opening parts: doctype, style, the title and a legend paragraph."""
  return [f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>", STYLE,
          f"<h1>{html.escape(title)}</h1>"] + ([f"<p>{legend}</p>"] if legend else [])


def view_figure(src: str, number: int, note: str = "") -> str:
  """One view, framed, captioned "View n" as questions count images (from 1)."""
  caption = f"View {number}" + (f" ({html.escape(note)})" if note else "")
  return (f"<figure class=view><img src='{html.escape(src)}' alt='View {number}'>"
          f"<figcaption>{caption}</figcaption></figure>")


def missing(what: str) -> str:
  return f"<span class=none>{html.escape(what)}</span>"


def text_block(text: str | None, cls: str, absent: str = "none", tag: str = "pre") -> str:
  """Escaped text, wrapped; `pre` (monospace) for model output."""
  return (missing(absent) if text is None
          else f"<{tag} class={cls}>{html.escape(text)}</{tag}>")


def options_list(options: Sequence[str]) -> str:
  """Options as "A. text" (readers store them with or without their letter)."""
  items = [o if o[:2] == f"{LETTERS[k]}." else f"{LETTERS[k]}. {o}"
           for k, o in enumerate(options)]
  return "<ul class=options>" + "".join(f"<li>{html.escape(o)}</li>" for o in items) + "</ul>"


def parsed_answer(parsed: str | None, correct: bool | None, note: str = "") -> str:
  """What the scorer read from the prediction and its verdict."""
  shown = missing("nothing parsed") if parsed is None else f"<b>{html.escape(parsed)}</b>"
  verdict = ("" if correct is None else " <span class=ok>correct</span>" if correct
             else " <span class=bad>incorrect</span>")
  return shown + verdict + (f" {html.escape(note)}" if note else "")


def facts(rows: Sequence[tuple[str, str, str]]) -> str:
  """A definition list of (class, label, html) rows; the class names the field (tests)."""
  return "<dl class=facts>" + "".join(f"<dt>{html.escape(label)}</dt><dd class={cls}>{value}"
                                      "</dd>" for cls, label, value in rows) + "</dl>"


def question_facts(question: str | None, options: Sequence[str],
                   references: Sequence[str] | None) -> list[tuple[str, str, str]]:
  rows = [("question", "Question", text_block(question, "text", "not recorded", "div"))]
  if options:
    rows.append(("options", "Options", options_list(options)))
  rows.append(("reference", "Reference",
               missing("not recorded") if references is None
               else f"<b>{html.escape(' | '.join(references))}</b>"))
  return rows


def png_src(image) -> str:
  buffer = io.BytesIO()
  Image.fromarray(np.asarray(image, np.uint8)).save(buffer, format="PNG")
  return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _turn_ids(trajectory) -> list[list[np.ndarray]]:
  """Each episode's generated turns as token ids."""
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
      turns.append(tokens[b, starts[t]:starts[t] + lengths[b, t]])
    out.append(turns)
  return out


def _decode(pieces: list[bytes], ids) -> str:
  return b"".join(pieces[i] if i < len(pieces) else b"<?>" for i in ids).decode(
      "utf-8", "replace")


def turn_texts(trajectory, tokenizer) -> list[list[str]]:
  """Each episode's generated turns as text."""
  pieces, _ = token_bytes(tokenizer)
  return [[_decode(pieces, ids) for ids in turns] for turns in _turn_ids(trajectory)]


_USER = re.compile(r"<\|im_start\|>user\n(.*?)(?:<\|im_end\|>|$)", re.S)
_VISION = re.compile(r"<\|vision_start\|>.*?<\|vision_end\|>", re.S)


def prompt_question(trajectory, pieces: list[bytes], b: int) -> str | None:
  """The question as the prompt gave it: its last user message, images left out (Qwen's
  chat layout); None if the prompt has none."""
  first = int(np.asarray(trajectory.turn_start)[0])
  ids = np.asarray(trajectory.tokens)[b, :first]
  text = _decode(pieces, ids[np.asarray(trajectory.attention_mask)[b, :first] > 0])
  found = _USER.findall(text)
  return _VISION.sub("", found[-1]).strip() if found else None


def _task_text(ids) -> str:
  ids = np.asarray(ids)
  return bytes(ids[ids >= 0].astype(np.uint8).tolist()).decode("utf-8", "replace")


def _forced_counts(forced, shape) -> np.ndarray:
  """[B, T] forced tokens per turn from `forced`: the rollout's forced ids [B, T, N] (-1:
  sampled; forcing is a prefix) or a [B, T] bool mask of turns forced whole."""
  if forced is None:
    return np.zeros(shape, np.int64)
  forced = np.asarray(forced)
  if forced.ndim == 3:
    counts = np.sum(forced >= 0, -1)
  else:
    counts = np.where(forced.astype(bool), np.iinfo(np.int32).max, 0)
  out = np.zeros(shape, np.int64)
  turns = min(shape[1], counts.shape[1])
  out[:, :turns] = counts[:shape[0], :turns]
  return out


def _action(grammar, values, present) -> str:
  fields = []
  for i, spec in enumerate(grammar.fields):
    if present[i] and spec.name != "kind":
      value = values[i]
      shown = spec.options[int(value)].decode() if hasattr(spec, "options") else f"{value:g}"
      fields.append(f"{spec.name}={shown}")
  return ", ".join(fields)


ROLLOUT_LEGEND = (
    "Per episode: the question, the reference answer, the prediction (the final answer "
    "turn) and the parsed answer (what the scorer read from it) beside the views the "
    "policy saw first; then each turn with the view it produced. Views are numbered in the "
    "order the policy saw them. <span class='label forced'>forced</span> marks turns whose "
    "tokens (highlighted) were written by a script or teacher, not sampled by the policy.")
UNMARKED = (" This page was not given the rollout's forced tokens: forced turns are not "
            "marked.")


def trajectory_html(trajectory, tokenizer, grammar, title: str = "rollouts", *,
                    questions: Sequence[str] | None = None,
                    options: Sequence[Sequence[str]] | None = None,
                    references: Sequence | None = None, tasks=None, forced=None) -> str:
  """The page of a batch of episodes. Optional per-episode context: `questions` (default:
  the task's question_ids, else the prompt's user text), `options`, `references` (a string
  or a list per episode; default: the task's answer_ids), `tasks` (the batch's `Task`) and
  `forced` (the rollout's forced ids [B, T, N], or a [B, T] mask of forced turns): the
  trajectory does not record what was forced."""
  pieces, _ = token_bytes(tokenizer)
  ids = _turn_ids(trajectory)
  images = np.asarray(trajectory.images)
  given = np.asarray(trajectory.image_given)
  views = trajectory.num_prompt_images
  valid = np.asarray(trajectory.turn_valid)
  answer = np.asarray(trajectory.turn_answer)
  rejected = np.asarray(trajectory.env_invalid)
  values = np.asarray(trajectory.action_values)
  present = np.asarray(trajectory.action_present)
  answers = np.asarray(trajectory.answer)
  reward = np.asarray(trajectory.reward)
  components = {k: np.asarray(v) for k, v in trajectory.reward_components.items()}
  counts = _forced_counts(forced, answer.shape)
  parts = page_head(title, ROLLOUT_LEGEND + ("" if forced is not None else UNMARKED))
  metrics = {k: float(v) for k, v in trajectory.metrics().items()}
  parts.append("<p>" + html.escape(", ".join(f"{k} {v:.3f}" for k, v in metrics.items()))
               + "</p>")
  for b, turns in enumerate(ids):
    question = questions[b] if questions is not None else None
    refs = references[b] if references is not None else None
    if tasks is not None:
      if question is None and np.any(np.asarray(tasks.question_ids)[b] >= 0):
        question = _task_text(np.asarray(tasks.question_ids)[b])
      if refs is None:
        refs = [_task_text(r) for r in np.asarray(tasks.answer_ids)[b] if r[0] >= 0]
    if question is None:
      question = prompt_question(trajectory, pieces, b)
    refs = [refs] if isinstance(refs, str) else refs
    answered = [t for t in range(len(turns)) if answer[b, t]]
    prediction = _decode(pieces, turns[answered[-1]]) if answered else None
    parsed = _task_text(answers[b]) if answered else None
    correct = bool(components["judge"][b] >= 0.5) if "judge" in components else None
    rows = question_facts(question, options[b] if options is not None else (), refs) + [
        ("prediction", "Prediction", text_block(prediction, "text", "no answer turn")),
        ("parsed", "Parsed answer", parsed_answer(parsed, correct))]
    seen = [k for k in range(images.shape[1]) if given[b, k]]
    number = {k: n + 1 for n, k in enumerate(seen)}  # as the policy met them
    first = "".join(view_figure(png_src(images[b, k]), number[k], "input")
                    for k in seen if k < views)
    score = ", ".join(f"{k} {v[b]:.2f}" for k, v in components.items())
    parts.append(f"<section class=episode><h2>episode {b}: reward {reward[b]:.3f}</h2>"
                 f"<p>{html.escape(score)}</p><div class=summary>{facts(rows)}"
                 f"<div class=views>{first}</div></div>")
    for t, turn in enumerate(turns):
      if not valid[b, t]:
        status = "<span class=bad>malformed</span>"
      elif answer[b, t]:
        status = "<span class=ok>answer</span>"
      else:
        action = html.escape(_action(grammar, values[b, t], present[b, t]))
        status = (f"<span class=bad>call {action}, rejected by the environment</span>"
                  if rejected[b, t] else f"<span class=ok>call {action}</span>")
      k = min(int(counts[b, t]), len(turn))
      label = ("" if k == 0 else "<span class='label forced'>forced</span>" if k == len(turn)
               else f"<span class='label forced'>forced: first {k} of {len(turn)} tokens"
               "</span>")
      text = (f"<span class=forced-text>{html.escape(_decode(pieces, turn[:k]))}</span>"
              if k else "") + html.escape(_decode(pieces, turn[k:]))
      after = views + t
      produced = (view_figure(png_src(images[b, after]), number[after], f"after turn {t + 1}")
                  if after in number else "")
      parts.append(f"<div class='turn{' forced' if k else ''}'><div><b>Turn {t + 1}</b> "
                   f"{status}{label}<pre class=text>{text}</pre></div>"
                   f"<div class=views>{produced}</div></div>")
    # Views given after the last turn shown (none in a well-formed trajectory) stay visible.
    extra = [k for k in seen if k >= views + len(turns)]
    if extra:
      parts.append("<div class=views>" + "".join(
          view_figure(png_src(images[b, k]), number[k]) for k in extra) + "</div>")
    parts.append("</section>")
  return "\n".join(parts)


def completions_html(images_BxKxHxWx3, prompts: list[str], completions: list[str], reward,
                     components: dict, title: str = "completions") -> str:
  """Single-turn samples (3DThinker): the views, the question, the completion, the reward."""
  images = np.asarray(images_BxKxHxWx3)
  reward = np.asarray(reward)
  components = {k: np.asarray(v) for k, v in components.items()}
  parts = page_head(title) + [
      "<p>" + html.escape(", ".join(f"mean {k} {v.mean():.3f}" for k, v in
                                    {"reward": reward, **components}.items())) + "</p>"]
  for b, (prompt, completion) in enumerate(zip(prompts, completions)):
    score = ", ".join(f"{k} {v[b]:.2f}" for k, v in components.items())
    figures = "".join(view_figure(png_src(view), k + 1) for k, view in enumerate(images[b]))
    parts.append(f"<section class=episode><h2>sample {b}: reward {reward[b]:.3f}</h2>"
                 f"<p>{html.escape(score)}</p><div class=summary>"
                 + facts([("question", "Prompt", text_block(prompt, "text")),
                          ("prediction", "Completion", text_block(completion, "text"))])
                 + f"<div class=views>{figures}</div></div></section>")
  return "\n".join(parts)
