"""3DThinker's 3D projector: latent "mental 3D" tokens and image embeddings to VGGT features.

The reference architecture (`projector` in 3DThinker's stage-1 code), per sample:
  1. latent MLP on the token axis: latents [T=12, C] -> transpose -> Linear T->64, GELU,
     Linear 64->64 -> 64 tokens x C
  2. per image: concatenate [64 latent tokens ; P image tokens] -> [64 + P, C]
  3. fusion MLP on the token axis: Linear (64 + P)->F, then (depth - 1) x (GELU, Linear F->F)
  4. channel MLP: Linear C->H, then (depth - 1) x (GELU, Linear H->H)
  -> [N images, F, H]; reference sizes C = H = 2048, T = 12, P = 391, F = 1374, depth 6.
GELU is the exact (erf) form, as torch's nn.GELU.

`load_torch_state_dict` reads the released weights (keys `projector_model.` +
`prompte_model.{0,2}`, `fusion_model.{0,2,..}`, `proj_3d_model.{0,2,..}`, torch Linear
layout [out, in]) into this module.

The stage-1 alignment loss: `0.1 * CE + 0.0005 * mean over tokens of the squared error
summed over channels`, the target detached; `mode="cosine"` L2-normalises both first.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspatial.models.sharding import logical_init

Array = jax.Array
_KERNEL_INIT = nnx.initializers.lecun_normal()


@dataclasses.dataclass(frozen=True)
class Projector3DConfig:
  mlp_depth: int = 6
  mm_hidden_size: int = 2048   # channels of latents and image embeddings
  hidden_size: int = 2048      # channels of the output (VGGT: 2048)
  latent_size: int = 12        # latent tokens
  latent_tokens: int = 64      # the latent MLP's output tokens (fixed in the reference)
  fusion_input: int = 391      # image tokens per image
  fusion_output: int = 1374    # VGGT tokens per image

  def parameter_count(self) -> int:
    """Weights and biases, from the architecture."""
    linear = lambda i, o: i * o + o
    d = self.mlp_depth
    return (linear(self.latent_size, self.latent_tokens)
            + linear(self.latent_tokens, self.latent_tokens)
            + linear(self.fusion_input + self.latent_tokens, self.fusion_output)
            + (d - 1) * linear(self.fusion_output, self.fusion_output)
            + linear(self.mm_hidden_size, self.hidden_size)
            + (d - 1) * linear(self.hidden_size, self.hidden_size))


TINY = Projector3DConfig(mlp_depth=3, mm_hidden_size=32, hidden_size=24, latent_size=12,
                         latent_tokens=64, fusion_input=20, fusion_output=30)


class MLP(nnx.Module):
  """Linear, then (GELU, Linear) for each further width: torch's nn.Sequential layout.
  `logical[k]` names layer k's kernel axes (in, out) for the sharding rules."""

  def __init__(self, widths: list[int], logical: list[tuple[str, str]], *, rngs: nnx.Rngs,
               dtype=jnp.float32, param_dtype=jnp.float32):
    self.layers = nnx.List([
        nnx.Linear(a, b, dtype=dtype, param_dtype=param_dtype, rngs=rngs,
                   kernel_init=logical_init(_KERNEL_INIT, axes),
                   bias_init=logical_init(nnx.initializers.zeros_init(), axes[1:]))
        for a, b, axes in zip(widths[:-1], widths[1:], logical)])

  def __call__(self, x: Array) -> Array:
    for k, layer in enumerate(self.layers):
      if k:
        x = jax.nn.gelu(x, approximate=False)
      x = layer(x)
    return x


