"""Qwen3-VL (dense) against transformers' PyTorch model on tiny random checkpoints."""

import copy
import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspatial.models import export
from jaxspatial.models.qwen3_vl import ModelFolderError, Qwen3VL, Qwen3VLConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

IMAGE, START, END = 250, 252, 253
PATCH_DIM = 3 * 2 * 16 * 16


def tiny_hf_config(tie=False, bias=False, deepstack=(1, 2)):
  return transformers.Qwen3VLConfig(
      text_config=dict(vocab_size=256, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6,
                       attention_bias=bias,
                       rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3],
                                        "mrope_interleaved": True, "rope_theta": 10000.0},
                       bos_token_id=1, eos_token_id=2),
      vision_config=dict(depth=4, hidden_size=32, intermediate_size=64, num_heads=2,
                         out_hidden_size=64, patch_size=16, spatial_merge_size=2,
                         temporal_patch_size=2, num_position_embeddings=64,
                         deepstack_visual_indexes=list(deepstack)),
      image_token_id=IMAGE, video_token_id=251, vision_start_token_id=START,
      vision_end_token_id=END, tie_word_embeddings=tie)


def _build(folder, tie=False, **options):
  torch.manual_seed(1 if tie else 0)
  model = transformers.Qwen3VLForConditionalGeneration(tiny_hf_config(tie, **options)).eval()
  with torch.no_grad():  # transformers initialises norms to 1 and biases to 0: perturb all
    for name, param in model.named_parameters():
      if name != "lm_head.weight" or not tie:
        param.add_(torch.randn_like(param) * 0.05)
  model.save_pretrained(folder)
  return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  folder = tmp_path_factory.mktemp("qwen3")
  return _build(folder), folder


@pytest.fixture(scope="module")
def tied_checkpoint(tmp_path_factory):
  """Also q / k / v / o biases, and DeepStack indexes out of block order (transformers then
  gives the features in block order, each through its list position's merger)."""
  folder = tmp_path_factory.mktemp("qwen3_tied")
  return _build(folder, tie=True, bias=True, deepstack=(2, 0)), folder


@pytest.fixture(scope="module")
def ours(checkpoint):
  return Qwen3VL.from_pretrained(checkpoint[1])


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


# Compiled once per shape: eager dispatch of the tiny model is slower than compiling it.
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
PADDED_A = [0, 0] + ONE                                               # left padding, 1x4x6
PADDED_B = [11, START] + [IMAGE] * 8 + [END, 12, 13, 14]              # 1x8x4: 8 tokens


def test_text_only_logits_match_transformers(checkpoint, ours):
  ids = np.random.default_rng(0).integers(3, 240, (2, 12))
  _check_logits(checkpoint[0], ours, ids, np.ones_like(ids))


def test_image_logits_match_transformers(checkpoint, ours):
  # One batch (one compile): two images of different sizes in the first sequence (12 x 10
  # patches resample the 8 x 8 position table upwards, 4 x 6 downwards), the second
  # left-padded with an image of its own. One image alone: the tied-head test.
  padded = [0] * (len(TWO) - len(PADDED_B)) + PADDED_B
  mask = [[1] * len(TWO), [0] * (len(TWO) - len(PADDED_B)) + [1] * len(PADDED_B)]
  _check_logits(checkpoint[0], ours, [TWO, padded], mask, [(1, 4, 6), (1, 12, 10), (1, 8, 4)],
                [[(1, 4, 6), (1, 12, 10)], [(1, 8, 4), (1, 8, 4)]], seed=2)


def test_tied_head_logits_match_transformers(tied_checkpoint):
  reference, folder = tied_checkpoint
  model = Qwen3VL.from_pretrained(folder)
  assert model.language_model.lm_head is None and model.config.text.tie_word_embeddings
  assert model.config.text.attention_bias
  assert model.config.vision.deepstack_visual_indexes == (2, 0)
  _check_logits(reference, model, [ONE], [[1] * len(ONE)], [(1, 4, 6)], [[(1, 4, 6)]], seed=4)


