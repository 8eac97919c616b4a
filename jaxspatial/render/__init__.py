"""The jit-compiled point-splatting renderer (z-buffer by int32 scatter-min), and marks
drawn into its images (lines, discs, bitmap text, camera markers).

Modules:
- splat.py: render / render_batch, the z-buffer renderer (jit, vmap rule)
- numpy_reference.py: Think3D's numpy renderer (baseline, host envs)
- contact_sheet.py: tiles views, depth and instance maps into a PNG
- markers.py: lines, discs, bitmap text and camera markers drawn into images (jit / vmap;
  Think3D's global views)

**The renderer.** `render(cloud, camera, H, W, splat_radius, background, point_radius=None,
footprint="square")` returns `Rendered(rgb, depth, point_index, instance)`; empty pixels have
depth 0, index -1, instance -1 and the background colour. Nearest point wins, ties go to the
lower point index, so results are deterministic on every backend. How:
1. Scatter-min of the int32 bits of positive float depth (they order like the floats) into a
   z-buffer at each point's centre pixel; a second scatter-min of point indices over the
   points equal to the buffer picks the lowest index among ties. No 64-bit mode. Invalid
   points go to a sentinel slot, never index -1. Never a scatter-set on repeated indices.
2. Footprints are a lexicographic (depth, index) min filter over the centre buffers (a square
   of radius r covers p iff p's square covers the centre), a variadic `reduce_window`, so its
   cost does not grow with the number of points. Buffers are padded by r so points just
   outside the image still draw into it. A disc is a union of rectangles.
3. `point_radius` (world units) gives each point the pixel radius
   `clip(round(fx * point_radius / z), 0, splat_radius)`; points of radius k go to layer k
   of the centre buffer (one scatter for all layers), each layer filtered with its radius.
4. Under `jax.vmap` a `custom_vmap` rule folds the batch into the renderer's view axis
   (nested vmaps fold again). On CPU the views then run one after another (a z-buffer per
   view stays in cache); elsewhere as one flat scatter over all views, split into
   sequential groups when the buffer would pass `MAX_SCATTER_SLOTS` (2^28 int32 slots).
   The renderer is not differentiable (integer z-buffer); nothing needs its gradient.
5. Refused before tracing (concrete values): `near <= 0`, a field of view outside (0, 180)
   degrees, non-finite or non-rigid cameras, `splat_radius > MAX_SPLAT_RADIUS` (64), buffers
   past `MAX_VIEW_SLOTS` (2^28 per view). On device a point needs positive depth whatever
   `near` says. `RolloutConfig` refuses a temperature in (0, 1e-3) (the logits overflow) and
   `check_turn_budget` a `max_turn_tokens` below the grammar's shortest turn in tokens
   (`automaton.min_turn_tokens`).
XLA:CPU notes that shaped this: a `[P,3] x [3,3]` dot is 10x slower than multiply-adds;
shifted-slice min filters get fused into a loop that recomputes shared minima; with a view
axis of size 1 XLA recomputed the projection, so single views take a scalar-camera path.
"""

from jaxspatial.render.markers import CameraMarkerStyle, draw_cameras
from jaxspatial.render.splat import Rendered, render, render_batch

__all__ = ["CameraMarkerStyle", "Rendered", "draw_cameras", "render", "render_batch"]
