"""Hostile Hugging Face checkpoints: export leaves a folder that loads exactly what was
exported, and loading refuses what it cannot honour (wrong dtypes, NaN / Inf, keys in two
shards, index paths outside the folder, config settings the model does not implement,
malformed files) with a ModelFolderError naming the file and the field or tensor; a seeded
fuzz over mutated configs, indexes and tensors. No transformers: the checkpoints are our own
`save_pretrained` of a tiny random model (built abstractly, filled from numpy: no compile)."""

import copy
import dataclasses
import json
import os
import pathlib
import signal
import time

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

from jaxspatial.errors import ModelFolderError
from jaxspatial.models.hf import INDEX, shards
from jaxspatial.models.qwen2_5_vl import (Qwen25VL, Qwen25VLConfig, TextModel, checkpoint_shapes,
                                          load_text_weights, save_pretrained, state_dict)

VOCAB = 512
MISSING = object()


def hf_config(config: Qwen25VLConfig) -> dict:
  """The config.json transformers 5 writes for `config` (its fields this library reads, and a
  few it must check), written by hand so that no test here needs transformers."""
  t, v = config.text, config.vision
  return {
      "model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"],
      "text_config": {
          "model_type": "qwen2_5_vl_text", "vocab_size": t.vocab_size,
          "hidden_size": t.hidden_size, "intermediate_size": t.intermediate_size,
          "num_hidden_layers": t.num_hidden_layers,
          "num_attention_heads": t.num_attention_heads,
          "num_key_value_heads": t.num_key_value_heads, "hidden_act": "silu",
          "rms_norm_eps": t.rms_norm_eps, "use_sliding_window": False, "sliding_window": None,
          "max_window_layers": 80, "layer_types": ["full_attention"] * t.num_hidden_layers,
          "rope_parameters": {"type": "mrope", "mrope_section": list(t.mrope_section),
                              "rope_theta": t.rope_theta, "rope_type": "default"},
          "tie_word_embeddings": t.tie_word_embeddings},
      "vision_config": {
          "model_type": "qwen2_5_vl_vision", "depth": v.depth, "hidden_size": v.hidden_size,
          "hidden_act": "silu", "intermediate_size": v.intermediate_size,
          "num_heads": v.num_heads, "in_channels": v.in_channels, "patch_size": v.patch_size,
          "spatial_merge_size": v.spatial_merge_size,
          "temporal_patch_size": v.temporal_patch_size, "window_size": v.window_size,
          "out_hidden_size": v.out_hidden_size,
          "fullatt_block_indexes": list(v.fullatt_block_indexes),
          "rope_parameters": {"rope_theta": v.rope_theta, "rope_type": "axial"}},
      "image_token_id": config.image_token_id, "video_token_id": config.video_token_id,
      "vision_start_token_id": config.vision_start_token_id,
      "vision_end_token_id": config.vision_end_token_id,
      "tie_word_embeddings": t.tie_word_embeddings}


def random_model(seed: int, tie: bool = True) -> Qwen25VL:
  """A tiny Qwen25VL with random parameters, set from numpy on an abstract model."""
  config = Qwen25VLConfig.tiny(VOCAB)
  config = dataclasses.replace(config, text=dataclasses.replace(config.text,
                                                                tie_word_embeddings=tie))
  config = dataclasses.replace(config, raw=hf_config(config))
  model = nnx.eval_shape(lambda: Qwen25VL(config, rngs=nnx.Rngs(0)))
  rng = np.random.default_rng(seed)
  for _, param in nnx.iter_graph(model):
    if isinstance(param, nnx.Param):
      shape = param.get_value().shape
      param.set_value(jnp.asarray(rng.normal(0, 0.05, shape).astype(np.float32)))
  return model


