"""Think3D's view tool: render the reconstructed scene from a new angle, up to K times.

An action picks an anchor (one of the task's input cameras), an azimuth, an
elevation and a mode, or stops:

ego     the virtual camera stays at the anchor's centre and turns: positive
        azimuth turns right, positive elevation looks up. Its rotation is
        `R_anchor Ry(azimuth) Rx(elevation)` in the anchor's OpenCV frame, with a
        wide pinhole field of view (140 degrees horizontally by default).
global  the scene turns about a pivot while the camera stays fixed, which is the
        camera orbiting the pivot: `R' = R_anchor Ry(azimuth) Rx(-elevation)`,
        `p' = c + Q (p - c)` with Q = R' R_anchor^T the same turn in world axes. Positive
        elevation raises the camera, which looks down on the scene (60 degrees is
        the layout view the papers use); positive azimuth turns the view right
        as in ego mode.

Where the paper and the public code (spagent) differ, we follow the paper and
offer the code's behaviour as options (see WORKSPACE.md):
- pivot: "centroid" of the valid points (paper) or "anchor_camera" (code).
- elevation_convention: "paper" as above, or "code", where the ego rotation is
  `Ry(azimuth) Rx(-elevation)` and positive elevation looks down.
- Turns happen in the anchor's own frame (both sources, for reconstructions
  without a known up); `up=(0, 0, 1)` turns about a world up axis instead and
  keeps the horizon level.
- Global views pull back along the view axis until a sphere of the scene's
  radius around the pivot fits the field of view (`pull_back`); the near plane
  moves with the camera, so the pull-back widens the view without putting the
  points behind the orbit position in front of it.

Input views (the paper's input is the multi-view images plus the question): `reset`
returns, besides the first observation (a render of input camera 0), the prompt's
`num_prompt_images` input views: the task's images (`Task.input_images`) when the
dataset has them, else renders of the input cameras (their intrinsics as given) at
the observation size; views past `num_input_cameras` are background. A view request
with azimuth 0 and elevation 0, in either mode, returns the anchor's input view, as the
public code's server does (`input_image_at_zero`; off, it renders the (0, 0) view). The
observation size must equal the images' size.

Global views draw the input cameras (`draw_cameras`, on by default, as the code's
global views do): pyramids, dots and `Cam{i}` labels from `render.markers`, on top of
the points (the code draws them after the scatter), not cut by the pull-back's near
plane (the code's global views show every camera).

Rounds: `max_rounds` views are accepted; the answer (STOP) after the last one is
accepted too. A view requested after the last round is invalid and ends the episode,
so `done` means no further action is accepted: stopped, or a view past the limit.

Online reconstruction: `with_reconstruction(tool, task)` replaces the dataset's cloud and
input poses by a reconstruction of the task's input images inside the compiled program
(a `perception.reconstruction_tool`, duck-typed here: envs never import perception);
`Think3DAgent(reconstruction=tool)` applies it at reset.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxspatial.envs.task import Task, bounds_are_sound, camera_is_finite, check_task
from jaxspatial.geometry import (Camera, PointCloud, check_fov, make_transform, matmul,
                                 rotation_about_axis)
from jaxspatial.render import render, render_batch
from jaxspatial.render.markers import CameraMarkerStyle, draw_cameras as draw_camera_markers
from jaxspatial.render.splat import DEFAULT_NEAR

Array = jax.Array

GLOBAL, EGO = 0, 1
VIEW, STOP = 0, 1
MODES = ("global", "ego")
_CORNER_SELECT = np.asarray([[(i >> k) & 1 for k in range(3)] for i in range(8)], bool)


@struct.dataclass
class Think3DParams:
  """Static configuration (no array leaves: jit specialises on it)."""

  width: int = struct.field(pytree_node=False, default=1024)
  height: int = struct.field(pytree_node=False, default=768)
  ego_hfov_deg: float = struct.field(pytree_node=False, default=140.0)
  global_hfov_deg: float = struct.field(pytree_node=False, default=70.0)
  max_rounds: int = struct.field(pytree_node=False, default=3)
  pivot: str = struct.field(pytree_node=False, default="centroid")
  elevation_convention: str = struct.field(pytree_node=False, default="paper")
  pull_back: bool = struct.field(pytree_node=False, default=True)
  # None: turn in the anchor camera's own frame (both sources; a tilted anchor gives
  # a rolled orbit). A world up vector: azimuth about it, elevation about the
  # anchor's horizontal right axis, so the horizon stays level.
  up: tuple[float, float, float] | None = struct.field(pytree_node=False, default=None)
  max_azimuth_deg: float = struct.field(pytree_node=False, default=180.0)
  max_elevation_deg: float = struct.field(pytree_node=False, default=90.0)
  splat_radius: int = struct.field(pytree_node=False, default=1)
  point_radius: float | None = struct.field(pytree_node=False, default=None)
  background: tuple[int, int, int] = struct.field(pytree_node=False, default=(255, 255, 255))
  # The first prompt's input views: 8 = the loader's padded camera count.
  num_prompt_images: int = struct.field(pytree_node=False, default=8)
  # (0, 0) from an anchor returns its input view (the public code; the paper is silent).
  input_image_at_zero: bool = struct.field(pytree_node=False, default=True)
  draw_cameras: bool = struct.field(pytree_node=False, default=True)
  camera_style: CameraMarkerStyle = struct.field(pytree_node=False,
                                                 default=CameraMarkerStyle())

  def check(self) -> None:
    if self.pivot not in ("centroid", "anchor_camera"):
      raise ValueError(f"Think3DParams.pivot: expected 'centroid' or 'anchor_camera', "
                       f"got {self.pivot!r}")
    if self.elevation_convention not in ("paper", "code"):
      raise ValueError(f"Think3DParams.elevation_convention: expected 'paper' or 'code', "
                       f"got {self.elevation_convention!r}")
    if self.num_prompt_images < 0:
      raise ValueError(f"Think3DParams.num_prompt_images: expected >= 0, got "
                       f"{self.num_prompt_images}")
    if self.max_rounds < 0:
      raise ValueError(f"Think3DParams.max_rounds: expected >= 0, got {self.max_rounds}")
    check_fov("Think3DParams.ego_hfov_deg", self.ego_hfov_deg)
    check_fov("Think3DParams.global_hfov_deg", self.global_hfov_deg)
    for name in ("max_azimuth_deg", "max_elevation_deg"):
      value = getattr(self, name)
      if not (isinstance(value, (int, float)) and 0 <= value < float("inf")):
        raise ValueError(f"Think3DParams.{name}: expected a finite angle >= 0, got {value!r}")
    if self.up is not None:
      up = np.asarray(self.up, np.float64)
      if up.shape != (3,) or not np.isfinite(up).all() or not np.linalg.norm(up) > 0:
        raise ValueError(f"Think3DParams.up: expected None or a finite non-zero 3-vector, got "
                         f"{self.up!r}")
    self.camera_style.check()


@struct.dataclass
class Think3DAction:
  """kind: 0 view, 1 stop. camera_index: 0-based anchor. mode: 0 global, 1 ego."""

  kind: Array
  camera_index: Array
  azimuth_deg: Array
  elevation_deg: Array
  mode: Array

  @classmethod
  def view(cls, camera_index: int, azimuth_deg: float, elevation_deg: float,
           mode: str = "ego") -> "Think3DAction":
    if mode not in MODES:
      raise ValueError(f"Think3DAction.view: mode must be one of {MODES}, got {mode!r}")
    return cls.create(VIEW, camera_index, azimuth_deg, elevation_deg, MODES.index(mode))

  @classmethod
  def stop(cls) -> "Think3DAction":
    return cls.create(STOP, 0, 0.0, 0.0, EGO)

  @classmethod
  def create(cls, kind, camera_index, azimuth_deg, elevation_deg, mode) -> "Think3DAction":
    return cls(kind=jnp.asarray(kind, jnp.int32), camera_index=jnp.asarray(camera_index, jnp.int32),
               azimuth_deg=jnp.asarray(azimuth_deg, jnp.float32),
               elevation_deg=jnp.asarray(elevation_deg, jnp.float32),
               mode=jnp.asarray(mode, jnp.int32))


@struct.dataclass
class Think3DObservation:
  image: Array             # [H, W, 3] uint8
  action: Think3DAction    # the action that produced the image
  round: Array             # [] int32, views rendered so far
  # The prompt's input views [num_prompt_images, H, W, 3] from reset; step's is empty
  # [0, H, W, 3] (the views are sent once, and per-step observations stay small).
  input_images: Array


@struct.dataclass
class Think3DState:
  task: Task
  round: Array     # [] int32
  stopped: Array   # [] bool
  done: Array      # [] bool, no further action is accepted
  camera: Camera   # the camera of the last observation
  near: Array      # [] its near plane
  anchor: Array    # [] int32, the last view's anchor camera
  is_global: Array  # [] bool, the last view was a global one (cameras drawn)
  is_photo: Array  # [] bool, the last view was the anchor's input view ((0, 0))


def _turn(azimuth_deg: Array, elevation_deg: Array) -> Array:
  """Ry(azimuth) Rx(elevation) in a camera's OpenCV frame (y down)."""
  yaw = rotation_about_axis(jnp.asarray([0.0, 1.0, 0.0]), jnp.deg2rad(azimuth_deg))
  pitch = rotation_about_axis(jnp.asarray([1.0, 0.0, 0.0]), jnp.deg2rad(elevation_deg))
  return matmul(yaw, pitch)


