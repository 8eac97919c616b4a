"""PaddleOCR-VL through transformers: a tiny random model and processor built here
(no downloads), saved with save_pretrained and loaded back by the backend."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxspatial.perception import ocr  # pylint: disable=wrong-import-position
from jaxspatial.perception.paddleocr_vl import (  # pylint: disable=wrong-import-position
    TASK_PROMPTS, PaddleOCRVLBackend)

SPECIALS = ["<s>", "</s>", "<pad>", "<|begin_of_sentence|>", "<|IMAGE_PLACEHOLDER|>",
            "<|IMAGE_START|>", "<|IMAGE_END|>", "<|video_pad|>"]
# PaddleOCR-VL's prompt layout (its chat template, written here from the published format):
# <|begin_of_sentence|>User: <image markers><prompt>\nAssistant:\n
CHAT_TEMPLATE = (
    '{{- "<|begin_of_sentence|>" -}}'
    '{%- for message in messages -%}{%- if message["role"] == "user" -%}{{- "User: " -}}'
    '{%- for c in message["content"] -%}{%- if c["type"] == "image" -%}'
    '{{- "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>" -}}{%- endif -%}{%- endfor -%}'
    '{%- for c in message["content"] -%}{%- if c["type"] == "text" -%}{{- c["text"] -}}'
    '{%- endif -%}{%- endfor -%}{{- "\\n" -}}{%- endif -%}{%- endfor -%}'
    '{%- if add_generation_prompt -%}{{- "Assistant:\\n" -}}{%- endif -%}')


# PaddleOCR-VL's element-level task prompts (model card, vLLM recipe, PERIA's tool server).
PUBLISHED_PROMPTS = {"ocr": "OCR:", "table": "Table Recognition:",
                     "formula": "Formula Recognition:", "chart": "Chart Recognition:"}


def expected_prompt(task: str) -> str:
  return ("<|begin_of_sentence|>User: <|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>"
          f"{PUBLISHED_PROMPTS[task]}\nAssistant:\n")


def tiny_tokenizer():
  """A byte-level BPE with no merges whose token 0 is "a" (a model whose logits are all
  equal then writes "aaa..."), plus PaddleOCR-VL's special tokens."""
  import tokenizers  # pylint: disable=import-outside-toplevel
  alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
  alphabet.remove("a")
  vocab = {token: i for i, token in enumerate(["a"] + alphabet)}
  model = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[]))
  model.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  model.decoder = tokenizers.decoders.ByteLevel()
  model.add_special_tokens(SPECIALS)
  return transformers.PreTrainedTokenizerFast(
      tokenizer_object=model, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
      cls_token="<|begin_of_sentence|>",
      extra_special_tokens={"image_token": "<|IMAGE_PLACEHOLDER|>"})


def save_tiny(folder, seed: int, flat_logits: bool = False):
  """A PaddleOCR-VL with 1-layer towers of width 32 and its processor, saved to `folder`.
  `flat_logits` zeroes the final norm: every logit is 0 and greedy decoding writes token 0."""
  tokenizer = tiny_tokenizer()
  ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIALS}
  text = dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
              num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
              rope_parameters={"rope_type": "default", "rope_theta": 500000.0,
                               "mrope_section": [2, 3, 3]},
              pad_token_id=ids["<pad>"], bos_token_id=ids["<s>"], eos_token_id=ids["</s>"],
              max_position_embeddings=1024, tie_word_embeddings=False)
  vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                patch_size=14, spatial_merge_size=2)
  config = transformers.PaddleOCRVLConfig(
      text_config=text, vision_config=vision, image_token_id=ids["<|IMAGE_PLACEHOLDER|>"],
      video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|IMAGE_START|>"],
      vision_end_token_id=ids["<|IMAGE_END|>"], tie_word_embeddings=False)
  torch.manual_seed(seed)
  model = transformers.PaddleOCRVLForConditionalGeneration(config).eval()
  if flat_logits:
    with torch.no_grad():
      model.model.language_model.norm.weight.zero_()
  image_processor = transformers.PaddleOCRVLImageProcessorPil(min_pixels=56 * 56,
                                                              max_pixels=112 * 112)
  processor = transformers.PaddleOCRVLProcessor(image_processor=image_processor,
                                                tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)
  model.save_pretrained(folder)
  processor.save_pretrained(folder)
  return folder


class Spy:
  """The processor, recording the text of every call and what it returned."""

  def __init__(self, inner):
    self.inner, self.calls = inner, []

  def __call__(self, text=None, images=None, **kwargs):
    out = self.inner(text=text, images=images, **kwargs)
    self.calls.append((text, out))
    return out

  def __getattr__(self, name):
    return getattr(self.inner, name)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  root = tmp_path_factory.mktemp("paddleocr_vl")
  return save_tiny(root / "random", seed=1), save_tiny(root / "flat", seed=0, flat_logits=True)


