"""The dtype policy, fused attention and remat against transformers and float32 references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspatial.models.attention import attention, einsum_attention, resolve
from jaxspatial.models.precision import Precision
from jaxspatial.models.qwen2_5_vl import Qwen25VL
from jaxspatial.models.sampler import SamplingConfig, generate
from jaxspatial.train import TrainBatch, token_logprobs

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tests.models.test_qwen2_5_vl import tiny_hf_config  # pylint: disable=wrong-import-position

IMAGE = 250
BF16_LOGIT_ATOL = 0.02  # measured 5e-3 on logits of size ~1 (bf16: 8 bits of mantissa)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  torch.manual_seed(0)
  model = transformers.Qwen2_5_VLForConditionalGeneration(tiny_hf_config(True)).eval()
  folder = tmp_path_factory.mktemp("qwen_bf16")
  model.save_pretrained(folder)
  return model, folder


def _image_batch(rng):
  one = [5, 252] + [IMAGE] * 6 + [253, 7, 8, 9]
  padded = [0, 0, 11, 252] + [IMAGE] * 6 + [253, 12, 13, 14]
  ids = np.asarray([one + [0, 0], padded])
  mask = np.asarray([[1] * len(one) + [0, 0], [0] * 2 + [1] * 12])
  grids = ((1, 4, 6), (1, 4, 6))
  pixels = rng.normal(size=(48, 1176)).astype(np.float32)
  return ids, mask, pixels, grids, np.asarray([[(1, 4, 6)], [(1, 4, 6)]])


def _logits(model, ids, mask, pixels, grids, sequence_grids):
  forward = nnx.jit(lambda m, i, a, p, s: m(i, a, p, grids, s))  # one program, not op by op
  return np.asarray(forward(model, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(pixels),
                            jnp.asarray(sequence_grids)))


def test_fused_attention_equals_the_einsum_path_and_transformers(checkpoint):
  reference, folder = checkpoint
  batch = _image_batch(np.random.default_rng(1))
  ids, mask, pixels, grids, _ = batch
  with torch.no_grad():
    expected = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                         pixel_values=torch.from_numpy(pixels), image_grid_thw=torch.tensor(grids),
                         mm_token_type_ids=torch.tensor(ids == IMAGE).int()).logits.numpy()
  real = mask.astype(bool)
  for implementation in ("einsum", "xla"):
    model = Qwen25VL.from_pretrained(folder, attention=implementation)
    got = _logits(model, *batch)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got[real], expected[real], atol=1e-4, rtol=1e-4,
                               err_msg=implementation)


@pytest.mark.slow
def test_fused_attention_kernel_matches_einsum_with_grouped_heads_and_masks():
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.normal(size=(2, 5, 4, 8)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(2, 7, 2, 8)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(2, 7, 2, 8)), jnp.float32)
  mask = jnp.asarray(rng.random((2, 5, 7)) < 0.6).at[:, :, 0].set(True)
  # a numpy reference of softmax(q k^T / sqrt(d)) v, each query head on its KV head
  qn, kn, vn, mn = (np.asarray(a, np.float64) for a in (q, k, v, mask))
  heads = np.repeat(np.arange(2), 2)
  scores = np.einsum("btnd,bsnd->bnts", qn, kn[:, :, heads]) / np.sqrt(8)
  scores = np.where(mn[:, None].astype(bool), scores, -np.inf)
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  expected = np.einsum("bnts,bsnd->btnd", probs, vn[:, :, heads])
  for name in ("einsum", "xla"):
    np.testing.assert_allclose(np.asarray(attention(q, k, v, mask, name)), expected, atol=1e-5)
  lengths = jnp.asarray([7, 3], jnp.int32)
  by_length = attention(q, k, v, implementation="xla", lengths_B=lengths)
  packed = jnp.arange(7)[None, None] < lengths[:, None, None]
  np.testing.assert_allclose(np.asarray(by_length[1, :3]),
                             np.asarray(einsum_attention(q, k, v, packed))[1, :3], atol=1e-5)
  grad = lambda name: jax.grad(lambda q: jnp.sum(attention(q, k, v, mask, name) ** 2))(q)
  np.testing.assert_allclose(np.asarray(grad("xla")), np.asarray(grad("einsum")), atol=1e-5)


def test_auto_attention_picks_cudnn_only_for_half_precision_on_gpu():
  assert resolve("auto", jnp.bfloat16) == ("cudnn" if jax.default_backend() == "gpu"
                                           else "einsum")
  assert resolve("auto", jnp.float32) == "einsum"
  with pytest.raises(ValueError, match="cudnn.*bfloat16"):
    resolve("cudnn", jnp.float32)
  with pytest.raises(ValueError, match="flash"):
    resolve("flash", jnp.float32)


@pytest.mark.slow
def test_bf16_logits_follow_float32_and_greedy_tokens_match_transformers(checkpoint):
  reference, folder = checkpoint
  batch = _image_batch(np.random.default_rng(2))
  full = _logits(Qwen25VL.from_pretrained(folder), *batch)
  real = batch[1].astype(bool)
  config = SamplingConfig(max_new_tokens=16, stop_tokens=(2,), pad_token=0,
                          cache_dtype="bfloat16")
  prompts = np.random.default_rng(3).integers(3, 240, (3, 7))
  with torch.no_grad():
    expected = reference.generate(
        input_ids=torch.tensor(prompts), attention_mask=torch.ones(3, 7, dtype=torch.long),
        max_new_tokens=16, do_sample=False, eos_token_id=2, pad_token_id=0,
        mm_token_type_ids=torch.zeros(3, 7, dtype=torch.long))[:, 7:].numpy()
  for param_dtype in (jnp.float32, jnp.bfloat16):  # master weights; rollout-only weights
    model = Qwen25VL.from_pretrained(folder, dtype=jnp.bfloat16, param_dtype=param_dtype)
    half = _logits(model, *batch)
    assert half.dtype == np.float32  # logits are float32 whatever the computation dtype
    np.testing.assert_allclose(half[real], full[real], atol=BF16_LOGIT_ATOL)
    out = nnx.jit(lambda m, p, k: generate(m, p, jnp.ones_like(p), k, config))(
        model, jnp.asarray(prompts), jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(out.tokens)[:, :expected.shape[1]], expected)


@pytest.mark.parametrize("dtype,tolerance", [("float32", 1e-5), ("bfloat16", 1e-2)])
def test_sampled_logprobs_equal_the_recomputed_old_logprobs(checkpoint, dtype, tolerance):
  """The sampler's log-probabilities (decoded through the cache) against the training
  pass's (one forward over the whole sequence), within the tolerance precision.py states."""
  _, folder = checkpoint
  policy = Precision(dtype=dtype, cache_dtype=dtype)
  model = Qwen25VL.from_pretrained(folder, **policy.model_kwargs())
  prompts = jnp.asarray(np.random.default_rng(4).integers(3, 240, (4, 9)))
  config = SamplingConfig(max_new_tokens=12, temperature=1.0, pad_token=0,
                          cache_dtype=policy.cache_dtype)
  out = nnx.jit(lambda m, p, k: generate(m, p, jnp.ones_like(p), k, config))(
      model, prompts, jax.random.key(5))
  tokens = jnp.concatenate([prompts, out.tokens], 1)
  recomputed = nnx.jit(lambda m, t: token_logprobs(m, t, jnp.ones_like(t), temperature=1.0))(
      model, tokens)[:, 9:]
  gap = np.abs(np.asarray(recomputed) - np.asarray(out.logprobs))
  assert gap.max() < tolerance, gap.max()