def test_vision_tokens_and_deepstack_match_transformers(checkpoint, ours):
  reference = checkpoint[0]
  grids = ((1, 4, 6), (1, 12, 10), (2, 4, 4))  # a two-frame grid: attention per frame
  pixels = _pixels(grids, 5)
  with torch.no_grad():
    out = reference.model.visual(torch.from_numpy(pixels), grid_thw=torch.tensor(grids))
  vision = nnx.jit(lambda m, p: m.encode_images(p, grids))(ours, jnp.asarray(pixels))
  tokens, deepstack = vision.tokens_NxC, vision.deepstack_KxNxC
  assert deepstack.shape == (2,) + tokens.shape == (2, 6 + 30 + 8, 64)
  np.testing.assert_allclose(np.asarray(tokens), out.pooler_output.numpy(), atol=1e-4, rtol=0)
  for k, feature in enumerate(out.deepstack_features):
    np.testing.assert_allclose(np.asarray(deepstack[k]), feature.numpy(), atol=1e-4, rtol=0)


def test_interleaved_mrope_and_rope_index_match_transformers(checkpoint, ours):
  from jaxspatial.models.qwen3_vl.rope import mrope_cos_sin
  reference = checkpoint[0]
  ids = torch.tensor([PADDED_A, PADDED_B])
  mask = torch.tensor([[0, 0] + [1] * 12, [1] * 14])
  grids = torch.tensor([[1, 4, 6], [1, 8, 4]])
  expected, _ = reference.model.get_rope_index(ids, (ids == IMAGE).int(), image_grid_thw=grids,
                                               attention_mask=mask)
  got = ours.position_ids(jnp.asarray(ids.numpy()), jnp.asarray(mask.numpy()),
                          jnp.asarray([[[1, 4, 6]], [[1, 8, 4]]]))
  real = mask.numpy().astype(bool)
  np.testing.assert_array_equal(np.asarray(got)[:, real], expected.numpy()[:, real])
  # Two images in one sequence.
  ids = torch.tensor([TWO])
  grids = torch.tensor([[1, 4, 6], [1, 12, 10]])
  expected, _ = reference.model.get_rope_index(ids, (ids == IMAGE).int(), image_grid_thw=grids)
  got = ours.position_ids(jnp.asarray(ids.numpy()), jnp.ones(ids.shape, jnp.int32),
                          jnp.asarray([[[1, 4, 6], [1, 12, 10]]]))
  np.testing.assert_array_equal(np.asarray(got), expected.numpy())
  # The interleaved cos / sin of those positions.
  with torch.no_grad():
    cos, sin = reference.model.language_model.rotary_emb(torch.zeros(1), expected)
  ours_cos, ours_sin = mrope_cos_sin(jnp.asarray(expected.numpy()), 16, 10000.0, (2, 3, 3))
  np.testing.assert_allclose(np.asarray(ours_cos), cos.numpy(), atol=1e-6)
  np.testing.assert_allclose(np.asarray(ours_sin), sin.numpy(), atol=1e-6)


def _reference_generate(reference, ids, mask, pixels=None, grids=None):
  ids, mask = torch.tensor(ids), torch.tensor(mask)
  kw = {}
  if grids:
    kw = dict(pixel_values=torch.from_numpy(pixels), image_grid_thw=torch.tensor(grids))
  with torch.no_grad():
    out = reference.generate(input_ids=ids, attention_mask=mask, max_new_tokens=32,
                             do_sample=False, eos_token_id=2, pad_token_id=0,
                             mm_token_type_ids=(ids == IMAGE).int(), **kw)
  return out[:, ids.shape[1]:].numpy()


def test_greedy_generation_matches_transformers_generate(checkpoint, ours):
  from jaxspatial.models import sampler
  reference = checkpoint[0]
  config = sampler.SamplingConfig(max_new_tokens=32, stop_tokens=(2,), pad_token=0)

  def check(expected, tokens):
    width = expected.shape[1]  # transformers stops once every sequence has stopped
    np.testing.assert_array_equal(np.asarray(tokens)[:, :width], expected)
    assert (np.asarray(tokens)[:, width:] == 0).all()

  # Text only, one sequence left-padded.
  prompts = np.random.default_rng(6).integers(3, 240, (2, 7))
  prompts[1, :2] = 0
  mask = np.ones_like(prompts)
  mask[1, :2] = 0
  out = nnx.jit(lambda m, i, a, k: sampler.generate(m, i, a, k, config))(
      ours, jnp.asarray(prompts), jnp.asarray(mask), jax.random.key(0))
  check(_reference_generate(reference, prompts.tolist(), mask.tolist()), out.tokens)
  # Images, a left-padded batch: the prefill carries the DeepStack residuals.
  ids = np.asarray([PADDED_A, PADDED_B])
  mask = np.asarray([[0, 0] + [1] * 12, [1] * 14])
  grids = ((1, 4, 6), (1, 8, 4))
  pixels = _pixels(grids, 7)
  per_sequence = jnp.asarray([[(1, 4, 6)], [(1, 8, 4)]])
  expected = _reference_generate(reference, ids.tolist(), mask.tolist(), pixels, list(grids))
  out = nnx.jit(lambda m, i, a, p, s: sampler.generate(m, i, a, jax.random.key(0), config, p,
                                                       grids, s))(
      ours, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(pixels), per_sequence)
  check(expected, out.tokens)


