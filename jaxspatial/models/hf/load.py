"""Placing a checkpoint's tensors into an (abstract) NNX model through its name map, shard
by shard and tensor by tensor, so host memory holds the parameters plus one tensor."""

from __future__ import annotations

import pathlib

from jaxspatial.errors import ModelFolderError
from jaxspatial.models import sharding
from jaxspatial.models.hf.names import Targets, to_param, torch_shape
from jaxspatial.models.hf.shards import TensorInfo, open_shard, read_tensor


def load_weights(model, folder, tensors: dict[str, TensorInfo], wanted: Targets) -> None:
  """Places every tensor (`scan`'s, by canonical key) into the parameter `wanted` (the
  family's `targets(model)`) names for it; NaN / Inf refused as read. Fails naming an
  unexpected or mis-shaped tensor, or parameters left unloaded."""
  by_file: dict[pathlib.Path, list[tuple[str, TensorInfo]]] = {}
  for name, info in tensors.items():
    if name not in wanted:
      raise ModelFolderError(f"{info.file}: unexpected checkpoint key {info.key!r}")
    by_file.setdefault(info.file, []).append((name, info))
  loaded = set()
  for file, entries in by_file.items():
    with open_shard(file) as reader:
      for name, info in entries:
        param, how = wanted[name]
        current = param.get_value()  # an array, or a ShapeDtypeStruct on an abstract model
        expected = torch_shape(current.shape, how, info.shape)
        if info.shape != expected:
          raise ModelFolderError(f"{file}: {info.key} has shape {info.shape}, expected "
                                 f"{expected} (from the model)")
        if how == "t":  # transposed as it is read
          value = read_tensor(reader, file, info.key, current.dtype, transposed=True)
        else:
          value = to_param(read_tensor(reader, file, info.key, current.dtype), how)
        sharding.place(param, value)
        del value  # a whole tensor: freed before the next is read
        loaded.add(name)
  missing = sorted(set(wanted) - loaded)
  if missing:
    raise ModelFolderError(f"checkpoint in {folder} lacks {len(missing)} tensor(s), e.g. "
                           f"{missing[:5]}")
