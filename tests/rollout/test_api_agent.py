"""API-model episodes (rollout/api_agent.py) against a real loopback chat server with
scripted replies: the actions, views and rewards equal the environments stepped by hand,
the requests hold the agent's prompts and the views as PNG data URLs, a malformed reply
ends the episode, the key comes from the environment, and the host DFA parse agrees with
the host regexes."""

import base64
import functools
import io
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from data_pipelines.synthetic import episodes
from jaxspatial.envs import act3d, peria, think3d
from jaxspatial.perception.judge import ChatEndpoint, EndpointError
from jaxspatial.rollout import agents, api_agent, host_parse, peria_agent, prompts
from jaxspatial.rollout.observation import format_number_host
from tests.perception.chat_server import ChatServer

KEY = jax.random.PRNGKey(3)


def _ids(text, length=64):
  out = np.full(length, -1, np.int32)
  out[:len(text.encode())] = list(text.encode())
  return out


@functools.lru_cache(maxsize=None)
def _rooms(n, seed):
  return episodes.act3d_tasks(n, seed=seed, points=3000)[0]


def _tasks(n, seed, questions, **replace):
  tasks = _rooms(n, seed)
  return tasks.replace(question_ids=np.stack([_ids(q) for q in questions]), **replace)


def _scripted(server, scripts):
  """Replies by episode (the question's tag "Q<b>:") and turn (assistant messages so far)."""
  def reply(body):
    user = body["messages"][1]["content"]
    text = user if isinstance(user, str) else "".join(p.get("text", "") for p in user)
    episode = int(re.search(r"Q(\d+):", text).group(1))
    turn = sum(m["role"] == "assistant" for m in body["messages"])
    return scripts[episode][turn]
  server.reply_fn = reply


def _decoded(url):
  assert url.startswith("data:image/png;base64,")
  return np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))))


def _requests_of(server, b):
  return [r["body"] for r in server.requests
          if f"Q{b}:" in json.dumps(r["body"]["messages"][1])]


def _images(message):
  return [_decoded(p["image_url"]["url"]) for p in message["content"]
          if isinstance(message["content"], list) and p["type"] == "image_url"]


@functools.lru_cache(maxsize=None)
def _env(module, params):
  """(reset, step) of an environment module, jitted with its params (the by-hand episodes)."""
  return (jax.jit(lambda k, t: module.reset(k, t, params)),
          jax.jit(lambda k, s, a: module.step(k, s, a, params)))


def _step_keys(turn, batch):
  return jax.random.split(jax.random.fold_in(jax.random.fold_in(KEY, 2 ** 21), turn), batch)


def _move(action, distance=None):
  arguments = f'"action": "{action}"' + ("" if distance is None else f', "distance": {distance}')
  return ('<think>look</think><tool_call>{"name": "render_view_tool", "arguments": {'
          + arguments + '}}</tool_call> trailing text the turn ignores')


@pytest.fixture(scope="module")
def act3d_run():
  agent = agents.Act3DAgent(act3d.Act3DParams(width=40, height=30, max_interactions=2))
  tasks = _tasks(3, 2, [f"Q{b}: what is near the door?" for b in range(3)])
  name = bytes(np.asarray(tasks.answer_ids[0])[np.asarray(tasks.answer_ids[0]) >= 0]
               .astype(np.uint8).tolist()).decode()
  scripts = [[_move("forward", 0.5), _move("turn_left"),
              f"<think>it is the {name}</think><answer>{name}</answer>"],
             ["It is a sofa, I think."],                               # malformed
             [_move("up"), _move("left", 1.25), _move("forward")]]     # a call in the last turn
  with ChatServer() as server:
    _scripted(server, scripts)
    endpoint = ChatEndpoint(server.base_url, "api-model", api_key_env="JAXSPATIAL_TEST_KEY",
                            concurrency=3, retries=0, timeout_s=10)
    mp = pytest.MonkeyPatch()
    mp.setenv("JAXSPATIAL_TEST_KEY", "sk-test-123")
    try:
      records = api_agent.api_rollout(endpoint, agent, tasks, KEY, max_tokens=256)
    finally:
      mp.undo()
    requests = list(server.requests)
  return dict(agent=agent, tasks=tasks, records=records, requests=requests, server=server,
              name=name, stats=endpoint.stats())


