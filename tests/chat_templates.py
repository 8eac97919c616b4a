"""Chat templates written for the tests after the Qwen3-VL model cards' documented layout
(no template can be downloaded here): `THINKING` as Qwen3-VL-*-Thinking renders a
conversation (assistant reasoning split at "</think>" and kept after the last real user
query, dropped before it; tool results as a user turn of <tool_response> blocks; a reply
opened with "<think>\\n"), `INSTRUCT` as the instruct models (a reply opened bare)."""

_MESSAGES = r"""
{%- set ns = namespace(last_query=-1) -%}
{%- for m in messages -%}
  {%- if m.role == 'user' and not (m.content.startswith('<tool_response>')) -%}
    {%- set ns.last_query = loop.index0 -%}
  {%- endif -%}
{%- endfor -%}
{%- for m in messages -%}
  {%- if m.role == 'system' or m.role == 'user' -%}
    {{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' -}}
  {%- elif m.role == 'assistant' -%}
    {%- set content = m.content -%}
    {%- set reasoning = '' -%}
    {%- if THINKING and '</think>' in content -%}
      {%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\n') -%}
      {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
    {%- endif -%}
    {%- if THINKING and loop.index0 > ns.last_query -%}
      {{- '<|im_start|>assistant\n<think>\n' + reasoning + '\n</think>\n\n' + content -}}
    {%- else -%}
      {{- '<|im_start|>assistant\n' + content -}}
    {%- endif -%}
    {{- '<|im_end|>\n' -}}
  {%- elif m.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
      {{- '<|im_start|>user' -}}
    {%- endif -%}
    {{- '\n<tool_response>\n' + m.content + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
      {{- '<|im_end|>\n' -}}
    {%- endif -%}
  {%- endif -%}
{%- endfor -%}
"""

THINKING = ("{%- set THINKING = true -%}" + _MESSAGES
            + "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n<think>\n' -}}"
              "{%- endif -%}")
INSTRUCT = ("{%- set THINKING = false -%}" + _MESSAGES
            + "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}")


def write_generation_config(folder, tokenizer, stops=("<|im_end|>", "<|endoftext|>")):
  """generation_config.json as the Qwen3-VL cards ship it: eos_token_id a list."""
  import json  # pylint: disable=import-outside-toplevel
  import pathlib  # pylint: disable=import-outside-toplevel
  ids = [tokenizer.convert_tokens_to_ids(t) for t in stops]
  (pathlib.Path(folder) / "generation_config.json").write_text(json.dumps(
      {"bos_token_id": ids[-1], "eos_token_id": ids, "pad_token_id": ids[-1],
       "do_sample": True, "temperature": 1.0, "top_k": 20, "top_p": 0.95}))
  return ids
