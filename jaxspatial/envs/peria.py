"""PERIA's image workspace as a pure environment: the episode's running image list, an
interaction tool applied to one of its images, the result appended as the next image.

  reset(key, task, params) -> (obs, state)       image 0: the task's initial view
  step(key, state, action, params) -> (obs, state, reward, done, info)

PERIA's own tasks are images (charts, maps, documents): a task that carries its input
views' images (`Task.has_input_images`, a static shape: a benchmark's stored views, e.g.
ChartQA's letterboxed chart) starts from its image at the initial camera (the first input
view whose pose is the initial camera's: view 0 for image benchmarks), which must be
params' width x height; a task without images (the synthetic 3D sets) starts from a render
of its scene from the initial camera, so those tasks serve this agent too.

The six interaction tools of the public tool server, with its argument names (`image_index`
is a position in the image list; coordinates are in [0, scale], Qwen-VL grounding: 1000):

  image_crop       bounding_box [x1, y1, x2, y2]   resized back to the observation size
  image_label      text, position [x, y]           a marker: text is not drawn on device
  draw_line        coordinates [x1, y1, x2, y2]
  draw_path        points [x1, y1, x2, y2, ...]    2 to `max_path_points` waypoints
  bounding_box     bounding_box [x1, y1, x2, y2]
  image_highlight  bounding_box [x1, y1, x2, y2]

Coordinates map to pixels as the public server does, int(c * size / 1000), so
[0, 0, 1000, 1000] is the whole image (`pixel_map`, see `image_tools`). Drawing styles are
the public tools': blue lines 3 px wide, red waypoint dots of radius 4 on a path, green
boxes 3 px wide, a yellow highlight at opacity 100/255; a label is a red marker.

An action carries the argument it wrote its coordinates to (`ARGUMENTS`) and its points.
A call is invalid, and changes nothing, for the first of these reasons (`ERRORS`, in the
order the public tools fail; `info["error"]` and `state.error` (with `state.tool`) say
which, so the agent can answer with the public error message):
  "limit"        the turn budget is spent (a call past it also ends the episode), the
                 list is full, or the episode is over (an episode whose initial camera is
                 not finite, seen only on device, starts over)
  "arguments"    the action's kind is neither TOOL nor STOP (a malformed call: it counts
                 toward the budget like one), the argument is not the tool's, the tool
                 takes another number of points, or it rejects them (a crop thinner than
                 a pixel, a box with x2 < x1)
  "image_index"  the image is not in the list
  "path_points"  a path of fewer than 2 points
An invalid call, and STOP, produce no image: the observation's image is all zeros and its
index -1.

Host text tools (`text_tools`: PERIA's perception tools, e.g. "text_ocr"; tool indices
after the six) run outside the environment: a call names an image (`image_index`) and
optionally either a `bounding_box` on it or a text argument (`TEXT_ARGUMENTS`:
"text_prompt", "question"; no points, the text itself is the agent's); the environment
checks and counts it like any call, appends no image, and sets `text_call`, so the
agent's host tool fills `text_ids` / `text_mask` (`text_tokens` wide) with the result's
tokens. Which text key a tool takes is its host tool's to check (a wrong one is the
tool's error text, as on the public server); an interaction tool given a text key is an
"arguments" error (not its own argument).

Budget: `max_turns` model turns, of which the last must answer, so max_turns - 1 tool
calls; `max_images` must hold the first image and one per call (max_images >= max_turns).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxspatial.envs import image_tools
from jaxspatial.envs.task import Task, check_task
from jaxspatial.geometry import Camera, check_fov
from jaxspatial.render import render

Array = jax.Array
TOOLS = ("image_crop", "image_label", "draw_line", "draw_path", "bounding_box",
         "image_highlight")  # the public tool registry's order
# "text": then "position"; the text keys are written only for host text tools.
ARGUMENTS = ("bounding_box", "coordinates", "points", "text", "text_prompt", "question")
TEXT_ARGUMENTS = ARGUMENTS[4:]  # the perception tools' text arguments (public names)
TOOL_ARGUMENT = (0, 3, 1, 2, 0, 0)        # per tool: the index of its argument
TOOL_POINTS = ((2, 2), (1, 1), (2, 2), (2, None), (2, 2), (2, 2))  # (min, max); None: K
ERRORS = ("none", "limit", "arguments", "image_index", "path_points")
NO_ERROR, ERROR_LIMIT, ERROR_ARGUMENTS, ERROR_INDEX, ERROR_PATH_POINTS = range(len(ERRORS))
TOOL, STOP = 0, 1

BLUE, RED, GREEN, YELLOW, WHITE = (0, 0, 255), (255, 0, 0), (0, 128, 0), (255, 255, 0), (
    255, 255, 255)  # PIL's named colours, as the public tools use them
LINE_WIDTH, WAYPOINT_RADIUS, HIGHLIGHT_ALPHA = 3.0, 4.0, 100 / 255
LABEL_RADIUS = 6.0
MAX_PATH_POINTS = 8  # the default static bound on a path's waypoints (the grammar's too)


@struct.dataclass
class PeriaParams:
  """Static configuration."""

  width: int = struct.field(pytree_node=False, default=640)
  height: int = struct.field(pytree_node=False, default=480)
  hfov_deg: float = struct.field(pytree_node=False, default=90.0)
  max_images: int = struct.field(pytree_node=False, default=10)
  max_turns: int = struct.field(pytree_node=False, default=10)   # the public script's T
  max_path_points: int = struct.field(pytree_node=False, default=MAX_PATH_POINTS)
  scale: float = struct.field(pytree_node=False, default=1000.0)
  pixel_map: str = struct.field(pytree_node=False, default="floor")
  splat_radius: int = struct.field(pytree_node=False, default=1)
  point_radius: float | None = struct.field(pytree_node=False, default=None)
  background: tuple[int, int, int] = struct.field(pytree_node=False, default=(255, 255, 255))
  text_tools: tuple[str, ...] = struct.field(pytree_node=False, default=())
  text_tokens: int = struct.field(pytree_node=False, default=0)

  def __post_init__(self):
    if set(self.text_tools) & set(TOOLS) or len(set(self.text_tools)) < len(self.text_tools):
      raise ValueError(f"PeriaParams.text_tools: expected distinct names outside {TOOLS}, "
                       f"got {self.text_tools}")
    if self.text_tools and self.text_tokens < 1:
      raise ValueError(f"PeriaParams.text_tokens: text tools need a text width >= 1, got "
                       f"{self.text_tokens}")
    if self.max_turns < 1:
      raise ValueError(f"PeriaParams.max_turns: expected at least 1, got {self.max_turns}")
    if self.max_images < self.max_turns:
      raise ValueError(
          f"PeriaParams: max_images ({self.max_images}) must be at least max_turns "
          f"({self.max_turns}): the list holds the first image and one per tool call "
          f"(max_turns - 1 calls)")
    if self.max_path_points < 2:
      raise ValueError(f"PeriaParams.max_path_points: expected at least 2, got "
                       f"{self.max_path_points}")
    if self.pixel_map not in image_tools.PIXEL_MAPS:
      raise ValueError(f"PeriaParams.pixel_map: expected one of {image_tools.PIXEL_MAPS}, "
                       f"got {self.pixel_map!r}")
    if not 0 < self.scale < float("inf"):
      raise ValueError(f"PeriaParams.scale: expected a finite scale > 0, got {self.scale}")
    check_fov("PeriaParams.hfov_deg", self.hfov_deg)


@struct.dataclass
class PeriaAction:
  kind: Array        # TOOL or STOP
  tool: Array        # index into TOOLS
  image: Array       # image_index: the position of the source image in the list
  argument: Array    # index into ARGUMENTS: the key the call wrote (its coordinates or
                     # text); -1: none (a text tool's call of image_index alone)
  points: Array      # [max_path_points, 2] x, y in [0, scale]; the first num_points count
  num_points: Array

  @classmethod
  def create(cls, kind, tool=0, image=0, points=(), num_points=None, argument=None,
             max_points: int = MAX_PATH_POINTS) -> "PeriaAction":
    """`points`: (x, y) pairs, flat or [n, 2] (a box is two points); `argument` defaults
    to the tool's own; `num_points` to all of `points`."""
    points = jnp.asarray(points, jnp.float32).reshape(-1, 2)
    if points.shape[0] > max_points:
      raise ValueError(f"PeriaAction.points: at most max_points={max_points} points, got "
                       f"{points.shape[0]}")
    count = points.shape[0] if num_points is None else num_points
    points = jnp.pad(points, ((0, max_points - points.shape[0]), (0, 0)))
    tool = jnp.asarray(tool, jnp.int32)
    if argument is None:
      argument = jnp.asarray(TOOL_ARGUMENT, jnp.int32)[jnp.clip(tool, 0, len(TOOLS) - 1)]
    return cls(kind=jnp.asarray(kind, jnp.int32), tool=tool,
               image=jnp.asarray(image, jnp.int32), argument=jnp.asarray(argument, jnp.int32),
               points=points, num_points=jnp.asarray(count, jnp.int32))