def _by_hand(agent, tasks, b, moves):
  """(views, numbers, state) of episode b with `moves` stepped on the environment itself."""
  task = jax.tree.map(lambda x: jnp.asarray(x[b]), tasks)
  reset_key = jax.random.split(jax.random.fold_in(KEY, 2 ** 20), 3)[b]
  reset, step = _env(act3d, agent.params)
  obs, state = reset(reset_key, task)
  views, numbers = [obs.image], []
  for t, move in enumerate(moves):
    obs, state, _, _, _ = step(_step_keys(t, 3)[b], state, act3d.Act3DAction.navigate(*move))
    views.append(obs.image)
    numbers.append(np.concatenate([obs.position, obs.look_at]))
  return np.stack(views), numbers, state, task


@pytest.mark.xla_default
def test_act3d_episodes_equal_the_environment_stepped_by_hand(act3d_run):
  agent, tasks, records = act3d_run["agent"], act3d_run["tasks"], act3d_run["records"]
  views, _, state, task = _by_hand(agent, tasks, 0, [("forward", 0.5), ("turn_left",)])
  r = records[0]
  assert [a["kind"] for a in r["actions"]] == ["call", "call", "answer"]
  assert r["actions"][0]["fields"] == {"kind": "<tool_call>", "action": "forward",
                                       "distance": 0.5}
  np.testing.assert_array_equal(r["views"], views)
  assert r["answer"] == act3d_run["name"] and r["answered"] and not r["malformed"]
  # Act3D's eqs. 8-9 (0.3 R_judge + 0.2 R_EM + 0.05 R_judge c - 0.2 R_fmt; c = 12 when
  # every answer object was seen, else the interactions), grounding from the state by hand.
  objects = np.asarray(task.answer_objects) >= 0
  grounded = objects.any() and np.all(np.asarray(state.objects_seen) | ~objects)
  assert r["reward_components"]["grounded"] == float(grounded)
  assert r["reward"] == pytest.approx(0.3 + 0.2 + 0.05 * (12 if grounded else 2))
  assert r["reward_components"]["judge"] == 1.0 and r["reward_components"]["interactions"] == 2
  assert r["requests"] == 3 and r["turns"][0].endswith("</tool_call>")  # cut at the tag
  # The malformed reply ends its episode after one request, scored as malformed.
  bad = records[1]
  assert bad["malformed"] and not bad["answered"] and bad["requests"] == 1
  assert [a["kind"] for a in bad["actions"]] == ["malformed"]
  assert bad["reward_components"]["malformed"] == 1.0 and bad["reward"] == pytest.approx(-0.2)
  # A tool call in the last turn ends the episode as malformed.
  views2, _, state2, _ = _by_hand(agent, tasks, 2, [("up",), ("left", 1.25), ("forward",)])
  last = records[2]
  assert last["malformed"] and last["requests"] == 3 and last["actions"][-1]["kind"] == "call"
  np.testing.assert_array_equal(last["views"], views2[:3])  # the last call's view is not shown
  assert act3d_run["stats"]["sent"] == 7


@pytest.mark.xla_default
def test_act3d_requests_hold_the_prompts_and_the_views(act3d_run):
  agent, tasks, requests = act3d_run["agent"], act3d_run["tasks"], act3d_run["requests"]
  assert all(r["headers"]["Authorization"] == "Bearer sk-test-123" for r in requests)
  views, numbers, _, _ = _by_hand(agent, tasks, 0, [("forward", 0.5), ("turn_left",)])
  bodies = _requests_of(act3d_run["server"], 0)
  assert len(bodies) == 3 and all(b["model"] == "api-model" and b["max_tokens"] == 256
                                  for b in bodies)
  system, user = bodies[0]["messages"]
  assert system == {"role": "system", "content": prompts.ACT3D_SYSTEM}
  assert user["content"][0]["type"] == "image_url"
  np.testing.assert_array_equal(_decoded(user["content"][0]["image_url"]["url"]), views[0])
  assert user["content"][1] == {"type": "text", "text": prompts.act3d_user_text(
      "Q0: what is near the door?", tasks.scene_min[0], tasks.scene_max[0])}
  final = bodies[2]["messages"]
  assert [m["role"] for m in final] == ["system", "user", "assistant", "user", "assistant",
                                        "user"]
  assert final[2]["content"] == act3d_run["records"][0]["turns"][0]
  for t in range(2):
    message = final[3 + 2 * t]
    np.testing.assert_array_equal(_images(message)[0], views[t + 1])
    position = ", ".join(format_number_host(v) for v in numbers[t][:3])
    look = ", ".join(format_number_host(v) for v in numbers[t][3:])
    assert message["content"][0] == {"type": "text", "text": "<tool_response>\n"}
    assert message["content"][1]["type"] == "image_url"
    assert message["content"][2] == {
        "type": "text", "text": f"\nCamera at ({position}), looking at ({look}).\n"
                                "</tool_response>"}