class Projector3D(nnx.Module):
  def __init__(self, config: Projector3DConfig = Projector3DConfig(), *, rngs: nnx.Rngs,
               dtype=jnp.float32, param_dtype=jnp.float32):
    self.config = config
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    depth = config.mlp_depth
    # Sharded like the model: the token-axis MLPs over 'tensor' on their outputs, the
    # channel MLP over ('fsdp', 'tensor'), alternating so no layer reshards both axes.
    self.latent_mlp = MLP([config.latent_size, config.latent_tokens, config.latent_tokens],
                          [("latents", "latents")] * 2, **kw)
    self.fusion_mlp = MLP([config.fusion_input + config.latent_tokens]
                          + [config.fusion_output] * depth, [("tokens", "mlp")] * depth, **kw)
    self.channel_mlp = MLP([config.mm_hidden_size] + [config.hidden_size] * depth,
                           [("embed", "mlp") if k % 2 == 0 else ("mlp", "embed")
                            for k in range(depth)], **kw)

  def __call__(self, latents_TxC: Array, images_NxPxC: Array) -> Array:
    """latents [T, C] and one sample's image embeddings [N, P, C] -> [N, F, H]."""
    c = self.config
    if latents_TxC.shape != (c.latent_size, c.mm_hidden_size):
      raise ValueError(f"Projector3D: latents must be [{c.latent_size}, {c.mm_hidden_size}], "
                       f"got {latents_TxC.shape}")
    if images_NxPxC.ndim != 3 or images_NxPxC.shape[1:] != (c.fusion_input, c.mm_hidden_size):
      raise ValueError(f"Projector3D: images must be [N, {c.fusion_input}, "
                       f"{c.mm_hidden_size}], got {images_NxPxC.shape}")
    latent_tokens_CxL = self.latent_mlp(latents_TxC.T)                  # [C, 64]
    num_images = images_NxPxC.shape[0]
    tokens = jnp.concatenate([jnp.broadcast_to(latent_tokens_CxL.T[None],
                                               (num_images,) + latent_tokens_CxL.T.shape),
                              images_NxPxC], axis=1)                    # [N, 64 + P, C]
    fused = self.fusion_mlp(jnp.swapaxes(tokens, 1, 2))                 # [N, C, F]
    return self.channel_mlp(jnp.swapaxes(fused, 1, 2))                  # [N, F, H]


def _torch_names(config: Projector3DConfig) -> dict[str, tuple[str, int]]:
  """torch Sequential prefix -> (our MLP attribute, layer index)."""
  names = {}
  for ours, theirs, count in (("latent_mlp", "prompte_model", 2),
                              ("fusion_mlp", "fusion_model", config.mlp_depth),
                              ("channel_mlp", "proj_3d_model", config.mlp_depth)):
    for k in range(count):
      names[f"{theirs}.{2 * k}"] = (ours, k)
  return names


def load_torch_state_dict(projector: Projector3D, state_dict, prefix: str = "projector_model.",
                          strict: bool = True) -> None:
  """Copies a torch state dict (arrays or tensors; keys under `prefix`) into the module.

  Raises KeyError naming missing or (with strict) unexpected keys, and ValueError naming
  a key whose shape does not match.
  """
  arrays = {k[len(prefix):]: np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v)
            for k, v in state_dict.items() if k.startswith(prefix)}
  expected = set()
  for torch_name, (attribute, index) in _torch_names(projector.config).items():
    layer = getattr(projector, attribute).layers[index]
    for suffix, param in (("weight", layer.kernel), ("bias", layer.bias)):
      key = f"{torch_name}.{suffix}"
      expected.add(key)
      if key not in arrays:
        raise KeyError(f"load_torch_state_dict: missing key {prefix}{key}")
      value = arrays[key].T if suffix == "weight" else arrays[key]
      current = param[...]
      if value.shape != current.shape:
        expected_shape = current.T.shape if suffix == "weight" else current.shape
        raise ValueError(f"load_torch_state_dict: {prefix}{key} has shape {arrays[key].shape}, "
                         f"expected {expected_shape}")
      param[...] = jnp.asarray(value, current.dtype)
  unexpected = sorted(set(arrays) - expected)
  if strict and unexpected:
    raise KeyError(f"load_torch_state_dict: unexpected key(s) {[prefix + k for k in unexpected]}")


def alignment_loss(predicted_NxFxH: Array, target_NxFxH: Array, mode: str = "mse") -> Array:
  """Mean over tokens of the squared error summed over channels (target detached)."""
  target = jax.lax.stop_gradient(target_NxFxH.astype(jnp.float32))
  predicted = predicted_NxFxH.astype(jnp.float32)
  if mode == "cosine":
    unit = lambda x: x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-8)
    predicted, target = unit(predicted), unit(target)
  elif mode != "mse":
    raise ValueError(f"alignment_loss: mode must be 'mse' or 'cosine', got {mode!r}")
  return jnp.mean(jnp.sum((predicted - target) ** 2, axis=-1))


def stage1_loss(cross_entropy: Array, predicted_NxFxH: Array, target_NxFxH: Array,
                ce_weight: float = 0.1, alignment_weight: float = 0.0005,
                mode: str = "mse") -> Array:
  return (ce_weight * cross_entropy
          + alignment_weight * alignment_loss(predicted_NxFxH, target_NxFxH, mode))
