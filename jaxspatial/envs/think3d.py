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
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxspatial.envs.task import Task
from jaxspatial.geometry import Camera, make_transform, rotation_about_axis
from jaxspatial.render import render
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

  def check(self) -> None:
    if self.pivot not in ("centroid", "anchor_camera"):
      raise ValueError(f"Think3DParams.pivot: expected 'centroid' or 'anchor_camera', "
                       f"got {self.pivot!r}")
    if self.elevation_convention not in ("paper", "code"):
      raise ValueError(f"Think3DParams.elevation_convention: expected 'paper' or 'code', "
                       f"got {self.elevation_convention!r}")


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


@struct.dataclass
class Think3DState:
  task: Task
  round: Array     # [] int32
  stopped: Array   # [] bool
  done: Array      # [] bool
  camera: Camera   # the camera of the last observation
  near: Array      # [] its near plane


def _turn(azimuth_deg: Array, elevation_deg: Array) -> Array:
  """Ry(azimuth) Rx(elevation) in a camera's OpenCV frame (y down)."""
  yaw = rotation_about_axis(jnp.asarray([0.0, 1.0, 0.0]), jnp.deg2rad(azimuth_deg))
  pitch = rotation_about_axis(jnp.asarray([1.0, 0.0, 0.0]), jnp.deg2rad(elevation_deg))
  return yaw @ pitch


def _world_turn(anchor_rotation: Array, azimuth_deg: Array, elevation_deg: Array,
                params: Think3DParams) -> Array:
  """The world-frame rotation that turns the anchor's view right by azimuth and up by
  elevation: about the anchor's own axes, or about `params.up` and the level right axis."""
  if params.up is None:
    return anchor_rotation @ _turn(azimuth_deg, elevation_deg) @ anchor_rotation.T
  up = jnp.asarray(params.up, jnp.float32)
  up = up / jnp.linalg.norm(up)
  forward = anchor_rotation[:, 2]
  right = jnp.cross(forward, up)
  right = jnp.where(jnp.linalg.norm(right) > 1e-6, right, anchor_rotation[:, 0])
  right = right / jnp.linalg.norm(right)
  # Turning right is clockwise seen from above: a negative angle about up.
  yaw = rotation_about_axis(up, -jnp.deg2rad(azimuth_deg))
  pitch = rotation_about_axis(right, jnp.deg2rad(elevation_deg))
  return yaw @ pitch


def scene_centroid(task: Task) -> Array:
  weights = task.cloud.valid.astype(jnp.float32)
  return jnp.sum(task.cloud.xyz * weights[:, None], 0) / jnp.maximum(jnp.sum(weights), 1.0)


def view_camera(task: Task, action: Think3DAction, params: Think3DParams):
  """The camera an action asks for, and the near plane to render it with."""
  anchor = jax.tree.map(lambda x: x[jnp.clip(action.camera_index, 0,
                                            task.input_cameras.fx.shape[0] - 1)],
                        task.input_cameras)
  rotation = anchor.world_from_camera[:3, :3]
  position = anchor.position
  sign = 1.0 if params.elevation_convention == "paper" else -1.0
  ego_turn = _world_turn(rotation, action.azimuth_deg, sign * action.elevation_deg, params)
  ego = Camera.from_fov(params.ego_hfov_deg, params.width, params.height,
                        make_transform(ego_turn @ rotation, position))

  pivot = scene_centroid(task) if params.pivot == "centroid" else position
  world_turn = _world_turn(rotation, action.azimuth_deg, -action.elevation_deg, params)
  global_rotation = world_turn @ rotation
  orbit_position = pivot + world_turn @ (position - pivot)
  forward = global_rotation[:, 2]
  pull = jnp.zeros(())
  if params.pull_back:
    corners = jnp.where(_CORNER_SELECT, task.scene_max, task.scene_min)  # [8, 3]
    radius = jnp.max(jnp.linalg.norm(corners - pivot, axis=-1))
    half_fov = jnp.deg2rad(params.global_hfov_deg) / 2
    half_vfov = jnp.arctan(jnp.tan(half_fov) * params.height / params.width)
    fit_distance = radius / jnp.sin(jnp.minimum(half_fov, half_vfov))
    pull = jnp.maximum(fit_distance - jnp.dot(pivot - orbit_position, forward), 0.0)
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


def _render(task: Task, camera: Camera, near, params: Think3DParams) -> Array:
  return render(task.cloud, camera, params.height, params.width, params.splat_radius,
                params.background, point_radius=params.point_radius, near=near).rgb


def reset(key: Array, task: Task, params: Think3DParams = Think3DParams()):
  """The first observation is the view of the first input camera, rendered at the
  observation size with that camera's intrinsics as given."""
  del key
  params.check()
  camera = jax.tree.map(lambda x: x[0], task.input_cameras)
  image = _render(task, camera, DEFAULT_NEAR, params)
  zero = jnp.zeros((), jnp.int32)
  obs = Think3DObservation(image=image, action=Think3DAction.create(VIEW, 0, 0.0, 0.0, EGO),
                           round=zero)
  state = Think3DState(task=task, round=zero, stopped=jnp.zeros((), bool),
                       done=jnp.zeros((), bool), camera=camera,
                       near=jnp.asarray(DEFAULT_NEAR, jnp.float32))
  return obs, state


def step(key: Array, state: Think3DState, action: Think3DAction,
         params: Think3DParams = Think3DParams()):
  """Renders the requested view. Returns (obs, state, reward, done, info).

  reward is 0: Think3D's reward needs the final answer and is computed by
  `jaxspatial.rl` from the episode. info: invalid (the state did not change).
  """
  del key
  params.check()
  valid = action_is_valid(state.task, action, params) & ~state.done
  is_view = valid & (action.kind == VIEW)
  camera, near = view_camera(state.task, action, params)
  camera = jax.tree.map(lambda new, old: jnp.where(is_view, new, old), camera, state.camera)
  near = jnp.where(is_view, near, state.near)
  image = _render(state.task, camera, near, params)
  round_ = state.round + is_view.astype(jnp.int32)
  stopped = state.stopped | (valid & (action.kind == STOP))
  done = state.done | stopped | (round_ >= params.max_rounds)
  new_state = Think3DState(task=state.task, round=round_, stopped=stopped, done=done,
                           camera=camera, near=near)
  obs = Think3DObservation(image=image, action=action, round=round_)
  info = {"invalid": ~valid, "round": round_}
  return obs, new_state, jnp.zeros((), jnp.float32), done, info
