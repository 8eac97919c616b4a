"""How a policy's chat template opens an assistant reply and which tokens end one, read
from its Hugging Face folder.

Qwen's instruct templates open a reply with "<|im_start|>assistant\\n". The thinking models'
templates (Qwen3-VL-*-Thinking) open it with "<|im_start|>assistant\\n<think>\\n": the model
writes its reasoning, "</think>", then the reply. The agents build their prompts in Qwen's
layout and write `prefill` wherever a reply opens (the first prompt and every observation
message); their grammars start after it. The stop tokens are generation_config.json's
`eos_token_id` (Qwen3-VL: <|im_end|> and <|endoftext|>), else the tokenizer's <|im_end|>.

    chat = ChatFormat.from_folder("/ckpt/Qwen3-VL-8B-Thinking", tokenizer)
    chat.prefill                  # "<think>\\n"
    chat.stop_ids(tokenizer)      # (151645, 151643)
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import pathlib

ASSISTANT = "<|im_start|>assistant\n"
END_OF_TURN = "<|im_end|>"
THINKING_PREFILL = "<think>\n"
FORMATS = ("auto", "instruct", "thinking")


@dataclasses.dataclass(frozen=True)
class ChatFormat:
  """`prefill`: what the template writes after "<|im_start|>assistant\\n" ("" or a
  thinking model's "<think>\\n"); `stop_tokens`: ids that end a reply (empty: <|im_end|>)."""
  prefill: str = ""
  stop_tokens: tuple[int, ...] = ()

  def __post_init__(self):
    if not isinstance(self.prefill, str) or "<|" in self.prefill:
      raise ValueError(f"ChatFormat.prefill: expected text without special tokens, got "
                       f"{self.prefill!r}")
    stops = self.stop_tokens
    if isinstance(stops, (str, bytes)) or not isinstance(stops, (tuple, list)) or any(
        isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0 for t in stops):
      raise ValueError(f"ChatFormat.stop_tokens: expected token ids >= 0, got {stops!r}")
    object.__setattr__(self, "stop_tokens", tuple(int(t) for t in stops))

  @classmethod
  def named(cls, name: str) -> "ChatFormat":
    """"instruct" (the reply opens bare) or "thinking" ("<think>\\n" opens it)."""
    if name == "instruct":
      return cls()
    if name == "thinking":
      return cls(prefill=THINKING_PREFILL)
    raise ValueError(f"chat format: expected 'instruct' or 'thinking', got {name!r}")

  @classmethod
  def from_folder(cls, folder, tokenizer=None) -> "ChatFormat":
    """The folder's chat template (through `tokenizer`, default: the folder's) and
    generation_config.json. A folder without a chat template is an instruct model."""
    folder = pathlib.Path(folder)
    if tokenizer is None:
      import transformers  # pylint: disable=import-outside-toplevel
      tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's
    return cls(prefill=template_prefill(tokenizer, folder),
               stop_tokens=generation_stops(folder))

  def stop_ids(self, tokenizer) -> tuple[int, ...]:
    if self.stop_tokens:
      return self.stop_tokens
    eos = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if eos is None or eos == tokenizer.unk_token_id:
      raise ValueError(f"the tokenizer has no {END_OF_TURN} token to end a reply; give "
                       "ChatFormat.stop_tokens")
    return (int(eos),)

  def generated(self, turn: str) -> str:
    """The part of a written turn (`<think>...</think>...`, as the teachers write them)
    the model generates after the prefill: the prefill itself, or its tag without the
    newline, is the prompt's."""
    if not self.prefill or turn.startswith(self.prefill):
      return turn[len(self.prefill):]
    tag = self.prefill.strip()
    if tag and turn.startswith(tag):
      return turn[len(tag):]
    raise ValueError(f"a turn for a chat template whose replies open with {self.prefill!r} "
                     f"must start with it; got {turn[:60]!r}")


def template_prefill(tokenizer, folder=None) -> str:
  """What the tokenizer's chat template writes after "<|im_start|>assistant\\n" when it
  opens a reply (its generation prompt past Qwen's header); "" without a template."""
  if not getattr(tokenizer, "chat_template", None):
    return ""
  where = f"{folder}: " if folder is not None else ""
  messages = [{"role": "user", "content": "Which object is closer?"}]
  try:
    closed = tokenizer.apply_chat_template(messages, tokenize=False)
    opened = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
  except Exception as error:  # a template is a program: any failure is the folder's
    raise ValueError(f"{where}the chat template failed to render a user message "
                     f"({type(error).__name__}: {str(error)[:200]})") from None
  if not opened.startswith(closed):
    raise ValueError(f"{where}the chat template's generation prompt does not extend the "
                     f"conversation: {closed[-80:]!r} then {opened[-80:]!r}")
  prompt = opened[len(closed):]
  if not prompt.startswith(ASSISTANT):
    raise ValueError(f"{where}expected the chat template to open a reply with Qwen's "
                     f"{ASSISTANT!r} (the layout jaxspatial's prompts use), got {prompt!r}")
  return prompt[len(ASSISTANT):]


def generation_stops(folder) -> tuple[int, ...]:
  """generation_config.json's `eos_token_id` (one id or a list) as a tuple; () when the
  file or the field is absent."""
  path = pathlib.Path(folder) / "generation_config.json"
  if not path.is_file():
    return ()
  try:
    config = json.loads(path.read_text(encoding="utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
    raise ValueError(f"{path}: not valid JSON ({type(error).__name__}: "
                     f"{str(error)[:200]})") from None
  if not isinstance(config, dict):
    raise ValueError(f"{path}: expected a JSON object, got {type(config).__name__}")
  eos = config.get("eos_token_id")
  if eos is None:
    return ()
  ids = eos if isinstance(eos, list) else [eos]
  if not ids or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in ids):
    raise ValueError(f"{path}: eos_token_id: expected a token id or a non-empty list of "
                     f"ids >= 0, got {eos!r}")
  return tuple(ids)


def chat_format(name: str, folder=None, tokenizer=None) -> ChatFormat:
  """A config's `model.chat_format`: "auto" reads `folder` (no folder: instruct),
  "instruct" or "thinking" set the prefill (stop tokens still from the folder)."""
  if name not in FORMATS:
    raise ValueError(f"model.chat_format: expected one of {FORMATS}, got {name!r}")
  if name == "auto":
    return ChatFormat.from_folder(folder, tokenizer) if folder else ChatFormat()
  chosen = ChatFormat.named(name)
  return dataclasses.replace(chosen, stop_tokens=generation_stops(folder)) if folder else chosen
