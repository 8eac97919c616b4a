"""Exact integer fingerprints of array pytrees, computed on device.

A leaf's fingerprint is sum_i bits[i] * (2 i + 1) mod 2^32 over its flattened (row-major)
index i, where bits are the values' bit patterns as unsigned integers of their width,
widened to uint32. Integer arithmetic wraps identically in any order, so the value does
not depend on sharding, device or reduction order; since 2 i + 1 is odd (invertible mod
2^32), flipping any single bit changes the sum. Never a matmul: bf16 / TF32 passes would
round it. `records` adds each leaf's shape and dtype, which the checkpoints store.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def path_str(path) -> str:
  """"model/layers/0/kernel" for a `tree_flatten_with_path` key path."""
  parts = []
  for key in path:
    for name in ("key", "idx", "name"):
      if hasattr(key, name):
        parts.append(str(getattr(key, name)))
        break
    else:
      parts.append(str(key))
  return "/".join(parts)


def _bits(x) -> jax.Array:
  """The values' bit patterns as uint32 (64-bit values as two uint32 words)."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  if jnp.issubdtype(x.dtype, jnp.complexfloating):
    raise TypeError(f"fingerprints: complex dtype {x.dtype} is not supported")
  width = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}.get(x.dtype.itemsize)
  if width is None:
    raise TypeError(f"fingerprints: dtype {x.dtype} has no unsigned integer of its width")
  return lax.bitcast_convert_type(x, width).astype(jnp.uint32)


def _leaf_sum(x) -> jax.Array:
  bits = _bits(x)
  index = jnp.uint32(0)
  stride = 1
  for axis in reversed(range(bits.ndim)):  # the row-major flat index, from iotas (no buffer)
    index = index + lax.broadcasted_iota(jnp.uint32, bits.shape, axis) * jnp.uint32(
        stride % 2**32)
    stride *= bits.shape[axis]
  weights = index * jnp.uint32(2) + jnp.uint32(1)
  return jnp.sum(bits * weights, dtype=jnp.uint32)


@jax.jit
def _sums(leaves):
  return [_leaf_sum(x) for x in leaves]


def _device_group(x) -> tuple:
  # One program per set of devices: committed arrays on different devices cannot meet in
  # one jit (e.g. a mesh-sharded parameter and a counter committed to device 0).
  if isinstance(x, jax.Array) and x.committed:
    return tuple(sorted(d.id for d in x.sharding.device_set))
  return ()


def _host_int(x) -> int:
  # The sum is replicated: any addressable shard holds it (also in multi-process runs).
  shard = x.addressable_data(0) if isinstance(x, jax.Array) else x
  return int(np.asarray(shard).astype(np.uint32))


def fingerprints(tree) -> dict[str, int]:
  """{path: fingerprint} for every array leaf of `tree` (one jitted program per device set)."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  paths = [path_str(path) for path, _ in flat]
  leaves = [x if isinstance(x, jax.Array) else jnp.asarray(x) for _, x in flat]
  groups: dict[tuple, list[int]] = {}
  for i, x in enumerate(leaves):
    groups.setdefault(_device_group(x), []).append(i)
  out: dict[str, int] = {}
  for members in groups.values():
    for i, value in zip(members, _sums([leaves[i] for i in members])):
      out[paths[i]] = _host_int(value)
  return out


def records(tree) -> dict[str, dict]:
  """{path: {"fingerprint", "shape", "dtype"}}: the integrity record a checkpoint stores."""
  sums = fingerprints(tree)
  out = {}
  for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
    name = path_str(path)
    dtype = x.dtype
    out[name] = {"fingerprint": sums[name], "shape": [int(n) for n in np.shape(x)],
                 "dtype": str(dtype)}
  return out


def first_mismatch(expected: dict[str, dict], actual: dict[str, dict]) -> str | None:
  """The first path whose record differs (or is missing on either side), else None."""
  for name in sorted(set(expected) | set(actual)):
    if expected.get(name) != actual.get(name):
      return name
  return None