def test_extend_with_residuals_equals_a_full_forward(ours):
  """Prefill with DeepStack residuals, then decode token by token through `extend`: the
  logits at every position equal a full forward over the whole sequence."""
  ids = jnp.asarray([PADDED_A, PADDED_B])
  mask = jnp.asarray([[0, 0] + [1] * 12, [1] * 14])
  grids = ((1, 4, 6), (1, 8, 4))
  pixels = jnp.asarray(_pixels(grids, 8))
  per_sequence = jnp.asarray([[(1, 4, 6)], [(1, 8, 4)]])
  follow = jnp.asarray([[30, 31], [40, 41]])
  capacity = 14 + follow.shape[1]

  @nnx.jit
  def run(model):
    text = model.language_model
    vision = model.encode_images(pixels, grids)  # once: `vision=` skips the encoder below
    embeds, residuals = model.decoder_inputs(ids, grids=grids, vision=vision)
    positions = model.position_ids(ids, mask, per_sequence)
    valid = jnp.zeros((2, capacity), bool).at[:, :14].set(mask.astype(bool))
    hidden, cache = text.extend(embeds, positions, valid, text.init_cache(2, capacity), 0,
                                residuals)
    steps = [text.logits(hidden)]
    next_position = jnp.max(jnp.where(mask.astype(bool)[None], positions, -1), axis=(0, 2)) + 1
    for step in range(follow.shape[1]):
      slot = 14 + step
      valid = valid.at[:, slot].set(True)
      position = jnp.broadcast_to((next_position + step)[None, :, None], (3, 2, 1))
      hidden, cache = text.extend(text.embed_tokens(follow[:, step:step + 1]), position, valid,
                                  cache, slot)
      steps.append(text.logits(hidden))
    full = jnp.concatenate([ids, follow], axis=1)
    full_mask = jnp.concatenate([mask, jnp.ones_like(follow)], axis=1)
    full_embeds, full_residuals = model.decoder_inputs(full, grids=grids, vision=vision)
    full_positions = model.position_ids(full, full_mask, per_sequence)
    expected = text.logits(text.hidden_states(full_embeds, full_positions, full_mask,
                                              full_residuals))
    return jnp.concatenate(steps, axis=1), expected, full_mask, residuals

  got, expected, full_mask, residuals = run(ours)
  assert residuals.shape == (2, 2, 14, 64)
  is_image = np.asarray(ids == IMAGE)
  assert not np.asarray(residuals)[:, ~is_image].any()  # zero off the images
  assert (np.abs(np.asarray(residuals)[:, is_image]).max(-1) > 1e-3).all()
  real = np.asarray(full_mask, bool)
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(expected)[real], atol=1e-5)


