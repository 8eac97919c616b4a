"""SpatialClaw's reply parsing as hostile input: the four-header step (think blocks, header
spellings, missing / misordered headers, nested and truncated fences), the structured
call, the plan's checklist and answers; huge and adversarial replies parse in bounded
time and only ever raise StepFormatError."""

import time

import pytest

from jaxspatial.agents import feedback as fb
from jaxspatial.agents import schema
from tests.deadline import deadline

STEP = """**Purpose**
Reconstruct the first two frames.

**Reasoning**
I need 3D positions. Verified: 1, 3

**Next Goal**
Find the chair.

**Code**
```python
r = tools.Reconstruct(frames=[0, 1])
print(r["points"].shape)
```
Some trailing prose that is ignored.
"""


def test_well_formed_step():
  step = schema.parse_step(STEP)
  assert step.purpose == "Reconstruct the first two frames."
  assert step.reasoning.startswith("I need 3D positions.")
  assert step.next_goal == "Find the chair."
  assert step.code == 'r = tools.Reconstruct(frames=[0, 1])\nprint(r["points"].shape)'
  assert not step.truncated and step.verified == (1, 3)


def test_think_blocks_are_stripped():
  decoy = "<think>\n**Purpose**\nx\n**Reasoning**\ny\n**Next Goal**\nz\n**Code**\n```python\nbad()\n```\n</think>\n"
  assert schema.parse_step(decoy + STEP).code.startswith("r = tools")
  # A template that opened the block in the prompt: only the closing tag is in the reply.
  assert schema.parse_step("thinking about it **Code**\n</think>\n" + STEP).purpose.startswith(
      "Reconstruct")
  # Case and several blocks.
  assert schema.parse_step("<THINK>a</THINK>" + STEP + "<think>b</think>").code.endswith(
      "shape)")
  # An opening tag never closed is dropped as a tag; the step after it still parses.
  assert schema.parse_step("<think>\n" + STEP).purpose.startswith("Reconstruct")


@pytest.mark.parametrize("header", ["**Purpose:**", "**Purpose**:", "## **Purpose**",
                                    "**PURPOSE**", "  **purpose**  "])
def test_header_spellings(header):
  step = schema.parse_step(STEP.replace("**Purpose**", header))
  assert step.purpose == "Reconstruct the first two frames."


def test_header_with_text_on_its_line():
  step = schema.parse_step(STEP.replace("**Purpose**\n", "**Purpose**: "))
  assert step.purpose == "Reconstruct the first two frames."


@pytest.mark.parametrize("drop, named", [("**Purpose**", "**Purpose**"),
                                         ("**Next Goal**", "**Next Goal**"),
                                         ("**Code**", "**Code**")])
def test_missing_header_is_named(drop, named):
  with pytest.raises(schema.StepFormatError, match=r"missing .*" + named.replace("*", r"\*")):
    schema.parse_step(STEP.replace(drop, "Something"))


def test_misordered_headers():
  text = STEP.replace("**Purpose**", "**TMP**").replace("**Reasoning**", "**Purpose**").replace(
      "**TMP**", "**Reasoning**")
  with pytest.raises(schema.StepFormatError, match="out of order"):
    schema.parse_step(text)


def test_code_without_fence_or_empty():
  with pytest.raises(schema.StepFormatError, match="no fenced block"):
    schema.parse_step(STEP.split("```python")[0] + "x = 1\n")
  with pytest.raises(schema.StepFormatError, match="empty"):
    schema.parse_step(STEP.split("```python")[0] + "```python\n\n```\n")
  with pytest.raises(schema.StepFormatError, match="empty"):
    schema.parse_step("")
  with pytest.raises(schema.StepFormatError):
    schema.parse_step(None)


def test_truncated_fence_is_kept():
  text = STEP.split("print(")[0] + "print(r['depth'].max()"
  step = schema.parse_step(text)
  assert step.truncated and step.code.endswith("print(r['depth'].max()")


