"""Logical axis names of parameters, and the one table that maps them to the mesh.

The mesh is ('data', 'fsdp', 'tensor'). Model code names each parameter's axes with
logical names (`embed`, `mlp`, `heads`, `kv_heads`, `vocab`, ...); `RULES` decides which
mesh axis shards each. Under `jax.set_mesh(mesh)` parameters are created sharded; with
no mesh active they are plain arrays (single-device use and tests need no mesh).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import AxisType, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
RULES: dict[str, str | None] = {
    "vocab": "tensor",
    "embed": "fsdp",
    "mlp": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "patch": None,
    "latents": None,
    "tokens": None,
}


def mesh_axes(logical: tuple[str | None, ...]) -> tuple[str | None, ...]:
  """Mesh axes for a parameter's logical axes (unknown names raise)."""
  for name in logical:
    if name is not None and name not in RULES:
      raise KeyError(f"no sharding rule for logical axis {name!r}; add it to RULES")
  return tuple(RULES[name] if name is not None else None for name in logical)


def logical_init(init, logical: tuple[str | None, ...]):
  """`init` that creates the parameter sharded by RULES when a mesh is active."""
  if jax.sharding.get_abstract_mesh().empty:
    return init
  return nnx.with_partitioning(init, mesh_axes(logical))


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1):
  """A ('data', 'fsdp', 'tensor') mesh with Auto axes (see ../shared/reference/platform.md)."""
  return jax.make_mesh((data, fsdp, tensor), MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def place(param, host_array):
  """A host array (a loaded checkpoint tensor) as `param`'s value: sharded as the parameter's
  metadata says when it was declared under a mesh (`jax.set_mesh`), so a model loads
  straight onto the mesh, one tensor at a time, without a whole copy on one device."""
  current = param.get_value()  # an array, or a ShapeDtypeStruct on an abstract model
  value = np.asarray(host_array, current.dtype)
  names = param.get_metadata().get("out_sharding")
  if jax.sharding.get_abstract_mesh().empty:
    # may_alias: on the CPU an aligned contiguous array (hf.shards reads into one) becomes
    # the parameter's buffer as it is, not a second copy; the caller lets go of it
    param.set_value(jax.device_put(value, may_alias=True))
  elif names is None:  # replicated over the mesh
    param.set_value(jnp.asarray(value))
  else:  # a PartitionSpec places onto the mesh set by `jax.set_mesh`
    param.set_value(jax.device_put(value, PartitionSpec(*names)))


class HostRows:
  """This process's rows of a pytree of global arrays (a trajectory), each field copied to
  the host when first read: a host reward reads a few fields, and the rest (the views)
  never leave the device."""

  def __init__(self, tree):
    self._tree, self._copied = tree, {}

  def __getattr__(self, name):
    if name.startswith("_"):
      raise AttributeError(name)
    if name not in self._copied:
      self._copied[name] = jax.tree.map(local_rows, getattr(self._tree, name))
    return self._copied[name]

  @property
  def copied(self) -> tuple:
    """The fields read so far (copied to the host)."""
    return tuple(self._copied)


def global_batch(local_tree, mesh):
  """Global arrays (leading axis over ('data', 'fsdp')) from each process's own rows."""
  from jax.sharding import NamedSharding  # pylint: disable=import-outside-toplevel
  spec = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
  return jax.tree.map(
      lambda x: jax.make_array_from_process_local_data(spec, np.asarray(x)), local_tree)


def local_rows(array) -> np.ndarray:
  """This process's rows of a global array (all of them on one host), as numpy."""
  shards = sorted(array.addressable_shards, key=lambda s: s.index[0].start or 0)
  rows, seen = [], set()
  for shard in shards:
    start = shard.index[0].start or 0
    if start not in seen:
      seen.add(start)
      rows.append(np.asarray(shard.data))
  return np.concatenate(rows)
