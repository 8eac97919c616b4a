r"""Models: the policy interface and its three families (Qwen2.5-VL in qwen2_5_vl/, Qwen3-VL
in qwen3_vl/, Qwen3.5 in qwen3_5/) on one base (hf/, layers, decoder, vision, rope,
preprocess, qwen_vl), the sampler, LoRA adapters, sharding rules, 3DThinker's latent block
and 3D projector; the dtype policy, attention implementations, memory estimates.

Modules:
- attention.py: prefill / training attention by name ("auto": cuDNN flash attention on GPU in
  bf16 via jax.nn.dot_product_attention, "einsum" elsewhere; "xla"); decode always takes the
  einsum path over the cache
- precision.py: the dtype policy (Precision: compute / parameter / KV-cache dtypes from a
  config's model block; training refuses bf16 parameters; `model_options` -> Qwen25VL keywords
  incl. attention and remat)
- memory.py: the per-device memory estimate printed at a job's start (parameters, gradients,
  AdamW state, the decode cache as the family's init_cache builds it, activations; remat, micro-
  batches, mesh) against the device's memory
- shapes.py: the released policies' shapes (PUBLISHED: Qwen3.5-9B, Qwen3-VL-4B / 8B,
  Qwen2.5-VL-3B / 7B; published_config, with_layers): random policies of a paper's size
- chat.py: ChatFormat (a checkpoint's chat template -> the reply prefill, a Thinking model's
  "<think>\n"; generation_config.json -> stop ids)
- policy.py: the policy interface every family implements (vision_inputs, image_grid /
  image_tokens, encode_images -> VisionOutput (tokens, DeepStack features), decoder_inputs ->
  (embeds, residuals), position_ids, the decoder's init_cache / extend / hidden_states / logits
  over a per-layer cache pytree the family owns), FAMILIES (config.json model_type -> class),
  load_model / load_policy (family from the folder), export
- sampler.py (prefill / prefill_shared (one prefix for every row) / repeat_rows (a group's
  prompt prefilled once, its cache repeated) / append (left-padded, or
  right-padded with `real_length`: the next write goes over the padding) / decode: greedy,
  temperature, top-k, top-p, Hugging Face's repetition penalty, 3DThinker's latent mode feeding
  final hidden states back under jit; the first positions' hidden states): written against the
  policy interface, any family
- hf/ (the Hugging Face side every family shares: fields.py (config.json fields with named
  `ModelFolderError`s: file, field, expected, got), config.py (the config parsing and checks the
  families share, transformers' dicts), shards.py (the safetensors index, streaming shards,
  dtype checks, NaN / Inf refused per tensor), names.py (the HF key <-> parameter path name map
  and the Qwen decoder / attention rows), load.py (`load_weights`: every tensor once, straight
  onto the mesh, nothing left random), export.py (`state_dict`, `config_dict`, `write_folder`:
  any family's atomic HF-folder writer))
- layers.py (linear with logical axes, RMSNorm (zero-centred for Qwen3.5), MLP, Attention (biases,
  QK-norm, Qwen3.5's output gate, partial rotary as options), DecoderLayer, remat_call, tied
  logits), decoder.py (TextDecoder: the decoder loop, its KV cache, float32 logits), vision.py
  (VisionOutput, Grids, Segments, VisionAttention inside packed windows / frames, VisionBlock),
  rope.py (M-RoPE: rope_index = get_rope_index on device, text positions), preprocess.py (smart
  resize + patchify on device, batched vision inputs), qwen_vl.py (QwenVLMethods: construction,
  from_pretrained, image token counts, positions and the forward the Qwen-VL families share;
  place_at_image_tokens)
- qwen2_5_vl/: what Qwen2.5-VL has of its own: config.py (from config.json; tiny()), text.py
  (GQA with biases, sectioned M-RoPE), vision.py (windowed ViT, 2-D rope, patch merger),
  hf_params.py (its name map rows), model.py (Qwen25VL), tokenizer.py (local BPE training,
  processor save / load), a two-line export
- qwen3_vl/: Qwen3-VL (dense): config.py (head_dim a field, interleaved M-RoPE, DeepStack
  indexes; the processor's pixel bounds), text.py (QK-norm, DeepStack residuals after the first
  layers), vision.py (learned position table interpolated to each grid, LayerNorm blocks, one
  DeepStack merger per index), rope.py (interleaved M-RoPE), hf_params.py, preprocess.py. What
  transformers ignores is refused (mrope_interleaved false, sliding windows, attention dropout,
  repeated DeepStack indexes)
- qwen3_5/: Qwen3.5 (dense; Act3D's family): Qwen3-VL's vision encoder without DeepStack, a
  hybrid decoder (`layer_types`: Gated DeltaNet or gated full attention). delta_rule.py: the
  gated delta rule `chunked` (UT transform per 64-token chunk, inverted by six matmul
  doublings, `lax.scan` across chunks; prefill and training) and `recurrent` (`lax.scan` over
  tokens; decode), float32 at HIGHEST precision; `causal_conv` over valid tokens only; invalid
  tokens are the identity on the state, so a trajectory with holes recomputes what the rollout
  sampled. text.py (GatedAttention, GatedDeltaNet, the hybrid cache), config.py, hf_params.py
  (`mtp.*` skipped), model.py
- sharding.py: logical axis names -> mesh ('data', 'fsdp', 'tensor'), one RULES table; `place`:
  checkpoint tensors load straight onto the mesh; `global_batch` (each process's rows -> global
  arrays), `local_rows`, `HostRows` (a trajectory's local rows, each field copied when first
  read: what recipes hand an agent's host reward)
- lora.py: apply_lora / merge_lora (nnx.LoRAParam adapters, alpha / r, dropout; under a mesh
  sharded like their base kernels; "lm_head" adapts a tied head, `LoRATiedHead`; `linear_names`;
  `untie_adapted_head`: a tied head's adapter as an untied head, for export)
- policy_folder.py: `write_policy_folder` (a whole Hugging Face policy folder: the family's
  save_pretrained after merging adapters, the tokenizer, the processor, the source folder's
  processor / chat template / generation config carried over, `qwen_chat_template(prefill)` when
  there is none, generation_config.json from the ChatFormat's stops, jaxspatial_export.json;
  staged in a hidden sibling, files 0644, then renamed in; `check_target`)
- reading_jit.py: `reading_jit`, `jax.jit` of a program that reads a model, the module passed
  as a pytree (a rollout call's host cost 61 -> 11 ms on a 3B-shaped graph)
- projector3d.py: 3DThinker's 3D projector (sharded like the model), torch weight loading, the
  alignment loss
- latent3d.py: 3DThinker's latent tokens, <output_3D> expansion, embedding growth,
  Thinker3DPolicy (model + projector; teacher-forced pass, image-token rows, training-mode
  latent positions)
"""

