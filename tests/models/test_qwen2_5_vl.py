"""The Qwen2.5-VL text decoder against transformers' PyTorch model on a tiny random model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspatial.models.qwen2_5_vl import (ModelFolderError, Qwen25VLConfig, TextModel,
                                          load_text_weights, text_position_ids)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def tiny_hf_config(tie=False):
  return transformers.Qwen2_5_VLConfig(
      text_config=dict(vocab_size=256, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=512, rms_norm_eps=1e-6,
                       rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
                       tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2),
      vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                         out_hidden_size=64, patch_size=14, spatial_merge_size=2,
                         temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1]),
      image_token_id=250, video_token_id=251, vision_start_token_id=252,
      vision_end_token_id=253, tie_word_embeddings=tie)


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def checkpoint(request, tmp_path_factory):
  torch.manual_seed(0)
  model = transformers.Qwen2_5_VLForConditionalGeneration(tiny_hf_config(request.param)).eval()
  folder = tmp_path_factory.mktemp("qwen")
  model.save_pretrained(folder)
  return model, folder


def test_text_logits_match_transformers(checkpoint):
  reference, folder = checkpoint
  config = Qwen25VLConfig.from_hf(folder)
  ours = TextModel(config.text, rngs=nnx.Rngs(0))
  skipped = load_text_weights(ours, folder)
  assert skipped and all(k.startswith(("model.visual.", "visual.")) for k in skipped)
  rng = np.random.default_rng(0)
  ids = rng.integers(3, 240, (3, 10))
  mask = np.ones((3, 10), np.int64)
  mask[1, :4] = 0  # left padding
  mask[2, 7:] = 0  # right padding
  with torch.no_grad():
    expected = reference(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                         mm_token_type_ids=torch.zeros_like(torch.from_numpy(ids))).logits
  logits = ours(jnp.asarray(ids), text_position_ids(jnp.asarray(mask)), jnp.asarray(mask))
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(logits)[real], expected.numpy()[real], atol=1e-4,
                             rtol=1e-4)


def test_loading_errors(checkpoint, tmp_path):
  _, folder = checkpoint
  config = Qwen25VLConfig.from_hf(folder)
  wrong = TextModel(config.text.__class__(**{**config.text.__dict__, "intermediate_size": 96}),
                    rngs=nnx.Rngs(0))
  with pytest.raises(ModelFolderError, match=r"layers.0.mlp.\w+_proj.weight has shape "
                                            r"\((128, 64|64, 128)\), expected \((96, 64|64, 96)\)"):
    load_text_weights(wrong, folder)
  with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
    load_text_weights(wrong, tmp_path)
  with pytest.raises(FileNotFoundError, match="Qwen2.5-VL config not found"):
    Qwen25VLConfig.from_hf(tmp_path)


def test_rope_index_matches_transformers_get_rope_index():
  import jax
  from jaxspatial.models.rope import rope_index
  model = transformers.Qwen2_5_VLForConditionalGeneration(tiny_hf_config()).eval()
  image = 250
  # Two sequences: text, image (grid 1x4x6 -> 6 tokens), text, image (1x8x4 -> 8 tokens),
  # text; the second left-padded with one image (1x6x6 -> 9 tokens).
  first = [5, 252] + [image] * 6 + [253, 7, 8, 252] + [image] * 8 + [253, 9]
  second = [0] * 5 + [11, 252] + [image] * 9 + [253, 12, 13, 14, 15, 16]
  ids = torch.tensor([first, second])
  mask = torch.tensor([[1] * len(first), [0] * 5 + [1] * (len(second) - 5)])
  grids = torch.tensor([[1, 4, 6], [1, 8, 4], [1, 6, 6]])
  types = (ids == image).int()
  expected, _ = model.model.get_rope_index(ids, types, image_grid_thw=grids, attention_mask=mask)
  per_sequence = jnp.asarray([[[1, 4, 6], [1, 8, 4]], [[1, 6, 6], [1, 6, 6]]])
  ours = jax.vmap(lambda i, m, g: rope_index(i, m, g, image))(
      jnp.asarray(ids.numpy()), jnp.asarray(mask.numpy()), per_sequence)
  ours = jnp.moveaxis(ours, 0, 1)  # [3, B, L]
  real = mask.numpy().astype(bool)
  np.testing.assert_array_equal(np.asarray(ours)[:, real], expected.numpy()[:, real])


def test_vision_encoder_matches_transformers(checkpoint):
  from jaxspatial.models.qwen2_5_vl import VisionModel, load_vision_weights
  reference, folder = checkpoint
  config = Qwen25VLConfig.from_hf(folder)
  ours = VisionModel(config.vision, rngs=nnx.Rngs(0))
  load_vision_weights(ours, folder)
  # Two images of different sizes; the second spans several 4x4-unit windows.
  grids = ((1, 4, 6), (1, 12, 10))
  count = sum(t * h * w for t, h, w in grids)
  pixels = np.random.default_rng(0).normal(size=(count, config.vision.patch_dim))
  with torch.no_grad():
    expected = reference.model.visual(torch.from_numpy(pixels).float(),
                                      grid_thw=torch.tensor(grids)).pooler_output.numpy()
  got = ours(jnp.asarray(pixels, jnp.float32), grids)
  assert got.shape == expected.shape == (count // 4, 64)
  np.testing.assert_allclose(np.asarray(got), expected, atol=1e-4, rtol=1e-4)


def test_full_model_logits_with_images_match_transformers(checkpoint):
  from jaxspatial.models.qwen2_5_vl import Qwen25VL
  reference, folder = checkpoint
  ours = Qwen25VL.from_pretrained(folder)
  image = 250
  rng = np.random.default_rng(1)

  def run(sequences, masks, grids, sequence_grids):
    ids = torch.tensor(sequences)
    mask = torch.tensor(masks)
    count = sum(t * h * w for t, h, w in grids)
    pixels = rng.normal(size=(count, 1176)).astype(np.float32)
    with torch.no_grad():
      expected = reference(input_ids=ids, attention_mask=mask,
                           pixel_values=torch.from_numpy(pixels),
                           image_grid_thw=torch.tensor(grids),
                           mm_token_type_ids=(ids == image).int()).logits.numpy()
    got = ours(jnp.asarray(ids.numpy()), jnp.asarray(mask.numpy()), jnp.asarray(pixels),
               tuple(grids), jnp.asarray(sequence_grids))
    real = mask.numpy().astype(bool)
    np.testing.assert_allclose(np.asarray(got)[real], expected[real], atol=1e-4, rtol=1e-4)

  one = [5, 252] + [image] * 6 + [253, 7, 8, 9]
  run([one], [[1] * len(one)], [(1, 4, 6)], [[(1, 4, 6)]])
  two = [5, 252] + [image] * 6 + [253, 7, 252] + [image] * 30 + [253, 9]
  run([two], [[1] * len(two)], [(1, 4, 6), (1, 12, 10)], [[(1, 4, 6), (1, 12, 10)]])
  padded = [0, 0, 11, 252] + [image] * 6 + [253, 12, 13, 14]  # left padding
  run([one + [0, 0], padded], [[1] * len(one) + [0, 0], [0] * 2 + [1] * 12],
      [(1, 4, 6), (1, 4, 6)], [[(1, 4, 6)], [(1, 4, 6)]])


def test_preprocessing_matches_the_transformers_processor():
  import PIL.Image
  from jaxspatial.models.qwen2_5_vl.preprocess import preprocess_image, smart_resize
  processor = transformers.Qwen2VLImageProcessorPil()
  rng = np.random.default_rng(2)
  # At the smart-resized size (how rendered views are made): equal to float rounding.
  image = rng.integers(0, 256, (56, 84, 3), dtype=np.uint8)
  expected = processor(images=[PIL.Image.fromarray(image)], return_tensors="np")
  pixels, grid = preprocess_image(jnp.asarray(image))
  assert grid == tuple(expected["image_grid_thw"][0]) == (1, 4, 6)
  np.testing.assert_allclose(np.asarray(pixels), expected["pixel_values"], atol=1e-5)
  # A smooth image that needs a resize: close, not equal (PIL resizes uint8 on the host).
  yy, xx = np.mgrid[0:75, 0:100]
  smooth = np.stack([128 + 100 * np.sin(xx / 9.0), 128 + 100 * np.cos(yy / 7.0),
                     (xx + yy) % 256], -1).astype(np.uint8)
  expected = processor(images=[PIL.Image.fromarray(smooth)], return_tensors="np")
  pixels, grid = preprocess_image(jnp.asarray(smooth))
  assert grid == tuple(expected["image_grid_thw"][0])
  difference = np.abs(np.asarray(pixels) - expected["pixel_values"]) * 0.27 * 255  # uint8 levels
  assert np.median(difference) < 0.5 and difference.max() < 1.5  # measured 0.24 and 0.94
  assert smart_resize(480, 640) == (476, 644)  # 391 merged tokens: 3DThinker's 17 x 23
  with pytest.raises(ValueError, match="aspect ratio must be under 200"):
    smart_resize(10, 3000)


def test_export_reloads_identically_and_transformers_reads_it(checkpoint, tmp_path):
  import jax
  from jaxspatial.models.qwen2_5_vl import Qwen25VL
  from jaxspatial.models.qwen2_5_vl.export import save_pretrained
  reference, folder = checkpoint
  ours = Qwen25VL.from_pretrained(folder)
  save_pretrained(ours, tmp_path / "export")
  again = Qwen25VL.from_pretrained(tmp_path / "export")
  jax.tree.map(np.testing.assert_array_equal, nnx.state(ours, nnx.Param),
               nnx.state(again, nnx.Param))
  loaded = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
      tmp_path / "export").eval()
  ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
  with torch.no_grad():
    a = reference(input_ids=ids, mm_token_type_ids=torch.zeros_like(ids)).logits
    b = loaded(input_ids=ids, mm_token_type_ids=torch.zeros_like(ids)).logits
  np.testing.assert_array_equal(a.numpy(), b.numpy())
  for name, tensor in reference.state_dict().items():
    assert torch.equal(tensor, loaded.state_dict()[name]), name


def test_greedy_generation_matches_transformers_generate(checkpoint):
  import jax
  from jaxspatial.models.qwen2_5_vl import Qwen25VL
  from jaxspatial.models.sampler import SamplingConfig, generate
  reference, folder = checkpoint
  ours = Qwen25VL.from_pretrained(folder)
  config = SamplingConfig(max_new_tokens=32, stop_tokens=(2,), pad_token=0)
  run = nnx.jit(lambda m, i, a, k: generate(m, i, a, k, config))

  def check(prompts, masks):
    ids, mask = torch.tensor(prompts), torch.tensor(masks)
    with torch.no_grad():
      expected = reference.generate(input_ids=ids, attention_mask=mask, max_new_tokens=32,
                                    do_sample=False, eos_token_id=2, pad_token_id=0,
                                    mm_token_type_ids=torch.zeros_like(ids))
    expected = expected[:, ids.shape[1]:].numpy()
    out = run(ours, jnp.asarray(ids.numpy()), jnp.asarray(mask.numpy()), jax.random.key(0))
    width = expected.shape[1]  # transformers stops once every sequence has stopped
    np.testing.assert_array_equal(np.asarray(out.tokens)[:, :width], expected)
    assert (np.asarray(out.tokens)[:, width:] == 0).all()

  rng = np.random.default_rng(3)
  prompts = rng.integers(3, 240, (3, 7)).tolist()
  check(prompts, [[1] * 7] * 3)
  padded = [[0, 0] + prompts[0][:5], prompts[1]]
  check(padded, [[0, 0, 1, 1, 1, 1, 1], [1] * 7])


def test_sampling_logprobs_match_a_full_forward_and_filters():
  import jax
  from jaxspatial.models.qwen2_5_vl import Qwen25VL, text_position_ids
  from jaxspatial.models.sampler import SamplingConfig, filter_logits, generate
  config = Qwen25VLConfig.from_hf(tiny_hf_config().to_dict())
  model = Qwen25VL(config, rngs=nnx.Rngs(0))
  prompt = jnp.asarray(np.random.default_rng(4).integers(3, 240, (2, 5)))
  mask = jnp.ones((2, 5), jnp.int32)
  sampling = SamplingConfig(max_new_tokens=12, temperature=1.0, top_k=50)
  out = nnx.jit(lambda m, k: generate(m, prompt, mask, k, sampling))(model, jax.random.key(7))
  again = nnx.jit(lambda m, k: generate(m, prompt, mask, k, sampling))(model, jax.random.key(7))
  np.testing.assert_array_equal(out.tokens, again.tokens)  # same seed, same samples
  # The cached decode gives the log-probabilities a full forward over the text gives.
  full = jnp.concatenate([prompt, out.tokens], axis=1)
  all_mask = jnp.ones_like(full)
  logits = model.language_model(full, text_position_ids(all_mask), all_mask)
  filtered = filter_logits(logits[:, 4:-1].reshape(-1, logits.shape[-1]), 50, 1.0)
  logp = jax.nn.log_softmax(filtered, -1).reshape(2, 12, -1)
  expected = jnp.take_along_axis(logp, out.tokens[..., None], -1)[..., 0]
  np.testing.assert_allclose(out.logprobs, expected, atol=1e-4)
  # Filters: top-k keeps k tokens, top-p the smallest set reaching p.
  logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
  assert np.isfinite(np.asarray(filter_logits(logits, 2, 1.0))).sum() == 2
  assert np.isfinite(np.asarray(filter_logits(logits, 0, 0.7))).sum() == 2
  assert np.isfinite(np.asarray(filter_logits(logits, 0, 0.81))).sum() == 3


def test_append_an_observation_segment_equals_a_full_forward(checkpoint):
  from jaxspatial.models.qwen2_5_vl import Qwen25VL
  from jaxspatial.models.sampler import append, prefill
  _, folder = checkpoint
  model = Qwen25VL.from_pretrained(folder)
  image = 250
  prompt = jnp.asarray([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
  prompt_mask = jnp.asarray([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
  segment = jnp.asarray([[20, 252] + [image] * 6 + [253, 21]] * 2)
  pixels = jnp.asarray(np.random.default_rng(5).normal(size=(48, 1176)), jnp.float32)
  grids = ((1, 4, 6), (1, 4, 6))
  per_sequence = jnp.asarray([[(1, 4, 6)], [(1, 4, 6)]])
  state, _ = prefill(model, prompt, prompt_mask, capacity=32)
  state, logits = append(model, state, segment, jnp.ones_like(segment), pixels, grids,
                         per_sequence)
  full = jnp.concatenate([prompt, segment], axis=1)
  full_mask = jnp.concatenate([prompt_mask, jnp.ones_like(segment)], axis=1)
  expected = model(full, full_mask, pixels, grids, per_sequence)[:, -1]
  np.testing.assert_allclose(np.asarray(logits), np.asarray(expected), atol=1e-4, rtol=1e-4)
  assert int(state.next_slot) == 15


def test_processor_from_the_checkpoint_folder_feeds_the_model(tmp_path):
  import PIL.Image
  from jaxspatial.models.qwen2_5_vl import Qwen25VL
  from jaxspatial.models.qwen2_5_vl.preprocess import preprocess_image
  from jaxspatial.models.qwen2_5_vl.tokenizer import (load_processor, save_processor,
                                                      train_tokenizer)
  corpus = ["what is to the left of the red chair?", "<think>turn left</think>",
            "the blue box is behind the table"] * 20
  tokenizer = train_tokenizer(corpus, vocab_size=400)
  image_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
  config = tiny_hf_config()
  config.image_token_id = image_id
  config.vision_start_token_id = tokenizer.convert_tokens_to_ids("<|vision_start|>")
  config.vision_end_token_id = tokenizer.convert_tokens_to_ids("<|vision_end|>")
  config.text_config.vocab_size = len(tokenizer)
  torch.manual_seed(0)
  transformers.Qwen2_5_VLForConditionalGeneration(config).save_pretrained(tmp_path)
  save_processor(tmp_path, tokenizer)
  processor = load_processor(tmp_path)
  image = np.random.default_rng(6).integers(0, 256, (56, 84, 3), dtype=np.uint8)
  text = "<|vision_start|><|image_pad|><|vision_end|>what is to the left of the red chair?"
  batch = processor(text=[text], images=[PIL.Image.fromarray(image)], return_tensors="np")
  ids = batch["input_ids"]
  assert (ids == image_id).sum() == 6  # 4 x 6 patches merged 2 x 2
  pixels, grid = preprocess_image(jnp.asarray(image))
  np.testing.assert_allclose(np.asarray(pixels), batch["pixel_values"], atol=1e-5)
  model = Qwen25VL.from_pretrained(tmp_path)
  logits = model(jnp.asarray(ids), jnp.asarray(batch["attention_mask"]), pixels, (grid,),
                 jnp.asarray([[grid]]))
  assert logits.shape == ids.shape + (len(tokenizer),) and np.isfinite(np.asarray(logits)).all()
  with pytest.raises(FileNotFoundError, match="no tokenizer in"):
    load_processor(tmp_path / "missing")


def test_tiny_config_size():
  import jax
  from jaxspatial.models.qwen2_5_vl import Qwen25VL
  model = nnx.eval_shape(lambda: Qwen25VL(Qwen25VLConfig.tiny(), rngs=nnx.Rngs(0)))
  count = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
  assert 100_000 < count < 1_000_000, count


@pytest.mark.slow
def test_latent_mode_feeds_hidden_states_back_under_jit():
  import jax
  from jaxspatial.models.qwen2_5_vl import Qwen25VL
  from jaxspatial.models.sampler import DecodeState, SamplingConfig, decode, prefill
  config = Qwen25VLConfig.tiny()
  model = Qwen25VL(config, rngs=nnx.Rngs(0))
  start, pad, end = 500, 501, 502
  prompt = jnp.asarray([[3, 4, 5, start], [7, 8, 9, start]])
  mask = jnp.ones_like(prompt)
  sampling = SamplingConfig(max_new_tokens=16, latent_tokens=(start, pad, end), num_latents=4)
  run = nnx.jit(lambda m, p, a: decode(m, *prefill(m, p, a, 24), jax.random.key(0), sampling))
  out = run(model, prompt, mask)
  np.testing.assert_array_equal(np.asarray(out.tokens)[:, :5], [[pad] * 4 + [end]] * 2)
  # A host-driven reference: feed each final hidden state back by hand.
  state, _ = prefill(model, prompt, mask, 24)
  hidden, latents = state.last_hidden, []
  for _ in range(4):
    latents.append(hidden)
    valid = state.valid.at[:, state.next_slot].set(True)
    position = jnp.broadcast_to(state.next_position[None, :, None], (3, 2, 1))
    out_hidden, cache = model.language_model.extend(hidden[:, None], position, valid,
                                                    state.cache, state.next_slot)
    state = DecodeState(cache=cache, valid=valid, next_slot=state.next_slot + 1,
                        next_position=state.next_position + 1, last_hidden=out_hidden[:, -1],
                        last_token=jnp.full(2, pad))
    hidden = out_hidden[:, -1]
  np.testing.assert_allclose(np.asarray(out.latents), np.stack(latents, 1), atol=1e-5)


def test_config_built_here_round_trips_through_config_json(tmp_path):
  from jaxspatial.models.qwen2_5_vl import Qwen25VL
  from jaxspatial.models.qwen2_5_vl.export import save_pretrained
  config = Qwen25VLConfig.tiny(320)
  assert Qwen25VLConfig.from_hf(config.to_hf()) == config
  model = Qwen25VL(config, rngs=nnx.Rngs(0))
  save_pretrained(model, tmp_path)
  again = Qwen25VL.from_pretrained(tmp_path)
  assert again.config == config
  jax.tree.map(np.testing.assert_array_equal, nnx.state(model, nnx.Param),
               nnx.state(again, nnx.Param))
  loaded = transformers.AutoConfig.from_pretrained(tmp_path)
  assert loaded.text_config.num_hidden_layers == 2 and loaded.image_token_id == 314
