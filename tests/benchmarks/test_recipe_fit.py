"""The device suite's recipes part: the paper policies' layers fitted to a device's memory
(checked against transformers' models of the chosen shapes) and the configs it runs."""

import pytest

from benchmarks.device_suite import Sizes
from benchmarks.device_suite.recipes import (BYTES_PER_TRAINED_PARAMETER, PAPER_POLICIES,
                                             fitting_layers, recipe_config)
from jaxspatial.models import shapes
from tests.models.test_shapes import _transformers_count

GiB = 2 ** 30


@pytest.mark.parametrize("shape", sorted(set(PAPER_POLICIES.values())))
def test_fitted_layers_are_the_most_that_fit(shape):
  budget = 0.7 * 80 * GiB
  layers = fitting_layers(shape, budget)
  config = shapes.published_config(shape)
  family = shapes.published_family(shape)
  period = 4 if family == "qwen3_5" else 1
  need = lambda n: BYTES_PER_TRAINED_PARAMETER * _transformers_count(
      shapes.with_layers(config, n), family)
  assert need(layers) <= budget
  assert layers == config.text.num_hidden_layers or need(layers + period) > budget
  assert layers % period == 0


def test_a_device_too_small_for_the_embeddings_is_named():
  with pytest.raises(MemoryError, match="Qwen3.5-9B: 4 decoder layers need"):
    fitting_layers("Qwen3.5-9B", 24 * GiB)


def test_the_full_sizes_run_each_paper_policy_in_bf16_micro_batches(tmp_path):
  for name, shape in PAPER_POLICIES.items():
    c = recipe_config(name, Sizes.full(), str(tmp_path), device_bytes=141 * GiB)
    assert c.model.shape == shape and c.model.family == shapes.published_family(shape)
    assert c.model.layers == fitting_layers(shape, 0.7 * 141 * GiB)
    assert (c.model.dtype, c.model.param_dtype, c.model.remat) == ("bfloat16", "float32", True)
    rows = c.rl.prompts * c.advantage.group_size // c.rl.mini_batches
    assert rows % c.rl.micro_batches == 0 and rows // c.rl.micro_batches <= 4
