"""Act3D navigation: move a camera through a 3D scene with relative actions.

The dynamics are equation (1) of the Act3D paper (section 3.1). The camera is a
position e and a unit view direction f; world up is +z and there is no roll.
Ten primitives, each with a multiplier n in 1..8:

  forward / backward   e += +-n * 1.0 m * f         (f keeps its vertical part)
  right / left         e += +-n * 0.6 m * r,  r = normalize(f x z)
  up / down            e += +-n * 0.6 m * z
  turn_left / right    f = Rot(+-z, n * 30 deg) f
  turn_up / down       f = Rot(+-r, n * 30 deg) f

A requested distance d (metres, or degrees for turns) becomes
`n = clip(round(d / unit), 1, 8)`, rounding halves up (within 1e-4, so that
0.9 m of 0.6 m steps is 2 in float32 too); no distance means n = 1. Positions are clamped to the scene box grown by 1 m on every side,
with no collision checking.

Our choice where the paper is silent: the pitch (angle of f above the horizon)
is clamped to [-max_pitch, +max_pitch] (85 degrees by default), so f is never
vertical and r is always defined. Inside the limits a turn up or down is
exactly the rotation about r; a turn past the limit stops at it. The same
clamp applies to the initial camera and to absolute actions.
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
from flax import struct

from jaxspatial.envs.task import Task, bounds_are_sound, camera_is_finite, check_task
from jaxspatial.geometry import Camera, check_fov, look_at
from jaxspatial.render import render

Array = jax.Array

PRIMITIVES = ("forward", "backward", "left", "right", "up", "down",
              "turn_left", "turn_right", "turn_up", "turn_down")
STOP = len(PRIMITIVES)  # primitive id of stop(answer)
WORLD_UP = (0.0, 0.0, 1.0)


@struct.dataclass
class Act3DParams:
  """Static configuration (no array leaves: jit specialises on it)."""

  width: int = struct.field(pytree_node=False, default=640)
  height: int = struct.field(pytree_node=False, default=480)
  hfov_deg: float = struct.field(pytree_node=False, default=90.0)
  max_interactions: int = struct.field(pytree_node=False, default=12)
  forward_step_m: float = struct.field(pytree_node=False, default=1.0)
  lateral_step_m: float = struct.field(pytree_node=False, default=0.6)
  turn_step_deg: float = struct.field(pytree_node=False, default=30.0)
  max_multiplier: int = struct.field(pytree_node=False, default=8)
  bounds_margin_m: float = struct.field(pytree_node=False, default=1.0)
  max_pitch_deg: float = struct.field(pytree_node=False, default=85.0)
  # "relative" (the paper's default) or "absolute" (target position and look-at point).
  parameterization: str = struct.field(pytree_node=False, default="relative")
  # Observation text: position and the point `look_at_distance_m` ahead, to 0.01 m.
  look_at_distance_m: float = struct.field(pytree_node=False, default=1.0)
  # An answer object counts as seen once its points win this many pixels of one view.
  grounding_min_pixels: int = struct.field(pytree_node=False, default=25)
  splat_radius: int = struct.field(pytree_node=False, default=1)
  point_radius: float | None = struct.field(pytree_node=False, default=None)
  background: tuple[int, int, int] = struct.field(pytree_node=False, default=(255, 255, 255))

  def __post_init__(self):
    def integer(name, low):
      value = getattr(self, name)
      if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low:
        raise ValueError(f"Act3DParams.{name}: expected an int >= {low}, got {value!r}")

    def real(name, low, high, what, closed_low=False):
      value = getattr(self, name)
      ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(
          value) and (value >= low if closed_low else value > low) and value < high
      if not ok:
        raise ValueError(f"Act3DParams.{name}: expected {what}, got {value!r}")

    for name in ("width", "height", "max_multiplier"):
      integer(name, 1)
    for name in ("max_interactions", "grounding_min_pixels"):
      integer(name, 0)
    check_fov("Act3DParams.hfov_deg", self.hfov_deg)
    for name in ("forward_step_m", "lateral_step_m", "turn_step_deg", "look_at_distance_m"):
      real(name, 0, math.inf, "a finite step > 0")
    real("bounds_margin_m", 0, math.inf, "a finite margin >= 0", closed_low=True)
    # At 90 degrees the view may turn vertical, where the lateral axis is undefined.
    real("max_pitch_deg", 0, 90, "a pitch limit in (0, 90) degrees")
    if self.parameterization not in ("relative", "absolute"):
      raise ValueError(f"Act3DParams.parameterization: expected 'relative' or 'absolute', "
                       f"got {self.parameterization!r}")

  def unit_steps(self) -> tuple[float, ...]:
    """Unit step of each primitive: metres for translations, degrees for turns."""
    return ((self.forward_step_m,) * 2 + (self.lateral_step_m,) * 4
            + (self.turn_step_deg,) * 4)


@struct.dataclass
class Act3DAction:
  """One action. `primitive` in 0..9 navigates (see PRIMITIVES), 10 stops.

  `distance` is read when `has_distance`. The absolute parameterization reads
  `position` and `look_at` instead of the primitive (stop still ends it).
  """

  primitive: Array
  distance: Array
  has_distance: Array
  position: Array
  look_at: Array

  @classmethod
  def navigate(cls, name: str, distance: float | None = None) -> "Act3DAction":
    if name not in PRIMITIVES:
      raise ValueError(f"Act3DAction.navigate: unknown primitive {name!r}; "
                       f"expected one of {PRIMITIVES}")
    return cls.create(PRIMITIVES.index(name), distance)

  @classmethod
  def stop(cls) -> "Act3DAction":
    return cls.create(STOP)

  @classmethod
  def absolute(cls, position, target) -> "Act3DAction":
    return cls.create(-1, position=position, look_at=target)

  @classmethod
  def create(cls, primitive, distance=None, position=(0.0, 0.0, 0.0),
             look_at=(0.0, 0.0, 0.0)) -> "Act3DAction":
    return cls(primitive=jnp.asarray(primitive, jnp.int32),
               distance=jnp.asarray(0.0 if distance is None else distance, jnp.float32),
               has_distance=jnp.asarray(distance is not None),
               position=jnp.asarray(position, jnp.float32),
               look_at=jnp.asarray(look_at, jnp.float32))


@struct.dataclass
class Act3DObservation:
  image: Array            # [H, W, 3] uint8
  position: Array         # [3] camera position, rounded to 0.01 m
  look_at: Array          # [3] the point look_at_distance_m ahead, rounded to 0.01 m
  num_interactions: Array  # [] int32


@struct.dataclass
class Act3DState:
  task: Task
  position: Array         # [3]
  forward: Array          # [3] unit
  num_interactions: Array  # [] int32, navigation actions taken
  stopped: Array          # [] bool, the agent answered
  done: Array             # [] bool
  objects_seen: Array     # [M] bool, answer object m seen in some view


def _normalize(v: Array) -> Array:
  return v / jnp.maximum(jnp.linalg.norm(v, axis=-1, keepdims=True), 1e-12)


def lateral_axis(forward: Array) -> Array:
  """r = normalize(f x z); for a vertical f (only reachable by bad input) it is +x."""
  r = jnp.cross(forward, jnp.asarray(WORLD_UP))
  norm = jnp.linalg.norm(r)
  return jnp.where(norm > 1e-6, r / jnp.maximum(norm, 1e-12), jnp.asarray([1.0, 0.0, 0.0]))


def _heading(forward: Array) -> Array:
  """The horizontal unit direction of forward (+y if forward is vertical)."""
  horizontal = forward.at[2].set(0.0)
  norm = jnp.linalg.norm(horizontal)
  return jnp.where(norm > 1e-6, horizontal / jnp.maximum(norm, 1e-12),
                   jnp.asarray([0.0, 1.0, 0.0]))


def _with_pitch(forward: Array, pitch: Array) -> Array:
  """The unit direction with forward's heading and the given pitch (radians)."""
  return _heading(forward) * jnp.cos(pitch) + jnp.asarray(WORLD_UP) * jnp.sin(pitch)


