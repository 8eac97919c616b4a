"""A policy folder's chat format: the reply opening its chat template renders and the stop
ids of its generation_config.json."""

import json

import pytest

from jaxspatial.models import ChatFormat, chat_format
from jaxspatial.rollout import tiny
from tests import chat_templates


@pytest.fixture(scope="module")
def tok():
  return tiny.tokenizer()


def _folder(tmp_path, tok, template):
  tok.chat_template = template
  try:
    tok.save_pretrained(tmp_path)
  finally:
    tok.chat_template = None
  return tmp_path


def test_a_thinking_template_opens_replies_with_think(tmp_path, tok):
  folder = _folder(tmp_path, tok, chat_templates.THINKING)
  ids = chat_templates.write_generation_config(folder, tok)
  chat = ChatFormat.from_folder(folder)
  assert chat.prefill == "<think>\n"
  assert chat.stop_ids(tok) == tuple(ids) and len(ids) == 2
  assert chat_format("auto", folder) == chat
  assert chat_format("instruct", folder) == ChatFormat(stop_tokens=tuple(ids))


def test_an_instruct_template_or_none_opens_replies_bare(tmp_path, tok):
  chat = ChatFormat.from_folder(_folder(tmp_path / "instruct", tok, chat_templates.INSTRUCT))
  assert chat == ChatFormat()
  assert chat.stop_ids(tok) == (tok.convert_tokens_to_ids("<|im_end|>"),)
  assert ChatFormat.from_folder(_folder(tmp_path / "none", tok, None)) == ChatFormat()
  assert chat_format("auto") == ChatFormat()
  assert chat_format("thinking").prefill == "<think>\n"


def test_generation_config_stops_one_id_or_a_list(tmp_path, tok):
  folder = _folder(tmp_path, tok, None)
  (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
  assert ChatFormat.from_folder(folder).stop_tokens == (7,)
  (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.7}))
  assert ChatFormat.from_folder(folder).stop_tokens == ()


@pytest.mark.parametrize("content, match", [
    ("{", "generation_config.json: not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"eos_token_id": "<|im_end|>"}', r"eos_token_id: expected a token id"),
    ('{"eos_token_id": [1, -3]}', r"eos_token_id: expected a token id"),
    ('{"eos_token_id": []}', r"eos_token_id: expected a token id"),
])
def test_a_bad_generation_config_is_named(tmp_path, tok, content, match):
  folder = _folder(tmp_path, tok, None)
  (folder / "generation_config.json").write_text(content)
  with pytest.raises(ValueError, match=match):
    ChatFormat.from_folder(folder)


def test_templates_outside_qwens_layout_are_refused(tmp_path, tok):
  llama = ("{% for m in messages %}{{ '<|start_header_id|>' + m.role + '<|end_header_id|>' "
           "+ m.content }}{% endfor %}{% if add_generation_prompt %}{{ "
           "'<|start_header_id|>assistant<|end_header_id|>' }}{% endif %}")
  with pytest.raises(ValueError, match=r"open a reply with Qwen's"):
    ChatFormat.from_folder(_folder(tmp_path / "llama", tok, llama))
  broken = "{{ raise_exception('no user turns') }}"
  with pytest.raises(ValueError, match=r"failed to render a user message.*no user turns"):
    ChatFormat.from_folder(_folder(tmp_path / "broken", tok, broken))
  with pytest.raises(ValueError, match=r"model.chat_format: expected one of"):
    chat_format("reasoning")
  with pytest.raises(ValueError, match="special tokens"):
    ChatFormat(prefill="<|im_start|>")


def test_generated_drops_the_prefill_from_written_turns():
  chat = ChatFormat.named("thinking")
  assert chat.generated("<think>\nlook\n</think>\n\n<answer>A</answer>") == (
      "look\n</think>\n\n<answer>A</answer>")
  assert chat.generated("<think>look</think><answer>A</answer>") == (
      "look</think><answer>A</answer>")
  with pytest.raises(ValueError, match="must start with it"):
    chat.generated("<answer>A</answer>")
  assert ChatFormat().generated("<think>x</think>") == "<think>x</think>"
