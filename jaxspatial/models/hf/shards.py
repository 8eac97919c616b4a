"""Reading a Hugging Face folder's safetensors, one tensor at a time.

Nothing is accepted that cannot be honoured: before any tensor is read, `scan` checks the
index (valid JSON, a `weight_map` of relative paths inside the folder, shards that exist and
hold what it maps to them) and every shard's header (readable, float16 / bfloat16 / float32
tensors only, no key in two shards, and, given the config's shapes, no missing, unexpected
or mis-shaped tensor); `read_tensor` refuses NaN or infinite values (also those a cast to
the parameters' dtype would make). Every refusal is a ModelFolderError naming the file and
the tensor or field, the expected and the found.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import struct

import ml_dtypes
import numpy as np
from safetensors import SafetensorError, safe_open

from jaxspatial.errors import ModelFolderError
from jaxspatial.models.hf.fields import read_json
from jaxspatial.models.hf.names import canonical_key

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
# The float types a checkpoint may hold (cast to the parameters' dtype on loading).
ACCEPTED_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}
DTYPE_NAMES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16",
               "U32": "uint32", "I32": "int32", "U64": "uint64", "I64": "int64",
               "F64": "float64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
               **ACCEPTED_DTYPES}


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  file: pathlib.Path
  key: str            # as stored
  shape: tuple[int, ...]
  dtype: str          # safetensors' name (F32, BF16, ...)


def shown_path(folder: pathlib.Path, file: pathlib.Path) -> str:
  try:
    return str(file.relative_to(folder))
  except ValueError:
    return str(file)


def weight_map(folder: pathlib.Path) -> dict[str, str] | None:
  """The index's weight map (key -> shard path relative to the folder), checked; None
  without an index."""
  index = folder / INDEX
  if not index.is_file():
    return None
  data = read_json(index)
  if not isinstance(data, dict):
    raise ModelFolderError(f"{index}: expected a JSON object, got {type(data).__name__}")
  if "weight_map" not in data:
    raise ModelFolderError(f"{index}: weight_map: expected an object of tensor name -> "
                           f"shard file, got nothing (the field is missing)")
  mapping = data["weight_map"]
  if not isinstance(mapping, dict) or not mapping:
    raise ModelFolderError(f"{index}: weight_map: expected a non-empty object of tensor "
                           f"name -> shard file, got {str(mapping)[:80]!r}")
  out = {}
  for key, name in mapping.items():
    where = f"{index}: weight_map[{key!r}]"
    if not isinstance(name, str) or not name.endswith(".safetensors"):
      raise ModelFolderError(f"{where}: expected a *.safetensors file name, got {name!r}")
    # Lexical checks only: the Hugging Face cache links shards to blobs outside the folder.
    path = pathlib.PurePosixPath(name.replace("\\", "/"))
    if (path.is_absolute() or pathlib.PureWindowsPath(name).anchor or ".." in path.parts
        or "\x00" in name):
      raise ModelFolderError(f"{where}: expected a path inside the checkpoint folder, got "
                             f"{name!r}")
    out[key] = str(path)
  return out


def safetensors_files(folder) -> list[pathlib.Path]:
  """The shards to read: the index's (checked), else model.safetensors, else every
  *.safetensors of the folder."""
  folder = pathlib.Path(folder)
  if not folder.is_dir():
    raise FileNotFoundError(f"checkpoint folder not found: {folder}")
  mapping = weight_map(folder)
  if mapping is not None:
    if (folder / SINGLE).is_file():
      raise ModelFolderError(f"{folder} holds both {SINGLE} and {INDEX} (one of them is "
                             f"stale; transformers would read {SINGLE}): remove the stale one")
    files = [folder / name for name in sorted(set(mapping.values()))]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
      raise FileNotFoundError(f"{folder / INDEX} names shard(s) that are missing: {missing}")
    return files
  if (folder / SINGLE).is_file():
    return [folder / SINGLE]
  files = sorted(f for f in folder.glob("*.safetensors")
                 if f.is_file() and not f.name.startswith("."))
  if not files:
    raise FileNotFoundError(f"no *.safetensors in {folder}")
  return files


@contextlib.contextmanager
def open_shard(file: pathlib.Path):
  """A shard's tensors to read one by one (`get_tensor(key)`), its errors (truncated file,
  bad header) as ModelFolderError."""
  try:
    reader = safe_open(str(file), framework="numpy")  # checks the header against the file
  except (SafetensorError, OSError, ValueError, TypeError) as error:
    raise ModelFolderError(f"{file}: not a readable safetensors file ({str(error)[:200]})") \
        from None
  with reader, open(file, "rb") as raw:
    yield _Shard(reader, raw)


ALIGNMENT = 64  # bytes: XLA's CPU client takes a host buffer as it is from this alignment
CHUNK_BYTES = 1 << 24


def aligned_empty(shape, dtype) -> np.ndarray:
  """np.empty aligned to ALIGNMENT bytes: `jax.device_put(x, may_alias=True)` then keeps
  the buffer on the CPU instead of copying it (one tensor less in flight)."""
  dtype = np.dtype(dtype)
  count = int(np.prod(shape, dtype=np.int64))
  raw = np.empty(count * dtype.itemsize + ALIGNMENT, np.uint8)
  offset = -raw.ctypes.data % ALIGNMENT
  return raw[offset:offset + count * dtype.itemsize].view(dtype).reshape(shape)


class _Shard:
  """Reads a tensor's bytes straight into its (aligned) array: safetensors' get_tensor
  copies out of a memory map whose touched pages also stay resident, two copies of every
  tensor in flight (measured by loading_bench)."""

  def __init__(self, reader, raw):
    self.reader, self.raw = reader, raw
    (size,) = struct.unpack("<Q", raw.read(8))
    self.header, self.start = json.loads(raw.read(size)), 8 + size

  def keys(self):
    return self.reader.keys()

  def get_slice(self, key: str):
    return self.reader.get_slice(key)

  def _entry(self, key: str) -> tuple[tuple[int, ...], np.dtype]:
    entry = self.header[key]
    begin, end = entry["data_offsets"]
    shape, dtype = tuple(entry["shape"]), _numpy_dtype(entry["dtype"])
    if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != end - begin:
      raise SafetensorError(f"tensor {key!r} holds {end - begin} bytes, its shape {shape} "
                            f"and dtype {dtype.name} {np.prod(shape) * dtype.itemsize}")
    self.raw.seek(self.start + begin)
    return shape, dtype

  def _read_into(self, key: str, out: np.ndarray) -> None:
    if self.raw.readinto(out.reshape(-1).view(np.uint8)) != out.nbytes:
      raise SafetensorError(f"tensor {key!r}: the file ends inside its data")

  def get_tensor(self, key: str) -> np.ndarray:
    shape, dtype = self._entry(key)
    out = aligned_empty(shape, dtype)
    self._read_into(key, out)
    return out

  def row_chunks(self, key: str):
    """(rows, 2-D tensor's rows `rows` as an array) for consecutive row blocks of about
    CHUNK_BYTES, one buffer reused."""
    shape, dtype = self._entry(key)
    if len(shape) != 2:
      raise SafetensorError(f"tensor {key!r}: row chunks of a {len(shape)}-D tensor")
    step = max(1, CHUNK_BYTES // max(1, shape[1] * dtype.itemsize))
    buffer = np.empty((min(step, shape[0]), shape[1]), dtype)
    for start in range(0, shape[0], step):
      block = buffer[:min(step, shape[0] - start)]
      self._read_into(key, block)
      yield slice(start, start + block.shape[0]), block


def _numpy_dtype(name: str) -> np.dtype:
  return np.dtype(ml_dtypes.bfloat16) if name == "BF16" else np.dtype(DTYPE_NAMES[name])


def _headers(folder: pathlib.Path) -> dict[str, TensorInfo]:
  """Every shard's tensors by `canonical_key`, dtypes and the index checked."""
  mapping = weight_map(folder)
  found: dict[str, TensorInfo] = {}
  for file in safetensors_files(folder):
    name = shown_path(folder, file)
    with open_shard(file) as reader:
      for key in reader.keys():
        info = reader.get_slice(key)
        tensor = TensorInfo(file, key, tuple(int(n) for n in info.get_shape()),
                            info.get_dtype())
        if tensor.dtype not in ACCEPTED_DTYPES:
          raise ModelFolderError(
              f"{file}: tensor {key!r}: expected dtype float16, bfloat16 or float32, got "
              f"{DTYPE_NAMES.get(tensor.dtype, tensor.dtype)}")
        canonical = canonical_key(key)
        if canonical in found:
          first = found[canonical]
          raise ModelFolderError(
              f"{folder}: tensor {key!r} is stored twice: in {shown_path(folder, first.file)}"
              f"{'' if first.key == key else f' (as {first.key!r})'} and in {name}")
        if mapping is not None and key in mapping and mapping[key] != name:
          raise ModelFolderError(f"{file}: holds tensor {key!r}, which {INDEX} maps to "
                                 f"{mapping[key]}")
        found[canonical] = tensor
  if mapping is not None:
    stored = {t.key for t in found.values()}
    absent = [k for k in mapping if k not in stored]
    if absent:
      raise ModelFolderError(f"{folder / INDEX}: maps {len(absent)} tensor(s) that no shard "
                             f"holds, e.g. {absent[0]!r} -> {mapping[absent[0]]}")
  return found


def scan(folder, expected: dict[str, tuple[int, ...]] | None = None,
         tied: bool = False, skip: tuple[str, ...] = ()) -> dict[str, TensorInfo]:
  """Checks the index and every shard's header, reading no tensor data; returns the tensors
  by `canonical_key`. With `expected` (a family's `checkpoint_shapes`), also refuses
  missing, unexpected and mis-shaped tensors (`tied`: the config ties the LM head). Tensors
  whose canonical name starts with one of `skip` are checked but left out."""
  folder = pathlib.Path(folder)
  found = {name: tensor for name, tensor in _headers(folder).items()
           if not name.startswith(skip)}
  if expected is None:
    return found
  for canonical, tensor in found.items():
    if canonical not in expected:
      why = (" (the config ties the LM head to the embeddings)"
             if canonical == "lm_head.weight" and tied else "")
      raise ModelFolderError(f"{tensor.file}: unexpected checkpoint key {tensor.key!r}{why}")
    if tensor.shape != tuple(expected[canonical]):
      raise ModelFolderError(f"{tensor.file}: {tensor.key} has shape {tensor.shape}, "
                             f"expected {tuple(expected[canonical])} (from config.json)")
  missing = [k for k in expected if k not in found]
  if missing:
    raise ModelFolderError(f"checkpoint in {folder} lacks {len(missing)} tensor(s) its "
                           f"config.json needs, e.g. {missing[:5]}")
  return found


def _all_finite(value: np.ndarray, chunk: int = 1 << 22) -> bool:
  """np.isfinite(value).all() in slices: the check's temporary is a few MB, not a boolean
  copy of a (possibly 1 GB) tensor, so loading stays near one tensor of host memory."""
  flat = value.reshape(-1)
  return all(np.isfinite(flat[start:start + chunk]).all()
             for start in range(0, flat.size, chunk))


def read_tensor(reader, file, key: str, dtype=None, transposed: bool = False) -> np.ndarray:
  """One tensor, in `dtype` when given (transposed: a 2-D tensor's transpose, made from
  row blocks as they are read, so that no second whole copy is in flight); refuses NaN
  and infinite values (also those the cast makes, e.g. float32 values beyond float16's
  range)."""
  try:
    if transposed and hasattr(reader, "row_chunks"):
      return _read_transposed(reader, file, key, dtype)
    value = reader.get_tensor(key)
  except ModelFolderError:
    raise
  except Exception as error:  # pylint: disable=broad-except  (safetensors' own error types)
    raise ModelFolderError(f"{file}: tensor {key!r} cannot be read ({str(error)[:200]})") \
        from None
  if transposed:
    value = value.T
  if dtype is None or np.dtype(dtype) == value.dtype:
    cast = value
  else:
    cast = aligned_empty(value.shape, dtype)
    with np.errstate(over="ignore", invalid="ignore"):
      np.copyto(cast, value, casting="unsafe")
  if not _all_finite(cast):
    _refuse(file, key, cast, value, dtype)
  return cast


def _read_transposed(reader, file, key: str, dtype) -> np.ndarray:
  out = None
  for rows, block in reader.row_chunks(key):
    if out is None:
      total = reader.header[key]["shape"][0]
      out = aligned_empty((block.shape[1], total), dtype or block.dtype)
    with np.errstate(over="ignore", invalid="ignore"):
      out[:, rows] = block.T
    # the block as read, unless a cast could have made new infinities
    checked = block if out.dtype == block.dtype else np.ascontiguousarray(out[:, rows])
    if not _all_finite(checked):
      _refuse(file, key, out[:, rows], block.T, dtype)
  return out


def _refuse(file, key: str, cast: np.ndarray, value: np.ndarray, dtype) -> None:
  count = int((~np.isfinite(cast)).sum())
  kind = "NaN" if np.isnan(cast).any() else "infinite"
  after = ("" if cast is value or not np.isfinite(value).all()
           else f" after the cast to the parameters' {np.dtype(dtype).name}")
  raise ModelFolderError(f"{file}: tensor {key!r}: expected finite values, got {count} "
                         f"{kind} value(s){after}")