def pitch_of(forward: Array) -> Array:
  return jnp.arcsin(jnp.clip(forward[2] / jnp.linalg.norm(forward), -1.0, 1.0))


def clamp_pitch(forward: Array, max_pitch_deg: float) -> Array:
  """The direction with the same heading and its pitch clamped to +-max_pitch_deg."""
  pitch = pitch_of(forward)
  limit = jnp.deg2rad(max_pitch_deg)
  return jnp.where(jnp.abs(pitch) > limit, _with_pitch(forward, jnp.clip(pitch, -limit, limit)),
                   _normalize(forward))


def multiplier(action: Act3DAction, params: Act3DParams) -> Array:
  """n = clip(round(d / unit), 1, max_multiplier), or 1 without a distance."""
  units = jnp.asarray(params.unit_steps(), jnp.float32)
  unit = units[jnp.clip(action.primitive, 0, len(PRIMITIVES) - 1)]
  # Decimal distances hit float32 just below a halfway point (0.9 m / 0.6 m is
  # 1.4999999); a 1e-4 tolerance rounds those up as the user meant.
  n = jnp.clip(jnp.floor(action.distance / unit + 0.5 + 1e-4), 1, params.max_multiplier)
  return jnp.where(action.has_distance, n, 1).astype(jnp.int32)


