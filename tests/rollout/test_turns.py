"""Each agent writes a turn from fields (`call_turn`, `answer_turn`) that its paper's parser
reads back to the same fields: the host regexes of `host_parse`, which are checked against
the on-device grammars in test_automaton.py. Fields the grammar cannot hold are refused."""

import pytest

from jaxspatial.envs.act3d import PRIMITIVES
from jaxspatial.rollout import AGENTS, host_parse, prompts
from jaxspatial.rollout.agents import Act3DAgent, Think3DAgent
from jaxspatial.rollout.grammars import PERIA_ARGUMENTS, PERIA_TOOLS, THINK3D_PRESET_VIEWS
from jaxspatial.rollout.peria_agent import PeriaAgent


def test_act3d_calls_parse_back_to_their_fields():
  agent = Act3DAgent()
  for k, action in enumerate(PRIMITIVES):
    for distance in (None, 0, 1.5, 2.25, 359.999, 3.0):
      turn = agent.call_turn(f"step {k}", action, distance)
      parsed = host_parse.parse_act3d(turn.encode(), agent.max_distance)
      assert parsed == {"action": k, "distance": None if distance is None else
                        round(distance, 2)}, turn
  with pytest.raises(ValueError, match="Act3D action"):
    agent.call_turn("x", "jump")
  with pytest.raises(ValueError, match="Act3D distance"):
    agent.call_turn("x", "forward", 400)


def test_think3d_calls_parse_back_to_their_fields():
  agent = Think3DAgent()
  for camera, azimuth, elevation, ego in ((1, -180, -90, False), (8, 180, 90, True),
                                          (3, 12.345, -0.5, False), (2, 0, 0, True)):
    turn = agent.call_turn("look", camera, azimuth, elevation, ego=ego)
    assert host_parse.parse_think3d(turn.encode(), agent.max_cameras) == {
        "camera": camera, "azimuth": round(azimuth, 2), "elevation": round(elevation, 2),
        "ego": ego}, turn
  preset = Think3DAgent(views="preset")
  for azimuth, elevation in THINK3D_PRESET_VIEWS:
    turn = preset.call_turn("look", 1, float(azimuth), elevation)
    assert host_parse.parse_think3d(turn.encode(), views="preset")["azimuth"] == azimuth, turn
  for bad in ((0, 0, 0), (9, 0, 0), (1, 181, 0), (1, 0, -91)):
    with pytest.raises(ValueError, match="Think3D"):
      agent.call_turn("x", *bad)
  with pytest.raises(ValueError, match="preset views"):
    preset.call_turn("x", 1, 30, 0)


@pytest.mark.parametrize("coordinates", ["list", "boxed"])
def test_peria_calls_parse_back_to_their_fields(coordinates):
  agent = PeriaAgent(coordinate_format=coordinates)
  points = [(0, 1000), (420, 310), (680, 590)]
  for tool_index, tool in enumerate(PERIA_TOOLS):
    label = "cup 2" if tool == "image_label" else None
    turn = agent.call_turn("crop it", tool, 3, points, label=label)
    parsed = host_parse.parse_peria(turn.encode(), coordinates=coordinates)
    assert parsed["tool"] == tool_index and parsed["image_index"] == 3, turn
    assert parsed["points"] == points, turn
    assert parsed["label"] == (None if label is None else label.encode()), turn
  for bad in ({"tool": "zoom"}, {"image_index": 10}, {"points": [(0, 1001)]},
              {"points": []}, {"points": [(1, 1)] * 9}):
    fields = {"tool": "image_crop", "image_index": 0, "points": [(1, 2)], **bad}
    with pytest.raises(ValueError, match="PERIA"):
      agent.call_turn("x", **fields)
  with pytest.raises(ValueError, match="image_label"):
    agent.call_turn("x", "image_label", 0, [(1, 2)], label='say "hi"')


class _PadOnly:  # TextTool reads only the pad id here: nothing is tokenised
  pad_token_id = 0


def test_peria_perception_calls_write_their_text_arguments():
  """A perception tool's call: image_index alone, a box, or a text argument under the
  tool's own key (its registry arguments) or the key asked for; the host regex reads the
  same fields back. Text the grammar cannot hold as written is refused."""
  from jaxspatial.perception import TOOLS, TextTool  # pylint: disable=import-outside-toplevel
  names = ("text_ocr", "text_segment", "grounding_dino")
  tools = [TextTool(n, str, _PadOnly(), 8, arguments=TOOLS[n].arguments,
                    optional=TOOLS[n].optional) for n in names]
  agent = PeriaAgent().with_perception(tools)
  parse = lambda turn: host_parse.parse_peria(turn.encode(), text_tools=names)
  # The system prompt names each tool's public arguments.
  listed = prompts.peria_perception_text(agent.perception)
  for clause in ("text_ocr takes image_index and an optional bounding_box",
                 "text_segment takes image_index and text_prompt",
                 "grounding_dino takes image_index and question"):
    assert clause in listed, listed
  text_prompt, question = PERIA_ARGUMENTS.index("text_prompt"), PERIA_ARGUMENTS.index("question")
  cases = [(("text_segment", 1), dict(text="red chair ä"), text_prompt, b"red chair \xc3\xa4"),
           (("grounding_dino", 0), dict(text="chair. table."), question, b"chair. table."),
           (("text_segment", 0), dict(text="cup", text_key="question"), question, b"cup"),
           (("text_ocr", 2), {}, None, None)]
  for (tool, index), kwargs, argument, text in cases:
    parsed = parse(agent.call_turn("look", tool, index, **kwargs))
    assert parsed == {"tool": 6 + names.index(tool), "image_index": index, "points": [],
                      "argument": argument, "label": None, "text": text}, (tool, kwargs)
  boxed = parse(agent.call_turn("read", "text_ocr", 0, [(0, 0), (500, 500)]))
  assert boxed["argument"] == 0 and boxed["points"] == [(0, 0), (500, 500)]
  for text in ('say "hi"', "a\\b", "two\nlines", " ", ""):
    with pytest.raises(ValueError, match="text argument with a non-space character"):
      agent.call_turn("x", "text_segment", 0, text=text)
  with pytest.raises(ValueError, match="takes no text argument"):
    agent.call_turn("x", "text_ocr", 0, text="chair")
  with pytest.raises(ValueError, match="text_key must be one of"):
    agent.call_turn("x", "text_segment", 0, text="chair", text_key="prompt")
  with pytest.raises(ValueError, match="a box or a text argument, not both"):
    agent.call_turn("x", "text_segment", 0, [(0, 0), (9, 9)], text="chair")
  with pytest.raises(ValueError, match="interaction tools take no text argument"):
    agent.call_turn("x", "image_crop", 0, [(0, 0), (9, 9)], text="chair")


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_answers_parse_back_and_blank_ones_are_refused(name):
  agent = AGENTS[name]()
  parse = host_parse.PARSERS[name]
  for answer in ("A", "red chair", "x < 3"):
    assert parse(agent.answer_turn("so", answer).encode()) == {"answer": answer.encode()}
  assert agent.answer_turn("so", "B").startswith(agent.answer_prefix("so"))
  for answer in ("", "  ", "a</answer>"):
    with pytest.raises(ValueError, match="answer"):
      agent.answer_turn("so", answer)
  with pytest.raises(ValueError, match="thought"):
    agent.answer_turn("a</think>b", "A")
