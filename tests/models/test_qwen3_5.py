"""Qwen3.5 (dense, hybrid Gated DeltaNet / gated attention) against transformers' PyTorch
model and its reference delta-rule kernels, on tiny random checkpoints."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspatial.models import export, load_model, sampler
from jaxspatial.models.qwen3_5 import ModelFolderError, Qwen35, Qwen35Config, delta_rule

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
reference_kernels = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")

IMAGE, START, END = 250, 252, 253
PATCH_DIM = 3 * 2 * 16 * 16
# Five layers: linear, linear, linear, full, linear (two kinds interleaved, not only 3:1).
LAYER_TYPES = ["linear_attention"] * 3 + ["full_attention", "linear_attention"]
# Compiled: eager dispatch of the scans is slower than compiling them.
gated_delta_rule = jax.jit(delta_rule.gated_delta_rule, static_argnames=("form", "chunk_size"))
causal_conv = jax.jit(delta_rule.causal_conv)


def tiny_hf_config(tie=False, bias=False):
  return transformers.Qwen3_5Config(
      text_config=dict(vocab_size=256, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=5, layer_types=LAYER_TYPES, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, linear_conv_kernel_dim=4,
                       linear_key_head_dim=8, linear_value_head_dim=16, linear_num_key_heads=2,
                       linear_num_value_heads=4, attention_bias=bias, rms_norm_eps=1e-6,
                       rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2],
                                        "mrope_interleaved": True, "rope_theta": 10000.0,
                                        "partial_rotary_factor": 0.5},
                       bos_token_id=1, eos_token_id=2),
      vision_config=dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2,
                         out_hidden_size=64, patch_size=16, spatial_merge_size=2,
                         temporal_patch_size=2, num_position_embeddings=64),
      image_token_id=IMAGE, video_token_id=251, vision_start_token_id=START,
      vision_end_token_id=END, tie_word_embeddings=tie)


def _build(folder, tie=False, **options):
  torch.manual_seed(3 if tie else 2)
  model = transformers.Qwen3_5ForConditionalGeneration(tiny_hf_config(tie, **options)).eval()
  with torch.no_grad():  # norms start at 0 / 1 and biases at 0: perturb every parameter
    for name, param in model.named_parameters():
      if name != "lm_head.weight" or not tie:
        param.add_(torch.randn_like(param) * 0.05)
  model.save_pretrained(folder)
  return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  folder = tmp_path_factory.mktemp("qwen3_5")
  return _build(folder), folder


@pytest.fixture(scope="module")
def ours(checkpoint):
  return Qwen35.from_pretrained(checkpoint[1])


def _pixels(grids, seed):
  count = sum(t * h * w for t, h, w in grids)
  return np.random.default_rng(seed).normal(size=(count, PATCH_DIM)).astype(np.float32)


def _reference_logits(reference, ids, mask, pixels=None, grids=None):
  ids, mask = torch.tensor(ids), torch.tensor(mask)
  kw = {}
  if grids:
    kw = dict(pixel_values=torch.from_numpy(pixels), image_grid_thw=torch.tensor(grids))
  with torch.no_grad():
    return reference(input_ids=ids, attention_mask=mask, mm_token_type_ids=(ids == IMAGE).int(),
                     **kw).logits.numpy()


_forward = nnx.jit(lambda model, ids, mask, pixels, sequence_grids, grids: model(
    ids, mask, pixels, grids, sequence_grids), static_argnames="grids")


def _check_logits(reference, model, ids, mask, grids=(), sequence_grids=None, seed=0):
  pixels = _pixels(grids, seed) if grids else None
  expected = _reference_logits(reference, ids, mask, pixels, list(grids))
  got = _forward(model, jnp.asarray(ids), jnp.asarray(mask),
                 None if pixels is None else jnp.asarray(pixels),
                 None if sequence_grids is None else jnp.asarray(sequence_grids),
                 grids=tuple(grids))
  assert got.dtype == jnp.float32
  real = np.asarray(mask, bool)
  np.testing.assert_allclose(np.asarray(got)[real], expected[real], atol=1e-4, rtol=0)


ONE = [5, START] + [IMAGE] * 6 + [END, 7, 8, 9]                     # grid 1x4x6: 6 tokens
TWO = ([5, START] + [IMAGE] * 6 + [END, 7, START] + [IMAGE] * 30 +   # 1x4x6, then 1x12x10
       [END, 9, 10])
PADDED_A = [0, 0] + ONE
PADDED_B = [11, START] + [IMAGE] * 8 + [END, 12, 13, 14]              # 1x8x4: 8 tokens


# --- the kernel ------------------------------------------------------------------------------

def _kernel_inputs(seed, batch=2, length=37, key_heads=2, heads=4, dk=8, dv=16):
  rng = np.random.default_rng(seed)
  normal = lambda *shape: rng.normal(size=shape).astype(np.float32)
  return dict(q=normal(batch, length, key_heads, dk), k=normal(batch, length, key_heads, dk),
              v=normal(batch, length, heads, dv),
              g=-np.abs(normal(batch, length, heads)) * 0.5,
              beta=(1 / (1 + np.exp(-normal(batch, length, heads)))).astype(np.float32),
              state=normal(batch, heads, dk, dv) * 0.1)


def test_chunked_and_recurrent_forms_equal_the_transformers_kernels():
  x = _kernel_inputs(0)
  t = torch.from_numpy
  expected, expected_state = reference_kernels.torch_recurrent_gated_delta_rule(
      t(x["q"]), t(x["k"]), t(x["v"]), t(x["g"]), t(x["beta"]), initial_state=t(x["state"]),
      output_final_state=True, use_qk_l2norm_in_kernel=True)
  hf_chunked, _ = reference_kernels.torch_chunk_gated_delta_rule(
      t(x["q"]), t(x["k"]), t(x["v"]), t(x["g"]), t(x["beta"]), chunk_size=16,
      initial_state=t(x["state"]), output_final_state=True, use_qk_l2norm_in_kernel=True)
  np.testing.assert_allclose(hf_chunked.numpy(), expected.numpy(), atol=1e-5)
  # 37 tokens: chunks that do not divide (5, 16, 64) and one that does (37).
  for form, chunk in (("recurrent", 64), ("chunked", 5), ("chunked", 16), ("chunked", 37),
                      ("chunked", 64)):
    out, state = gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"], None,
                                  form, chunk)
    np.testing.assert_allclose(np.asarray(out), expected.numpy(), atol=2e-5, err_msg=form)
    np.testing.assert_allclose(np.asarray(state), expected_state.numpy(), atol=2e-5,
                               err_msg=f"{form} {chunk}")
  with pytest.raises(ValueError, match="form"):
    delta_rule.gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None,
                                "parallel")


def test_invalid_tokens_leave_the_state_and_the_convolution_untouched():
  """A sequence with holes (padding, slots an ended episode skips) gives, at its valid
  tokens, what the valid tokens alone give: the delta rule in both forms and the causal
  convolution (which reads the last K - 1 valid inputs across the holes)."""
  x = _kernel_inputs(1, length=29)
  valid = np.random.default_rng(2).random((2, 29)) > 0.35
  conv_in = np.random.default_rng(3).normal(size=(2, 29, 6)).astype(np.float32)
  weight = np.random.default_rng(4).normal(size=(4, 6)).astype(np.float32)
  conv_state = np.random.default_rng(5).normal(size=(2, 3, 6)).astype(np.float32)
  for form in ("chunked", "recurrent"):
    out, state = gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"], valid,
                                  form, 8)
    for b in range(2):
      keep = valid[b]
      alone, alone_state = gated_delta_rule(
          *(x[name][b:b + 1, keep] for name in ("q", "k", "v", "g", "beta")),
          x["state"][b:b + 1], None, "recurrent")
      np.testing.assert_allclose(np.asarray(out)[b, keep], np.asarray(alone)[0], atol=2e-5)
      np.testing.assert_allclose(np.asarray(state)[b], np.asarray(alone_state)[0], atol=2e-5)
  out, state = causal_conv(conv_in, weight, valid, conv_state)
  for b in range(2):
    keep = valid[b]
    alone, alone_state = causal_conv(conv_in[b:b + 1, keep], weight, None, conv_state[b:b + 1])
    np.testing.assert_allclose(np.asarray(out)[b, keep], np.asarray(alone)[0], atol=1e-6)
    np.testing.assert_array_equal(np.asarray(state)[b], np.asarray(alone_state)[0])
  # Without holes or a state: transformers' causal_conv1d_fn.
  expected = reference_kernels.causal_conv1d_fn(
      torch.from_numpy(conv_in).transpose(1, 2), torch.from_numpy(weight.T.copy()), None,
      activation=None).transpose(1, 2).numpy()
  out, state = causal_conv(conv_in, weight, None, None)
  np.testing.assert_allclose(np.asarray(out), expected, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(state), conv_in[:, -3:])


def test_the_layer_exposes_both_forms(ours):
  layer = next(l.linear_attn for l in ours.language_model.layers if l.kind == "linear_attention")
  x = jnp.asarray(np.random.default_rng(6).normal(size=(2, 23, 64)), jnp.float32)
  valid = jnp.asarray(np.random.default_rng(7).random((2, 23)) > 0.2)
  chunked, _ = layer(x, valid, form="chunked")
  recurrent, _ = layer(x, valid, form="recurrent")
  np.testing.assert_allclose(np.asarray(chunked)[np.asarray(valid)],
                             np.asarray(recurrent)[np.asarray(valid)], atol=1e-5)


# --- the model against transformers ------------------------------------------------------------

def test_config_reads_the_hybrid_layout(checkpoint, ours):
  config = ours.config
  assert config.text.layer_types == tuple(LAYER_TYPES)
  assert config.text.rotary_dim == 8 and config.vision.deepstack_visual_indexes == ()
  assert [layer.kind for layer in ours.language_model.layers] == LAYER_TYPES
  assert Qwen35Config.from_hf(config.to_hf()) == config
  # Without layer_types, transformers' default: every fourth layer full attention.
  raw = json.loads((checkpoint[1] / "config.json").read_text())
  del raw["text_config"]["layer_types"]
  raw["text_config"]["num_hidden_layers"] = 8
  assert Qwen35Config.from_hf(raw).text.layer_types == (("linear_attention",) * 3 +
                                                         ("full_attention",)) * 2


def test_text_only_logits_match_transformers(checkpoint, ours):
  # 70 tokens: two chunks of the chunked form; the second sequence left-padded.
  ids = np.random.default_rng(0).integers(3, 240, (2, 70))
  mask = np.ones_like(ids)
  mask[1, :5] = 0
  _check_logits(checkpoint[0], ours, ids, mask)


def test_image_logits_match_transformers(checkpoint, ours):
  # One image; two images of different sizes in one sequence beside a left-padded one.
  _check_logits(checkpoint[0], ours, [ONE], [[1] * len(ONE)], [(1, 4, 6)], [[(1, 4, 6)]],
                seed=1)
  padded = [0] * (len(TWO) - len(PADDED_B)) + PADDED_B
  mask = [[1] * len(TWO), [0] * (len(TWO) - len(PADDED_B)) + [1] * len(PADDED_B)]
  _check_logits(checkpoint[0], ours, [TWO, padded], mask, [(1, 4, 6), (1, 12, 10), (1, 8, 4)],
                [[(1, 4, 6), (1, 12, 10)], [(1, 8, 4), (1, 8, 4)]], seed=2)


def test_tied_head_and_biases_match_transformers(tmp_path):
  reference = _build(tmp_path, tie=True, bias=True)
  model = Qwen35.from_pretrained(tmp_path)
  assert model.language_model.lm_head is None and model.config.text.attention_bias
  _check_logits(reference, model, [ONE], [[1] * len(ONE)], [(1, 4, 6)], [[(1, 4, 6)]], seed=4)


def _reference_generate(reference, ids, mask, pixels=None, grids=None):
  ids, mask = torch.tensor(ids), torch.tensor(mask)
  kw = {}
  if grids:
    kw = dict(pixel_values=torch.from_numpy(pixels), image_grid_thw=torch.tensor(grids))
  with torch.no_grad():
    out = reference.generate(input_ids=ids, attention_mask=mask, max_new_tokens=32,
                             min_new_tokens=32, do_sample=False, eos_token_id=2, pad_token_id=0,
                             mm_token_type_ids=(ids == IMAGE).int(), **kw)
  return out[:, ids.shape[1]:].numpy()


def test_greedy_generation_matches_transformers_generate(checkpoint, ours):
  """32 greedy tokens, no early stop: prefill through the chunked form, then 32 recurrent
  decode steps over the hybrid cache."""
  reference = checkpoint[0]
  config = sampler.SamplingConfig(max_new_tokens=32, pad_token=0)
  prompts = np.random.default_rng(6).integers(3, 240, (2, 7))
  prompts[1, :2] = 0
  mask = np.ones_like(prompts)
  mask[1, :2] = 0
  out = nnx.jit(lambda m, i, a, k: sampler.generate(m, i, a, k, config))(
      ours, jnp.asarray(prompts), jnp.asarray(mask), jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(out.tokens),
                                _reference_generate(reference, prompts.tolist(), mask.tolist()))
  ids = np.asarray([PADDED_A, PADDED_B])
  mask = np.asarray([[0, 0] + [1] * 12, [1] * 14])
  grids = ((1, 4, 6), (1, 8, 4))
  pixels = _pixels(grids, 7)
  expected = _reference_generate(reference, ids.tolist(), mask.tolist(), pixels, list(grids))
  out = nnx.jit(lambda m, i, a, p, s: sampler.generate(m, i, a, jax.random.key(0), config, p,
                                                       grids, s))(
      ours, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(pixels),
      jnp.asarray([[(1, 4, 6)], [(1, 8, 4)]]))
  np.testing.assert_array_equal(np.asarray(out.tokens), expected)


def test_prefill_then_decode_equals_a_full_forward(ours):
  """An image prompt, then a segment with padding inside it (an observation laid out for
  static shapes), then token-by-token decode, all through `extend`: the logits at every
  valid position the cache serves (the prompt's end, the segment's end, each decode step)
  equal one forward over the whole sequence with the same holes."""
  ids = jnp.asarray([PADDED_A, PADDED_B])
  mask = jnp.asarray([[0, 0] + [1] * 12, [1] * 14])
  grids = ((1, 4, 6), (1, 8, 4))
  pixels = jnp.asarray(_pixels(grids, 8))
  per_sequence = jnp.asarray([[(1, 4, 6)], [(1, 8, 4)]])
  segment = jnp.asarray([[20, 21, 22, 23, 24], [30, 31, 32, 33, 34]])
  segment_mask = jnp.asarray([[1, 1, 0, 0, 1], [0, 1, 1, 1, 1]])
  follow = jnp.asarray([[40, 41, 42], [50, 51, 52]])
  capacity = 14 + 5 + 3

  @nnx.jit
  def run(model):
    state, prompt_logits = sampler.prefill(model, ids, mask, capacity, jnp.float32, pixels,
                                           grids, per_sequence)
    state, segment_logits = sampler.append(model, state, segment, segment_mask)
    steps = [segment_logits]
    for step in range(follow.shape[1]):
      state, logits = sampler.append(model, state, follow[:, step:step + 1],
                                     jnp.ones((2, 1), jnp.int32))
      steps.append(logits)
    full = jnp.concatenate([ids, segment, follow], axis=1)
    full_mask = jnp.concatenate([mask, segment_mask, jnp.ones_like(follow)], axis=1)
    embeds, _ = model.decoder_inputs(full, pixels, grids)
    # The positions `append` gave: the prompt's, then counting on over valid tokens.
    prompt_positions = model.position_ids(ids, mask, per_sequence)
    start = jnp.max(jnp.where(mask.astype(bool)[None], prompt_positions, -1), axis=(0, 2)) + 1
    later = jnp.cumsum(full_mask[:, 14:], axis=-1) - 1 + start[:, None]
    positions = jnp.concatenate([prompt_positions,
                                 jnp.broadcast_to(later[None], (3,) + later.shape)], axis=2)
    text = model.language_model
    expected = text.logits(text.hidden_states(embeds, positions, full_mask))
    return prompt_logits, jnp.stack(steps, axis=1), expected, full_mask

  prompt_logits, got, expected, full_mask = run(ours)
  assert np.asarray(full_mask, bool)[:, 18:].all()  # the positions compared are real
  np.testing.assert_allclose(np.asarray(prompt_logits), np.asarray(expected)[:, 13], atol=1e-5)
  np.testing.assert_allclose(np.asarray(got), np.asarray(expected)[:, 18:], atol=1e-5)


def test_hybrid_cache_is_constant_in_length_for_linear_layers(ours):
  short = ours.language_model.init_cache(2, 64)
  long = ours.language_model.init_cache(2, 4096)
  for kind, a, b in zip(LAYER_TYPES, short, long):
    shapes = [x.shape for x in a], [x.shape for x in b]
    assert (shapes[0] == shapes[1]) == (kind == "linear_attention"), (kind, shapes)
  conv, state = short[0]
  assert conv.shape == (2, 3, 2 * 2 * 8 + 4 * 16) and state.shape == (2, 4, 8, 16)
  assert state.dtype == jnp.float32


# --- loading and export ------------------------------------------------------------------------

def test_export_reloads_in_transformers_and_here(checkpoint, ours, tmp_path):
  reference, _ = checkpoint
  export(ours, tmp_path / "out")
  assert load_model(tmp_path / "out").family == "qwen3_5"
  again = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(tmp_path / "out").eval()
  expected = reference.state_dict()
  for name, value in again.state_dict().items():
    np.testing.assert_array_equal(value.numpy(), expected[name].numpy(), err_msg=name)
  assert set(again.state_dict()) == set(expected)


def test_multi_token_prediction_tensors_are_skipped(checkpoint, ours, tmp_path):
  """Released checkpoints carry the MTP head (`mtp.*`): loading skips it, as transformers'
  Qwen3.5 does, and every other tensor still has to be there."""
  from safetensors.numpy import load_file, save_file
  folder = tmp_path / "with_mtp"
  shutil.copytree(checkpoint[1], folder)
  tensors = load_file(folder / "model.safetensors")
  tensors["mtp.fc.weight"] = np.ones((64, 128), np.float32)
  save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
  model = Qwen35.from_pretrained(folder)
  np.testing.assert_array_equal(np.asarray(model.language_model.norm.weight[...]),
                                np.asarray(ours.language_model.norm.weight[...]))
  del tensors["model.language_model.layers.0.linear_attn.A_log"]
  save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
  with pytest.raises(ModelFolderError, match="A_log"):
    Qwen35.from_pretrained(folder)


@pytest.mark.parametrize("edit, field", [
    (lambda t: t.update(layer_types=["linear_attention"] * 4), "layer_types"),
    (lambda t: t.update(layer_types=["linear_attention"] * 4 + ["sliding_attention"]),
     "layer_types"),
    (lambda t: t["rope_parameters"].update(mrope_section=[2, 2, 2]), "mrope_section"),
    (lambda t: t["rope_parameters"].update(mrope_interleaved=False), "mrope_interleaved"),
    (lambda t: t["rope_parameters"].update(rope_type="yarn"), "rope_type"),
    (lambda t: t.update(linear_num_key_heads=3), "linear_num_key_heads"),
    (lambda t: t.update(hidden_act="gelu"), "hidden_act"),
])
def test_config_refusals_name_the_field(checkpoint, tmp_path, edit, field):
  raw = json.loads((checkpoint[1] / "config.json").read_text())
  edit(raw["text_config"])
  (tmp_path / "config.json").write_text(json.dumps(raw))
  with pytest.raises(ModelFolderError, match=field):
    Qwen35Config.from_hf(tmp_path)


def test_tiny_config_size():
  config = Qwen35Config.tiny()
  model = nnx.eval_shape(lambda: Qwen35(config, rngs=nnx.Rngs(0)))
  count = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  assert 100_000 < count < 600_000, count
  assert config.text.layer_types.count("full_attention") == 1
