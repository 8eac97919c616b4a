"""Loading Qwen2.5-VL weights from a local Hugging Face folder, tensor by tensor.

Reads `*.safetensors` (with or without `model.safetensors.index.json`) one tensor at a
time into the NNX parameters, so peak host memory stays near the largest tensor. Both
key layouts are accepted: transformers 5.x (`model.language_model.*`) and 4.x
(`model.layers.*`, `model.embed_tokens.*`). Vision weights (`model.visual.*`, `visual.*`)
are left to the vision encoder's loader.

Nothing is accepted that cannot be honoured: before any tensor is read, `scan` checks the
index (valid JSON, a `weight_map` of relative paths inside the folder, shards that exist and
hold what it maps to them) and every shard's header (readable, float16 / bfloat16 / float32
tensors only, no key in two shards, and, given the config's shapes, no missing, unexpected
or mis-shaped tensor); `read_tensor` refuses NaN or infinite values (also those a cast to
the parameters' dtype would make). Every refusal is a `CheckpointError` naming the file and
the tensor or field, the expected and the found.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import re

import numpy as np

from jaxspatial.models import sharding
from jaxspatial.models.qwen2_5_vl.text import TextModel

_TEXT_PREFIXES = ("model.language_model.", "model.")
_VISION_PREFIXES = ("model.visual.", "visual.")
_LAYER = re.compile(r"layers\.(\d+)\.(.+)$")
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
# The float types a checkpoint may hold (cast to the parameters' dtype on loading).
ACCEPTED_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}
_DTYPE_NAMES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16",
                "U32": "uint32", "I32": "int32", "U64": "uint64", "I64": "int64",
                "F64": "float64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
                **ACCEPTED_DTYPES}


class CheckpointError(ValueError):
  """A checkpoint that does not fit the model: missing, unexpected or mis-shaped keys, a
  tensor of another dtype or with NaN / Inf values, a key in two shards, a malformed index
  or config.json."""


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  file: pathlib.Path
  key: str            # as stored
  shape: tuple[int, ...]
  dtype: str          # safetensors' name (F32, BF16, ...)


def _show_path(folder: pathlib.Path, file: pathlib.Path) -> str:
  try:
    return str(file.relative_to(folder))
  except ValueError:
    return str(file)


def _weight_map(folder: pathlib.Path) -> dict[str, str] | None:
  """The index's weight map (key -> shard path relative to the folder), checked; None
  without an index."""
  index = folder / INDEX
  if not index.is_file():
    return None
  try:
    data = json.loads(index.read_text(encoding="utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
    raise CheckpointError(f"{index}: not valid JSON ({type(error).__name__}: "
                          f"{str(error)[:200]})") from None
  if not isinstance(data, dict):
    raise CheckpointError(f"{index}: expected a JSON object, got {type(data).__name__}")
  if "weight_map" not in data:
    raise CheckpointError(f"{index}: weight_map: expected an object of tensor name -> shard "
                          f"file, got nothing (the field is missing)")
  weight_map = data["weight_map"]
  if not isinstance(weight_map, dict) or not weight_map:
    raise CheckpointError(f"{index}: weight_map: expected a non-empty object of tensor name "
                          f"-> shard file, got {str(weight_map)[:80]!r}")
  out = {}
  for key, name in weight_map.items():
    where = f"{index}: weight_map[{key!r}]"
    if not isinstance(name, str) or not name.endswith(".safetensors"):
      raise CheckpointError(f"{where}: expected a *.safetensors file name, got {name!r}")
    # Lexical checks only: the Hugging Face cache links shards to blobs outside the folder.
    path = pathlib.PurePosixPath(name.replace("\\", "/"))
    if (path.is_absolute() or pathlib.PureWindowsPath(name).anchor or ".." in path.parts
        or "\x00" in name):
      raise CheckpointError(f"{where}: expected a path inside the checkpoint folder, got "
                            f"{name!r}")
    out[key] = str(path)
  return out


def safetensors_files(folder) -> list[pathlib.Path]:
  """The shards to read: the index's (checked), else model.safetensors, else every
  *.safetensors of the folder."""
  folder = pathlib.Path(folder)
  if not folder.is_dir():
    raise FileNotFoundError(f"checkpoint folder not found: {folder}")
  weight_map = _weight_map(folder)
  if weight_map is not None:
    if (folder / SINGLE).is_file():
      raise CheckpointError(f"{folder} holds both {SINGLE} and {INDEX} (one of them is stale; "
                            f"transformers would read {SINGLE}): remove the stale one")
    files = [folder / name for name in sorted(set(weight_map.values()))]
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
  """safe_open(file), its errors (truncated file, bad header) as CheckpointError."""
  from safetensors import SafetensorError, safe_open  # pylint: disable=import-outside-toplevel
  try:
    reader = safe_open(str(file), framework="numpy")
  except (SafetensorError, OSError, ValueError, TypeError) as error:
    raise CheckpointError(f"{file}: not a readable safetensors file ({str(error)[:200]})") \
        from None
  with reader:
    yield reader


def canonical_key(key: str) -> str:
  """One name per tensor across the 4.x and 5.x layouts (4.x: model.*, visual.*)."""
  if key.startswith("model.visual."):
    return key[len("model."):]
  if key.startswith("model.language_model."):
    return "model." + key[len("model.language_model."):]
  return key


def checkpoint_shapes(config) -> dict[str, tuple[int, ...]]:
  """Every tensor a checkpoint of `config` (a Qwen25VLConfig) holds, under its 4.x name
  (`canonical_key`), with its shape in torch layout (what `export.state_dict` writes)."""
  t, v = config.text, config.vision
  d = t.head_dim
  out = {"model.embed_tokens.weight": (t.vocab_size, t.hidden_size)}
  for i in range(t.num_hidden_layers):
    p = f"model.layers.{i}."
    for name, rows in (("q_proj", t.num_attention_heads * d),
                       ("k_proj", t.num_key_value_heads * d),
                       ("v_proj", t.num_key_value_heads * d)):
      out[p + f"self_attn.{name}.weight"] = (rows, t.hidden_size)
      out[p + f"self_attn.{name}.bias"] = (rows,)
    out[p + "self_attn.o_proj.weight"] = (t.hidden_size, t.num_attention_heads * d)
    out[p + "mlp.gate_proj.weight"] = (t.intermediate_size, t.hidden_size)
    out[p + "mlp.up_proj.weight"] = (t.intermediate_size, t.hidden_size)
    out[p + "mlp.down_proj.weight"] = (t.hidden_size, t.intermediate_size)
    out[p + "input_layernorm.weight"] = (t.hidden_size,)
    out[p + "post_attention_layernorm.weight"] = (t.hidden_size,)
  out["model.norm.weight"] = (t.hidden_size,)
  if not t.tie_word_embeddings:
    out["lm_head.weight"] = (t.vocab_size, t.hidden_size)
  c = v.hidden_size
  out["visual.patch_embed.proj.weight"] = (c, v.in_channels, v.temporal_patch_size,
                                           v.patch_size, v.patch_size)
  for i in range(v.depth):
    p = f"visual.blocks.{i}."
    out[p + "norm1.weight"] = (c,)
    out[p + "norm2.weight"] = (c,)
    for name, rows, cols in (("attn.qkv", 3 * c, c), ("attn.proj", c, c),
                             ("mlp.gate_proj", v.intermediate_size, c),
                             ("mlp.up_proj", v.intermediate_size, c),
                             ("mlp.down_proj", c, v.intermediate_size)):
      out[p + name + ".weight"] = (rows, cols)
      out[p + name + ".bias"] = (rows,)
  merged = c * v.spatial_merge_size ** 2
  out["visual.merger.ln_q.weight"] = (c,)
  out["visual.merger.mlp.0.weight"] = (merged, merged)
  out["visual.merger.mlp.0.bias"] = (merged,)
  out["visual.merger.mlp.2.weight"] = (v.out_hidden_size, merged)
  out["visual.merger.mlp.2.bias"] = (v.out_hidden_size,)
  return out


def scan(folder, expected: dict[str, tuple[int, ...]] | None = None,
         tied: bool = False, skip: tuple[str, ...] = ()) -> dict[str, TensorInfo]:
  """Checks the index and every shard's header, reading no tensor data; returns the tensors
  by `canonical_key`. With `expected` (`checkpoint_shapes`), also refuses missing,
  unexpected and mis-shaped tensors (`tied`: the config ties the LM head). Tensors whose
  canonical name starts with one of `skip` are checked but left out."""
  folder = pathlib.Path(folder)
  files = safetensors_files(folder)
  weight_map = _weight_map(folder)
  found: dict[str, TensorInfo] = {}
  for file in files:
    name = _show_path(folder, file)
    with open_shard(file) as reader:
      for key in reader.keys():
        info = reader.get_slice(key)
        tensor = TensorInfo(file, key, tuple(int(n) for n in info.get_shape()),
                            info.get_dtype())
        if tensor.dtype not in ACCEPTED_DTYPES:
          raise CheckpointError(
              f"{file}: tensor {key!r}: expected dtype float16, bfloat16 or float32, got "
              f"{_DTYPE_NAMES.get(tensor.dtype, tensor.dtype)}")
        canonical = canonical_key(key)
        if canonical in found:
          first = found[canonical]
          raise CheckpointError(
              f"{folder}: tensor {key!r} is stored twice: in {_show_path(folder, first.file)}"
              f"{'' if first.key == key else f' (as {first.key!r})'} and in {name}")
        if weight_map is not None and key in weight_map and weight_map[key] != name:
          raise CheckpointError(f"{file}: holds tensor {key!r}, which {INDEX} maps to "
                                f"{weight_map[key]}")
        found[canonical] = tensor
  if weight_map is not None:
    stored = {t.key for t in found.values()}
    absent = [k for k in weight_map if k not in stored]
    if absent:
      raise CheckpointError(f"{folder / INDEX}: maps {len(absent)} tensor(s) that no shard "
                            f"holds, e.g. {absent[0]!r} -> {weight_map[absent[0]]}")
  found = {name: tensor for name, tensor in found.items() if not name.startswith(skip)}
  if expected is not None:
    for canonical, tensor in found.items():
      if canonical not in expected:
        why = (" (the config ties the LM head to the embeddings)"
               if canonical == "lm_head.weight" and tied else "")
        raise CheckpointError(f"{tensor.file}: unexpected checkpoint key {tensor.key!r}{why}")
      if tensor.shape != tuple(expected[canonical]):
        raise CheckpointError(f"{tensor.file}: {tensor.key} has shape {tensor.shape}, "
                              f"expected {tuple(expected[canonical])} (from config.json)")
    missing = [k for k in expected if k not in found]
    if missing:
      raise CheckpointError(f"checkpoint in {folder} lacks {len(missing)} tensor(s) its "
                            f"config.json needs, e.g. {missing[:5]}")
  return found


def _all_finite(value: np.ndarray, chunk: int = 1 << 22) -> bool:
  """np.isfinite(value).all() in slices: the check's temporary is a few MB, not a boolean
  copy of a (possibly 1 GB) tensor, so loading stays near one tensor of host memory."""
  flat = value.reshape(-1)
  return all(np.isfinite(flat[start:start + chunk]).all()
             for start in range(0, flat.size, chunk))


def read_tensor(reader, file, key: str, dtype=None) -> np.ndarray:
  """One tensor, in `dtype` when given; refuses NaN and infinite values (also those the cast
  makes, e.g. float32 values beyond float16's range)."""
  try:
    value = reader.get_tensor(key)
  except Exception as error:  # pylint: disable=broad-except  (safetensors' own error types)
    raise CheckpointError(f"{file}: tensor {key!r} cannot be read ({str(error)[:200]})") \
        from None
  if dtype is not None:
    with np.errstate(over="ignore", invalid="ignore"):
      cast = np.asarray(value, dtype)
  else:
    cast = value
  if not _all_finite(cast):
    count = int((~np.isfinite(cast)).sum())
    kind = "NaN" if np.isnan(cast).any() else "infinite"
    after = ("" if cast is value or not np.isfinite(value).all()
             else f" after the cast to the parameters' {np.dtype(dtype).name}")
    raise CheckpointError(f"{file}: tensor {key!r}: expected finite values, got {count} "
                          f"{kind} value(s){after}")
  return cast


def check_values(tensors, dtype=None) -> None:
  """Reads the given tensors (`scan`'s TensorInfo) and refuses NaN / Inf (`read_tensor`)."""
  by_file: dict[pathlib.Path, list[str]] = {}
  for info in tensors:
    by_file.setdefault(info.file, []).append(info.key)
  for file, keys in by_file.items():
    with open_shard(file) as reader:
      for key in keys:
        read_tensor(reader, file, key, dtype)


def check_checkpoint(folder, config, dtype=None) -> dict[str, TensorInfo]:
  """Everything short of loading: index, headers, keys, shapes and dtypes against the
  config, and finite values (in `dtype`) of the vision tensors (the text loader checks its
  own as it reads them). Raises CheckpointError."""
  tensors = scan(folder, checkpoint_shapes(config), config.text.tie_word_embeddings)
  check_values([t for name, t in tensors.items() if name.startswith("visual.")], dtype)
  return tensors


def _text_target(model: TextModel, key: str):
  """(parameter, transpose) for a checkpoint key, or None if it is not a text key."""
  if key.startswith(_VISION_PREFIXES):
    return None
  if key == "lm_head.weight":
    if model.lm_head is None:
      raise CheckpointError("checkpoint has lm_head.weight but the config ties embeddings")
    return model.lm_head.kernel, True
  for prefix in _TEXT_PREFIXES:
    if key.startswith(prefix):
      name = key[len(prefix):]
      break
  else:
    raise CheckpointError(f"unexpected checkpoint key {key!r}")
  if name == "embed_tokens.weight":
    return model.embed_tokens.embedding, False
  if name == "norm.weight":
    return model.norm.weight, False
  match = _LAYER.match(name)
  if not match or int(match.group(1)) >= len(model.layers):
    raise CheckpointError(f"unexpected checkpoint key {key!r}")
  layer = model.layers[int(match.group(1))]
  parts = match.group(2).split(".")
  module = layer
  for part in parts[:-1]:
    if not hasattr(module, part):
      raise CheckpointError(f"unexpected checkpoint key {key!r}")
    module = getattr(module, part)
  if parts[-1] == "weight" and hasattr(module, "kernel"):
    return module.kernel, True
  if parts[-1] in ("weight", "bias") and hasattr(module, parts[-1]):
    return getattr(module, parts[-1]), False
  raise CheckpointError(f"unexpected checkpoint key {key!r}")


def load_text_weights(model: TextModel, folder) -> list[str]:
  """Loads every text tensor of the checkpoint; returns the skipped (vision) keys."""
  tensors = scan(folder)  # index, headers, dtypes, duplicates, before any data is read
  expected = {id(v): path for path, v in _named_params(model)}
  loaded, skipped = set(), []
  for file in safetensors_files(folder):
    with open_shard(file) as reader:
      for key in reader.keys():
        target = _text_target(model, key)
        if target is None:
          skipped.append(key)
          continue
        param, transpose = target
        current = param.get_value()  # an array, or a ShapeDtypeStruct on an abstract model
        want = current.shape[::-1] if transpose else current.shape
        stored = tensors[canonical_key(key)].shape
        if stored != tuple(want):
          raise CheckpointError(f"{file.name}: {key} has shape {stored}, expected {tuple(want)}")
        value = read_tensor(reader, file, key, current.dtype)
        sharding.place(param, value.T if transpose else value)
        loaded.add(id(param))
  missing = [path for pid, path in expected.items() if pid not in loaded]
  if missing:
    raise CheckpointError(f"checkpoint in {folder} lacks {len(missing)} text parameter(s), "
                          f"e.g. {missing[:5]}")
  return skipped


def _named_params(model: TextModel):
  from flax import nnx  # pylint: disable=import-outside-toplevel
  for path, value in nnx.iter_graph(model):
    if isinstance(value, nnx.Param):
      yield ".".join(str(p) for p in path), value
