r"""Perception models outside the compiled program, as host callbacks: the host-tool
wrapper (`HostTool`, `TextTool`: fixed shapes, one call per batch, timeouts, retries,
failure flags, statistics); OCR (PP-OCRv4, PaddleOCR-VL), SAM 3, GroundingDINO and Depth
Anything backends with PERIA's tools (`TOOLS`: the twelve by public name); reconstruction
adapters with Think3D's fusion; the HTTP tool service; LLM judges; VGGT features.

Modules:
- host_tool.py: HostTool (a host function over numpy batches with declared per-example output
  shapes, through pure_callback: one host call per batch under vmap, under a mesh too; timeout,
  retries, on_error "raise" (a ToolError naming the tool, the input shapes, the cause) or "flag"
  (zeros + `failed`); stats() per tool), TextTool (image + optional 0-1000 box + the model's
  text argument, its bytes and the index of its key in `text_keys` ("text_prompt", "question"),
  decoded as UTF-8 with replacement and passed as that keyword -> observation text, tokenised as
  text into `max_tokens` ids + mask; a raising backend becomes "Error executing {tool}: tool
  failed: ..."; `arguments` / `optional`: its public arguments for the prompt)
- tool_args.py: model-written tool arguments (PERIA's 0-1000 box as a list or "\\boxed{...}",
  images) -> checked values or error text, shared by the tools
- ocr.py: PP-OCRv4 through rapidocr-onnxruntime (weights in the wheel), PERIA's OCR tools
  (text_ocr, formula_ocr, table_ocr, text_spotting, map_text_ocr) -> "Tool executed
  successfully.\nResult: {json}";
- paddleocr_vl.py: PaddleOCR-VL (transformers; "OCR:", "Table Recognition:", "Formula
  Recognition:", "Chart Recognition:", greedy) as a recognising backend
- segmentation.py: SAM 3 through transformers as PERIA's six SAM tools (auto / bbox / text /
  exemplar segment, concept_count, presence_check; score 0.25, presence 0.1, 20 proposals),
  `segment_padded` for a HostTool; SAM 3's preprocessing and a torch roi_align where torchvision
  is absent
- detection.py: GroundingDINO (`grounding_dino`: box and text 0.25, NMS 0.8, 20 boxes),
  `detect_padded`; depth.py: Depth Anything (relative inverse or metric depth as its config
  says), points_from_depth (OpenCV axes, through geometry.unproject_depth)
- fusion.py: Think3D's fusion rules (Pi3: sigmoid conf > 0.06 and no depth edge (rtol 0.02);
  VGGT: conf >= its 50th percentile; squared Mahalanobis mean + 3 std; stride cap 1.5M (VGGT
  500k); VGGT pose encoding -> c2w);
- reconstruction.py: Pi3 / VGGT / Depth-Anything-3 adapters -> Reconstruction (PointCloud,
  OpenCV c2w cameras, padded host outputs, Morton-ordered, of the first `count` frames;
  `reconstruction_tool`: a HostTool for online use inside a rollout); `reconstruct(frames,
  backend=, checkpoint=)` -> (padded Morton-ordered PointCloud, Camera [N] with intrinsics
  mapped back to the frames' size; Pi3's fitted to its local points; a backend without
  intrinsics is an error); named backends loaded once per checkpoint (`load_reconstructor`), or
  any object with `reconstruct(frames, **options)`; Pi3 frames in BGR (what Think3D's caches
  were made with), VGGT's poses properly inverted (no x flip; `mirror_x` reproduces the code's)
- tools.py: TOOLS, PERIA's twelve perception tools by public name (families ocr, sam3,
  grounding_dino; public argument names): `tool(image, **args)` -> the JSON dict ({"error":
  text} for a bad model-written argument), `.text` (the observation text), `.bind(folder or
  backend)` (SAM 3 / GroundingDINO need a folder, else $JAXSPATIAL_{FAMILY}_MODEL; a missing one
  is a ModelFolderError naming the tool, the family and the ways to give it; backends loaded
  once per folder), `.host_tool` (a TextTool for jit, with its public arguments); `select`
  (names or families -> tools)
- wire.py (the numpy wire format of tool requests and replies; `describe_inputs`, `excerpt`),
  client.py (RemoteTool: timeouts, bounded retries of 5xx and transport errors, a total
  deadline, named errors; `http_request`, `health`, `wait_healthy`, `remote_tools`), server.py
  (ToolServer: a Starlette app on uvicorn (jaxspatial/web.py's BackgroundServer, as the chat
  server), POST /tools/{name}, GET /health, /stats; each call on a worker thread,
  `max_concurrent` at once; 400 for the caller's mistakes (a tool raising ValueError /
  TypeError refused its inputs), 500 with the exception's type and message, the traceback only
  in the server's log), service.py (the registry: TOOL_FACTORIES (echo, empty and the tool
  families, each `factory(folder)`) and build_tools (families or tool names + model folders),
  what launch/perception_server.py serves)
- judge.py: LLM judges through an OpenAI-compatible endpoint (ChatEndpoint: concurrency,
  retries, a request budget, the key from an environment variable (default "auto":
  $OPENAI_API_KEY to api.openai.com only, `key_variable`); EndpointError names the failing
  endpoint by its role ("policy endpoint", "judge endpoint"); `complete_each` reports each reply
  or failure as it ends; ChatReply carries reasoning, usage and seconds); LLMJudge with Act3D's
  training / evaluation presets, PERIA's fallback and HR-Bench's yes / no scorer;
  `judge_verdict`, the one verdict rule; the rollout's host-judge signature)
- policy_judge.py: PolicyJudge, a jaxspatial policy as the judge inside the compiled rollout
  (the same JudgePrompt assembled on device: static pieces of the chat template tokenised once,
  the fields as single-byte tokens, one_line-normalised, references packed; the system prompt
  prefilled once per batch (`sampler.prefill_shared`), then each case; generation by
  models.sampler; the verdict read from the reply's bytes by `judge_verdict`'s rule
  (`reply_reading` -> correct, unreadable); `stats()` counts the host calls' verdicts; `state()`
  is the program's argument)
- judges.py: make_judge(block, preset) (url -> LLMJudge, checkpoint -> PolicyJudge, neither ->
  None: the rule judge; PRESETS act3d_training / act3d_eval / peria), make_endpoint
- vggt.py: VGGT's frame preprocessing and token counts, VGGTExtractor (host; frames resized to
  480 x 640 first, `vggt_frames`), features_in_jit (a host extractor through pure_callback)
"""