@pytest.mark.slow
def test_remat_gives_the_same_loss_and_gradients(checkpoint):
  _, folder = checkpoint
  ids, mask, pixels, grids, sequence_grids = _image_batch(np.random.default_rng(6))

  def loss_and_grads(remat):
    model = Qwen25VL.from_pretrained(folder, remat=remat)

    def loss(model):
      logits = model(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(pixels), grids,
                     jnp.asarray(sequence_grids))
      return jnp.mean(jax.nn.logsumexp(logits, -1) * mask)

    value, grads = nnx.jit(nnx.value_and_grad(loss))(model)
    return value, jax.tree.leaves(nnx.to_pure_dict(grads))

  plain, remat = loss_and_grads(False), loss_and_grads(True)
  np.testing.assert_allclose(remat[0], plain[0], rtol=1e-6)
  for a, b in zip(remat[1], plain[1]):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)

  # one model serves rollouts and updates: a remat model runs inside a loop (nnx.remat,
  # which writes the module back, raised TraceContextError there)
  def in_loop(remat):
    model = Qwen25VL.from_pretrained(folder, remat=remat)
    run = nnx.jit(lambda m: jax.lax.fori_loop(0, 2, lambda i, acc: acc + m(
        jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(pixels), grids,
        jnp.asarray(sequence_grids))[:, -1], jnp.zeros((2, 256))))
    return np.asarray(run(model))

  np.testing.assert_allclose(in_loop(True), in_loop(False), atol=1e-5)


