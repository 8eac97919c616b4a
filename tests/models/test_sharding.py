"""With 8 fake CPU devices, the sharded Qwen2.5-VL, Qwen3-VL and Qwen3.5 forwards equal the
unsharded ones; checkpoints load onto the mesh as every parameter declares.

Runs in its own process: the device count is fixed when JAX starts.
"""

import os
import pathlib
import subprocess
import sys

import pytest

from jaxspatial.models.sharding import mesh_axes
from tests.conftest import xla_flags

SCRIPT = r"""
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from jaxspatial.models.qwen2_5_vl import Qwen25VL, Qwen25VLConfig, TextConfig, VisionConfig
from jaxspatial.models.sharding import make_mesh

assert len(jax.devices()) == 8, jax.devices()
config = Qwen25VLConfig(
    text=TextConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, mrope_section=(2, 3, 3),
                    tie_word_embeddings=False),
    vision=VisionConfig(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                        out_hidden_size=64, fullatt_block_indexes=(1,)),
    image_token_id=250)
plain = Qwen25VL(config, rngs=nnx.Rngs(0))
mesh = make_mesh(data=2, fsdp=2, tensor=2)
with jax.set_mesh(mesh):
  sharded = Qwen25VL(config, rngs=nnx.Rngs(1))
  state = nnx.state(sharded, nnx.Param)
  values = jax.tree.map(lambda x, s: jax.device_put(x, s.sharding),
                        nnx.to_pure_dict(nnx.state(plain, nnx.Param)), nnx.to_pure_dict(state))
  nnx.replace_by_pure_dict(state, values)
  nnx.update(sharded, state)
  kernel = sharded.language_model.layers[0].mlp.gate_proj.kernel[...]
  assert kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor"), kernel.sharding

rng = np.random.default_rng(0)
ids = np.array([[5, 252] + [250] * 6 + [253, 7, 8, 9]] * 4)
mask = np.ones_like(ids)
mask[1, :3] = 0
pixels = rng.normal(size=(4 * 24, 1176)).astype(np.float32)
grids = ((1, 4, 6),) * 4
sequence_grids = jnp.asarray([[(1, 4, 6)]] * 4)
args = (jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(pixels))
expected = plain(*args, grids, sequence_grids)
with jax.set_mesh(mesh):
  forward = nnx.jit(lambda m, i, a, p, s: m(i, a, p, grids, s))
  got = forward(sharded, *args, sequence_grids)
np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5, rtol=1e-5)
print("sharded forward equals unsharded, max diff", float(jnp.abs(got - expected).max()))

# The 3D projector carries the same sharding metadata, and its sharded forward agrees.
from jaxspatial.models.projector3d import Projector3D, Projector3DConfig
P = jax.sharding.PartitionSpec
pconfig = Projector3DConfig(mlp_depth=3, mm_hidden_size=64, hidden_size=32, fusion_input=6,
                            fusion_output=40)
plain_projector = Projector3D(pconfig, rngs=nnx.Rngs(0))
with jax.set_mesh(mesh):
  sharded_projector = Projector3D(pconfig, rngs=nnx.Rngs(0))
  specs = [layer.kernel[...].sharding.spec for layer in sharded_projector.channel_mlp.layers]
  assert specs == [P("fsdp", "tensor"), P("tensor", "fsdp"), P("fsdp", "tensor")], specs
  fusion = sharded_projector.fusion_mlp.layers[1].kernel[...].sharding.spec
  assert fusion == P(None, "tensor"), fusion
  latents = jnp.asarray(rng.normal(size=(12, 64)), jnp.float32)
  images = jnp.asarray(rng.normal(size=(3, 6, 64)), jnp.float32)
  got = nnx.jit(lambda m, l, i: m(l, i))(sharded_projector, latents, images)
np.testing.assert_allclose(np.asarray(got), np.asarray(plain_projector(latents, images)),
                           atol=1e-5, rtol=1e-5)
print("sharded projector equals unsharded")

# LoRA adapters take their base kernel's sharding (A by input, B by output axis).
from jaxspatial.models import apply_lora
with jax.set_mesh(mesh):
  apply_lora(sharded.language_model, ("gate_proj",), 4, 8.0, rngs=nnx.Rngs(2))
  adapter = sharded.language_model.layers[0].mlp.gate_proj
  assert adapter.lora_a[...].sharding.spec == P("fsdp", None), adapter.lora_a[...].sharding
  assert adapter.lora_b[...].sharding.spec == P(None, "tensor"), adapter.lora_b[...].sharding
print("lora adapters sharded like their kernels")

# A checkpoint loads straight onto the mesh: every tensor as its parameter declares.
import tempfile
from jaxspatial.models.qwen2_5_vl.export import save_pretrained
folder = tempfile.mkdtemp()
save_pretrained(plain, folder)
with jax.set_mesh(mesh):
  loaded = Qwen25VL.from_pretrained(folder)
  want = nnx.to_pure_dict(nnx.state(Qwen25VL(config, rngs=nnx.Rngs(3)), nnx.Param))
got_state = nnx.to_pure_dict(nnx.state(loaded, nnx.Param))
mismatch = [(a.sharding.spec, b.sharding.spec) for a, b in zip(jax.tree.leaves(got_state),
            jax.tree.leaves(want)) if a.sharding.spec != b.sharding.spec]
assert not mismatch, mismatch[:3]
assert loaded.language_model.layers[0].mlp.gate_proj.kernel[...].sharding.spec == P("fsdp", "tensor")
with jax.set_mesh(mesh):
  got = forward(loaded, *args, sequence_grids)
np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5, rtol=1e-5)
print("checkpoint loaded onto the mesh")

# Qwen3-VL (QK-norm, DeepStack residuals, learned vision positions) shards the same way:
# its sharded forward with images equals the unsharded one, and its checkpoint loads onto
# the mesh with every parameter as it declares.
import dataclasses
from jaxspatial.models import export
from jaxspatial.models.qwen3_vl import Qwen3VL, Qwen3VLConfig
config3 = Qwen3VLConfig.tiny(256)
config3 = dataclasses.replace(config3, text=dataclasses.replace(config3.text,
                                                                tie_word_embeddings=False))
plain3 = Qwen3VL(config3, rngs=nnx.Rngs(0))
image3 = config3.image_token_id
ids3 = np.array([[5, 6] + [image3] * 6 + [7, 8, 9, 10]] * 4)
mask3 = np.ones_like(ids3)
mask3[1, :2] = 0
pixels3 = rng.normal(size=(4 * 24, config3.vision.patch_dim)).astype(np.float32)
args3 = (jnp.asarray(ids3), jnp.asarray(mask3), jnp.asarray(pixels3))
expected3 = plain3(*args3, grids, sequence_grids)
folder3 = tempfile.mkdtemp()
export(plain3, folder3)
with jax.set_mesh(mesh):
  loaded3 = Qwen3VL.from_pretrained(folder3)
  want3 = nnx.to_pure_dict(nnx.state(Qwen3VL(config3, rngs=nnx.Rngs(3)), nnx.Param))
  got3 = nnx.jit(lambda m, i, a, p, s: m(i, a, p, grids, s))(loaded3, *args3, sequence_grids)
got_state3 = nnx.to_pure_dict(nnx.state(loaded3, nnx.Param))
mismatch = [(a.sharding.spec, b.sharding.spec) for a, b in zip(jax.tree.leaves(got_state3),
            jax.tree.leaves(want3)) if a.sharding.spec != b.sharding.spec]
assert not mismatch, mismatch[:3]
layer = loaded3.language_model.layers[0]
assert layer.mlp.gate_proj.kernel[...].sharding.spec == P("fsdp", "tensor")
assert layer.self_attn.q_proj.kernel[...].sharding.spec == P("fsdp", "tensor")
np.testing.assert_allclose(np.asarray(got3), np.asarray(expected3), atol=1e-5, rtol=1e-5)
print("qwen3-vl sharded forward equals unsharded, max diff",
      float(jnp.abs(got3 - expected3).max()))

# Qwen3.5 (Gated DeltaNet layers: the convolution and projections split over 'tensor', the
# delta rule's heads with them) loads onto the mesh and its sharded forward, with a
# left-padded row, equals the unsharded one.
from jaxspatial.models.qwen3_5 import Qwen35, Qwen35Config
config5 = Qwen35Config.tiny(256)
config5 = dataclasses.replace(config5, text=dataclasses.replace(config5.text,
                                                                tie_word_embeddings=False))
plain5 = Qwen35(config5, rngs=nnx.Rngs(0))
# Linear kernels at transformers' initializer_range (normal 0.02, not LeCun's 1 / sqrt(64)):
# at LeCun scale each random DeltaNet layer amplifies float32 rounding about 4x (its gated
# norms scale near-zero head outputs up), and summation order alone then moves the logits
# by ~1e-4. Compared jitted on both sides: eager dispatch rounds differently again.
text5 = nnx.state(plain5.language_model, nnx.Param)
nnx.update(plain5.language_model, jax.tree_util.tree_map_with_path(
    lambda path, x: x * 0.16 if "kernel" in str(path) else x, text5))
forward5 = nnx.jit(lambda m, i, a, p, s: m(i, a, p, grids, s))
expected5 = forward5(plain5, *args3, sequence_grids)
folder5 = tempfile.mkdtemp()
export(plain5, folder5)
with jax.set_mesh(mesh):
  loaded5 = Qwen35.from_pretrained(folder5)
  got5 = forward5(loaded5, *args3, sequence_grids)
mixer = loaded5.language_model.layers[0].linear_attn
assert mixer.in_proj_qkv.kernel[...].sharding.spec == P("fsdp", "tensor")
assert mixer.conv_weight[...].sharding.spec == P(None, "tensor")
np.testing.assert_allclose(np.asarray(got5), np.asarray(expected5), atol=1e-5, rtol=1e-5)
print("qwen3.5 sharded forward equals unsharded, max diff",
      float(jnp.abs(got5 - expected5).max()))
"""


