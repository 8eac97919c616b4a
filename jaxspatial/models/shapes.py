"""The published policies' shapes, for random policies of a paper's size without its
weights (memory planning, profiling, the device suite).

    config = published_config("Qwen3-VL-4B")          # Qwen3VLConfig of the 4B checkpoint
    config = with_layers(config, 18)                  # the same widths, 18 decoder layers

Each entry is the config.json of the released checkpoint (text and vision towers; the
special token ids are the family's defaults), as its family's config class reads it.
"""

from __future__ import annotations

import dataclasses

# name -> (family, text fields, vision fields); unnamed fields: the family's defaults
# (transformers' config classes), which are themselves one of these checkpoints.
_PUBLISHED = {
    # Act3D's policy (paper section 4.1); the defaults of Qwen3_5TextConfig
    "Qwen3.5-9B": ("qwen3_5", {}, {}),
    # Think3D-RL's (think3d.md: Qwen3-VL-4B, the LLM fully fine-tuned, vision frozen)
    "Qwen3-VL-4B": ("qwen3_vl",
                    dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                         rope_theta=5_000_000.0, tie_word_embeddings=True),
                    dict(depth=24, hidden_size=1024, intermediate_size=4096,
                         out_hidden_size=2560, deepstack_visual_indexes=(5, 11, 17))),
    # PERIA's (peria.md: SFT from Qwen3-VL-8B-Thinking)
    "Qwen3-VL-8B": ("qwen3_vl",
                    dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                         rope_theta=5_000_000.0, tie_word_embeddings=False),
                    dict(out_hidden_size=4096)),
    # 3DThinker's (Qwen2.5-VL-3B-Instruct): the Qwen2.5-VL config classes' defaults
    "Qwen2.5-VL-3B": ("qwen2_5_vl", {}, {}),
    "Qwen2.5-VL-7B": ("qwen2_5_vl",
                      dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                           num_hidden_layers=28, num_attention_heads=28,
                           num_key_value_heads=4, tie_word_embeddings=False),
                      dict(out_hidden_size=3584)),
}
PUBLISHED = tuple(_PUBLISHED)


def published_family(name: str) -> str:
  return _entry(name)[0]


def published_config(name: str):
  """The family's config (`Qwen25VLConfig`, `Qwen3VLConfig`, `Qwen35Config`) of the
  released checkpoint `name` (one of `PUBLISHED`)."""
  from jaxspatial.models.policy import policy_class  # pylint: disable=import-outside-toplevel
  family, text, vision = _entry(name)
  base = policy_class(family).config_class()
  config = dataclasses.replace(base, text=dataclasses.replace(base.text, **text),
                               vision=dataclasses.replace(base.vision, **vision))
  config.text.check()
  return config


def with_layers(config, layers: int):
  """`config` with `layers` decoder layers (the same widths; Qwen3.5's layer pattern, every
  fourth layer full attention, recomputed). The vision tower is unchanged."""
  text = config.text
  if not 0 < layers:
    raise ValueError(f"with_layers: layers must be positive, got {layers}")
  fields = dict(num_hidden_layers=layers)
  if hasattr(text, "layer_types"):
    from jaxspatial.models.qwen3_5.config import default_layer_types  # pylint: disable=import-outside-toplevel
    fields["layer_types"] = default_layer_types(layers)
  deepstack = getattr(config.vision, "deepstack_visual_indexes", ())
  if len(deepstack) > layers:  # each DeepStack feature is added to one of the first layers
    raise ValueError(f"with_layers: {layers} layers, fewer than the {len(deepstack)} "
                     f"DeepStack features the vision tower adds to the first layers")
  return dataclasses.replace(config, text=dataclasses.replace(text, **fields))


def _entry(name: str):
  if name not in _PUBLISHED:
    raise ValueError(f"unknown published policy {name!r}; expected one of {PUBLISHED}")
  return _PUBLISHED[name]