def _world_turn(anchor_rotation: Array, azimuth_deg: Array, elevation_deg: Array,
                params: Think3DParams) -> Array:
  """The world-frame rotation that turns the anchor's view right by azimuth and up by
  elevation: about the anchor's own axes, or about `params.up` and the level right axis."""
  if params.up is None:
    return matmul(matmul(anchor_rotation, _turn(azimuth_deg, elevation_deg)),
                  anchor_rotation.T)
  up = jnp.asarray(params.up, jnp.float32)
  up = up / jnp.linalg.norm(up)
  forward = anchor_rotation[:, 2]
  right = jnp.cross(forward, up)
  right = jnp.where(jnp.linalg.norm(right) > 1e-6, right, anchor_rotation[:, 0])
  right = right / jnp.linalg.norm(right)
  # Turning right is clockwise seen from above: a negative angle about up.
  yaw = rotation_about_axis(up, -jnp.deg2rad(azimuth_deg))
  pitch = rotation_about_axis(right, jnp.deg2rad(elevation_deg))
  return matmul(yaw, pitch)


def scene_centroid(task: Task) -> Array:
  weights = task.cloud.valid.astype(jnp.float32)
  return jnp.sum(task.cloud.xyz * weights[:, None], 0) / jnp.maximum(jnp.sum(weights), 1.0)