def test_preprocessing_matches_the_transformers_processor(ours):
  import PIL.Image
  from jaxspatial.models.qwen3_vl.preprocess import preprocess_image, smart_resize
  # The released preprocessor_config.json's settings (the PIL backend: no torchvision here).
  processor = transformers.Qwen2VLImageProcessorPil(
      patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
      image_std=[0.5] * 3, size={"shortest_edge": 65536, "longest_edge": 16777216})
  rng = np.random.default_rng(9)
  # At the smart-resized size (how rendered views are made): equal to float rounding.
  images = rng.integers(0, 256, (2, 2, 256, 320, 3), dtype=np.uint8)  # B = 2, K = 2 views
  expected = processor(images=[PIL.Image.fromarray(im) for im in images.reshape(4, 256, 320, 3)],
                       return_tensors="np")
  pixels, grids, sequence_grids = ours.vision_inputs(jnp.asarray(images))
  assert grids == tuple(map(tuple, expected["image_grid_thw"])) == ((1, 16, 20),) * 4
  assert sequence_grids.shape == (2, 2, 3) and ours.image_grid((256, 320)) == (1, 16, 20)
  assert ours.image_tokens((256, 320)) == 80
  np.testing.assert_allclose(np.asarray(pixels), expected["pixel_values"], atol=1e-5)
  # A smooth image that needs a resize (300 x 400 -> 288 x 384): close, not equal (PIL
  # resizes uint8 on the host).
  yy, xx = np.mgrid[0:300, 0:400]
  smooth = np.stack([128 + 100 * np.sin(xx / 23.0), 128 + 100 * np.cos(yy / 17.0),
                     128 + 60 * np.sin((xx + yy) / 31.0)], -1).astype(np.uint8)
  expected = processor(images=[PIL.Image.fromarray(smooth)], return_tensors="np")
  pixels, grid = preprocess_image(jnp.asarray(smooth))
  assert grid == tuple(expected["image_grid_thw"][0]) == (1, 18, 24)
  difference = np.abs(np.asarray(pixels) - expected["pixel_values"]) * 0.5 * 255  # uint8 levels
  # measured: median 0.23, max 1.04 levels
  assert np.median(difference) < 0.5 and difference.max() < 2.0, (np.median(difference),
                                                                   difference.max())
  assert smart_resize(100, 100) == (256, 256)  # the 65536-pixel floor


def test_export_reloads_in_transformers_and_here(checkpoint, ours, tmp_path):
  from safetensors import safe_open
  from jaxspatial.models.qwen3_vl.export import save_pretrained, state_dict
  reference, folder = checkpoint
  with safe_open(str(folder / "model.safetensors"), "np") as reader:
    assert set(state_dict(ours)) == set(reader.keys())  # transformers 5.x's layout
  save_pretrained(ours, tmp_path / "export")
  loaded = transformers.Qwen3VLForConditionalGeneration.from_pretrained(
      tmp_path / "export").eval()
  for name, tensor in reference.state_dict().items():
    assert torch.equal(tensor, loaded.state_dict()[name]), name
  pixels = _pixels([(1, 4, 6)], 10)
  a = _reference_logits(reference, [ONE], [[1] * len(ONE)], pixels, [(1, 4, 6)])
  b = _reference_logits(loaded, [ONE], [[1] * len(ONE)], pixels, [(1, 4, 6)])
  np.testing.assert_array_equal(a, b)
  again = Qwen3VL.from_pretrained(tmp_path / "export")
  jax.tree.map(np.testing.assert_array_equal, nnx.state(ours, nnx.Param),
               nnx.state(again, nnx.Param))
  assert json.loads((tmp_path / "export" / "config.json").read_text()) == ours.config.raw
  # The 4.x-style names (model.layers.*, visual.*) load the same.
  from jaxspatial.models.hf import canonical_key, write_folder
  write_folder(tmp_path / "old", ours.config.raw,
               {canonical_key(k): v for k, v in state_dict(ours).items()})
  with safe_open(str(tmp_path / "old" / "model.safetensors"), "np") as reader:
    assert "visual.pos_embed.weight" in reader.keys()
  old = Qwen3VL.from_pretrained(tmp_path / "old")
  jax.tree.map(np.testing.assert_array_equal, nnx.state(ours, nnx.Param),
               nnx.state(old, nnx.Param))
  # Built here (no raw config): config.json is `to_hf()`, which transformers reads and which
  # round-trips.
  from jaxspatial.models.hf import config_dict
  config = Qwen3VLConfig.tiny(320)
  fresh = nnx.eval_shape(lambda: Qwen3VL(config, rngs=nnx.Rngs(0)))
  written = config_dict(fresh)
  assert written == config.to_hf()
  # config.json round-trips everything but the pixel bounds, which are the image
  # processor's (preprocessor_config.json; see the test below).
  reread = Qwen3VLConfig.from_hf(written)
  assert dataclasses.replace(reread, vision=dataclasses.replace(
      reread.vision, min_pixels=config.vision.min_pixels)) == config
  hf = transformers.Qwen3VLConfig.from_dict(written)
  assert hf.image_token_id == 314 and hf.tie_word_embeddings
  assert hf.vision_config.deepstack_visual_indexes == [0, 1]