from jaxspatial.perception import fusion, ocr
from jaxspatial.perception.host_tool import HostTool, TextTool, ToolError, encode_text
from jaxspatial.perception.depth import DepthBackend, points_from_depth
from jaxspatial.perception.detection import DetectionConfig, GroundingDinoBackend
from jaxspatial.perception.ocr import RapidOCRBackend, TextLine
from jaxspatial.perception.paddleocr_vl import PaddleOCRVLBackend
from jaxspatial.perception.reconstruction import (DepthAnything3Reconstructor, Pi3Reconstructor,
                                                  Reconstruction, VGGTReconstructor,
                                                  load_reconstructor, reconstruct,
                                                  reconstruction_tool)
from jaxspatial.perception.judge import (ChatEndpoint, EndpointError, LLMJudge, act3d_eval_judge,
                                         act3d_training_judge, peria_fallback_judge)
from jaxspatial.perception.judges import make_endpoint, make_judge
from jaxspatial.perception.policy_judge import PolicyJudge
from jaxspatial.perception.segmentation import SAM3_TOOLS, SAM3Backend, SegmentationConfig
from jaxspatial.perception.client import RemoteTool, remote_tools, wait_healthy
from jaxspatial.perception.server import ToolServer
from jaxspatial.perception.service import TOOL_FACTORIES, build_tools
from jaxspatial.perception.tools import TOOLS, ModelFolderError, PerceptionTool

from jaxspatial.perception.vggt import (VGGT_FRAME_SIZE, VGGT_PATCH, VGGT_SPECIAL_TOKENS,
                                        VGGTExtractor, features_in_jit, resize_frames,
                                        vggt_frames, vggt_input_size, vggt_preprocess,
                                        vggt_tokens)

__all__ = ["PolicyJudge", "make_endpoint", "make_judge", "DepthBackend", "DetectionConfig", "GroundingDinoBackend", "PaddleOCRVLBackend",
           "SAM3Backend", "SAM3_TOOLS", "SegmentationConfig", "points_from_depth",
           "DepthAnything3Reconstructor", "Pi3Reconstructor", "RapidOCRBackend",
           "Reconstruction", "TextLine", "VGGTReconstructor", "fusion", "ocr",
           "reconstruction_tool", "reconstruct", "load_reconstructor", "ChatEndpoint", "HostTool", "EndpointError", "LLMJudge", "RemoteTool", "TOOL_FACTORIES",
           "TextTool", "ToolError", "ToolServer", "act3d_eval_judge", "act3d_training_judge",
           "build_tools", "encode_text", "TOOLS", "ModelFolderError", "PerceptionTool", "peria_fallback_judge", "remote_tools", "wait_healthy", "VGGT_FRAME_SIZE", "VGGT_PATCH", "VGGT_SPECIAL_TOKENS", "VGGTExtractor",
           "features_in_jit", "resize_frames", "vggt_frames", "vggt_input_size",
           "vggt_preprocess", "vggt_tokens"]