def _anchor_camera(task: Task, index: Array) -> Camera:
  count = task.input_cameras.fx.shape[0]
  return jax.tree.map(lambda x: x[jnp.clip(index, 0, count - 1)], task.input_cameras)


def view_camera(task: Task, action: Think3DAction, params: Think3DParams):
  """The camera an action asks for, and the near plane to render it with (the (0, 0)
  case is `step`'s)."""
  anchor = _anchor_camera(task, action.camera_index)
  rotation = anchor.world_from_camera[:3, :3]
  position = anchor.position
  sign = 1.0 if params.elevation_convention == "paper" else -1.0
  ego_turn = _world_turn(rotation, action.azimuth_deg, sign * action.elevation_deg, params)
  ego = Camera.from_fov(params.ego_hfov_deg, params.width, params.height,
                        make_transform(matmul(ego_turn, rotation), position))

  pivot = scene_centroid(task) if params.pivot == "centroid" else position
  world_turn = _world_turn(rotation, action.azimuth_deg, -action.elevation_deg, params)
  global_rotation = matmul(world_turn, rotation)
  orbit_position = pivot + matmul(world_turn, position - pivot)
  forward = global_rotation[:, 2]
  pull = jnp.zeros(())
  if params.pull_back:
    corners = jnp.where(_CORNER_SELECT, task.scene_max, task.scene_min)  # [8, 3]
    radius = jnp.max(jnp.linalg.norm(corners - pivot, axis=-1))
    half_fov = jnp.deg2rad(params.global_hfov_deg) / 2
    half_vfov = jnp.arctan(jnp.tan(half_fov) * params.height / params.width)
    fit_distance = radius / jnp.sin(jnp.minimum(half_fov, half_vfov))
    pull = jnp.maximum(fit_distance - jnp.sum((pivot - orbit_position) * forward), 0.0)
  global_camera = Camera.from_fov(params.global_hfov_deg, params.width, params.height,
                                  make_transform(global_rotation, orbit_position - pull * forward))
  is_ego = action.mode == EGO
  camera = jax.tree.map(lambda e, g: jnp.where(is_ego, e, g), ego, global_camera)
  near = jnp.where(is_ego, DEFAULT_NEAR, DEFAULT_NEAR + pull)
  return camera, near


def action_is_valid(task: Task, action: Think3DAction, params: Think3DParams) -> Array:
  index_ok = (action.camera_index >= 0) & (action.camera_index < task.num_input_cameras)
  angles_ok = ((jnp.abs(action.azimuth_deg) <= params.max_azimuth_deg)
               & (jnp.abs(action.elevation_deg) <= params.max_elevation_deg))  # False for NaN
  mode_ok = (action.mode == GLOBAL) | (action.mode == EGO)
  view_ok = (action.kind == VIEW) & index_ok & angles_ok & mode_ok
  return view_ok | (action.kind == STOP)


