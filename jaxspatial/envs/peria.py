"""PERIA's image workspace as a pure environment: the episode's running image list, an
interaction tool applied to one of its images, the result appended as the next image.

  reset(key, task, params) -> (obs, state)       image 0: the task's initial view
  step(key, state, action, params) -> (obs, state, reward, done, info)

PERIA's own tasks are images (charts, maps, documents); here image 0 is a render of the
task's scene from its initial camera, so the synthetic 3D tasks serve this agent too.
Tools take a box in [0, scale] coordinates (Qwen-VL grounding: 1000), as in the paper's
`image_crop` example; `draw_line` joins the box's corners (x0, y0) and (x1, y1). A crop is
resized back to the observation size (static shapes). A call is invalid, and changes
nothing, when its image index is not in the list, the list is full, or the tool rejects
its box (`jaxspatial.envs.image_tools`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxspatial.envs import image_tools
from jaxspatial.envs.task import Task
from jaxspatial.geometry import Camera
from jaxspatial.render import render

Array = jax.Array
TOOLS = ("image_crop", "draw_line", "bounding_box", "image_highlight")
TOOL, STOP = 0, 1


@struct.dataclass
class PeriaParams:
  """Static configuration."""

  width: int = struct.field(pytree_node=False, default=640)
  height: int = struct.field(pytree_node=False, default=480)
  hfov_deg: float = struct.field(pytree_node=False, default=90.0)
  max_images: int = struct.field(pytree_node=False, default=8)
  max_turns: int = struct.field(pytree_node=False, default=10)   # the public script's T
  scale: float = struct.field(pytree_node=False, default=1000.0)
  splat_radius: int = struct.field(pytree_node=False, default=1)
  point_radius: float | None = struct.field(pytree_node=False, default=None)
  background: tuple[int, int, int] = struct.field(pytree_node=False, default=(255, 255, 255))


@struct.dataclass
class PeriaAction:
  kind: Array        # TOOL or STOP
  tool: Array        # index into TOOLS
  image: Array       # index into the image list
  box_4: Array       # x0, y0, x1, y1 in [0, scale]

  @classmethod
  def create(cls, kind, tool=0, image=0, box=(0, 0, 0, 0)) -> "PeriaAction":
    return cls(kind=jnp.asarray(kind, jnp.int32), tool=jnp.asarray(tool, jnp.int32),
               image=jnp.asarray(image, jnp.int32), box_4=jnp.asarray(box, jnp.float32))


@struct.dataclass
class PeriaObservation:
  image: Array       # [H, W, 3] uint8: the tool's result (the source image when invalid)
  index: Array       # its index in the image list (-1 when the call was invalid)


@struct.dataclass
class PeriaState:
  task: Task
  images: Array      # [max_images, H, W, 3] uint8
  count: Array       # images in the list
  calls: Array       # tool calls made (valid or not): a truncated episode still acted
  done: Array


def apply_tool(image: Array, tool: Array, box_4: Array, params: PeriaParams):
  """(new image, valid) of TOOLS[tool] on one image."""
  scale = params.scale
  branches = (
      lambda b: image_tools.image_crop(image, b, params.height, params.width, scale=scale),
      lambda b: image_tools.draw_line(image, b[:2], b[2:], scale=scale),
      lambda b: image_tools.bounding_box(image, b, scale=scale),
      lambda b: image_tools.image_highlight(image, b, scale=scale),
  )
  new, valid = jax.lax.switch(jnp.clip(tool, 0, len(TOOLS) - 1), branches, box_4)
  return new, valid & (tool >= 0) & (tool < len(TOOLS))


def reset(key: Array, task: Task, params: PeriaParams = PeriaParams()):
  """Image 0 renders the scene from the task's initial camera pose at `hfov_deg`."""
  del key
  camera = Camera.from_fov(params.hfov_deg, params.width, params.height,
                           task.initial_camera.world_from_camera)
  image = render(task.cloud, camera, params.height, params.width, params.splat_radius,
                 params.background, point_radius=params.point_radius).rgb
  images = jnp.zeros((params.max_images, params.height, params.width, 3), jnp.uint8)
  zero = jnp.zeros((), jnp.int32)
  state = PeriaState(task=task, images=images.at[0].set(image), count=zero + 1, calls=zero,
                     done=jnp.zeros((), bool))
  return PeriaObservation(image=image, index=zero), state


def step(key: Array, state: PeriaState, action: PeriaAction,
         params: PeriaParams = PeriaParams()):
  """Applies the tool; STOP ends the episode. reward is 0 (PERIA's reward needs the final
  answer: `jaxspatial.rl`). info: invalid."""
  del key
  is_tool = (action.kind == TOOL) & ~state.done
  index_ok = (action.image >= 0) & (action.image < state.count)
  source = state.images[jnp.clip(action.image, 0, params.max_images - 1)]
  result, tool_ok = apply_tool(source, action.tool, action.box_4, params)
  valid = is_tool & index_ok & tool_ok & (state.count < params.max_images)
  slot = jnp.minimum(state.count, params.max_images - 1)
  images = jnp.where(valid, state.images.at[slot].set(result), state.images)
  calls = state.calls + is_tool.astype(jnp.int32)
  done = state.done | (action.kind == STOP) | (calls >= params.max_turns)
  new_state = PeriaState(task=state.task, images=images, count=state.count + valid, calls=calls,
                         done=done)
  obs = PeriaObservation(image=jnp.where(valid, result, source),
                         index=jnp.where(valid, state.count, -1))
  invalid = ~valid & (action.kind == TOOL)
  return obs, new_state, jnp.zeros((), jnp.float32), done, {"invalid": invalid}
