"""SpatialClaw's prompts, in our own words (the reference's prompt text is not used).

The main conversation: `system_prompt` (the kernel, the step schema, the tools offered, the
answer rule), then the first user turn (`task_text` after the frames shown), then for each
step the model's reply and a feedback turn (feedback.py). The plan is a separate
conversation (`plan_messages`: no images, only the frames' metadata, the question and the
tool list) whose reply is put into the main history with `PLAN_INTRO` and `TRANSITION`.
"""

from __future__ import annotations

from typing import Sequence

from jaxspatial.agents import tools as tool_lib

KERNEL_NAMES = """\
Names already defined in the kernel:
- InputImages: list of the task's frames, uint8 arrays [H, W, 3] (RGB), indexed like the
  frame labels. Every frame is here even when only some were shown to you.
- Metadata: dict with the question, its options, the answer format, the number of frames,
  their size and which frames you were shown.
- np (NumPy), scipy, math, PIL (imports of other pure-Python modules such as re work).
- tools and vlm: the host tools listed below (tools.Reconstruct, tools.SAM3, vlm.locate,
  ...).
- show(image, label): attach an image (uint8 [H, W, 3]) to the next feedback so you can
  look at it.
- ReturnAnswer(value): submit the final answer (str, int or float). For multiple choice,
  submit the option letter only."""

RULES = """\
Rules of the kernel: no files, no network, no subprocesses; imports of os, sys, subprocess,
pathlib, io, socket, pickle, importlib, torch, jax and similar are refused, as are open,
eval, exec and compile. A cell that fails has its new variables removed; fix the error and
run the corrected code. A cell runs for at most {timeout:g} seconds."""

def _format(what: str, seen: str, last: str) -> str:
  """The four-header turn format; the code cell or the one structured call comes last."""
  return f"""\
Answer every turn in exactly this format, with the four bold headers in this order:

**Purpose**
One sentence: what this step does.

**Reasoning**
Why this {what}, given the {seen} so far. When a checklist item is settled, add a line
"Verified: <item numbers>".

**Next Goal**
What the step after this one should do.

{last}"""


STEP_FORMAT = _format("step", "feedback", """**Code**
```python
# one cell of Python for the kernel
```""")

STRUCTURED_FORMAT = _format("call", "results", """**Action**
{"tool": "<tool name>", "arguments": {"<name>": <value>, ...}}

Each turn makes exactly one call. A tool's name is as listed, without "tools.": e.g.
"Reconstruct", "SAM3.video", "vlm.locate". Its result is printed and kept in the kernel as
result_<step>. To answer, call {"tool": "ReturnAnswer", "arguments": {"answer": "B"}}.""")


def _tool_section(names: Sequence[str]) -> str:
  if not names:
    return "No host tools are available in this run: use NumPy and SciPy on the frames."
  return "Host tools (called from your code; each returns plain Python / NumPy values):\n" + (
      tool_lib.documentation(names))


def system_prompt(tool_names: Sequence[str], *, max_steps: int, structured: bool = False,
                  cell_timeout_s: float = 600.0) -> str:
  """The main conversation's system prompt."""
  intro = (
      "You solve spatial reasoning questions about a scene seen in one or more frames. You "
      "work step by step in a persistent Python kernel: each turn you write one cell, it "
      "runs, and the next turn shows you its output, errors, new variables and any images "
      "you showed. Variables persist between cells. Measure rather than guess: reconstruct "
      "the scene, locate the objects in 3D, and compute distances, directions and angles "
      "with NumPy / SciPy (a KD-tree for nearest points, dot products for directions).")
  if structured:
    intro = (
        "You solve spatial reasoning questions about a scene seen in one or more frames. "
        "Each turn you call exactly one tool; the next turn shows its result. Use the "
        "tools' results to reason about distances, directions and positions.")
  parts = [intro, KERNEL_NAMES if not structured else "", _tool_section(tool_names),
           RULES.format(timeout=cell_timeout_s) if not structured else "",
           STRUCTURED_FORMAT if structured else STEP_FORMAT,
           f"You have at most {max_steps} steps. Finish by calling ReturnAnswer once you are "
           "confident; an answer in the wrong format is refused and you may try again."]
  return "\n\n".join(p for p in parts if p)