def _check_action(action: Think3DAction) -> None:
  """Static checks of an action's fields (shapes and dtypes; values are checked on device)."""
  if not isinstance(action, Think3DAction):
    raise TypeError(f"think3d.step: expected a Think3DAction, got {type(action).__name__}")
  for name, is_float in (("kind", False), ("camera_index", False), ("azimuth_deg", True),
                         ("elevation_deg", True), ("mode", False)):
    value = getattr(action, name)
    shape, dtype = tuple(jnp.shape(value)), jnp.result_type(value)
    if shape != ():
      raise ValueError(f"Think3DAction.{name}: expected shape (), got {shape}")
    ok = (jnp.issubdtype(dtype, jnp.floating) if is_float
          else jnp.issubdtype(dtype, jnp.integer) and dtype != jnp.bool_)
    if not ok:
      raise ValueError(f"Think3DAction.{name}: expected a {'float' if is_float else 'integer'} "
                       f"dtype, got {dtype}")


def _render(task: Task, camera: Camera, near, params: Think3DParams) -> Array:
  return render(task.cloud, camera, params.height, params.width, params.splat_radius,
                params.background, point_radius=params.point_radius, near=near).rgb


def _check_image_size(task: Task, params: Think3DParams) -> None:
  if not task.has_input_images:
    return
  height, width = task.input_images.shape[-3:-1]
  if (height, width) != (params.height, params.width):
    raise ValueError(f"Think3DParams: the observation is {params.width}x{params.height} but "
                     f"Task.input_images are {width}x{height}; set width={width}, "
                     f"height={height}")


def _background(params: Think3DParams, shape) -> Array:
  return jnp.broadcast_to(jnp.asarray(params.background, jnp.uint8), shape)


def input_views(task: Task, params: Think3DParams) -> Array:
  """The prompt's input views [num_prompt_images, H, W, 3]: the task's images, or renders
  of its input cameras; background past `num_input_cameras`."""
  count = params.num_prompt_images
  shape = (count, params.height, params.width, 3)
  taken = min(count, task.input_cameras.fx.shape[0])
  if taken == 0:
    return _background(params, shape)
  if task.has_input_images:
    views = task.input_images[:taken]
  else:
    cameras = jax.tree.map(lambda x: x[:taken], task.input_cameras)
    views = render_batch(task.cloud, cameras, params.height, params.width, params.splat_radius,
                         params.background, point_radius=params.point_radius).rgb
  views = jnp.concatenate([views, _background(params, (count - taken,) + shape[1:])])
  real = jnp.arange(count) < task.num_input_cameras
  return jnp.where(real[:, None, None, None], views, _background(params, shape))


def _scene_size(task: Task) -> Array:
  return jnp.max(task.scene_max - task.scene_min)


def _observe(state: Think3DState, params: Think3DParams) -> Array:
  """The image of the state's view: the render, with the input cameras drawn in a global
  view, or the anchor's input image for a (0, 0) request."""
  task = state.task
  image = _render(task, state.camera, state.near, params)
  if params.draw_cameras:
    marked = draw_camera_markers(image, state.camera, task.input_cameras,
                                 task.num_input_cameras, state.anchor, _scene_size(task),
                                 params.camera_style, near=DEFAULT_NEAR)
    image = jnp.where(state.is_global, marked, image)
  if task.has_input_images:
    # Without images the state's camera is the anchor itself, so the render stands in.
    image = jnp.where(state.is_photo, task.input_images[state.anchor], image)
  return image


def with_reconstruction(tool, task: Task) -> Task:
  """One task (vmap it: one host call per batch) with its scene reconstructed from its
  input images by `tool` (`perception.reconstruction_tool` over the task's K cameras:
  `tool(images=[K, H, W, 3], count=[])` -> points [P, 3], colors [P, 3] uint8, valid [P],
  cameras [K, 4, 4] camera-to-world, failed []), from the first `num_input_cameras`
  frames. The cloud becomes the tool's points (no instances), the input cameras' poses
  its cameras (their intrinsics stay the task's, the images' own), the initial camera
  input camera 0, the bounds the valid points' box. A failed call (the tool's "flag"
  mode) leaves no valid point, so the bounds are not finite and the episode starts done;
  the poses stay the dataset's."""
  if not task.has_input_images:
    raise ValueError("with_reconstruction: Task.input_images is empty "
                     f"{tuple(task.input_images.shape)}; the reconstruction needs the input "
                     "views' images (the loader's input_images=True)")
  out = tool(images=task.input_images, count=task.num_input_cameras)
  failed = out["failed"]
  xyz, valid = out["points"], out["valid"] & ~failed
  cloud = PointCloud(xyz=xyz, rgb=out["colors"], valid=valid,
                     instance=jnp.full(valid.shape, -1, jnp.int32))
  scene_min = jnp.min(jnp.where(valid[:, None], xyz, jnp.inf), 0)
  scene_max = jnp.max(jnp.where(valid[:, None], xyz, -jnp.inf), 0)
  poses = jnp.where(failed, task.input_cameras.world_from_camera, out["cameras"])
  cameras = task.input_cameras.replace(world_from_camera=poses)
  return task.replace(cloud=cloud, input_cameras=cameras,
                      initial_camera=jax.tree.map(lambda x: x[0], cameras),
                      scene_min=scene_min, scene_max=scene_max)