def _view(camera, azimuth, elevation, ego):
  return ('<think>v</think><tool_call>{"name": "pi3_tool", "arguments": '
          f'{{"rotation_reference_camera": {camera}, "azimuth_angle": {azimuth}, '
          f'"elevation_angle": {elevation}, "camera_view": {str(ego).lower()}}}}}</tool_call>')


@pytest.mark.xla_default
def test_think3d_episodes_show_the_input_views_and_equal_the_view_tool_by_hand():
  agent = agents.Think3DAgent(think3d.Think3DParams(width=32, height=24, max_rounds=2,
                                                    num_prompt_images=4))
  tasks = _tasks(2, 4, ["Q0: Which is left? (A) a (B) b (C) c", "Q1: Which is left? (A) a"],
                 answer_choice=np.asarray([1, 2], np.int32),
                 num_input_cameras=np.asarray([4, 2], np.int32))
  views = [(2, -45, 10, True), (1, 30.5, 60, False)]
  scripts = [[_view(*views[0]), _view(*views[1]), "<think>ok</think><answer>(B) b</answer>"],
             [_view(6, 0, 0, True), "<think>ok</think><answer>A</answer>"]]
  with ChatServer() as server:
    _scripted(server, scripts)
    endpoint = ChatEndpoint(server.base_url, "m", concurrency=2, retries=0, timeout_s=10)
    records = api_agent.api_rollout(endpoint, agent, tasks, KEY)
    first = [_requests_of(server, b) for b in range(2)]
  # by hand
  task = jax.tree.map(lambda x: jnp.asarray(x[0]), tasks)
  reset, step = _env(think3d, agent.params)
  obs, state = reset(jax.random.split(jax.random.fold_in(KEY, 2 ** 20), 2)[0], task)
  shown = [obs.input_images[k] for k in range(4)]
  for t, (camera, azimuth, elevation, ego) in enumerate(views):
    action = think3d.Think3DAction.view(camera - 1, azimuth, elevation, "ego" if ego else "global")
    obs, state, _, _, info = step(_step_keys(t, 2)[0], state, action)
    assert not info["invalid"]
    shown.append(obs.image)
  np.testing.assert_array_equal(records[0]["views"], np.stack(shown))
  assert [r["reward"] for r in records] == [2.0, 1.0]
  assert records[1]["actions"][0]["invalid"] and records[1]["answer"] == "A"
  # The first prompt shows the task's real input views only (episode 1: 2 of 4).
  for b, count in ((0, 4), (1, 2)):
    system, user = first[b][0]["messages"]
    assert system["content"] == prompts.THINK3D_SYSTEM
    assert len(_images(user)) == count and user["content"][-1]["type"] == "text"
    for k, image in enumerate(_images(user)):
      np.testing.assert_array_equal(image, records[b]["views"][k])
  texts = [p["text"] for p in first[0][2]["messages"][-1]["content"] if p["type"] == "text"]
  assert ("View of camera 1 at azimuth 30.50, elevation 60.00. This is the final turn: do not "
          "call pi3_tool" in "".join(texts))
  rejected = first[1][1]["messages"][-1]["content"]
  assert "The request for camera 6 at azimuth 0.00, elevation 0.00 was rejected" in "".join(
      p.get("text", "") for p in rejected)


def _peria_call(tool, image, key, coords):
  return ('<think>t</think><action>{"name": "' + tool + '", "arguments": {"image_index": '
          f'{image}, "{key}": [{", ".join(map(str, coords))}]}}}}</action>')


PERIA_PARAMS = peria.PeriaParams(width=32, height=24, max_images=4, max_turns=4,
                                 max_path_points=4)