def test_nested_fences():
  code = ('doc = """\n```python\nprint(1)\n```\n"""\nx = 2')
  text = STEP.split("```python")[0] + "```python\n" + code + "\n```\nAfter:\n```\nnot code\n```\n"
  step = schema.parse_step(text)
  assert step.code == code and not step.truncated


def test_first_of_repeated_headers_wins():
  step = schema.parse_step(STEP + "\n" + STEP.replace("[0, 1]", "[5]"))
  assert "[0, 1]" in step.code and "[5]" not in step.code


HOSTILE = [
    "*" * 2_000_000,
    "**" * 1_000_000,
    "```\n" * 300_000,
    "```python\n" * 300_000,
    "<think>" * 300_000,
    "</think>" * 300_000,
    "**Purpose**\n" * 200_000,
    ("**Purpose**\na\n**Reasoning**\nb\n**Next Goal**\nc\n**Code**\n```python\n"
     + "x = 1\n" * 400_000),
    ("**Purpose**\na\n**Reasoning**\n" + "Verified: " + "1, " * 100_000 + "\n**Next Goal**\nc\n"
     "**Code**\n```python\nx=1\n```"),
    " " * 3_000_000 + "**Code**",
    "[" * 500_000 + "{" * 500_000,
    "\n" * 2_000_000,
    "\x00\ud800" * 100_000,
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_replies_parse_in_bounded_time(text):
  with deadline(10):
    start = time.perf_counter()
    for parse in (schema.parse_step,
                  lambda t: schema.parse_structured(t, ["Reconstruct"], 1)):
      try:
        step = parse(text)
      except schema.StepFormatError:
        pass
      else:
        assert len(step.code) <= schema.MAX_REPLY_CHARS + 2_000
    plan = schema.parse_plan(text)
    assert len(plan.checklist) <= schema.MAX_CHECKLIST_ITEMS
    fb.condensed_reply(text)
    assert time.perf_counter() - start < 5.0


# --- structured calls ---

ACTION = """**Purpose**
Reconstruct.
**Reasoning**
Need geometry.
**Next Goal**
Measure.
**Action**
{"tool": "Reconstruct", "arguments": {"frames": [0, 1]}}
"""


def test_structured_call_translates_to_code():
  step = schema.parse_structured(ACTION, ["Reconstruct", "vlm.locate"], 4)
  assert step.call == ("Reconstruct", {"frames": [0, 1]})
  assert step.code.startswith("result_4 = tools.Reconstruct(frames=[0, 1])")
  compile(step.code, "<cell>", "exec")  # valid Python
  answer = schema.parse_structured(ACTION.replace(
      '{"tool": "Reconstruct", "arguments": {"frames": [0, 1]}}',
      'I will answer: {"tool": "ReturnAnswer", "arguments": {"answer": "B"}}'),
      ["vlm.locate"], 5)
  assert answer.code == "ReturnAnswer('B')"
  # The paper's dotted names run where the kernel puts them.
  for name, path in (("vlm.locate", "vlm.locate"), ("SAM3.video", "tools.SAM3.video")):
    dotted = schema.parse_structured(ACTION.replace('"Reconstruct"', f'"{name}"'), [name], 6)
    assert dotted.code.startswith(f"result_6 = {path}(frames=[0, 1])")


@pytest.mark.parametrize("action, message", [
    ('{"tool": "Explode", "arguments": {}}', "unknown tool"),
    ('{"tool": "Reconstruct", "arguments": [1]}', "arguments"),
    ('{"tool": "Reconstruct", "arguments": {"a b": 1}}', "arguments"),
    ('{"tool": "Reconstruct", "arguments": {"x": NaN}}', "non-finite"),
    ('{"tool": "ReturnAnswer", "arguments": {"value": 1}}', "ReturnAnswer"),
    ("no json here", "no JSON"),
])
def test_structured_call_errors(action, message):
  text = ACTION.replace('{"tool": "Reconstruct", "arguments": {"frames": [0, 1]}}', action)
  with pytest.raises(schema.StepFormatError, match=message):
    schema.parse_structured(text, ["Reconstruct"], 1)


def test_structured_argument_strings_cannot_inject_code():
  text = ACTION.replace('[0, 1]', '"x\\"); import os; (\\""')
  step = schema.parse_structured(text, ["Reconstruct"], 2)
  tree = compile(step.code, "<cell>", "exec", flags=0x400)  # ast.PyCF_ONLY_AST
  assert not any(type(node).__name__ == "Import" for node in __import__("ast").walk(tree))


# --- the plan ---

PLAN = """**Task Analysis**
Which object is left of the sofa.
**Information Needs**
Positions.
**Computation Plan**
1. Reconstruct.
**Verification Checklist**
```json
[{"priority": "HIGH", "description": "sofa located"},
 {"priority": "low", "description": "  cross-check   in BEV "},
 {"priority": "urgent", "description": "answer is a letter"},
 {"description": ""}, 7, "plain string item"]
```
**Fallbacks**
Use the VLM.
"""


def test_plan_and_checklist():
  plan = schema.parse_plan("<think>hmm [1, 2]</think>" + PLAN)
  assert plan.sections == schema.PLAN_SECTIONS
  assert [(i.priority, i.description) for i in plan.checklist] == [
      ("HIGH", "sofa located"), ("LOW", "cross-check in BEV"),
      ("MEDIUM", "answer is a letter"), ("MEDIUM", "plain string item")]


def test_checklist_from_bullets_and_broken_json():
  text = PLAN.split("**Verification Checklist**")[0] + (
      "**Verification Checklist**\n[{\"priority\": \"HIGH\", \"description\": \"unclosed\"\n"
      "- [HIGH] both objects found\n- LOW: units are metres\n2) order checked\n"
      "**Fallbacks**\n- not an item\n")
  items = schema.parse_checklist(text)
  assert [(i.priority, i.description) for i in items] == [
      ("HIGH", "both objects found"), ("LOW", "units are metres"),
      ("MEDIUM", "order checked")]
  assert schema.parse_plan("no plan at all").checklist == ()
  assert schema.parse_plan(None).text == ""


def test_checklist_is_bounded():
  items = [{"priority": "HIGH", "description": "x" * 1000}] * 50
  text = "**Verification Checklist**\n" + __import__("json").dumps(items)
  found = schema.parse_checklist(text)
  assert len(found) == schema.MAX_CHECKLIST_ITEMS
  assert all(len(i.description) == schema.MAX_CHECK_CHARS for i in found)


# --- answers ---

@pytest.mark.parametrize("value, expected", [
    ("B", "B"), (" (C) ", "C"), ("A. red chair", "A"), ("red chair", "A"), ("Blue Ball", "B"),
])
def test_option_answers(value, expected):
  assert schema.check_answer(value, ("red chair", "blue ball", "lamp")) == (expected, None)


@pytest.mark.parametrize("value", ["D", "maybe", "", 3, None, True, ["A"], float("nan")])
def test_refused_option_answers(value):
  text, reason = schema.check_answer(value, ("red chair", "blue ball", "lamp"))
  assert text is None and reason


def test_number_and_text_answers():
  assert schema.check_answer(2.5, (), "number") == ("2.5", None)
  assert schema.check_answer("about 3 m", (), "number") == ("3", None)
  assert schema.check_answer("far", (), "number")[0] is None
  assert schema.check_answer("  the sofa ", (), "text") == ("the sofa", None)
  assert schema.check_answer(7, (), "text") == ("7", None)


def test_windows_line_ends():
  step = schema.parse_step(STEP.replace("\n", "\r\n"))
  assert step.code == schema.parse_step(STEP).code and "\r" not in step.code