def image(seed: int, height: int = 60, width: int = 90) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def test_recognize_is_a_deterministic_string_with_each_tasks_prompt(folders):
  assert TASK_PROMPTS == PUBLISHED_PROMPTS
  random_folder, _ = folders
  backend = PaddleOCRVLBackend.from_pretrained(random_folder, max_new_tokens=8)
  backend.processor = spy = Spy(backend.processor)
  picture = image(0)
  answers = {}
  for task in ("ocr", "table", "formula", "chart"):
    answers[task] = first = backend.recognize(picture, task)
    assert isinstance(first, str) and first and backend.recognize(picture, task) == first
    (text, inputs), (again, _) = spy.calls[-2:]
    assert text == again == [expected_prompt(task)] == [backend.prompt(task)]
    # The prompt reaches the model: it is in the token ids, the image tokens expanded.
    ids = inputs["input_ids"][0]
    decoded = backend.processor.tokenizer.decode(ids, skip_special_tokens=True)
    assert decoded == f"User: {PUBLISHED_PROMPTS[task]}\nAssistant:\n"
    grid = inputs["image_grid_thw"][0]
    assert int((ids == backend.model.config.image_token_id).sum()) == int(grid.prod()) // 4
  # Untied random weights (seed 1) answer differently per task and per image: the prompt
  # and the pixels both reach the decoder.
  assert len(set(answers.values())) >= 2, answers
  assert backend.recognize(picture.copy(), "ocr") == answers["ocr"]
  assert backend.recognize(image(1), "ocr") != answers["ocr"]
  assert not np.array_equal(spy.calls[-1][1]["pixel_values"].numpy(),
                            spy.calls[-2][1]["pixel_values"].numpy())

def test_flat_logits_decode_to_token_zero_and_read_gives_one_line(folders):
  _, flat_folder = folders
  backend = PaddleOCRVLBackend.from_pretrained(flat_folder, max_new_tokens=6)
  picture = image(2, 40, 130)
  # All logits equal: greedy takes token 0 ("a") at every step, never the end token.
  assert backend.recognize(picture, "formula") == "aaaaaa"
  (line,) = backend.read(picture)
  assert line.text == "aaaaaa"
  np.testing.assert_array_equal(line.box_4x2, [[0, 0], [130, 0], [130, 40], [0, 40]])
  vocab = len(backend.processor.tokenizer)
  assert line.score == pytest.approx(1 / vocab, rel=1e-4)  # uniform over the vocabulary
  # The tools route to the VLM's own tasks.
  spy = backend.processor = Spy(backend.processor)
  table = ocr.table_ocr(picture, backend=backend)
  assert json.loads(table[len(ocr.SUCCESS):]) == {"task": "table", "text": "aaaaaa"}
  assert spy.calls[-1][0] == [expected_prompt("table")]
  formula = ocr.formula_ocr(picture, [0, 0, 500, 1000], backend=backend)
  assert json.loads(formula[len(ocr.SUCCESS):]) == {"task": "formula", "text": "aaaaaa"}
  assert spy.calls[-1][0] == [expected_prompt("formula")]
  assert tuple(spy.calls[-1][1]["image_grid_thw"].shape) == (1, 3)
  text = ocr.text_ocr(picture, backend=backend)
  assert json.loads(text[len(ocr.SUCCESS):]) == {"task": "ocr", "text": "aaaaaa"}
  assert spy.calls[-1][0] == [expected_prompt("ocr")]


def test_bad_tasks_images_and_settings_are_refused(folders):
  random_folder, _ = folders
  backend = PaddleOCRVLBackend.from_pretrained(random_folder, max_new_tokens=2)
  with pytest.raises(ValueError, match=r"task must be one of \('ocr', 'table', 'formula', "
                     r"'chart'\), got 'seal'"):
    backend.recognize(image(0), "seal")
  with pytest.raises(ValueError, match=r"expected an image \[H, W, 3\] uint8 RGB, got dtype "
                     r"float32"):
    backend.recognize(image(0).astype(np.float32), "ocr")
  with pytest.raises(ValueError, match="max_new_tokens: expected an int >= 1, got 0"):
    PaddleOCRVLBackend(backend.model, backend.processor, max_new_tokens=0)
  # Tiny and extreme images reach the model without crashing the image processor.
  for shape in [(1, 1), (2, 1000), (1000, 3)]:
    assert isinstance(backend.recognize(np.full(shape + (3,), 200, np.uint8), "ocr"), str)


def test_loading_names_the_folder_and_what_is_missing(folders, tmp_path):
  random_folder, _ = folders
  with pytest.raises(FileNotFoundError, match=r"from_pretrained\('.*nowhere'\): no such folder"):
    PaddleOCRVLBackend.from_pretrained(tmp_path / "nowhere")
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(FileNotFoundError, match="empty'\\): config.json is missing"):
    PaddleOCRVLBackend.from_pretrained(empty)
  other = tmp_path / "other"
  other.mkdir()
  (other / "config.json").write_text('{"model_type": "qwen2_5_vl"}')
  with pytest.raises(ValueError, match="model_type: expected 'paddleocr_vl', got 'qwen2_5_vl'"):
    PaddleOCRVLBackend.from_pretrained(other)
  partial = tmp_path / "partial"
  shutil.copytree(random_folder, partial)
  (partial / "model.safetensors").unlink()
  (partial / "chat_template.jinja").unlink()
  with pytest.raises(FileNotFoundError, match=r"missing the weights \(one of model.safetensors, "
                     r".*; the chat template"):
    PaddleOCRVLBackend.from_pretrained(partial)
  with pytest.raises(ValueError, match="dtype must name a torch dtype"):
    PaddleOCRVLBackend.from_pretrained(random_folder, dtype="float99")
