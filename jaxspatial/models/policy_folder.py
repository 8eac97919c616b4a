"""A whole Hugging Face policy folder from a jaxspatial policy: what `launch.export` writes,
and what `load_policy`, `launch.serve`, `launch.eval --checkpoint` and transformers'
`from_pretrained` read.

    write_policy_folder(model, tokenizer, "/out/policy", chat=ChatFormat(), source=folder)

The folder holds:
  config.json, model.safetensors   the family's `save_pretrained` (`policy.export`), LoRA
                                   adapters merged into the base weights first
                                   (`merge_adapters`; an adapter on a tied LM head becomes
                                   an untied head, E^T + (alpha / r) A B, and config.json
                                   says `tie_word_embeddings: false`)
  tokenizer.json, tokenizer_config.json   the tokenizer the run trained with (tokens it
                                   added included)
  preprocessor_config.json         the source folder's, else the family's image processor
                                   settings (`tokenizer.save_processor`)
  chat_template.jinja              the tokenizer's or the source folder's template, else
                                   Qwen's layout opening a reply with the chat format's
                                   prefill (`qwen_chat_template`)
  generation_config.json           the source folder's, else the chat format's stop ids
  jaxspatial_export.json           `notes` (where the weights came from) and how many
                                   adapters were merged, when notes are given
and the source folder's other processor files (video_preprocessor_config.json,
processor_config.json, chat_template.json). Everything is written into a hidden temporary
sibling (files 0644, the folder 0755) and renamed into place: a crash leaves the old
folder, or none, never a mix.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import secrets
import shutil
import tempfile

from jaxspatial.models.chat import ASSISTANT, ChatFormat
from jaxspatial.models.lora import merge_lora, untie_adapted_head
from jaxspatial.models.policy import FAMILIES, export
from jaxspatial.models.qwen2_5_vl.tokenizer import save_processor

# A source folder's files carried into the export as they are (the tokenizer is re-saved
# from the run's tokenizer, the weights from the run's parameters).
CARRIED = ("preprocessor_config.json", "video_preprocessor_config.json",
           "processor_config.json", "chat_template.json", "chat_template.jinja",
           "generation_config.json")
NOTES = "jaxspatial_export.json"

_CONTENT = r"""
{%- macro render(content) -%}
  {%- if content is string -%}
    {{- content -}}
  {%- else -%}
    {%- for part in content -%}
      {%- if part['type'] in ['image', 'image_url'] or 'image' in part -%}
        {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
      {%- elif part['type'] == 'text' -%}
        {{- part['text'] -}}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- for message in messages -%}
  {%- if message['role'] == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}
      {{- '<|im_start|>user' -}}
    {%- endif -%}
    {{- '\n<tool_response>\n' + render(message['content']) + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}
      {{- '<|im_end|>\n' -}}
    {%- endif -%}
  {%- else -%}
    {{- '<|im_start|>' + message['role'] + '\n' + render(message['content']) + '<|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
"""


def qwen_chat_template(prefill: str = "") -> str:
  """A chat template in Qwen's layout (what jaxspatial's prompts are built in: no default
  system turn): "<|im_start|>{role}\\n{content}<|im_end|>\\n" per message, image parts as
  "<|vision_start|><|image_pad|><|vision_end|>", tool results as one user turn of
  <tool_response> blocks, and the reply opened with "<|im_start|>assistant\\n" + `prefill`."""
  ChatFormat(prefill=prefill)  # the same checks: text without special tokens
  opening = json.dumps(ASSISTANT + prefill)  # a Jinja string literal, escapes and all
  return (_CONTENT.strip() + "\n{%- if add_generation_prompt -%}\n  {{- " + opening
          + " -}}\n{%- endif -%}\n")


def merge_adapters(model) -> int:
  """Folds every LoRA adapter of a policy family's model into its base weights, in place;
  an adapter on a tied LM head (3DThinker's) becomes the model's own, untied head and the
  model's config says so. Returns how many adapters were merged."""
  text = model.language_model
  count = 0
  if untie_adapted_head(text):
    config = model.config
    untied = dataclasses.replace(config, text=dataclasses.replace(config.text,
                                                                  tie_word_embeddings=False))
    model.config = untied
    text.config = untied.text
    count += 1
  return count + merge_lora(model)


def check_target(folder, overwrite: bool = False) -> None:
  """Refuses an output folder `write_policy_folder` would not write: a file, a non-empty
  folder (without `overwrite`), or one that is not a model folder (with it)."""
  folder = pathlib.Path(folder)
  if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
    raise FileExistsError(f"{folder}: exists and is not a folder; choose another output "
                          "folder")
  if folder.is_dir() and any(folder.iterdir()):
    if not overwrite:
      raise FileExistsError(f"{folder}: exists and is not empty; pass --overwrite to replace "
                            "it, or choose another output folder")
    if not (folder / "config.json").is_file():
      raise FileExistsError(f"{folder}: --overwrite replaces a model folder (one holding "
                            "config.json), and this one holds none; choose another output "
                            "folder")


def _has_template(folder: pathlib.Path, tokenizer) -> bool:
  if getattr(tokenizer, "chat_template", None):
    return True
  if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
    return True
  try:
    saved = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
  except (OSError, ValueError):
    return False
  return isinstance(saved, dict) and bool(saved.get("chat_template"))


def _generation_config(folder: pathlib.Path, tokenizer, chat: ChatFormat) -> None:
  import transformers  # pylint: disable=import-outside-toplevel
  stops = list(chat.stop_ids(tokenizer))
  pad = tokenizer.pad_token_id
  transformers.GenerationConfig(
      eos_token_id=stops if len(stops) > 1 else stops[0],
      pad_token_id=stops[0] if pad is None else pad).save_pretrained(folder)


def _fsync(path: pathlib.Path) -> None:
  try:
    handle = os.open(path, os.O_RDONLY)
  except OSError:
    return  # some systems cannot open folders
  try:
    os.fsync(handle)
  except OSError:
    pass
  finally:
    os.close(handle)


def _publish(staging: pathlib.Path) -> None:
  """Files 0644 and flushed, folders 0755."""
  for path in sorted(staging.rglob("*")):
    if path.is_symlink():
      raise RuntimeError(f"write_policy_folder: {path} is a symbolic link (expected files)")
    if path.is_dir():
      path.chmod(0o755)
    else:
      path.chmod(0o644)
      _fsync(path)
  staging.chmod(0o755)


def _swap_in(staging: pathlib.Path, folder: pathlib.Path) -> None:
  if folder.exists():  # checked: an empty folder, or a model folder --overwrite replaces
    aside = folder.parent / f".{folder.name}.{secrets.token_hex(6)}.old"
    os.rename(folder, aside)
    try:
      os.rename(staging, folder)
    except BaseException:
      os.rename(aside, folder)
      raise
    shutil.rmtree(aside, ignore_errors=True)
  else:
    os.rename(staging, folder)
  _fsync(folder.parent)


def write_policy_folder(model, tokenizer, folder, *, chat: ChatFormat | None = None,
                        source=None, notes: dict | None = None,
                        overwrite: bool = False) -> pathlib.Path:
  """Writes `model` (a policy family's, adapters merged here, in place) with `tokenizer` as
  a Hugging Face folder (see the module's docstring). `chat`: how the run's replies open
  and end (default: an instruct model ending at <|im_end|>); `source`: the Hugging Face
  folder the run started from, whose processor files, chat template and generation config
  are carried over; `notes`: written as jaxspatial_export.json. An existing non-empty
  `folder` is refused unless `overwrite` (and then only a model folder is replaced)."""
  kind = getattr(type(model), "family", None)
  if kind not in FAMILIES:
    raise TypeError(f"write_policy_folder: {type(model).__name__} is not a policy family "
                    f"({sorted(FAMILIES)})")
  folder = pathlib.Path(folder).absolute()
  check_target(folder, overwrite)
  if source is not None and not pathlib.Path(source).is_dir():
    raise FileNotFoundError(f"write_policy_folder: the source folder {source} does not exist")
  chat = chat or ChatFormat()
  tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's
  merged = merge_adapters(model)
  folder.parent.mkdir(parents=True, exist_ok=True)
  staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp",
                                          dir=folder.parent))
  try:
    export(model, staging)
    save_processor(staging, tokenizer, model)
    if source is not None:
      for name in CARRIED:
        if (pathlib.Path(source) / name).is_file():
          shutil.copyfile(pathlib.Path(source) / name, staging / name)
    if not _has_template(staging, tokenizer):
      (staging / "chat_template.jinja").write_text(qwen_chat_template(chat.prefill),
                                                   encoding="utf-8")
    if not (staging / "generation_config.json").is_file():
      _generation_config(staging, tokenizer, chat)
    if notes is not None:
      (staging / NOTES).write_text(json.dumps({**notes, "lora_adapters_merged": merged},
                                              indent=2) + "\n", encoding="utf-8")
    _publish(staging)
    _swap_in(staging, folder)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  return folder