@pytest.mark.xla_default
def test_peria_continues_after_a_format_error_and_shows_each_new_image():
  params = PERIA_PARAMS
  agent = agents.PeriaAgent(params)
  tasks = _tasks(2, 4, ["Q0: which letter?", "Q1: which letter?"],
                 answer_choice=np.asarray([1, 0], np.int32))
  scripts = [[_peria_call("image_crop", 0, "bounding_box", (0, 0, 500, 500)),
              '<think>hm</think><action>{"name": "zoom"}</action>',  # unparseable: retried
              "<think>ok</think><answer>B</answer>"],
             ["<think>ok</think><answer>B"]]                          # never closed: ends
  with ChatServer() as server:
    _scripted(server, scripts)
    endpoint = ChatEndpoint(server.base_url, "m", retries=0, timeout_s=10)
    records = api_agent.api_rollout(endpoint, agent, tasks, KEY)
    bodies = _requests_of(server, 0)
  task = jax.tree.map(lambda x: jnp.asarray(x[0]), tasks)
  reset, step = _env(peria, params)
  obs, state = reset(jax.random.split(jax.random.fold_in(KEY, 2 ** 20), 2)[0], task)
  action = peria.PeriaAction.create(peria.TOOL, peria.TOOLS.index("image_crop"), 0,
                                    (0, 0, 500, 500), max_points=params.max_path_points)
  new, state, _, _, _ = step(_step_keys(0, 2)[0], state, action)
  np.testing.assert_array_equal(records[0]["views"], np.stack([obs.image, new.image]))
  assert [a["kind"] for a in records[0]["actions"]] == ["call", "malformed", "answer"]
  assert records[0]["actions"][1]["variant"] == peria_agent.FORMAT_ERROR_VARIANT
  assert records[0]["reward"] == 2.0 and not records[0]["malformed"]
  assert records[0]["host_reward"] is not None
  assert records[1]["malformed"] and records[1]["requests"] == 1 and records[1]["reward"] == -1.0
  user = bodies[0]["messages"][1]["content"]
  assert user[0] == {"type": "text", "text": "Observation 0:\n"} and user[1]["type"] == "image_url"
  assert user[2] == {"type": "text", "text": "\nQ0: which letter?"}
  assert bodies[1]["messages"][-1]["content"][0]["text"] == (
      "Tool executed successfully.\nObservation 1:\n")
  assert bodies[2]["messages"][-1]["content"] == (
      'Error: Could not parse action. Expected format: <action>{"name": "tool_name", '
      '"arguments": {...}}</action>')


def test_a_spent_budget_raises_or_ends_the_episodes():
  # The fixture's agent and rooms: the programs are already compiled.
  agent = agents.Act3DAgent(act3d.Act3DParams(width=40, height=30, max_interactions=2))
  tasks = _tasks(3, 2, ["Q0: a?", "Q1: b?", "Q2: c?"])
  with ChatServer() as server:
    _scripted(server, [[_move("up"), "<think>x</think><answer>a</answer>"]] * 3)
    endpoint = ChatEndpoint(server.base_url, "m", retries=0, timeout_s=10, max_requests=4)
    with pytest.raises(EndpointError, match="request budget"):  # turn 2's batch of 3 > 1 left
      api_agent.api_rollout(endpoint, agent, tasks, KEY)
    endpoint = ChatEndpoint(server.base_url, "m", retries=0, timeout_s=10, max_requests=4)
    records = api_agent.api_rollout(endpoint, agent, tasks, KEY, on_error="end")
  errors = [r["error"] for r in records]
  assert sum(e is not None for e in errors) == 2
  assert all("budget" in e for e in errors if e is not None)
  assert sum(r["answered"] for r in records) == 1
  assert [r["requests"] for r in records] == [2, 2, 2]


@pytest.mark.parametrize("turn", [
    '<think>a</think><tool_call>{"name": "render_view_tool", "arguments": {"action": "left"}}'
    '</tool_call>',
    '<think>a</think>\n<tool_call> {"name":"render_view_tool", "arguments":{"action":"turn_up",'
    ' "distance": 12.25}} </tool_call>',
    '<think>a</think><tool_call>{"name": "render_view_tool", "arguments": {"action": "left", '
    '"distance": 400}}</tool_call>',
    "<think>a</think><answer>the red chair</answer>",
    "<think>a</think><answer> </answer>",
    "<answer>no thinking</answer>",
])
def test_the_host_dfa_parse_agrees_with_the_host_regex(turn):
  agent = agents.Act3DAgent()
  parsed = api_agent.parse_reply(agent.grammar, turn.encode())
  reference = host_parse.parse_act3d(turn.encode(), agent.max_distance)
  assert bool(parsed.valid) == (reference is not None)
  if reference is None or "answer" in reference:
    return
  fields = api_agent._fields(agent.grammar, parsed)  # pylint: disable=protected-access
  assert act3d.PRIMITIVES.index(fields["action"]) == reference["action"]
  assert fields.get("distance") == reference["distance"]