def test_pixel_bounds_come_from_the_processor_config(tmp_path):
  """smart resize bounds are the image processor's: save_processor writes the model's, the
  folder's preprocessor_config.json gives them back, and transformers' processor, reading
  the same file, makes the same grid as ours."""
  from jaxspatial.models.qwen2_5_vl.tokenizer import save_processor
  from jaxspatial.rollout import tiny
  tok = tiny.tokenizer()
  model = tiny.model(tok, "qwen3_vl")
  export(model, tmp_path)
  save_processor(tmp_path, tok, model)
  loaded = Qwen3VL.from_pretrained(tmp_path)
  assert (loaded.config.vision.min_pixels, loaded.config.vision.max_pixels) == (64 * 64,
                                                                                4096 * 4096)
  processor = transformers.AutoImageProcessor.from_pretrained(tmp_path)
  image = np.random.default_rng(0).integers(0, 256, (72, 96, 3), np.uint8)
  grid = processor(images=[image], return_tensors="np")["image_grid_thw"][0]
  assert tuple(int(g) for g in grid) == loaded.image_grid((72, 96)) == (1, 4, 6)
  # A processor config whose bounds cross is refused, naming the file and field.
  (tmp_path / "preprocessor_config.json").write_text(
      '{"size": {"shortest_edge": 9000, "longest_edge": 4000}}')
  with pytest.raises(ModelFolderError, match=r"preprocessor_config.json: size: expected "
                     r"shortest_edge \(min pixels\) <= longest_edge"):
    Qwen3VL.from_pretrained(tmp_path)


def test_config_refusals_name_the_field(checkpoint, tmp_path):
  base = json.loads((checkpoint[1] / "config.json").read_text())
  config = Qwen3VLConfig.from_hf(base)
  assert config.vision.deepstack_visual_indexes == (1, 2) and config.text.head_dim == 16
  assert not config.text.tie_word_embeddings

  def refused(edit, match):
    changed = copy.deepcopy(base)
    edit(changed)
    with pytest.raises(ModelFolderError, match=match):
      Qwen3VLConfig.from_hf(changed)

  refused(lambda c: c["vision_config"].update(deepstack_visual_indexes=[1, 4]),
          r"vision_config\.deepstack_visual_indexes: expected .*\[0, 3\].*got \[1, 4\]")
  refused(lambda c: c["vision_config"].update(deepstack_visual_indexes=[2, 2]),
          r"deepstack_visual_indexes: expected a list of distinct")
  refused(lambda c: c["text_config"]["rope_parameters"].update(rope_type="yarn", factor=4.0),
          r"text_config\.rope_parameters\.rope_type: expected 'default' or 'mrope'.*'yarn'")
  refused(lambda c: c["vision_config"].update(hidden_act="gelu"),
          r"vision_config\.hidden_act: expected 'gelu_pytorch_tanh'.*got 'gelu'")
  refused(lambda c: c["text_config"].update(hidden_act="gelu"), r"text_config\.hidden_act")
  refused(lambda c: c.update(image_token_id=256), r"image_token_id: expected an integer in "
                                                  r"\[0, 255\], got 256")
  refused(lambda c: c["text_config"].update(rms_norm_eps=-1e-6), r"text_config\.rms_norm_eps")
  refused(lambda c: c["text_config"].update(head_dim=32), r"mrope_section: expected sections "
                                                          r"summing to head_dim / 2 = 16")
  refused(lambda c: c["text_config"]["rope_parameters"].update(mrope_interleaved=False),
          r"mrope_interleaved: expected true")
  refused(lambda c: c["text_config"].update(use_sliding_window=True, sliding_window=64),
          r"text_config\.use_sliding_window")
  refused(lambda c: c["vision_config"].update(out_hidden_size=32),
          r"vision_config\.out_hidden_size: expected the text hidden_size 64")
  # A config that ties the head against a checkpoint that has one: refused before loading.
  shutil.copy(checkpoint[1] / "model.safetensors", tmp_path / "model.safetensors")
  (tmp_path / "config.json").write_text(json.dumps({**base, "tie_word_embeddings": True}))
  with pytest.raises(ModelFolderError, match=r"unexpected checkpoint key 'lm_head.weight' "
                                            r"\(the config ties"):
    Qwen3VL.from_pretrained(tmp_path)


def test_tiny_config_size():
  model = nnx.eval_shape(lambda: Qwen3VL(Qwen3VLConfig.tiny(), rngs=nnx.Rngs(0)))
  count = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
  assert 100_000 < count < 1_000_000, count
  from jaxspatial.models.policy import policy_class
  assert Qwen3VL.family == "qwen3_vl" and policy_class("qwen3_vl") is Qwen3VL
  assert Qwen3VL.config_class is Qwen3VLConfig
