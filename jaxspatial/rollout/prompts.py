"""First prompts, built on the host before a rollout (tokenising is the host's job; the
rollout itself never returns to the host). Qwen's chat layout, the first view's image
tokens expanded, left-padded to a fixed length.

Act3D's system message and first user turn are the paper's, verbatim (appendix C.1; the
room sentence is dropped when the scene bounds are unknown). The appendix prints each line
of the reply formats as its own paragraph; we send them one per line. Think3D's and
PERIA's system prompts summarise the public code's (see ../shared/reference).
"""

from __future__ import annotations

import numpy as np

ACT3D_SYSTEM = (
    "You are a 3D spatial reasoning assistant exploring an indoor scene. You are given ONE "
    "image: your current camera view \u2014 this is your starting position. To see more of the "
    "scene, call render_view_tool with a single movement action, and optionally a distance. "
    "Actions: forward, backward, left, right, up, down, turn_left, turn_right, turn_up, "
    "turn_down. If you do not give a distance, the camera takes its default step \u2014 about 1 "
    "metre forward or backward, about 0.6 metres for the other moves, and about 30 degrees "
    "for turns. Give a distance in metres (or degrees for turns) when a larger or smaller "
    "step is more efficient \u2014 one 4 m move is better than four small ones. You will see "
    "the new view after each action and can then decide to move again or to answer. Only "
    "answer when confident; if a view is empty or low-coverage, move to a better viewpoint "
    "first. Respond in exactly one of these two formats:\n"
    "<think>your reasoning here</think>\n"
    "<tool_call>\n"
    "{\"name\":\"render_view_tool\",\n"
    "\"arguments\":{\"action\":\"<action>\",\"distance\":<optional number>}}\n"
    "</tool_call>\n"
    "or\n"
    "<think>your reasoning here</think>\n"
    "<answer>your final answer</answer>")
THINK3D_SYSTEM = (
    "You answer a question about a scene from its input images (image k is camera k). A 3D "
    "reconstruction of the scene can be viewed from new angles with pi3_tool: "
    "rotation_reference_camera picks the camera the view is relative to, azimuth_angle turns "
    "it right (negative: left) and elevation_angle raises it (degrees); camera_view true turns "
    "the camera itself in place (ego view), false orbits the whole scene (global view, with "
    "each input camera drawn as a pyramid pointing from its base to its apex, labelled CamN, "
    "* on the reference). Azimuth 0 and elevation 0 return the reference camera's own image: "
    "ask for a new angle instead. Reply as <think>...</think><tool_call>{\"name\": "
    "\"pi3_tool\", \"arguments\": {\"rotation_reference_camera\": 1, \"azimuth_angle\": -45, "
    "\"elevation_angle\": 0, \"camera_view\": false}}</tool_call>, or answer with "
    "<think>...</think><answer>the option letter</answer>.")
THINK3D_PRESET_SYSTEM = THINK3D_SYSTEM.replace(
    "Azimuth 0 and elevation 0 return the reference camera's own image: ask for a new angle "
    "instead.",
    "The views allowed are (azimuth, elevation) = (-45, 0) to the left, (45, 0) to the "
    "right and (0, 60) from above.")

PERIA_SYSTEM = (
    "You answer questions about an image with tools that return new images. Images are "
    "numbered as they appear: Observation 0 is the input, and each tool's result is the next. "
    "Think inside <think>...</think> first, then either call one tool, <action>{\"name\": "
    "\"image_crop\", \"arguments\": {\"image_index\": 0, \"bounding_box\": [420, 310, "
    "680, 590]}}</action>, or answer inside <answer>...</answer>. Coordinates are integers "
    "from 0 to 1000 across the image's width and height. The tools and their arguments: "
    "image_crop, bounding_box and image_highlight take image_index and bounding_box [x1, y1, "
    "x2, y2]; draw_line takes image_index and coordinates [x1, y1, x2, y2]; draw_path takes "
    "image_index and points [x1, y1, x2, y2, ...] (2 to 8 points); image_label takes "
    "image_index, text and position [x, y].")


PERIA_ARGUMENT_TEXT = {  # how the perception tools' public arguments are described
    "image_index": "image_index",
    "bounding_box": "bounding_box [x1, y1, x2, y2]",
    "text_prompt": 'text_prompt, a short phrase such as "red chair"',
    "question": 'question, object names separated by periods such as "chair. table."',
}


def _signature(arguments, optional) -> str:
  parts = [("an optional " if a in optional else "") + PERIA_ARGUMENT_TEXT.get(a, a)
           for a in arguments]
  return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def peria_perception_text(tools) -> str:
  """The system prompt's sentences on PERIA's perception tools, when the agent has them:
  each tool's public arguments (`tools`: TextTools, whose `arguments` / `optional` say
  them, or names: image_index and an optional bounding_box), tools with the same ones
  named together, in order."""
  groups: dict[tuple, list[str]] = {}
  for tool in tools:
    if isinstance(tool, str):
      name, arguments, optional = tool, ("image_index", "bounding_box"), ("bounding_box",)
    else:
      name, arguments, optional = tool.name, tuple(tool.arguments), tuple(tool.optional)
    groups.setdefault((arguments, optional), []).append(name)
  if not groups:
    return ""
  clauses = [", ".join(names) + (" takes " if len(names) == 1 else " take ")
             + _signature(*signature) for signature, names in groups.items()]
  return (" The perception tools return text (JSON) instead of an image: "
          + "; ".join(clauses) + ".")


