"""A chat request's messages -> the policy's prompt: token ids (each image's placeholder
expanded to its vision tokens) and the images at the policy's size.

Each image part becomes Qwen's "<|vision_start|><|image_pad|><|vision_end|>" where it
stands in its message (what the Qwen-VL chat templates write for an image part); the
messages, with string content, go through the checkpoint's chat template with the reply
opened (`add_generation_prompt`), or, without a template, Qwen's layout with
`ChatFormat.prefill` after "<|im_start|>assistant\\n". Text may not spell the vision
tokens itself (a 400), so every placeholder is an image of the request.
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np

from jaxspatial.models.chat import ASSISTANT, ChatFormat
from jaxspatial.serving import images as image_lib
from jaxspatial.serving.protocol import ChatRequest, ImagePart, invalid

VISION_START, IMAGE_PAD, VISION_END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"
PLACEHOLDER = VISION_START + IMAGE_PAD + VISION_END
RESERVED = (VISION_START, IMAGE_PAD, VISION_END, "<|video_pad|>")


@dataclasses.dataclass(frozen=True, eq=False)
class Prompt:
  ids: np.ndarray            # [L] int32, image tokens expanded
  images: tuple              # uint8 [H, W, 3] each, at the policy's size, in order

  @property
  def grids(self) -> tuple:
    return tuple(image.shape[:2] for image in self.images)


class PromptBuilder:
  """Builds prompts for one policy: its tokenizer, chat template, chat format and image
  token counts. `max_images`: images per request."""

  def __init__(self, tokenizer, model, chat: ChatFormat, max_images: int = 8,
               max_image_pixels: int = image_lib.MAX_IMAGE_PIXELS,
               max_context: int | None = None):
    self.tokenizer, self.model, self.chat = tokenizer, model, chat
    self.max_images, self.max_image_pixels = int(max_images), int(max_image_pixels)
    # Text this long cannot fit `max_context` tokens (no token spells more characters
    # than the vocabulary's longest): refused before the tokenizer spends time and memory.
    self.max_text_chars = None if max_context is None else int(max_context) * max(
        (len(t) for t in tokenizer.get_vocab()), default=1)
    self.image_pad_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    self._lock = threading.Lock()  # request threads share the (stateful) tokenizer

  def text(self, request: ChatRequest) -> tuple[str, list]:
    """(the templated prompt text, the image parts in order)."""
    flat, parts = [], []
    chars = sum(len(part) for m in request.messages for part in m.parts
                if not isinstance(part, ImagePart))
    if self.max_text_chars is not None and chars > self.max_text_chars:
      raise invalid(f"messages: {chars} characters of text cannot fit this server's context "
                    f"(at most {self.max_text_chars} characters could)", "messages",
                    "context_length_exceeded")
    for i, message in enumerate(request.messages):
      pieces = []
      for j, part in enumerate(message.parts):
        if isinstance(part, ImagePart):
          parts.append(part)
          pieces.append(PLACEHOLDER)
        else:
          reserved = next((r for r in RESERVED if r in part), None)
          if reserved:
            raise invalid(f"messages[{i}].content[{j}]: the text spells the vision token "
                          f"{reserved}; send images as image_url parts", f"messages[{i}]")
          pieces.append(part)
      role = "system" if message.role == "developer" else message.role
      flat.append({"role": role, "content": "".join(pieces)})
    if len(parts) > self.max_images:
      raise invalid(f"messages: {len(parts)} images, over this server's limit of "
                    f"{self.max_images} per request", "messages")
    if getattr(self.tokenizer, "chat_template", None):
      try:
        with self._lock:
          text = self.tokenizer.apply_chat_template(flat, tokenize=False,
                                                    add_generation_prompt=True,
                                                    **request.chat_template_kwargs)
      except Exception as error:  # the template is a program: its refusal is the request's
        raise invalid(f"messages: the chat template refused them ({type(error).__name__}: "
                      f"{str(error)[:300]})", "messages") from None
    else:
      text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in flat)
      text += ASSISTANT + self.chat.prefill
    return text, parts

  def build(self, request: ChatRequest) -> Prompt:
    text, parts = self.text(request)
    pictures = [image_lib.resize_for(self.model, image_lib.decode_data_url(
        p.url, p.where, self.max_image_pixels) if p.pixels is None else
        image_lib.check_pixels(p.pixels, p.where, self.max_image_pixels)) for p in parts]
    with self._lock:
      ids = self.tokenizer.encode(text, add_special_tokens=False)
    pads = [k for k, t in enumerate(ids) if t == self.image_pad_id]
    if len(pads) != len(pictures):
      raise invalid(f"messages: the chat template wrote {len(pads)} image placeholders for "
                    f"{len(pictures)} images", "messages")
    out = []
    start = 0
    for k, picture in zip(pads, pictures):
      out += ids[start:k] + [self.image_pad_id] * self.model.image_tokens(picture.shape[:2])
      start = k + 1
    out += ids[start:]
    return Prompt(np.asarray(out, np.int32), tuple(pictures))
