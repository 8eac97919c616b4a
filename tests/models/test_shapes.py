"""The published policies' shapes against transformers' models of the same configs and the
parameter totals the released checkpoints publish; random policies of those shapes."""

import dataclasses

import pytest
import torch
import transformers
from flax import nnx

from jaxspatial.models import memory, shapes
from jaxspatial.models.policy import policy_class
from jaxspatial.rollout import tiny

# The released checkpoints' parameter totals (their Hugging Face model cards)
PUBLISHED_TOTALS = {"Qwen3-VL-4B": 4.44e9, "Qwen3-VL-8B": 8.77e9, "Qwen2.5-VL-3B": 3.75e9,
                    "Qwen2.5-VL-7B": 8.29e9}
HF_CLASSES = {"qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
              "qwen3_vl": "Qwen3VLForConditionalGeneration",
              "qwen3_5": "Qwen3_5ForConditionalGeneration"}


def _ours(config, family):
  return memory.parameter_count(nnx.eval_shape(
      lambda: policy_class(family)(config, rngs=nnx.Rngs(0))))


def _transformers_count(config, family) -> int:
  hf = config.to_hf()
  hf_config = getattr(transformers, type(transformers.AutoConfig.for_model(
      hf["model_type"])).__name__)(**{k: v for k, v in hf.items() if k != "model_type"})
  with torch.device("meta"):  # shapes only
    reference = getattr(transformers, HF_CLASSES[family])(hf_config)
  return sum(p.numel() for p in reference.parameters())


@pytest.mark.parametrize("name", shapes.PUBLISHED)
def test_shape_counts_as_transformers_and_the_release(name):
  """transformers' model of the whole shape has the released total; ours has transformers'
  parameters layer for layer (counted on 4 layers: tracing our 36-layer init takes 9 s)."""
  family = shapes.published_family(name)
  config = shapes.published_config(name)
  whole = _transformers_count(config, family)
  if name in PUBLISHED_TOTALS:
    assert whole == pytest.approx(PUBLISHED_TOTALS[name], abs=0.006e9)
  cut = shapes.with_layers(config, 4)
  assert _ours(cut, family) == _transformers_count(cut, family)


def test_with_layers_keeps_the_widths():
  config = shapes.published_config("Qwen3.5-9B")
  cut = shapes.with_layers(config, 8)
  assert cut.text.num_hidden_layers == 8 and cut.text.hidden_size == config.text.hidden_size
  assert cut.text.layer_types.count("full_attention") == 2  # every fourth, as transformers
  assert cut.vision == config.vision
  cut.text.check()
  with pytest.raises(ValueError, match="DeepStack"):
    shapes.with_layers(shapes.published_config("Qwen3-VL-4B"), 2)
  with pytest.raises(ValueError, match="unknown published policy 'Qwen9'"):
    shapes.published_config("Qwen9")


def test_random_policy_of_a_published_shape_takes_the_tokenizers_ids():
  tok = tiny.tokenizer()
  model = nnx.eval_shape(lambda: tiny.model(tok, shape="Qwen3-VL-4B", layers=4))
  reference = shapes.published_config("Qwen3-VL-4B")
  assert model.family == "qwen3_vl"
  assert dataclasses.replace(model.config.text, num_hidden_layers=36) == reference.text
  assert model.config.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")
  assert model.config.text.vocab_size == 151936 > len(tok)
