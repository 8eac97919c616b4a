"""The rollout page (`viewer.trajectory_html`): per episode the question, its options, the
reference, the prediction and the parsed answer beside its numbered, framed views; forced
turns marked; model text escaped. Pages are read with html.parser; the helpers here also
read look_around's page and the benchmark's episodes.html (tests/recipes)."""

from __future__ import annotations

import html.parser
import re
import types

import jax.numpy as jnp
import numpy as np
import pytest

from jaxspatial.rollout import grammars, prompts, viewer
from jaxspatial.rollout.trajectory import Trajectory

HOSTILE = "<script>alert('owned')</script>"
QUESTION = "Which colour is the box on your left? A. red B. blue"


class Node:
  """An element of a parsed page: tag, attributes, children (nodes and text)."""

  def __init__(self, tag: str, attrs):
    self.tag, self.attrs, self.children = tag, dict(attrs), []

  @property
  def classes(self) -> list[str]:
    return (self.attrs.get("class") or "").split()

  def text(self) -> str:
    return "".join(c if isinstance(c, str) else c.text() for c in self.children)

  def find(self, tag: str | None = None, cls: str | None = None) -> list["Node"]:
    """Descendants with `tag` and / or class `cls`, in document order."""
    out = []
    for child in self.children:
      if isinstance(child, Node):
        if (tag is None or child.tag == tag) and (cls is None or cls in child.classes):
          out.append(child)
        out += child.find(tag, cls)
    return out


class _Tree(html.parser.HTMLParser):
  VOID = {"img", "meta", "br", "hr", "link", "input"}

  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.root = Node("document", [])
    self.stack = [self.root]

  def handle_starttag(self, tag, attrs):
    node = Node(tag, attrs)
    self.stack[-1].children.append(node)
    if tag not in self.VOID:
      self.stack.append(node)

  def handle_endtag(self, tag):
    for i in range(len(self.stack) - 1, 0, -1):
      if self.stack[i].tag == tag:
        del self.stack[i:]
        return

  def handle_data(self, data):
    self.stack[-1].children.append(data)


def parse_page(text: str) -> Node:
  tree = _Tree()
  tree.feed(text)
  tree.close()
  return tree.root


def field(node: Node, name: str) -> str:
  """The text of the one fact `name` (dd.name) under `node`."""
  found = node.find("dd", name)
  assert len(found) == 1, (name, len(found))
  return found[0].text()


def check_views(node: Node, count: int) -> None:
  """`node` shows `count` framed views, each an <img> captioned "View n", n = 1..count."""
  figures = node.find("figure", "view")
  assert len(node.find("img")) == len(figures) == count
  for n, figure in enumerate(figures, 1):
    assert len(figure.find("img")) == 1 and figure.find("img")[0].attrs["alt"] == f"View {n}"
    assert re.fullmatch(rf"View {n}( \(.*\))?", figure.find("figcaption")[0].text())


def call_turn(action: str) -> str:
  return ('<think>look</think><tool_call>{"name": "render_view_tool", "arguments": '
          f'{{"action": "{action}", "distance": 0.5}}}}</tool_call>')


def answer_turn(answer: str) -> str:
  return f"<think>I see it</think><answer>{answer}</answer>"