def _rotate(v: Array, axis: Array, angle: Array) -> Array:
  """Rodrigues' rotation of v about the unit axis."""
  c, s = jnp.cos(angle), jnp.sin(angle)
  return v * c + jnp.cross(axis, v) * s + axis * jnp.sum(axis * v, -1, keepdims=True) * (1.0 - c)


def relative_dynamics(position: Array, forward: Array, action: Act3DAction,
                      params: Act3DParams, box_min: Array, box_max: Array):
  """Equation (1). Returns (position, forward, n); the inputs are assumed valid."""
  n = multiplier(action, params)
  units = jnp.asarray(params.unit_steps(), jnp.float32)
  k = jnp.clip(action.primitive, 0, len(PRIMITIVES) - 1)
  amount = n * units[k]
  z = jnp.asarray(WORLD_UP)
  r = lateral_axis(forward)
  directions = jnp.stack([forward, -forward, -r, r, z, -z])  # forward..down
  moved = jnp.clip(position + amount * directions[jnp.minimum(k, 5)], box_min, box_max)

  angle = jnp.deg2rad(amount)
  yawed = _rotate(forward, jnp.where(k == 6, 1.0, -1.0) * z, angle)
  # Inside the pitch limits a turn up or down is exactly Rot(+-r); past them it stops there.
  sign = jnp.where(k == 8, 1.0, -1.0)
  target_pitch = pitch_of(forward) + sign * angle
  limit = jnp.deg2rad(params.max_pitch_deg)
  pitched = jnp.where(jnp.abs(target_pitch) <= limit, _rotate(forward, sign * r, angle),
                      _with_pitch(forward, jnp.clip(target_pitch, -limit, limit)))
  is_translation = k < 6
  new_forward = jnp.where(k < 8, yawed, pitched)
  return (jnp.where(is_translation, moved, position),
          _normalize(jnp.where(is_translation, forward, new_forward)), n)


def scene_box(task: Task, params: Act3DParams) -> tuple[Array, Array]:
  return task.scene_min - params.bounds_margin_m, task.scene_max + params.bounds_margin_m


def camera_of(position: Array, forward: Array, params: Act3DParams) -> Camera:
  pose = look_at(position, position + forward, WORLD_UP)
  return Camera.from_fov(params.hfov_deg, params.width, params.height, pose)


def _observe(task: Task, position: Array, forward: Array, num_interactions: Array,
             params: Act3DParams):
  view = render(task.cloud, camera_of(position, forward, params), params.height, params.width,
                params.splat_radius, params.background, point_radius=params.point_radius)
  pixels = jnp.sum(view.instance[None] == task.answer_objects[:, None, None], axis=(1, 2))
  seen = (pixels >= params.grounding_min_pixels) & (task.answer_objects >= 0)
  obs = Act3DObservation(
      image=view.rgb,
      position=jnp.round(position * 100.0) / 100.0,
      look_at=jnp.round((position + params.look_at_distance_m * forward) * 100.0) / 100.0,
      num_interactions=num_interactions)
  return obs, seen


def reset(key: Array, task: Task, params: Act3DParams = Act3DParams()):
  """Starts at the task's initial camera. Returns (observation, state).

  A task whose initial camera or bounds are unusable raises here when its values are
  concrete (`check_task`); under jit or vmap such an episode starts done, so every action
  is invalid (rather than running in a NaN state with blank views)."""
  del key  # deterministic
  check_task(task)
  box_min, box_max = scene_box(task, params)
  position = jnp.clip(task.initial_camera.position, box_min, box_max)
  forward = clamp_pitch(task.initial_camera.forward, params.max_pitch_deg)
  usable = (camera_is_finite(task.initial_camera) & bounds_are_sound(task)
            & _is_pose(position, forward))
  zero = jnp.zeros((), jnp.int32)
  obs, seen = _observe(task, position, forward, zero, params)
  state = Act3DState(task=task, position=position, forward=forward, num_interactions=zero,
                     stopped=jnp.zeros((), bool), done=~usable,
                     objects_seen=seen & usable)
  return obs, state


def _is_pose(position: Array, forward: Array) -> Array:
  """A finite position and a finite unit view direction (a zero or overflowed direction
  would give a degenerate camera)."""
  return (jnp.all(jnp.isfinite(position)) & jnp.all(jnp.isfinite(forward))
          & (jnp.abs(jnp.sum(forward * forward) - 1.0) < 1e-3))


