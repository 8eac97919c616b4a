"""Perception models outside the compiled program, as host callbacks: VGGT features (more in
issue 20)."""

from jaxspatial.perception.vggt import (VGGT_FRAME_SIZE, VGGT_PATCH, VGGT_SPECIAL_TOKENS,
                                        VGGTExtractor, features_in_jit, resize_frames,
                                        vggt_frames, vggt_input_size, vggt_preprocess,
                                        vggt_tokens)

__all__ = ["VGGT_FRAME_SIZE", "VGGT_PATCH", "VGGT_SPECIAL_TOKENS", "VGGTExtractor",
           "features_in_jit", "resize_frames", "vggt_frames", "vggt_input_size",
           "vggt_preprocess", "vggt_tokens"]