def answer_format(options: Sequence[str], kind: str) -> str:
  if options:
    letters = "ABCDEFGHIJ"[:len(options)]
    return f"one option letter ({', '.join(letters)})"
  if kind == "number":
    return "a single number"
  return "a short phrase"


def task_text(question: str, options: Sequence[str], kind: str, shown: Sequence[int],
              count: int, height: int, width: int) -> str:
  """The first user turn's text, after the frames shown (each labelled "Frame i:")."""
  lines = [f"The task has {count} frame(s) of {width} x {height} pixels, InputImages[0] to "
           f"InputImages[{count - 1}]."]
  if not shown:
    lines.append("No frame is shown to you in this run: work from the kernel's data.")
  elif len(shown) < count:
    lines.append(f"You were shown {len(shown)} of them: {list(shown)}.")
  lines.append(f"Question: {question}")
  if options and not any(f"{'ABCDEFGHIJ'[k]}." in question for k in range(len(options))):
    lines.append("Options: " + " ".join(f"{'ABCDEFGHIJ'[k]}. {o}" for k, o in
                                         enumerate(options)))
  lines.append(f"Answer with ReturnAnswer(...): {answer_format(options, kind)}.")
  return "\n".join(lines)


PLAN_SYSTEM = (
    "You plan how to answer a spatial question about a scene before anyone looks at it. "
    "You cannot see the frames; you get their metadata, the question and the tools that "
    "will be available. Another agent will carry out your plan in a Python kernel.")

PLAN_REQUEST = """\
Write a plan with these five sections, each under its bold heading:

**Task Analysis**
What the question asks and what kind of spatial relation decides it.

**Information Needs**
What must be measured or found in the frames (objects, positions, cameras, ...).

**Computation Plan**
Numbered steps: which tools to call and what to compute with NumPy / SciPy.

**Verification Checklist**
A JSON list of checks to make before answering, e.g.
[{"priority": "HIGH", "description": "both objects located in 3D"}]
(priority HIGH, MEDIUM or LOW; at most 8 items).

**Fallbacks**
What to do if a tool fails or a measurement is unreliable."""


def plan_messages(question: str, options: Sequence[str], kind: str, count: int, height: int,
                  width: int, tool_names: Sequence[str]) -> list[dict]:
  """The planning conversation (text only)."""
  meta = (f"Frames: {count}, each {width} x {height} pixels.\nQuestion: {question}\n"
          + (f"Options: {list(options)}\n" if options else "")
          + f"Answer format: {answer_format(options, kind)}.")
  return [{"role": "system", "content": PLAN_SYSTEM},
          {"role": "user", "content": meta + "\n\n" + _tool_section(tool_names) + "\n\n"
           + PLAN_REQUEST}]


PLAN_INTRO = "A plan for this task, written before looking at the frames:"
TRANSITION = ("Carry out the plan one step at a time, adapting it to what you find. Start "
              "with step 1 now, in the required format.")
CONTINUE = "Continue with the next step, in the required format."
REFLECTION = (
    "Pause before the next step. In a few sentences: what has been established so far, "
    "which checklist items are still open, whether the current approach is working, and "
    "what to change. Do not write code in this reply.")
SUB_QUERY_SYSTEM = ("Answer the question about the image(s) briefly and precisely. If the "
                    "images do not show what is asked, say so.")
SUB_QUERY_THINKING_SYSTEM = (
    "Look at the image(s) carefully and reason about the question step by step before "
    "answering. Then give your answer, briefly and precisely, on a last line that starts "
    "with \"Final answer:\". If the images do not show what is asked, say so there.")
FORMAT_ERROR = "Your reply could not be run: {error}"