def _check_action(action: Act3DAction) -> None:
  """Static checks of an action's fields (shapes and dtypes; values are checked on device)."""
  if not isinstance(action, Act3DAction):
    raise TypeError(f"act3d.step: expected an Act3DAction, got {type(action).__name__}")
  for name, shape, kind in (("primitive", (), "integer"), ("distance", (), "float"),
                            ("has_distance", (), "bool"), ("position", (3,), "float"),
                            ("look_at", (3,), "float")):
    value = getattr(action, name)
    got_shape, dtype = tuple(jnp.shape(value)), jnp.result_type(value)
    if got_shape != shape:
      raise ValueError(f"Act3DAction.{name}: expected shape {shape}, got {got_shape}")
    ok = {"integer": jnp.issubdtype(dtype, jnp.integer) and dtype != jnp.bool_,
          "float": jnp.issubdtype(dtype, jnp.floating),
          "bool": dtype == jnp.bool_}[kind]
    if not ok:
      raise ValueError(f"Act3DAction.{name}: expected a {kind} dtype, got {dtype}")


def action_is_valid(action: Act3DAction, params: Act3DParams) -> Array:
  """Known primitive, finite numbers; absolute targets must differ from the position."""
  is_stop = action.primitive == STOP
  if params.parameterization == "relative":
    known = (action.primitive >= 0) & (action.primitive <= STOP)
    distance_ok = ~action.has_distance | jnp.isfinite(action.distance)
    return known & distance_ok
  finite = jnp.all(jnp.isfinite(action.position)) & jnp.all(jnp.isfinite(action.look_at))
  apart = jnp.linalg.norm(action.look_at - action.position) > 1e-6
  return is_stop | (finite & apart)


def step(key: Array, state: Act3DState, action: Act3DAction,
         params: Act3DParams = Act3DParams()):
  """Applies one action. Returns (obs, state, reward, done, info).

  reward is 0: Act3D's reward needs the final answer and the judge, and is
  computed from the episode by `jaxspatial.rl` from `info` and the answer.
  done: the episode accepts no further action: it stopped, or a move came after the
  `max_interactions` allowed (that move is invalid; a stop after the last move is not).
  info: invalid (the state did not change), multiplier, objects_seen,
  newly_seen, grounded, num_interactions.
  """
  del key
  if params.parameterization not in ("relative", "absolute"):
    raise ValueError(f"Act3DParams.parameterization: expected 'relative' or 'absolute', "
                     f"got {params.parameterization!r}")
  _check_action(action)
  task = state.task
  box_min, box_max = scene_box(task, params)
  is_stop = action.primitive == STOP
  # max_interactions moves, then only stop(answer): a move past the budget is refused and
  # ends the episode without an answer.
  exhausted = state.num_interactions >= params.max_interactions
  past_budget = ~state.done & ~is_stop & exhausted
  valid = action_is_valid(action, params) & ~state.done & (is_stop | ~exhausted)
  if params.parameterization == "relative":
    position, forward, n = relative_dynamics(state.position, state.forward, action, params,
                                              box_min, box_max)
  else:
    position = jnp.clip(action.position, box_min, box_max)
    forward = clamp_pitch(action.look_at - action.position, params.max_pitch_deg)
    n = jnp.ones((), jnp.int32)
  # Whatever the action, a move must land on a sound pose (huge finite targets overflow).
  valid = valid & (is_stop | _is_pose(position, forward))
  moves = valid & ~is_stop
  position = jnp.where(moves, position, state.position)
  forward = jnp.where(moves, forward, state.forward)
  num_interactions = state.num_interactions + moves.astype(jnp.int32)
  stopped = state.stopped | (valid & is_stop)
  done = state.done | stopped | past_budget

  obs, seen_now = _observe(task, position, forward, num_interactions, params)
  seen_now = seen_now & moves
  objects_seen = state.objects_seen | seen_now
  new_state = Act3DState(task=task, position=position, forward=forward,
                         num_interactions=num_interactions, stopped=stopped, done=done,
                         objects_seen=objects_seen)
  has_objects = jnp.any(task.answer_objects >= 0)
  info = {
      "invalid": ~valid,
      "multiplier": jnp.where(moves, n, 0),
      "objects_seen": objects_seen,
      "newly_seen": objects_seen & ~state.objects_seen,
      "grounded": has_objects & jnp.all(objects_seen | (task.answer_objects < 0)),
      "num_interactions": num_interactions,
  }
  return obs, new_state, jnp.zeros((), jnp.float32), done, info
