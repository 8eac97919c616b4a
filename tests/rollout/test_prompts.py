"""First prompts against the papers' printed text."""

from jaxspatial.rollout import prompts

# Act3D appendix C.1, as printed (each line of the reply formats is its own paragraph
# there; we send them one per line).
ACT3D_SYSTEM_PAPER = [
    "You are a 3D spatial reasoning assistant exploring an indoor scene. You are given ONE "
    "image: your current camera view — this is your starting position. To see more of the "
    "scene, call render_view_tool with a single movement action, and optionally a distance. "
    "Actions: forward, backward, left, right, up, down, turn_left, turn_right, turn_up, "
    "turn_down. If you do not give a distance, the camera takes its default step — about 1 "
    "metre forward or backward, about 0.6 metres for the other moves, and about 30 degrees "
    "for turns. Give a distance in metres (or degrees for turns) when a larger or smaller step "
    "is more efficient — one 4 m move is better than four small ones. You will see the new "
    "view after each action and can then decide to move again or to answer. Only answer when "
    "confident; if a view is empty or low-coverage, move to a better viewpoint first. Respond "
    "in exactly one of these two formats:",
    "<think>your reasoning here</think>",
    "<tool_call>",
    '{"name":"render_view_tool",',
    '"arguments":{"action":"<action>","distance":<optional number>}}',
    "</tool_call>",
    "or",
    "<think>your reasoning here</think>",
    "<answer>your final answer</answer>",
]
ACT3D_USER_PAPER = (
    "<image> This image is your current camera view — your starting position. The room "
    "measures roughly {dx} m x {dy} m, with about {dz} m of height. Move through it with "
    "render_view_tool to gather evidence, then answer.\n\nQuestion:{question}\n\nKeep the "
    "text inside the <answer> tag to a SHORT PHRASE of 1–5 words — no full sentence, no "
    "explanation. Still reason inside <think> first.")


def test_act3d_prompts_are_the_papers_verbatim():
  assert prompts.ACT3D_SYSTEM.split("\n") == ACT3D_SYSTEM_PAPER
  user = prompts.act3d_user_text("What is on the table?", [0.5, 1.0, 0.0], [4.7, 4.0, 2.6])
  assert "<image>" + user == ACT3D_USER_PAPER.format(dx="4.2", dy="3.0", dz="2.6",
                                                     question="What is on the table?")


def test_act3d_drops_the_room_sentence_without_bounds():
  """"The sentence giving the room dimensions is omitted when scene bounds are
  unavailable" (appendix C.1)."""
  room = (" The room measures roughly {dx} m x {dy} m, with about {dz} m of height.")
  expected = ACT3D_USER_PAPER.replace(room, "").format(question="Where is the lamp?")
  for bounds in ((None, None), ([0, 0, 0], [float("nan")] * 3)):
    assert "<image>" + prompts.act3d_user_text("Where is the lamp?", *bounds) == expected
