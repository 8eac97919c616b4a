"""Observation messages: numbers formatted on device equal Python's formatting."""

import jax
import numpy as np

from jaxspatial.rollout import observation, tiny


def test_device_numbers_equal_the_host_layout_and_python_formatting():
  tok = tiny.tokenizer()
  template = observation.compile_template(
      tok, "pos ({}, {}) <|vision_start|><|image_pad|><|vision_end|> at {}", image_tokens=3)
  rng = np.random.default_rng(0)
  values = np.concatenate([rng.uniform(-50, 50, 300), rng.uniform(-1, 1, 100) * 0.01,
                           [0.0, -0.0, 0.005, -0.005, 0.015, 123.455, 9999.994, 12345.0,
                            -12345.0, 1.0049999]]).astype(np.float32)
  values = values[: len(values) // 3 * 3].reshape(-1, 3)
  run = jax.jit(jax.vmap(lambda n: observation.observation_tokens(template, n)))
  ids, mask = jax.device_get(run(values))
  assert ids.shape[1] == template.length
  pieces = {i: tok.decode([i]) for i in range(len(tok))}
  for row, numbers in enumerate(values):
    host_ids, host_mask = observation.observation_tokens_host(template, numbers)
    np.testing.assert_array_equal(ids[row], host_ids)
    np.testing.assert_array_equal(mask[row], host_mask)
    text = "".join(pieces[i] for i in ids[row][mask[row]])
    formatted = [observation.format_number_host(v) for v in numbers]
    assert text == ("pos ({}, {}) <|vision_start|>" + "<|image_pad|>" * 3
                    + "<|vision_end|> at {}").format(*formatted)
    for v, f in zip(numbers, formatted):
      if abs(v) < 9999.99 and abs(abs(v) * 100 % 1 - 0.5) > 1e-3:  # away from rounding ties
        assert float(f) == round(float(v), 2) or abs(float(f) - float(v)) <= 0.005 + 1e-6


def test_integer_fields_round_half_away_from_zero_and_match_the_host_layout():
  tok = tiny.tokenizer()
  template = observation.compile_template(tok, "Observation {:d}: at {}", image_tokens=0)
  assert template.integers == (True, False)
  values = np.asarray([[0, 1.5], [3, -2.25], [2.5, 0], [-2.5, 1], [-0.4, 2], [7.49, 3],
                       [1234, 4]], np.float32)
  ids, mask = jax.device_get(jax.jit(jax.vmap(
      lambda n: observation.observation_tokens(template, n)))(values))
  pieces = {i: tok.decode([i]) for i in range(len(tok))}
  expected = ["0", "3", "3", "-3", "0", "7", "1234"]  # half away from zero; no "-0"
  for row, numbers in enumerate(values):
    host_ids, host_mask = observation.observation_tokens_host(template, numbers)
    np.testing.assert_array_equal(ids[row], host_ids)
    np.testing.assert_array_equal(mask[row], host_mask)
    text = "".join(pieces[i] for i in ids[row][mask[row]])
    assert text == f"Observation {expected[row]}: at {numbers[1]:.2f}"


def test_variants_share_one_length_and_each_equals_its_own_formatting():
  """A message set of three variants: each episode's chosen variant reads exactly as its
  own string (Python formatting), the others' tokens never leak, and the variant without
  the image carries the image group masked (every message holds the same vision tokens)."""
  tok = tiny.tokenizer()
  texts = ("Tool executed successfully.\nObservation {:d}:\n<|vision_start|><|image_pad|>"
           "<|vision_end|>",
           "Error: image index {:d} is not in the list.",
           "Your action could not be parsed.")
  template = observation.compile_template(tok, texts, image_tokens=4)
  assert template.num_variants == 3 and template.num_numbers == 1
  numbers = np.asarray([[2.0], [7.0], [3.0], [0.0]], np.float32)
  choice = np.asarray([0, 1, 2, 0], np.int32)
  ids, mask = jax.device_get(jax.jit(jax.vmap(
      lambda n, v: observation.observation_tokens(template, n, v)))(numbers, choice))
  assert ids.shape == (4, template.length)
  pieces = {i: tok.decode([i]) for i in range(len(tok))}
  image_pad = tok.convert_tokens_to_ids("<|image_pad|>")
  for row in range(4):
    text = "".join(pieces[i] for i in ids[row][mask[row]])
    expected = texts[choice[row]].replace("<|image_pad|>", "<|image_pad|>" * 4)
    if "{:d}" in expected:
      expected = expected.replace("{:d}", str(int(numbers[row, 0])))
    assert text == expected
    assert np.sum(ids[row] == image_pad) == 4  # the image group, attended or masked
    assert mask[row, -1]  # the next turn samples from the last slot: a real token
    host_ids, host_mask = observation.observation_tokens_host(template, numbers[row],
                                                              int(choice[row]))
    np.testing.assert_array_equal(ids[row], host_ids)
    np.testing.assert_array_equal(mask[row], host_mask)
