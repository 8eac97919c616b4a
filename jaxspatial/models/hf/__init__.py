"""Hugging Face folders for every model family: config-field reading with named errors
(fields, config), safetensors streaming (shards), the checkpoint-key <-> parameter name map
(names), loading through it (load) and export (export). Every refusal is a
`jaxspatial.errors.ModelFolderError` naming the file and the field or tensor."""

from jaxspatial.models.hf.export import config_dict, stale_files, state_dict, write_folder
from jaxspatial.models.hf.fields import (MAX_DIM, MAX_LAYERS, MISSING, Fields, is_number,
                                         read_json, rope_theta, show)
from jaxspatial.models.hf.load import load_weights
from jaxspatial.models.hf.names import (Shapes, Targets, attention_shapes, attention_targets,
                                        canonical_key, checked_targets, decoder_shapes,
                                        decoder_targets, from_param, hf_key, linear_shape,
                                        linear_target, to_param, torch_shape)
from jaxspatial.models.hf.shards import (ACCEPTED_DTYPES, INDEX, SINGLE, TensorInfo,
                                         open_shard, read_tensor, safetensors_files, scan,
                                         weight_map)

__all__ = ["ACCEPTED_DTYPES", "Fields", "INDEX", "MAX_DIM", "MAX_LAYERS", "MISSING", "SINGLE",
           "Shapes", "Targets", "TensorInfo", "attention_shapes", "attention_targets",
           "canonical_key", "checked_targets", "config_dict", "decoder_shapes",
           "decoder_targets", "from_param", "hf_key", "is_number", "linear_shape",
           "linear_target", "load_weights", "open_shard", "read_json", "read_tensor",
           "rope_theta", "safetensors_files", "scan", "show", "stale_files", "state_dict",
           "to_param", "torch_shape", "weight_map", "write_folder"]
