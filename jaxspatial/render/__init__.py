"""The jit-compiled point-splatting renderer (z-buffer by int32 scatter-min), and marks
drawn into its images (lines, discs, bitmap text, camera markers)."""

from jaxspatial.render.markers import CameraMarkerStyle, draw_cameras
from jaxspatial.render.splat import Rendered, render, render_batch

__all__ = ["CameraMarkerStyle", "Rendered", "draw_cameras", "render", "render_batch"]