def make_trajectory(tokenizer, question: str, episodes: list[list[str]], judge,
                    views: int = 1, size: int = 12) -> Trajectory:
  """A Trajectory laid out as the rollout lays one out (the left-padded prompt, then each
  turn's slots and an observation message) from each episode's turn strings; a turn with
  <answer> answers, the others call. Views: white with a coloured square (white
  backgrounds must not melt into the page); one given after each call."""
  grammar = grammars.act3d()
  batch, turns = len(episodes), max(map(len, episodes))
  prompt = prompts.chat_prompt("Answer with a letter.", question, 2, num_images=views)
  ids, mask = prompts.left_padded(tokenizer, [prompt] * batch)
  encoded = [[tokenizer.encode(t, add_special_tokens=False) for t in e] for e in episodes]
  widths = [max(len(e[t]) if t < len(e) else 0 for e in encoded) for t in range(turns)]
  starts = ids.shape[1] + np.cumsum([0] + [w + 3 for w in widths[:-1]])
  tokens = np.zeros((batch, starts[-1] + widths[-1] + 3), np.int32)
  tokens[:, :ids.shape[1]] = ids
  attention, generated = np.zeros(tokens.shape, bool), np.zeros(tokens.shape, bool)
  attention[:, :ids.shape[1]] = mask
  images = np.full((batch, views + turns, size, size, 3), 255, np.uint8)
  given = np.zeros((batch, views + turns), bool)
  given[:, :views] = True
  shape = (batch, turns)
  length, active, answered = np.zeros(shape, np.int32), np.zeros(shape, bool), np.zeros(shape, bool)
  values, present = np.zeros(shape + (3,), np.float32), np.zeros(shape + (3,), bool)
  answer = np.full((batch, 64), -1, np.int32)
  for b, episode in enumerate(encoded):
    for t, turn in enumerate(episode):
      span = slice(starts[t], starts[t] + len(turn))
      tokens[b, span], attention[b, span], generated[b, span] = turn, True, True
      length[b, t], active[b, t] = len(turn), True
      body = re.search("<answer>(.*)</answer>", episodes[b][t], re.S)
      answered[b, t] = body is not None
      if body:
        data = np.frombuffer(body.group(1).encode(), np.uint8)
        answer[b, :len(data)] = data
        values[b, t, 0], present[b, t, 0] = 1, True
      else:
        action = re.search(r'"action": "(\w+)"', episodes[b][t]).group(1).encode()
        values[b, t] = (0, grammar.fields[1].options.index(action), 0.5)
        present[b, t], given[b, views + t] = True, True
    for k in range(views + turns):
      images[b, k, size // 3:-(size // 3), size // 3:-(size // 3)] = (50 * (b + k) % 256, 90, 200)
  judge = np.asarray(judge, np.float32)
  arrays = dict(
      tokens=tokens, attention_mask=attention, loss_mask=generated,
      logprobs=np.zeros(tokens.shape, np.float32), images=images, image_given=given,
      turn_start=starts.astype(np.int32), turn_end=(starts + widths).astype(np.int32),
      turn_length=length, turn_active=active, turn_valid=active, turn_answer=answered,
      env_invalid=np.zeros(shape, bool), action_values=values, action_present=present,
      observation_numbers=np.zeros((batch, turns + 1, 6), np.float32),
      observation_variant=np.zeros(shape, np.int32),
      observation_hashes=np.zeros((batch, turns + 1), np.uint32), answer=answer,
      reward=judge)
  # jax arrays, as the rollout returns them (callers take their rows with local_rows).
  return Trajectory(**{k: jnp.asarray(v) for k, v in arrays.items()},
                    reward_components={"judge": jnp.asarray(judge)})


EPISODES = [[call_turn("turn_left"), answer_turn("A")], [answer_turn(HOSTILE)]]


@pytest.fixture(scope="module")
def trajectory(tokenizer):
  return make_trajectory(tokenizer, QUESTION, EPISODES, judge=[1.0, 0.0])


def _forced(tokenizer) -> np.ndarray:
  """Episode 0's call forced whole; episode 1's answer forced for its first 3 tokens."""
  forced = np.full((2, 2, 64), -1, np.int32)
  call = tokenizer.encode(EPISODES[0][0], add_special_tokens=False)
  forced[0, 0, :len(call)] = call
  forced[1, 0, :3] = tokenizer.encode(EPISODES[1][0], add_special_tokens=False)[:3]
  return forced


def test_each_episode_shows_question_reference_prediction_parsed_answer_and_views(
    trajectory, tokenizer):
  page = viewer.trajectory_html(trajectory, tokenizer, grammars.act3d(), title="rollouts",
                                questions=[QUESTION] * 2, options=[("red", "blue")] * 2,
                                references=["A", "B"], forced=_forced(tokenizer))
  assert "overflow-wrap:anywhere" in page and "white-space:pre-wrap" in page
  episodes = parse_page(page).find("section", "episode")
  assert len(episodes) == 2
  for b, episode in enumerate(episodes):
    assert field(episode, "question") == QUESTION
    assert [li.text() for li in episode.find("dd", "options")[0].find("li")] == [
        "A. red", "B. blue"]
    assert field(episode, "reference") == "AB"[b]
    assert field(episode, "prediction") == EPISODES[b][-1]
  assert field(episodes[0], "parsed") == "A correct"
  assert field(episodes[1], "parsed") == f"{HOSTILE} incorrect"
  # Episode 0: the input view, then the view its call produced (beside that turn).
  check_views(episodes[0], 2)
  check_views(episodes[1], 1)
  turns = episodes[0].find("div", "turn")
  assert turns[0].find("figcaption")[0].text() == "View 2 (after turn 1)"
  assert "call action=turn_left, distance=0.5" in turns[0].text()
  # Forced turns are labelled and set apart; the policy's own are not.
  assert "forced" in turns[0].classes and "forced" not in turns[1].classes
  assert [s.text() for s in turns[0].find("span", "label")] == ["forced"]
  assert turns[0].find("span", "forced-text")[0].text() == EPISODES[0][0]
  prefix = episodes[1].find("div", "turn")[0]
  label = prefix.find("span", "label")[0].text()
  assert re.fullmatch(r"forced: first 3 of \d+ tokens", label)
  assert EPISODES[1][0].startswith(prefix.find("span", "forced-text")[0].text())


def test_model_output_is_escaped(trajectory, tokenizer):
  page = viewer.trajectory_html(trajectory, tokenizer, grammars.act3d(),
                                questions=[HOSTILE] * 2, references=[HOSTILE] * 2)
  assert "<script" not in page
  tree = parse_page(page)
  assert not tree.find("script")
  episode = tree.find("section", "episode")[1]
  assert HOSTILE in field(episode, "prediction") and HOSTILE in field(episode, "parsed")
  assert field(episode, "question") == field(episode, "reference") == HOSTILE


def test_question_from_the_prompt_and_reference_from_the_task(trajectory, tokenizer):
  """Without context the question is the prompt's; the task's answer_ids give the
  reference; without them the page says it is not recorded."""
  page = parse_page(viewer.trajectory_html(trajectory, tokenizer, grammars.act3d()))
  episode = page.find("section", "episode")[0]
  assert field(episode, "question") == QUESTION
  assert field(episode, "reference") == "not recorded" and not episode.find("dd", "options")
  answers = np.full((2, 2, 8), -1, np.int32)
  answers[:, 0, 0], answers[1, 1, :3] = ord("A"), np.frombuffer(b"red", np.uint8)
  tasks = types.SimpleNamespace(question_ids=np.full((2, 4), -1, np.int32),
                                answer_ids=answers)
  page = parse_page(viewer.trajectory_html(trajectory, tokenizer, grammars.act3d(),
                                           tasks=tasks))
  assert [field(e, "reference") for e in page.find("section", "episode")] == ["A", "A | red"]