def chat_prompt(system: str, user: str, image_tokens: int, num_images: int = 1,
                prefill: str = "") -> str:
  """A system message, a user turn (the images, then `user`), and the reply opened (with
  the chat template's `prefill`)."""
  image = ("<|vision_start|>" + "<|image_pad|>" * image_tokens + "<|vision_end|>") * num_images
  return (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{image}{user}"
          f"<|im_end|>\n<|im_start|>assistant\n{prefill}")


def peria_prompt(system: str, question: str, image_tokens: int, prefill: str = "") -> str:
  """PERIA's first turn: the public pipeline's user message puts "Observation 0:" and a
  newline before the image, then the question."""
  image = "<|vision_start|>" + "<|image_pad|>" * image_tokens + "<|vision_end|>"
  return (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nObservation 0:\n"
          f"{image}\n{question}<|im_end|>\n<|im_start|>assistant\n{prefill}")


def act3d_user_text(question: str, scene_min=None, scene_max=None) -> str:
  """Act3D's first user turn after the image (appendix C.1, verbatim); the room sentence
  only when the bounds are known (finite), sizes to 0.1 m."""
  room = ""
  if scene_min is not None and scene_max is not None:
    size = np.asarray(scene_max, np.float64) - np.asarray(scene_min, np.float64)
    if size.shape == (3,) and np.all(np.isfinite(size)):
      dx, dy, dz = size.tolist()
      room = (f" The room measures roughly {dx:.1f} m x {dy:.1f} m, with about {dz:.1f} m "
              "of height.")
  return (" This image is your current camera view \u2014 your starting position." + room
          + " Move through it with render_view_tool to gather evidence, then answer.\n\n"
          f"Question:{question}\n\n"
          "Keep the text inside the <answer> tag to a SHORT PHRASE of 1\u20135 words \u2014 no "
          "full sentence, no explanation. Still reason inside <think> first.")


def left_padded(tokenizer, prompts: list[str], length: int | None = None,
                pad_token: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(ids [B, L] int32, mask [B, L] bool), left-padded to `length` (default: the longest)."""
  encoded = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
  longest = max(len(e) for e in encoded)
  length = length or longest
  if longest > length:
    raise ValueError(f"left_padded: a prompt has {longest} tokens, more than length {length}")
  if pad_token is None:
    pad_token = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  ids = np.full((len(prompts), length), pad_token, np.int32)
  mask = np.zeros((len(prompts), length), bool)
  for row, e in enumerate(encoded):
    ids[row, length - len(e):] = e
    mask[row, length - len(e):] = True
  return ids, mask


def left_padded_views(tokenizer, system: str, users: list[str], image_tokens: int,
                      views: int, real_views, length: int | None = None,
                      pad_token: int | None = None, prefill: str = ""
                      ) -> tuple[np.ndarray, np.ndarray]:
  """(ids [B, L] int32, mask [B, L] bool) of first prompts holding `views` image groups
  each (Think3D: the task's input views, then the question), left-padded to `length`.
  Row b shows its first `real_views[b]` groups; the others keep their slots (every
  sequence holds the same vision tokens: static shapes) with attention mask 0, so the
  policy never sees a padding view and M-RoPE positions skip it."""
  real_views = np.asarray(real_views).reshape(-1)
  if len(real_views) != len(users):
    raise ValueError(f"left_padded_views: {len(users)} questions but {len(real_views)} view "
                     "counts")
  encode = lambda text: tokenizer.encode(text, add_special_tokens=False)
  head = encode(f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n")
  group = encode("<|vision_start|>" + "<|image_pad|>" * image_tokens + "<|vision_end|>")
  rows = []
  for user, shown in zip(users, real_views):
    if not 1 <= shown <= views:
      raise ValueError(f"left_padded_views: a prompt shows {shown} of {views} views; "
                       f"expected 1..{views}")
    ids, mask = list(head), [True] * len(head)
    for k in range(views):
      ids += group
      mask += [bool(k < shown)] * len(group)
    tail = encode(f"{user}<|im_end|>\n<|im_start|>assistant\n{prefill}")
    rows.append((ids + tail, mask + [True] * len(tail)))
  longest = max(len(ids) for ids, _ in rows)
  length = length or longest
  if longest > length:
    raise ValueError(f"left_padded_views: a prompt has {longest} tokens, more than length "
                     f"{length}")
  if pad_token is None:
    pad_token = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  out_ids = np.full((len(rows), length), pad_token, np.int32)
  out_mask = np.zeros((len(rows), length), bool)
  for row, (ids, mask) in enumerate(rows):
    out_ids[row, length - len(ids):] = ids
    out_mask[row, length - len(ids):] = mask
  return out_ids, out_mask