@struct.dataclass
class PeriaObservation:
  image: Array       # [H, W, 3] uint8: the tool's result; zeros when no image was produced
  index: Array       # its index in the image list; -1 when no image was produced


@struct.dataclass
class PeriaState:
  task: Task
  images: Array      # [max_images, H, W, 3] uint8
  count: Array       # images in the list
  calls: Array       # tool calls made (valid or not): a truncated episode still acted
  done: Array
  error: Array       # the last step's error, an index into ERRORS
  tool: Array        # the last step's tool (its error message names it)
  text_call: Array   # the last step was a valid call of a host text tool
  text_ids: Array    # [text_tokens] its result's tokens (the agent's host tool writes them)
  text_mask: Array


def apply_tool(image: Array, tool: Array, points_Kx2: Array, num_points: Array,
               params: PeriaParams):
  """(new image, valid) of TOOLS[tool] on one image: valid when the tool accepts its
  points (their number is checked by `step`)."""
  s, m = params.scale, params.pixel_map
  box = lambda p: p[:2].reshape(4)
  branches = (
      lambda p, n: image_tools.image_crop(image, box(p), params.height, params.width, s, m),
      lambda p, n: image_tools.image_label(image, p[0], RED, LABEL_RADIUS, WHITE, s, m),
      lambda p, n: image_tools.draw_line(image, p[0], p[1], BLUE, LINE_WIDTH, s, m),
      lambda p, n: image_tools.draw_path(image, p, n, BLUE, LINE_WIDTH, s, WAYPOINT_RADIUS,
                                         RED, m),
      lambda p, n: image_tools.bounding_box(image, box(p), GREEN, LINE_WIDTH, s, m),
      lambda p, n: image_tools.image_highlight(image, box(p), YELLOW, HIGHLIGHT_ALPHA, s, m),
  )
  new, valid = jax.lax.switch(jnp.clip(tool, 0, len(TOOLS) - 1), branches, points_Kx2,
                              num_points)
  return new, valid & (tool >= 0) & (tool < len(TOOLS))