def test_remat_keeps_dropout_random_across_calls(checkpoint):
  from jaxspatial.models import apply_lora  # pylint: disable=import-outside-toplevel
  _, folder = checkpoint
  model = Qwen25VL.from_pretrained(folder, remat=True)
  apply_lora(model.language_model, ("q_proj",), 4, 8.0, 0.5, rngs=nnx.Rngs(1))
  for layer in model.language_model.layers:  # non-zero adapters, so dropout shows
    layer.self_attn.q_proj.lora_b[...] = jnp.ones_like(layer.self_attn.q_proj.lora_b[...])
  ids = jnp.asarray(np.random.default_rng(8).integers(3, 240, (2, 6)))
  grad = nnx.jit(lambda m: nnx.value_and_grad(
      lambda m: jnp.sum(m(ids, jnp.ones_like(ids)) ** 2),
      argnums=nnx.DiffState(0, nnx.LoRAParam))(m)[0])
  assert float(grad(model)) != float(grad(model))  # the dropout counter moved on


@pytest.mark.slow
def test_bf16_grpo_step_runs_and_keeps_float32_master_weights(checkpoint):
  from jaxspatial.rl.objectives import PolicyLossConfig  # pylint: disable=import-outside-toplevel
  from jaxspatial.train import OptimizerConfig, StepConfig, make_optimizer, train_step  # pylint: disable=import-outside-toplevel
  _, folder = checkpoint
  model = Qwen25VL.from_pretrained(folder, dtype=jnp.bfloat16, param_dtype=jnp.float32,
                                   remat=True)
  rng = np.random.default_rng(7)
  tokens = jnp.asarray(rng.integers(3, 240, (4, 16)), jnp.int32)
  loss_mask = jnp.zeros((4, 16), bool).at[:, 8:].set(True)
  batch = TrainBatch(tokens=tokens, attention_mask=jnp.ones_like(tokens), loss_mask=loss_mask,
                     images=None, advantages=jnp.asarray([1.0, -1.0, 0.5, -0.5]),
                     old_logprobs=token_logprobs(model, tokens, jnp.ones_like(tokens)),
                     ref_logprobs=jnp.zeros((4, 16)))
  optimizer = make_optimizer(model, OptimizerConfig(learning_rate=1e-3))
  before = np.asarray(model.language_model.layers[0].mlp.up_proj.kernel[...]).copy()
  metrics = train_step(model, optimizer, batch,
                       StepConfig(objective="grpo", micro_batches=2, loss=PolicyLossConfig()))
  assert bool(metrics["finite"]) and np.isfinite(float(metrics["loss"]))
  after = model.language_model.layers[0].mlp.up_proj.kernel[...]
  assert after.dtype == jnp.float32 and not np.allclose(np.asarray(after), before)


def test_precision_policy_names_what_is_wrong():
  with pytest.raises(ValueError, match="model.cache_dtype.*float8"):
    Precision(cache_dtype="float8")
  with pytest.raises(ValueError, match="act3d_grpo: model.param_dtype 'bfloat16'"):
    Precision(dtype="bfloat16", param_dtype="bfloat16").check_trainable("act3d_grpo")
  policy = Precision.from_config({"dtype": "bfloat16"})
  assert policy.compute == jnp.bfloat16 and policy.params == jnp.float32
  assert policy.check_trainable("job") is policy
