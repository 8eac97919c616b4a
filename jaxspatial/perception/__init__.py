"""Perception models outside the compiled program, as host callbacks: the host-tool
wrapper (`HostTool`, `TextTool`: fixed shapes, one call per batch, timeouts, retries,
failure flags, statistics); OCR (PP-OCRv4, PaddleOCR-VL), SAM 3, GroundingDINO and Depth
Anything backends with PERIA's tools (`TOOLS`: the twelve by public name); reconstruction
adapters with Think3D's fusion; the HTTP tool service; LLM judges; VGGT features."""

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