def params(model):
  return {".".join(map(str, k)): np.asarray(v.get_value())
          for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def assert_same(a, b):
  pa, pb = params(a), params(b)
  assert pa.keys() == pb.keys()
  for key in pa:
    np.testing.assert_array_equal(pa[key], pb[key], err_msg=key)


def write_sharded(folder: pathlib.Path, tensors: dict, config: dict) -> None:
  """transformers' sharded layout: two shards (text, vision) and the index."""
  folder.mkdir(parents=True, exist_ok=True)
  names = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
  shards = ({k: v for k, v in tensors.items() if not k.startswith("visual.")},
            {k: v for k, v in tensors.items() if k.startswith("visual.")})
  weight_map = {}
  for name, shard in zip(names, shards):
    save_file(shard, str(folder / name), metadata={"format": "pt"})
    weight_map.update({k: name for k in shard})
  (folder / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
  (folder / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  model = random_model(0)
  folder = save_pretrained(model, tmp_path_factory.mktemp("base"))
  return model, folder, state_dict(model), json.loads((folder / "config.json").read_text())


def folder_with(tmp_path, base, *, config=None, tensors=None, raw_config=None) -> pathlib.Path:
  """A copy of the base checkpoint with its config.json and / or tensors replaced."""
  _, source, _, base_config = base
  tmp_path.mkdir(parents=True, exist_ok=True)
  if raw_config is not None:
    (tmp_path / "config.json").write_text(raw_config)
  else:
    (tmp_path / "config.json").write_text(json.dumps(base_config if config is None else config))
  if tensors is None:
    os.link(source / "model.safetensors", tmp_path / "model.safetensors")
  else:
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
  return tmp_path


# --- export -------------------------------------------------------------------------------

def test_checkpoint_shapes_match_what_export_writes(base):
  model, _, tensors, _ = base
  assert checkpoint_shapes(model.config) == {k: v.shape for k, v in tensors.items()}
  untied = random_model(1, tie=False)
  assert checkpoint_shapes(untied.config) == {k: v.shape
                                              for k, v in state_dict(untied).items()}


def test_export_over_a_sharded_checkpoint_loads_the_new_model(base, tmp_path):
  old, _, tensors, config = base
  folder = tmp_path / "ckpt"
  write_sharded(folder, tensors, config)
  (folder / "tokenizer.json").write_text("{}")           # the user's files stay
  (folder / "adapter_model.safetensors").write_bytes(b"not ours")
  (folder / "model_card.md").write_text("notes")
  assert_same(Qwen25VL.from_pretrained(folder), old)
  new = random_model(7)
  save_pretrained(new, folder)
  assert sorted(p.name for p in folder.iterdir()) == [
      "adapter_model.safetensors", "config.json", "model.safetensors", "model_card.md",
      "tokenizer.json"]  # the index and both shards are gone, no temporary files are left
  assert (folder / "adapter_model.safetensors").read_bytes() == b"not ours"
  again = Qwen25VL.from_pretrained(folder)
  assert_same(again, new)
  assert again.config == new.config
  mode = 0o666 & ~_umask()
  for name in ("config.json", "model.safetensors"):
    assert (folder / name).stat().st_mode & 0o777 == mode, name
  # Exporting over a single-file checkpoint replaces it too.
  save_pretrained(old, folder)
  assert_same(Qwen25VL.from_pretrained(folder), old)


def test_export_writes_the_config_of_the_model_not_a_stale_one(base, tmp_path):
  model, folder, _, _ = base
  loaded = Qwen25VL.from_pretrained(folder)
  assert loaded.config.raw  # the loaded config.json, rewritten as it was while it fits
  changed = dataclasses.replace(loaded.config, image_token_id=VOCAB - 1)
  pytest.importorskip("transformers")  # a changed config is written by config.to_hf()
  loaded.config = changed
  save_pretrained(loaded, tmp_path)
  assert Qwen25VLConfig.from_hf(tmp_path) == changed


def test_a_failed_export_never_leaves_a_model_that_loads_half_new(base, tmp_path, monkeypatch):
  old, _, _, _ = base
  folder = save_pretrained(old, tmp_path / "ckpt")
  real_replace = os.replace

  def crash_at_config(source, target):
    if pathlib.Path(target).name == "config.json":
      raise OSError("disk gone")
    return real_replace(source, target)

  monkeypatch.setattr(os, "replace", crash_at_config)
  with pytest.raises(OSError, match="disk gone"):
    save_pretrained(random_model(3), folder)
  monkeypatch.undo()
  # New weights are in place but config.json is not: the folder loads nothing.
  assert sorted(p.name for p in folder.iterdir()) == ["model.safetensors"]
  with pytest.raises(FileNotFoundError, match="config not found"):
    Qwen25VL.from_pretrained(folder)


def test_a_folder_with_both_layouts_is_refused(base, tmp_path):
  _, _, tensors, config = base
  write_sharded(tmp_path, tensors, config)
  save_file(tensors, str(tmp_path / "model.safetensors"))
  with pytest.raises(ModelFolderError, match="both model.safetensors and "
                                            "model.safetensors.index.json"):
    Qwen25VL.from_pretrained(tmp_path)


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


# --- tensors ------------------------------------------------------------------------------

KEY = "model.layers.1.mlp.up_proj.weight"
VISION_KEY = "visual.blocks.0.attn.qkv.bias"


@pytest.mark.parametrize("dtype", [np.bool_, np.int32, np.float64, np.int8])
def test_wrong_dtypes_are_refused(base, tmp_path, dtype):
  _, _, tensors, _ = base
  bad = dict(tensors, **{KEY: tensors[KEY].astype(dtype)})
  folder = folder_with(tmp_path, base, tensors=bad)
  message = (rf"model.safetensors: tensor '{KEY}': expected dtype float16, bfloat16 or "
             rf"float32, got {np.dtype(dtype).name}")
  with pytest.raises(ModelFolderError, match=message):
    Qwen25VL.from_pretrained(folder)
  text = nnx.eval_shape(lambda: TextModel(Qwen25VLConfig.tiny(VOCAB).text, rngs=nnx.Rngs(0)))
  with pytest.raises(ModelFolderError, match=message):  # the text loader on its own, too
    load_text_weights(text, folder)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_half_precision_tensors_load(base, tmp_path, dtype):
  _, _, tensors, _ = base
  half = {k: v.astype(dtype) for k, v in tensors.items()}
  model = Qwen25VL.from_pretrained(folder_with(tmp_path, base, tensors=half))
  np.testing.assert_array_equal(np.asarray(model.language_model.layers[1].mlp.up_proj.kernel[...]),
                                half[KEY].astype(np.float32).T)


def test_kernels_transposed_in_row_blocks_load_whole(base, tmp_path, monkeypatch):
  """A linear's kernel is transposed block by block as it is read (3 rows a block here,
  the last block short): every value lands in place, and a NaN in a later block is found."""
  _, _, tensors, _ = base
  rows, columns = tensors[KEY].shape
  monkeypatch.setattr(shards, "CHUNK_BYTES", 3 * columns * 4)
  assert rows % 3
  model = Qwen25VL.from_pretrained(folder_with(tmp_path / "whole", base))
  np.testing.assert_array_equal(np.asarray(model.language_model.layers[1].mlp.up_proj.kernel[...]),
                                tensors[KEY].T)
  bad = dict(tensors, **{KEY: tensors[KEY].copy()})
  bad[KEY][rows - 1, 2] = np.nan
  with pytest.raises(ModelFolderError, match=rf"tensor '{KEY}': expected finite values, got 1 "
                                            "NaN value"):
    Qwen25VL.from_pretrained(folder_with(tmp_path / "bad", base, tensors=bad))


@pytest.mark.parametrize("key,value,kind", [(KEY, np.nan, "NaN"), (KEY, -np.inf, "infinite"),
                                            (VISION_KEY, np.inf, "infinite"),
                                            (VISION_KEY, np.nan, "NaN")])
def test_nan_and_inf_are_refused(base, tmp_path, key, value, kind):
  _, _, tensors, _ = base
  bad = dict(tensors)
  bad[key] = tensors[key].copy()
  bad[key].reshape(-1)[3] = value
  with pytest.raises(ModelFolderError, match=rf"model.safetensors: tensor '{key}': expected "
                                            rf"finite values, got 1 {kind} value"):
    Qwen25VL.from_pretrained(folder_with(tmp_path, base, tensors=bad))


def test_values_beyond_the_parameter_dtype_are_refused(base, tmp_path):
  _, _, tensors, _ = base
  bad = dict(tensors)
  bad[KEY] = tensors[KEY].copy()
  bad[KEY][0, 0] = 1e5  # finite in float32, inf in float16
  folder = folder_with(tmp_path, base, tensors=bad)
  Qwen25VL.from_pretrained(folder)  # float32 parameters hold it
  with pytest.raises(ModelFolderError, match=rf"'{KEY}': expected finite values, got 1 "
                                            r"infinite value\(s\) after the cast to the "
                                            r"parameters' float16"):
    Qwen25VL.from_pretrained(folder, param_dtype=jnp.float16, dtype=jnp.float16)


def test_a_key_in_two_shards_is_refused(base, tmp_path):
  _, _, tensors, config = base
  write_sharded(tmp_path / "indexed", tensors, config)
  first = tmp_path / "indexed" / "model-00001-of-00002.safetensors"
  second = tmp_path / "indexed" / "model-00002-of-00002.safetensors"
  vision = {k: v for k, v in tensors.items() if k.startswith("visual.")}
  save_file(dict(vision, **{KEY: tensors[KEY] + 1}), str(second))  # and the index maps it
  with pytest.raises(ModelFolderError, match=rf"tensor '{KEY}' is stored twice: in "
                                            rf"model-00001-of-00002.safetensors and in "
                                            rf"model-00002-of-00002.safetensors"):
    Qwen25VL.from_pretrained(tmp_path / "indexed")
  # Without an index, in both layouts' names (model.layers.* and model.language_model.*).
  plain = tmp_path / "plain"
  plain.mkdir()
  (plain / "config.json").write_text(json.dumps(config))
  os.link(first, plain / "model-00001-of-00002.safetensors")
  renamed = "model.language_model." + KEY[len("model."):]
  save_file(dict(vision, **{renamed: tensors[KEY]}),
            str(plain / "model-00002-of-00002.safetensors"))
  with pytest.raises(ModelFolderError, match=rf"tensor '{renamed}' is stored twice: in "
                                            rf"model-00001-of-00002.safetensors \(as '{KEY}'\) "
                                            rf"and in model-00002-of-00002.safetensors"):
    Qwen25VL.from_pretrained(plain)


def test_both_key_layouts_load(base, tmp_path):
  model, _, tensors, _ = base
  renamed = {("model.language_model." + k[6:] if k.startswith("model.") else
              "model." + k if k.startswith("visual.") else k): v for k, v in tensors.items()}
  assert_same(Qwen25VL.from_pretrained(folder_with(tmp_path, base, tensors=renamed)), model)


# --- the index ----------------------------------------------------------------------------

def _indexed(tmp_path, base) -> pathlib.Path:
  _, _, tensors, config = base
  write_sharded(tmp_path, tensors, config)
  return tmp_path


def _set_index(folder, text):
  (folder / INDEX).write_text(text if isinstance(text, str) else json.dumps(text))


def _weight_map(folder):
  return json.loads((folder / INDEX).read_text())["weight_map"]


@pytest.mark.parametrize("name", ["/etc/passwd.safetensors", "../outside.safetensors",
                                  "shards/../../outside.safetensors", "C:\\x.safetensors"])
def test_index_paths_outside_the_folder_are_refused(base, tmp_path, name):
  folder = _indexed(tmp_path, base)
  weight_map = _weight_map(folder)
  weight_map[KEY] = name
  _set_index(folder, {"weight_map": weight_map})
  with pytest.raises(ModelFolderError, match=rf"{INDEX}: weight_map\['{KEY}'\]: expected a "
                                            r"path inside the checkpoint folder, got"):
    Qwen25VL.from_pretrained(folder)


@pytest.mark.parametrize("index,message", [
    ('{"weight_map": {"a": ', r"index.json: not valid JSON \(JSONDecodeError"),
    ("[1, 2]", r"index.json: expected a JSON object, got list"),
    ('{"metadata": {}}', r"index.json: weight_map: expected an object of tensor name -> "
                         r"shard file, got nothing \(the field is missing\)"),
    ('{"weight_map": ["model-00001-of-00002.safetensors"]}', r"weight_map: expected a "
                                                             r"non-empty object"),
    ('{"weight_map": {"lm_head.weight": 3}}', r"weight_map\['lm_head.weight'\]: expected a "
                                              r"\*.safetensors file name, got 3"),
])
def test_malformed_indexes_are_refused(base, tmp_path, index, message):
  folder = _indexed(tmp_path, base)
  _set_index(folder, index)
  with pytest.raises(ModelFolderError, match=message):
    Qwen25VL.from_pretrained(folder)


def test_index_and_shards_must_agree(base, tmp_path):
  folder = _indexed(tmp_path, base)
  weight_map = _weight_map(folder)
  weight_map[KEY] = "model-00002-of-00002.safetensors"
  _set_index(folder, {"weight_map": weight_map})
  with pytest.raises(ModelFolderError, match=rf"model-00001-of-00002.safetensors: holds tensor "
                                            rf"'{KEY}', which {INDEX} maps to "
                                            r"model-00002-of-00002.safetensors"):
    Qwen25VL.from_pretrained(folder)
  weight_map = _weight_map(_indexed(tmp_path, base))
  weight_map["model.layers.9.mlp.up_proj.weight"] = "model-00001-of-00002.safetensors"
  _set_index(folder, {"weight_map": weight_map})
  with pytest.raises(ModelFolderError, match=r"maps 1 tensor\(s\) that no shard holds"):
    Qwen25VL.from_pretrained(folder)
  weight_map["x"] = "model-00003-of-00003.safetensors"
  _set_index(folder, {"weight_map": weight_map})
  with pytest.raises(FileNotFoundError, match="names shard\\(s\\) that are missing"):
    Qwen25VL.from_pretrained(folder)


# --- config.json --------------------------------------------------------------------------

def _mutated(config, path, value):
  config = copy.deepcopy(config)
  *parents, leaf = path.split(".")
  node = config
  for part in parents:
    node = node[part]
  if value is MISSING:
    del node[leaf]
  else:
    node[leaf] = value
  return config


REFUSED = [
    ("text_config.hidden_act", "gelu",
     r"text_config.hidden_act: expected 'silu' or 'swish'.*got 'gelu'"),
    ("vision_config.hidden_act", "quick_gelu",
     r"vision_config.hidden_act: expected 'silu' or 'swish'.*got 'quick_gelu'"),
    ("text_config.rope_parameters.rope_type", "yarn",
     r"text_config.rope_parameters.rope_type: expected 'default' or 'mrope'.*got 'yarn'"),
    ("text_config.rope_scaling", {"type": "yarn", "factor": 4.0, "mrope_section": [2, 3, 3]},
     r"text_config.rope_scaling.type: expected 'default' or 'mrope'.*got 'yarn'"),
    ("text_config.layer_types", ["full_attention", "sliding_attention"],
     r"text_config.layer_types: expected 2 x 'full_attention'"),
    ("vision_config.fullatt_block_indexes", [1, 2],
     r"vision_config.fullatt_block_indexes: expected a list of block indexes in \[0, 1\] "
     r"\(depth 2\), got \[1, 2\]"),
    ("vision_config.fullatt_block_indexes", [-1],
     r"vision_config.fullatt_block_indexes: expected .*, got \[-1\]"),
    ("vision_config.window_size", 100,
     r"vision_config.window_size: expected a multiple of patch_size x spatial_merge_size = "
     r"28, got 100"),
    ("image_token_id", VOCAB, rf"image_token_id: expected an integer in \[0, {VOCAB - 1}\], "
                              rf"got {VOCAB}"),
    ("image_token_id", -1, r"image_token_id: expected an integer in \[0, 511\], got -1"),
    ("image_token_id", MISSING, r"image_token_id: expected an id in the vocabulary \[0, 511\] "
                                r"\(transformers' default 151655 lies outside it\)"),
    ("video_token_id", -1, r"video_token_id: expected an integer in \[0, \d+\], got -1"),
    ("text_config.rms_norm_eps", -1e-6,
     r"text_config.rms_norm_eps: expected a finite number > 0, got -1e-06 \(float\)"),
    ("text_config.rms_norm_eps", MISSING,
     r"text_config.rms_norm_eps: expected a finite number > 0, got nothing \(the field is "
     r"missing\)"),
    ("text_config.num_attention_heads", 0,
     r"text_config.num_attention_heads: expected an integer in \[1, \d+\], got 0 \(int\)"),
    ("text_config.num_key_value_heads", 3,
     r"text_config.num_key_value_heads: expected a divisor of num_attention_heads 4, got 3"),
    ("text_config.vocab_size", "512", r"text_config.vocab_size: expected an integer in "
                                      r"\[1, \d+\], got '512' \(str\)"),
    ("text_config.vocab_size", 512.0, r"text_config.vocab_size: expected an integer.*got "
                                      r"512.0 \(float\)"),
    ("text_config.tie_word_embeddings", "false",
     r"text_config.tie_word_embeddings: expected true or false, got 'false'"),
    ("text_config.rope_parameters.mrope_section", [2, 3, 4],
     r"text_config.rope_parameters.mrope_section: expected sections summing to head_dim / "
     r"2 = 8"),
    ("text_config.num_hidden_layers", 10 ** 12,
     r"text_config.num_hidden_layers: expected an integer in \[1, 10000\]"),
    ("vision_config.num_heads", 3, r"vision_config.num_heads: expected a divisor of "
                                   r"hidden_size 32, got 3"),
    ("vision_config", [], r"vision_config: expected an object, got \[\] \(list\)"),
]


@pytest.mark.parametrize("path,value,message", REFUSED,
                         ids=[f"{p}={v if v is not MISSING else 'missing'}"[:60]
                              for p, v, _ in REFUSED])
def test_config_fields_the_model_cannot_honour_are_refused(base, tmp_path, path, value,
                                                           message):
  _, _, _, config = base
  folder = folder_with(tmp_path, base, config=_mutated(config, path, value))
  with pytest.raises(ModelFolderError, match=str(folder / "config.json") + ": " + message):
    Qwen25VL.from_pretrained(folder)


def test_sliding_windows_are_refused_where_a_layer_would_slide(base, tmp_path):
  model, _, _, config = base
  sliding = _mutated(_mutated(config, "text_config.use_sliding_window", True),
                     "text_config.sliding_window", 64)
  sliding["text_config"].pop("layer_types")
  slides = _mutated(sliding, "text_config.max_window_layers", 1)
  with pytest.raises(ModelFolderError, match=r"text_config.use_sliding_window: expected false "
                                            r"\(sliding-window attention is not implemented; "
                                            r"with max_window_layers 1 layers 1 to 1 would "
                                            r"slide\), got True"):
    Qwen25VLConfig.from_hf(slides)
  # transformers slides no layer below max_window_layers (80 here): honoured as is.
  assert_same(Qwen25VL.from_pretrained(folder_with(tmp_path, base, config=sliding)), model)


@pytest.mark.parametrize("text,message", [
    ("[1, 2, 3]", r"expected a JSON object at the top level, got \[1, 2, 3\] \(list\)"),
    ('{"text_config": {', r"not valid JSON \(JSONDecodeError"),
    ("", r"not valid JSON"),
    ("[" * 100_000, r"not valid JSON \(RecursionError"),
])
def test_malformed_config_files_are_refused(base, tmp_path, text, message):
  folder = folder_with(tmp_path, base, raw_config=text)
  with pytest.raises(ModelFolderError, match=str(folder / "config.json") + ": " + message):
    Qwen25VL.from_pretrained(folder)


def test_truncated_and_corrupt_shards_are_refused(base, tmp_path):
  _, source, _, _ = base
  data = (source / "model.safetensors").read_bytes()
  for name, content in (("truncated", data[:len(data) - 100]), ("header", data[:40]),
                        ("empty", b""), ("garbage", b"\xff" * 64)):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text((source / "config.json").read_text())
    (folder / "model.safetensors").write_bytes(content)
    with pytest.raises(ModelFolderError, match=rf"{folder}/model.safetensors: not a readable "
                                              r"safetensors file"):
      Qwen25VL.from_pretrained(folder)


def test_zero_heads_in_a_text_config_built_by_hand():
  config = Qwen25VLConfig.tiny().text
  with pytest.raises(ValueError, match=r"TextConfig.num_attention_heads: expected an integer "
                                       r">= 1, got 0"):
    TextModel(dataclasses.replace(config, num_attention_heads=0), rngs=nnx.Rngs(0))


# --- the fuzz -----------------------------------------------------------------------------

CONFIG_FIELDS = [
    "text_config.vocab_size", "text_config.hidden_size", "text_config.intermediate_size",
    "text_config.num_hidden_layers", "text_config.num_attention_heads",
    "text_config.num_key_value_heads", "text_config.rms_norm_eps", "text_config.hidden_act",
    "text_config.rope_parameters", "text_config.rope_parameters.mrope_section",
    "text_config.rope_parameters.rope_theta", "text_config.rope_parameters.rope_type",
    "text_config.use_sliding_window", "text_config.layer_types",
    "text_config.tie_word_embeddings", "text_config", "vision_config",
    "vision_config.depth", "vision_config.hidden_size", "vision_config.intermediate_size",
    "vision_config.num_heads", "vision_config.out_hidden_size", "vision_config.in_channels",
    "vision_config.patch_size", "vision_config.temporal_patch_size",
    "vision_config.spatial_merge_size", "vision_config.window_size",
    "vision_config.fullatt_block_indexes", "vision_config.hidden_act",
    "vision_config.rope_parameters", "vision_config.rope_parameters.rope_theta",
    "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id",
    "tie_word_embeddings"]
WRONG_TYPES = ["12", 12.5, True, None, [], {}, "silu", [1, 2], [2, 3, 3]]
# Where these land on a field and are refused, the message names the field (None and {}
# mean 'absent' / 'defaults', whose refusal may instead name a tensor that no longer fits).
NAMED_TYPES = ["12", 12.5, True, [], "silu", [1, 2], [2, 3, 3]]
WRONG_VALUES = [-1, 0, 1, 3, 100, 2 ** 31, 10 ** 12, 2 ** 64, -1e-6, 1e308, float("nan"),
                float("inf"), MISSING]
DTYPES = [np.bool_, np.int32, np.int64, np.uint8, np.float64, np.float16, ml_dtypes.bfloat16]


class CaseTimeout(Exception):
  pass


def _on_alarm(signum, frame):
  raise CaseTimeout()


def _config_case(rng, config):
  path = CONFIG_FIELDS[rng.integers(len(CONFIG_FIELDS))]
  pool = WRONG_TYPES if rng.random() < 0.5 else WRONG_VALUES
  value = pool[rng.integers(len(pool))]
  try:
    return dict(config=_mutated(config, path, value)), (path, value)
  except (KeyError, TypeError):  # the parent was mutated away: mutate the parent instead
    return dict(config=_mutated(config, path.rsplit(".", 1)[0], value)), (path, value)


def _config_file_case(rng, config):
  text = json.dumps(config)
  kind = rng.integers(4)
  if kind == 0:
    text = text[:rng.integers(len(text))]
  elif kind == 1:
    position = rng.integers(len(text))
    text = text[:position] + chr(rng.integers(32, 127)) + text[position + 1:]
  elif kind == 2:
    text = json.dumps([config, 1][rng.integers(2):] if rng.random() < 0.5 else "config")
  else:
    text = bytes(rng.integers(0, 256, 64, dtype=np.uint8)).decode("latin-1")
  return dict(raw_config=text), None


def _tensor_case(rng, tensors):
  tensors = dict(tensors)
  keys = sorted(tensors)
  key = keys[rng.integers(len(keys))]
  value = tensors[key]
  kind = rng.integers(7)
  if kind == 0:
    tensors[key] = value.astype(DTYPES[rng.integers(len(DTYPES))])
  elif kind == 1:
    shapes = [value.T, value.reshape(-1)[:-1], value[None], np.float32(1.0),
              np.zeros((0,), np.float32), value.reshape(-1)]
    tensors[key] = np.ascontiguousarray(shapes[rng.integers(len(shapes))])
  elif kind == 2:
    bad = value.copy()
    bad.reshape(-1)[rng.integers(bad.size)] = [np.nan, np.inf, -np.inf][rng.integers(3)]
    tensors[key] = bad
  elif kind == 3:
    del tensors[key]
  elif kind == 4:
    tensors[["model.extra.weight", "visual.blocks.9.norm1.weight", "lm_head.weight",
             "model.layers.0.self_attn.rotary_emb.inv_freq"][rng.integers(4)]] = value
  elif kind == 5:
    tensors["model.language_model." + key[6:] if key.startswith("model.")
            else "model." + key] = value  # the same tensor under the other layout's name
  else:
    tensors[key] = (value * 10.0).astype(np.float32)  # a different, valid value: loads
  return dict(tensors=tensors), None


def _file_case(rng, data):
  kind = rng.integers(4)
  if kind == 0:
    return data[:rng.integers(len(data))]
  if kind == 1:  # a corrupted byte in the header (its length field and JSON)
    position = rng.integers(min(len(data), 2000))
    return data[:position] + bytes([rng.integers(256)]) + data[position + 1:]
  if kind == 2:
    return (rng.integers(2 ** 40, 2 ** 63)).tobytes() + data[8:]
  return bytes(rng.integers(0, 256, rng.integers(0, 200), dtype=np.uint8))


def _index_case(rng, folder):
  index = json.loads((folder / INDEX).read_text())
  weight_map = index["weight_map"]
  keys = sorted(weight_map)
  key = keys[rng.integers(len(keys))]
  kind = rng.integers(8)
  if kind == 0:
    return json.dumps(index)[:rng.integers(len(json.dumps(index)))]
  if kind == 1:
    del index["weight_map"]
  elif kind == 2:
    index["weight_map"] = [None, [], "x", 3, {}][rng.integers(5)]
  elif kind == 3:
    weight_map[key] = ["/tmp/model.safetensors", "../model-00001-of-00002.safetensors",
                       "a/../../b.safetensors", 7, None, "model-00009-of-00009.safetensors",
                       "config.json"][rng.integers(7)]
  elif kind == 4:
    weight_map[key] = ("model-00002-of-00002.safetensors"
                       if weight_map[key].startswith("model-00001")
                       else "model-00001-of-00002.safetensors")
  elif kind == 5:
    weight_map["model.layers.7.mlp.up_proj.weight"] = weight_map[key]
  elif kind == 6:
    del weight_map[key]  # the shard still holds it: transformers reads it too, so it loads
  else:
    return json.dumps([index])
  return json.dumps(index)


def test_fuzz_hostile_checkpoints_load_or_raise_a_named_error(base, tmp_path):
  """From a fixed seed, 300 mutated checkpoints: each loads, or raises ModelFolderError (or
  FileNotFoundError for a missing file) naming a file and, for a mistyped config field, the
  field; never another exception, never more than a few seconds."""
  _, source, tensors, config = base
  data = (source / "model.safetensors").read_bytes()
  sharded = tmp_path / "sharded"
  write_sharded(sharded, tensors, config)
  rng = np.random.default_rng(20240611)
  outcomes = {"loaded": 0, "refused": 0}
  previous = signal.signal(signal.SIGALRM, _on_alarm)
  slowest = 0.0
  try:
    for case in range(300):
      folder = tmp_path / f"case{case}"
      family = rng.choice(["config", "config", "config", "file", "tensor", "tensor", "shard",
                           "index"])
      field = None
      if family == "config":
        kwargs, field = _config_case(rng, config)
        folder_with(folder, base, **kwargs)
      elif family == "file":
        folder_with(folder, base, **_config_file_case(rng, config)[0])
      elif family == "tensor":
        folder_with(folder, base, **_tensor_case(rng, tensors)[0])
      elif family == "shard":
        folder_with(folder, base)
        (folder / "model.safetensors").unlink()
        (folder / "model.safetensors").write_bytes(_file_case(rng, data))
      else:
        folder.mkdir()
        for item in sharded.iterdir():
          if item.name != INDEX:
            os.link(item, folder / item.name)
        (folder / INDEX).write_text(_index_case(rng, sharded))
      start = time.perf_counter()
      signal.setitimer(signal.ITIMER_REAL, 20.0)
      try:
        Qwen25VL.from_pretrained(folder)
        outcomes["loaded"] += 1
      except (ModelFolderError, FileNotFoundError) as error:
        outcomes["refused"] += 1
        message = str(error)
        assert str(folder) in message or "config.json" in message, (case, family, message)
        if field is not None and any(field[1] is value for value in NAMED_TYPES):
          leaf = field[0].rsplit(".", 1)[-1]
          assert leaf in message, (case, field, message)
      except CaseTimeout:
        pytest.fail(f"case {case} ({family}, {field}) ran past 20 s")
      except Exception as error:  # pylint: disable=broad-except
        pytest.fail(f"case {case} ({family}, {field}): {type(error).__name__}: {error}")
      finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
      slowest = max(slowest, time.perf_counter() - start)
  finally:
    signal.signal(signal.SIGALRM, previous)
  assert outcomes["loaded"] > 10 and outcomes["refused"] > 150, outcomes
  assert slowest < 10.0, slowest