def test_chat_messages_round_trip_the_first_prompt():
  agent = agents.Act3DAgent()
  tasks = _tasks(1, 2, ["Q0: where?"])
  text = api_agent.first_prompt_texts(agent, tasks)[0]
  assert text == prompts.chat_prompt(agent.system_prompt, prompts.act3d_user_text(
      "Q0: where?", tasks.scene_min[0], tasks.scene_max[0]), 1)
  messages, views = api_agent.chat_messages(text)
  assert views == 1 and [m["role"] for m in messages] == ["system", "user"]
  with pytest.raises(ValueError, match="outside the chat turns"):
    api_agent.chat_messages("stray <|im_start|>user\nx<|im_end|>")


@pytest.mark.parametrize("name", ["act3d", "think3d", "peria"])
def test_the_host_dfa_parse_agrees_with_the_host_regexes_on_generated_turns(name):
  """Valid, mutated and truncated turns (tests/rollout/turn_strings.py): validity, the
  fields and the answer bytes as the host regexes read them."""
  from tests.rollout import turn_strings  # pylint: disable=import-outside-toplevel
  agent = {"act3d": agents.Act3DAgent(), "think3d": agents.Think3DAgent(),
           "peria": agents.PeriaAgent(PERIA_PARAMS)}[name]  # its grammar built once
  grammar = agent.grammar
  regex = {"act3d": lambda t: host_parse.parse_act3d(t, agent.max_distance),
           "think3d": lambda t: host_parse.parse_think3d(t, agent.max_cameras),
           "peria": lambda t: host_parse.parse_peria(t, agent.params.max_images,
                                                     int(agent.params.scale),
                                                     agent.params.max_path_points)}[name]
  value = lambda parsed, field: float(parsed.field(grammar, field)[0])
  checked = 0
  for text in turn_strings.turns(name, 150, seed=7):
    turn = api_agent.cut_turn(text.encode(), grammar.stops)
    parsed, reference = api_agent.parse_reply(grammar, turn), regex(turn)
    assert bool(parsed.valid) == (reference is not None), text
    if reference is None:
      continue
    checked += 1
    if "answer" in reference:
      got = api_agent.answer_bytes(turn)
      assert bytes(got[got >= 0].astype(np.uint8)) == reference["answer"][:128], text
      continue
    if name == "act3d":
      assert value(parsed, "action") == reference["action"]
      assert parsed.field(grammar, "distance")[1] == (reference["distance"] is not None)
      if reference["distance"] is not None:
        assert value(parsed, "distance") == pytest.approx(reference["distance"], abs=1e-4)
    elif name == "think3d":
      assert value(parsed, "camera") == reference["camera"]
      assert value(parsed, "azimuth") == pytest.approx(reference["azimuth"], abs=1e-4)
      assert value(parsed, "elevation") == pytest.approx(reference["elevation"], abs=1e-4)
      assert value(parsed, "camera_view") == float(reference["ego"])
    else:
      assert value(parsed, "tool") == reference["tool"]
      assert value(parsed, "image_index") == reference["image_index"]
      for k, (x, y) in enumerate(reference["points"]):
        assert (value(parsed, f"x{k}"), value(parsed, f"y{k}")) == (x, y)
  assert checked > 20


def test_a_host_judge_replaces_the_rule_judge(act3d_run):
  """`judge(question, answer, references)` as compile_rollout's host judge: it sees the
  recorded answer bytes and its verdict replaces the rule judge (an endpoint is anything
  with `complete_many`)."""
  agent, tasks, name = act3d_run["agent"], act3d_run["tasks"], act3d_run["name"]

  class Scripted:
    def complete_many(self, requests):
      return [f"<think>x</think><answer>{name}</answer>"] * len(requests)

  seen = []

  def judge(question, answer, references):
    seen.append((np.asarray(question), np.asarray(answer), np.asarray(references)))
    return np.asarray([False, True, False])

  records = api_agent.api_rollout(Scripted(), agent, tasks, KEY, judge=judge)
  question, answer, references = seen[0]
  assert bytes(answer[0][answer[0] >= 0].astype(np.uint8)).decode() == name
  np.testing.assert_array_equal(question, tasks.question_ids)
  np.testing.assert_array_equal(references, tasks.answer_ids)
  assert [r["reward_components"]["judge"] for r in records] == [0.0, 1.0, 0.0]
  assert records[0]["reward_components"]["exact_match"] == 1.0


def test_views_are_written_as_pngs(act3d_run, tmp_path):
  records = [dict(r) for r in act3d_run["records"]]
  api_agent.write_views(records, tmp_path / "views")
  assert len(records[0]["view_paths"]) == 3
  np.testing.assert_array_equal(np.asarray(Image.open(records[0]["view_paths"][2])),
                                records[0]["views"][2])