def reset(key: Array, task: Task, params: Think3DParams = Think3DParams()):
  """The first observation is the view of the first input camera, rendered at the
  observation size with that camera's intrinsics as given; `obs.input_images` holds the
  prompt's input views (`input_views`). A task whose real input cameras or bounds are
  unusable raises when its values are concrete (`check_task`); under jit or vmap the
  episode starts done instead (every action invalid)."""
  del key
  params.check()
  _check_image_size(task, params)
  check_task(task)
  camera = jax.tree.map(lambda x: x[0], task.input_cameras)
  zero = jnp.zeros((), jnp.int32)
  no = jnp.zeros((), bool)
  # Seen only on device (under jit or vmap): an episode whose real input cameras or bounds
  # are not finite starts done, so every action is invalid.
  real = jnp.arange(task.input_cameras.fx.shape[0]) < task.num_input_cameras
  usable = (jnp.all(camera_is_finite(task.input_cameras) | ~real) & bounds_are_sound(task)
            & (task.num_input_cameras >= 1))
  state = Think3DState(task=task, round=zero, stopped=no, done=~usable, camera=camera,
                       near=jnp.asarray(DEFAULT_NEAR, jnp.float32), anchor=zero,
                       is_global=no, is_photo=no)
  views = input_views(task, params)
  rendered_first = not task.has_input_images and params.num_prompt_images > 0
  image = views[0] if rendered_first else _render(task, camera, DEFAULT_NEAR, params)
  obs = Think3DObservation(image=image, action=Think3DAction.create(VIEW, 0, 0.0, 0.0, EGO),
                           round=zero, input_images=views)
  return obs, state


def step(key: Array, state: Think3DState, action: Think3DAction,
         params: Think3DParams = Think3DParams()):
  """Renders the requested view. Returns (obs, state, reward, done, info).

  `max_rounds` views are accepted, then only STOP (the answer); any other action after
  the last round is invalid and ends the episode. done: no further action is accepted.
  reward is 0: Think3D's reward needs the final answer and is computed by
  `jaxspatial.rl` from the episode. info: invalid (the state did not change, except
  `done` for an action past the last round).
  """
  del key
  params.check()
  _check_action(action)
  task = state.task
  _check_image_size(task, params)
  rounds_left = state.round < params.max_rounds
  is_stop = action.kind == STOP
  open_ = ~state.done
  valid = action_is_valid(task, action, params) & open_ & (is_stop | rounds_left)
  overrun = open_ & ~is_stop & ~rounds_left
  is_view = valid & (action.kind == VIEW)
  at_zero = ((jnp.abs(action.azimuth_deg) < 1e-6) & (jnp.abs(action.elevation_deg) < 1e-6)
             & params.input_image_at_zero)
  camera, near = view_camera(task, action, params)
  # (0, 0) shows the anchor's input view: its own camera, as the input views render it.
  camera = jax.tree.map(lambda photo, new: jnp.where(at_zero, photo, new),
                        _anchor_camera(task, action.camera_index), camera)
  near = jnp.where(at_zero, DEFAULT_NEAR, near)
  keep = lambda new, old: jnp.where(is_view, new, old)
  new_state = state.replace(
      round=state.round + is_view.astype(jnp.int32),
      stopped=state.stopped | (valid & is_stop),
      camera=jax.tree.map(keep, camera, state.camera), near=keep(near, state.near),
      anchor=keep(action.camera_index, state.anchor),
      is_global=keep((action.mode == GLOBAL) & ~at_zero, state.is_global),
      is_photo=keep(at_zero, state.is_photo))
  done = state.done | new_state.stopped | overrun
  new_state = new_state.replace(done=done)
  empty = jnp.zeros((0, params.height, params.width, 3), jnp.uint8)
  obs = Think3DObservation(image=_observe(new_state, params), action=action,
                           round=new_state.round, input_images=empty)
  info = {"invalid": ~valid, "round": new_state.round}
  return obs, new_state, jnp.zeros((), jnp.float32), done, info