def _point_bounds(tool: Array, max_points: int) -> tuple[Array, Array]:
  low = jnp.asarray([lo for lo, _ in TOOL_POINTS], jnp.int32)
  high = jnp.asarray([max_points if hi is None else hi for _, hi in TOOL_POINTS], jnp.int32)
  k = jnp.clip(tool, 0, len(TOOLS) - 1)
  return low[k], high[k]


def initial_image(task: Task, params: PeriaParams = PeriaParams()) -> Array:
  """Image 0 [H, W, 3] uint8: with the task's input images (a static shape check), the
  image of the first real input view whose pose is the initial camera's (view 0 when none
  is); else the scene rendered from the initial camera's pose at `hfov_deg`. Input images
  of another size than params' width x height raise ValueError naming both."""
  if task.has_input_images:
    height, width = task.input_images.shape[-3:-1]
    if (height, width) != (params.height, params.width):
      raise ValueError(f"PeriaParams: the image list is {params.width}x{params.height} but "
                       f"Task.input_images are {width}x{height}: image 0 is the task's input "
                       f"view; set width={width}, height={height}")
    poses = task.input_cameras.world_from_camera
    real = jnp.arange(poses.shape[0]) < task.num_input_cameras
    same = real & jnp.all(poses == task.initial_camera.world_from_camera, axis=(-2, -1))
    return task.input_images[jnp.argmax(same)]  # argmax: the first match; none: view 0
  camera = Camera.from_fov(params.hfov_deg, params.width, params.height,
                           task.initial_camera.world_from_camera)
  return render(task.cloud, camera, params.height, params.width, params.splat_radius,
                params.background, point_radius=params.point_radius).rgb


def reset(key: Array, task: Task, params: PeriaParams = PeriaParams()):
  """Image 0 is `initial_image`: the task's input view at the initial camera when the task
  carries images, else a render of the scene from the initial camera. A task whose initial
  camera is unusable raises when its values are concrete (`check_task`); under jit or vmap
  the episode starts done instead (every call fails with "limit")."""
  del key
  check_task(task)
  usable = jnp.all(jnp.isfinite(task.initial_camera.world_from_camera))
  image = initial_image(task, params)
  images = jnp.zeros((params.max_images, params.height, params.width, 3), jnp.uint8)
  zero = jnp.zeros((), jnp.int32)
  state = PeriaState(task=task, images=images.at[0].set(image), count=zero + 1, calls=zero,
                     done=~usable, error=zero, tool=zero, text_call=jnp.zeros((), bool),
                     text_ids=jnp.zeros(params.text_tokens, jnp.int32),
                     text_mask=jnp.zeros(params.text_tokens, bool))
  return PeriaObservation(image=image, index=zero), state


