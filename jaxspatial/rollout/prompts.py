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
    "You reason about a 3D scene reconstructed from the input views. Call pi3_tool to see "
    "it from a new angle: <think>...</think><tool_call>{\"name\": \"pi3_tool\", "
    "\"arguments\": {\"rotation_reference_camera\": 1, \"azimuth_angle\": -45, "
    "\"elevation_angle\": 0, \"camera_view\": false}}</tool_call>, or answer with "
    "<think>...</think><answer>the option letter</answer>.")

PERIA_SYSTEM = (
    "You answer questions about an image with tools that return new images, referring to "
    "images by their index (the input is image 0): image_crop, draw_line, bounding_box, "
    "image_highlight, each with a box in [0, 1000] coordinates. Reply as <think>...</think>"
    "<action>{\"name\": \"image_crop\", \"arguments\": {\"image\": 0, \"bbox\": [420, "
    "310, 680, 590]}}</action> or <think>...</think><answer>...</answer>.")


def chat_prompt(system: str, user: str, image_tokens: int, num_images: int = 1) -> str:
  image = ("<|vision_start|>" + "<|image_pad|>" * image_tokens + "<|vision_end|>") * num_images
  return (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{image}{user}"
          "<|im_end|>\n<|im_start|>assistant\n")


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
