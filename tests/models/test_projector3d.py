"""3DThinker's projector: parameter count, parity with a PyTorch module built from the
published description, weight loading, and the stage-1 loss against numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspatial.models import (TINY, Projector3D, Projector3DConfig, alignment_loss,
                               load_torch_state_dict, stage1_loss)

torch = pytest.importorskip("torch")


class TorchProjector(torch.nn.Module):
  """Written from the description in ../shared/reference/thinker3d.md, section 3."""

  def __init__(self, depth, mm_hidden, hidden, latent, fusion_in, fusion_out):
    super().__init__()

    def mlp(widths):
      layers = [torch.nn.Linear(widths[0], widths[1])]
      for a, b in zip(widths[1:-1], widths[2:]):
        layers += [torch.nn.GELU(), torch.nn.Linear(a, b)]
      return torch.nn.Sequential(*layers)

    self.prompte_model = mlp([latent, 64, 64])
    self.fusion_model = mlp([fusion_in + 64] + [fusion_out] * depth)
    self.proj_3d_model = mlp([mm_hidden] + [hidden] * depth)

  def forward(self, latents, images):  # [T, C], [N, P, C]
    tokens = self.prompte_model(latents.T).T  # [64, C]
    outputs = []
    for image in images:
      x = torch.cat([tokens, image], 0)  # [64 + P, C]
      x = self.fusion_model(x.T).T       # [F, C]
      outputs.append(self.proj_3d_model(x))
    return torch.stack(outputs)


def torch_for(config: Projector3DConfig) -> TorchProjector:
  return TorchProjector(config.mlp_depth, config.mm_hidden_size, config.hidden_size,
                        config.latent_size, config.fusion_input, config.fusion_output)


def test_reference_parameter_count():
  config = Projector3DConfig()
  weights = 12 * 64 + 64 * 64 + 455 * 1374 + 5 * 1374 ** 2 + 6 * 2048 ** 2
  biases = 64 + 64 + 6 * 1374 + 6 * 2048
  assert (weights, biases) == (35_235_238, 20_660)
  assert config.parameter_count() == weights + biases == 35_255_898
  abstract = nnx.eval_shape(lambda: Projector3D(config, rngs=nnx.Rngs(0)))
  params = nnx.state(abstract, nnx.Param)
  assert sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params)) == 35_255_898
  assert sum(p.numel() for p in torch_for(config).parameters()) == 35_255_898


def test_loads_torch_weights_and_matches_torch():
  torch.manual_seed(0)
  reference = torch_for(TINY).double()
  state = {f"projector_model.{k}": v for k, v in reference.state_dict().items()}
  state["other_model.weight"] = torch.zeros(3)  # other parts of a checkpoint are ignored
  ours = Projector3D(TINY, rngs=nnx.Rngs(1))
  load_torch_state_dict(ours, state)
  rng = np.random.default_rng(0)
  latents = rng.normal(size=(12, TINY.mm_hidden_size))
  images = rng.normal(size=(3, TINY.fusion_input, TINY.mm_hidden_size))
  expected = reference(torch.from_numpy(latents), torch.from_numpy(images)).detach().numpy()
  got = ours(jnp.asarray(latents, jnp.float32), jnp.asarray(images, jnp.float32))
  assert got.shape == (3, TINY.fusion_output, TINY.hidden_size)
  np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)
  # jit and vmap over samples give the same.
  batched = nnx.jit(nnx.vmap(lambda m, l, i: m(l, i), in_axes=(None, 0, 0)))(
      ours, jnp.stack([latents, latents]).astype(jnp.float32),
      jnp.stack([images, images]).astype(jnp.float32))
  np.testing.assert_allclose(batched[1], got, atol=1e-6)


def test_loading_errors_name_the_key():
  reference = torch_for(TINY)
  state = {f"projector_model.{k}": v for k, v in reference.state_dict().items()}
  ours = Projector3D(TINY, rngs=nnx.Rngs(1))
  missing = dict(state)
  del missing["projector_model.fusion_model.2.bias"]
  with pytest.raises(KeyError, match=r"missing key projector_model.fusion_model.2.bias"):
    load_torch_state_dict(ours, missing)
  wrong = dict(state)
  wrong["projector_model.proj_3d_model.0.weight"] = torch.zeros(5, 5)
  with pytest.raises(ValueError, match=r"proj_3d_model.0.weight has shape \(5, 5\), "
                                       r"expected \(24, 32\)"):
    load_torch_state_dict(ours, wrong)
  extra = dict(state)
  extra["projector_model.fusion_model.99.weight"] = torch.zeros(1)
  with pytest.raises(KeyError, match="unexpected key"):
    load_torch_state_dict(ours, extra)
  with pytest.raises(ValueError, match=r"latents must be \[12, 32\]"):
    ours(jnp.zeros((11, 32)), jnp.zeros((1, 20, 32)))


def test_stage1_loss_against_numpy():
  rng = np.random.default_rng(1)
  predicted, target = rng.normal(size=(2, 7, 5)), rng.normal(size=(2, 7, 5))
  mse = np.mean(np.sum((predicted - target) ** 2, -1))
  assert float(alignment_loss(predicted, target)) == pytest.approx(mse, rel=1e-5)
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  cosine = np.mean(np.sum((unit(predicted) - unit(target)) ** 2, -1))
  assert float(alignment_loss(predicted, target, "cosine")) == pytest.approx(cosine, rel=1e-5)
  assert float(stage1_loss(jnp.asarray(2.0), predicted, target)) == pytest.approx(
      0.1 * 2.0 + 0.0005 * mse, rel=1e-5)
  # The target is detached: only the prediction gets a gradient.
  grads = jax.grad(lambda p, t: alignment_loss(p, t), argnums=(0, 1))(
      jnp.asarray(predicted, jnp.float32), jnp.asarray(target, jnp.float32))
  np.testing.assert_allclose(grads[0], 2 * (predicted - target) / 14, rtol=1e-4)
  assert float(jnp.abs(grads[1]).max()) == 0.0