from jaxspatial.models import memory, shapes
from jaxspatial.models.attention import IMPLEMENTATIONS as ATTENTION_IMPLEMENTATIONS
from jaxspatial.models.attention import attention, resolve as resolve_attention

from jaxspatial.models.latent3d import (Thinker3DPolicy, add_latent_tokens, expand_output_3d,
                                        grow_embeddings, image_token_rows, latent_label_mask,
                                        latent_positions)
from jaxspatial.models.lora import (LoRALinear, LoRATiedHead, apply_lora, linear_names, merge_lora,
                                   untie_adapted_head)
from jaxspatial.models.projector3d import (TINY, Projector3D, Projector3DConfig,
                                           alignment_loss, load_torch_state_dict, stage1_loss)
from jaxspatial.models.chat import ChatFormat, chat_format
from jaxspatial.models.memory import MemoryEstimate
from jaxspatial.models.policy import (FAMILIES, VisionOutput, export, load_model, load_policy,
                                      model_type, policy_class)
from jaxspatial.models.sampler import (DecodeState, Generation, SamplingConfig, append, decode,
                                       generate, prefill, repeat_rows)
from jaxspatial.models.precision import Precision, model_options
from jaxspatial.models.reading_jit import reading_jit
from jaxspatial.models.sharding import RULES, logical_init, make_mesh, mesh_axes

__all__ = ["FAMILIES", "ChatFormat", "DecodeState", "Generation", "SamplingConfig", "VisionOutput", "append",
           "chat_format", "decode", "export", "generate", "load_model", "load_policy", "model_type",
           "policy_class", "prefill", "repeat_rows", "ATTENTION_IMPLEMENTATIONS", "MemoryEstimate", "Precision", "attention", "memory", "shapes",
           "model_options", "resolve_attention", "RULES", "TINY", "LoRALinear", "LoRATiedHead",
           "Projector3D", "Projector3DConfig", "Thinker3DPolicy",
           "add_latent_tokens", "alignment_loss", "apply_lora", "expand_output_3d",
           "grow_embeddings", "image_token_rows", "latent_label_mask", "latent_positions",
           "linear_names", "load_torch_state_dict", "logical_init", "make_mesh", "merge_lora",
           "mesh_axes", "reading_jit", "stage1_loss", "untie_adapted_head"]
