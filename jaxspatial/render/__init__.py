"""The jit-compiled point-splatting renderer (z-buffer by int32 scatter-min)."""

from jaxspatial.render.splat import Rendered, render, render_batch

__all__ = ["Rendered", "render", "render_batch"]