def _check_action(action: PeriaAction, params: PeriaParams) -> None:
  """Static checks of an action's fields (shapes and dtypes; values are checked on device)."""
  if not isinstance(action, PeriaAction):
    raise TypeError(f"peria.step: expected a PeriaAction, got {type(action).__name__}")
  if tuple(jnp.shape(action.points)) != (params.max_path_points, 2):
    raise ValueError(f"PeriaAction.points: expected [max_path_points={params.max_path_points}"
                     f", 2], got {tuple(jnp.shape(action.points))}")
  if not jnp.issubdtype(jnp.result_type(action.points), jnp.floating):
    raise ValueError(f"PeriaAction.points: expected a float dtype, got "
                     f"{jnp.result_type(action.points)}")
  for name in ("kind", "tool", "image", "argument", "num_points"):
    value = getattr(action, name)
    shape, dtype = tuple(jnp.shape(value)), jnp.result_type(value)
    if shape != ():
      raise ValueError(f"PeriaAction.{name}: expected shape (), got {shape}")
    if not jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_:
      raise ValueError(f"PeriaAction.{name}: expected an integer dtype, got {dtype}")


def step(key: Array, state: PeriaState, action: PeriaAction,
         params: PeriaParams = PeriaParams()):
  """Applies the tool; STOP ends the episode, and so does a call past the budget of
  max_turns - 1; any other kind is an invalid call (counted toward the budget). reward is
  0 (PERIA's reward needs the final answer: `jaxspatial.rl`).
  info: invalid (a call that changed nothing), error (an index into ERRORS)."""
  del key
  _check_action(action, params)
  is_call = action.kind == TOOL
  is_stop = action.kind == STOP
  # Anything but STOP is a call attempt: an unknown kind is a malformed call ("arguments"),
  # invalid and counted toward the budget, never a silent no-op.
  attempt = ~is_stop
  acting = attempt & ~state.done
  over_budget = acting & (state.calls >= params.max_turns - 1)
  limit = state.done | over_budget | (state.count >= params.max_images)
  is_text = (action.tool >= len(TOOLS)) & (action.tool < len(TOOLS) + len(params.text_tools))
  tool_known = ((action.tool >= 0) & (action.tool < len(TOOLS))) | is_text
  # A text tool takes image_index alone (argument -1, no points), a bounding box (a box's
  # two points), or a text argument (no points); which text key is the host tool's to check.
  box_argument = action.argument == ARGUMENTS.index("bounding_box")
  text_argument = ((action.argument < 0) | (
      (action.argument >= len(ARGUMENTS) - len(TEXT_ARGUMENTS))
      & (action.argument < len(ARGUMENTS)))) & (action.num_points == 0)
  own_argument = jnp.where(
      is_text, box_argument | text_argument,
      action.argument == jnp.asarray(TOOL_ARGUMENT)[jnp.clip(action.tool, 0, len(TOOLS) - 1)])
  index_ok = (action.image >= 0) & (action.image < state.count)
  low, high = _point_bounds(action.tool, params.max_path_points)
  count_ok = jnp.where(is_text, (action.num_points == 0) | (action.num_points == 2),
                       (action.num_points >= low) & (action.num_points <= high))
  source = state.images[jnp.clip(action.image, 0, params.max_images - 1)]
  result, tool_ok = apply_tool(source, action.tool, action.points, action.num_points, params)
  x1y1, x2y2 = action.points[0], action.points[1]
  box_ok = (action.num_points == 0) | jnp.all(x1y1 < x2y2)
  tool_ok = jnp.where(is_text, box_ok, tool_ok)
  error = jnp.select(
      [limit, ~is_call | ~tool_known | ~own_argument, ~index_ok,
       (action.tool == TOOLS.index("draw_path")) & ~count_ok, ~count_ok | ~tool_ok],
      [ERROR_LIMIT, ERROR_ARGUMENTS, ERROR_INDEX, ERROR_PATH_POINTS, ERROR_ARGUMENTS],
      NO_ERROR)
  error = jnp.where(attempt, error, NO_ERROR).astype(jnp.int32)
  valid = is_call & (error == NO_ERROR)
  appended = valid & ~is_text
  slot = jnp.minimum(state.count, params.max_images - 1)
  images = jnp.where(appended, state.images.at[slot].set(result), state.images)
  done = state.done | is_stop | over_budget
  new_state = PeriaState(task=state.task, images=images, count=state.count + appended,
                         calls=state.calls + acting.astype(jnp.int32), done=done, error=error,
                         tool=action.tool, text_call=valid & is_text,
                         text_ids=jnp.zeros_like(state.text_ids),
                         text_mask=jnp.zeros_like(state.text_mask))
  obs = PeriaObservation(image=jnp.where(appended, result, jnp.zeros_like(result)),
                         index=jnp.where(appended, state.count, -1))
  invalid = attempt & ~valid
  return obs, new_state, jnp.zeros((), jnp.float32), done, {"invalid": invalid, "error": error}