@pytest.mark.multidevice
def test_sharded_forward_equals_unsharded():
  env = dict(os.environ, XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=8"),
             JAX_PLATFORMS="cpu")
  root = pathlib.Path(__file__).resolve().parents[2]
  result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=root,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  assert "sharded forward equals unsharded" in result.stdout
  assert "sharded projector equals unsharded" in result.stdout
  assert "lora adapters sharded like their kernels" in result.stdout
  assert "checkpoint loaded onto the mesh" in result.stdout
  assert "qwen3-vl sharded forward equals unsharded" in result.stdout
  assert "qwen3.5 sharded forward equals unsharded" in result.stdout


def test_rules():
  assert mesh_axes(("embed", "mlp")) == ("fsdp", "tensor")
  assert mesh_axes((None, "vocab")) == (None, "tensor")
  with pytest.raises(KeyError, match="no sharding rule for logical axis 'bogus'"):
    mesh_axes(("bogus",))


def test_host_rows_copy_only_the_fields_read():
  """A host reward's view of a trajectory (recipes' rewards): each field read is this
  process's rows as numpy; a field never read (the views) is never copied."""
  import types  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jaxspatial.models.sharding import HostRows  # pylint: disable=import-outside-toplevel
  tokens = np.arange(12, dtype=np.int32).reshape(3, 4)
  traj = types.SimpleNamespace(tokens=jnp.asarray(tokens),
                               images=jnp.zeros((3, 2, 8, 8, 3), jnp.uint8),
                               reward_components={"correct": jnp.asarray([1.0, 0.0, 1.0])})
  rows = HostRows(traj)
  assert isinstance(rows.tokens, np.ndarray)
  np.testing.assert_array_equal(rows.tokens, tokens)
  np.testing.assert_array_equal(rows.reward_components["correct"], [1.0, 0.0, 1.0])
  assert rows.copied == ("tokens", "reward_components")
  with pytest.raises(AttributeError):
    _ = rows.missing_field
