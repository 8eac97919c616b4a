"""Logical axis names of parameters, and the one table that maps them to the mesh.

The mesh is ('data', 'fsdp', 'tensor'). Model code names each parameter's axes with
logical names (`embed`, `mlp`, `heads`, `kv_heads`, `vocab`, ...); `RULES` decides which
mesh axis shards each. Under `jax.set_mesh(mesh)` parameters are created sharded; with
no mesh active they are plain arrays (single-device use and tests need no mesh).
"""

from __future__ import annotations

import jax
from flax import nnx
from jax.sharding import AxisType

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
