"""First prompts, built on the host before a rollout (tokenising is the host's job; the
rollout itself never returns to the host). Qwen's chat layout, the first view's image
tokens expanded, left-padded to a fixed length.

The system prompts summarise the papers' (Act3D appendix C.1; Think3D's tool prompt); the
exact published wording is not public in full, see ../shared/reference.
"""

from __future__ import annotations

import numpy as np

ACT3D_SYSTEM = (
    "You are a 3D spatial reasoning assistant in an indoor scene, given one image, the start "
    "view. Call render_view_tool with one action (forward, backward, left, right, up, down, "
    "turn_left, turn_right, turn_up, turn_down) and an optional distance (steps are about "
    "1 m, 0.6 m and 30 degrees); prefer one large move over many small ones. Reply as "
    "<think>...</think><tool_call>{\"name\": \"render_view_tool\", \"arguments\": "
    "{\"action\": ..., \"distance\": ...}}</tool_call> or <think>...</think><answer>..."
    "</answer>, answering only when confident.")
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


def act3d_user_text(question: str, scene_min, scene_max) -> str:
  dx, dy, dz = (np.asarray(scene_max) - np.asarray(scene_min)).tolist()
  return (f"The room is roughly {dx:.1f} m x {dy:.1f} m, with about {dz:.1f} m of height. "
          f"{question} Answer with a short phrase of 1-5 words, reasoning in <think> first.")


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
