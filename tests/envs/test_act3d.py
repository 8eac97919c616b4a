"""Act3D dynamics against a numpy implementation of the paper's equation (1), and the env."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from data_pipelines.synthetic import make_room, orbit_cameras
from jaxspatial.envs import act3d
from jaxspatial.envs.act3d import STOP, Act3DAction, Act3DParams
from jaxspatial.envs.task import Task
from jaxspatial.geometry import Camera, look_at

UNITS = [1.0, 1.0, 0.6, 0.6, 0.6, 0.6, 30.0, 30.0, 30.0, 30.0]
MAX_PITCH = np.deg2rad(85.0)


def numpy_step(e, f, primitive, distance, has_distance, box_min, box_max):
  """Equation (1), written from the paper with scipy rotations, plus our pitch clamp."""
  unit = UNITS[primitive]
  if has_distance:
    q = distance / unit
    n = int(np.clip(np.sign(q) * np.floor(abs(q) + 0.5), 1, 8))
  else:
    n = 1
  z = np.array([0.0, 0.0, 1.0])
  r = np.cross(f, z)
  r /= np.linalg.norm(r)
  if primitive < 6:
    u = [f, -f, -r, r, z, -z][primitive]
    return np.clip(e + n * unit * u, box_min, box_max), f, n
  angle = np.deg2rad(n * unit)
  if primitive in (6, 7):
    axis = z if primitive == 6 else -z
    return e, Rotation.from_rotvec(axis * angle).apply(f), n
  sign = 1.0 if primitive == 8 else -1.0
  target = np.arcsin(f[2]) + sign * angle
  if abs(target) <= MAX_PITCH:
    return e, Rotation.from_rotvec(sign * r * angle).apply(f), n
  heading = np.array([f[0], f[1], 0.0]) / np.linalg.norm(f[:2])
  pitch = np.clip(target, -MAX_PITCH, MAX_PITCH)
  return e, heading * np.cos(pitch) + z * np.sin(pitch), n


def random_cases(rng, count):
  box_min, box_max = np.array([-1.0, -1.0, -1.0]), np.array([7.0, 6.0, 4.0])
  e = rng.uniform(box_min, box_max, (count, 3))
  yaw = rng.uniform(-np.pi, np.pi, count)
  pitch = rng.uniform(-MAX_PITCH, MAX_PITCH, count)
  f = np.stack([np.cos(pitch) * np.cos(yaw), np.cos(pitch) * np.sin(yaw), np.sin(pitch)], 1)
  primitive = rng.integers(0, 10, count)
  has_distance = rng.uniform(size=count) < 0.7
  distance = rng.uniform(-2.0, 300.0, count) * np.where(primitive < 6, 1 / 30, 1.0)
  # Keep away from the rounding halfway points, where float32 and float64 may disagree.
  q = distance / np.array(UNITS)[primitive]
  distance = np.where(np.abs(q - np.floor(q) - 0.5) < 1e-3, distance + 0.01, distance)
  return e, f, primitive, distance, has_distance, box_min, box_max


def test_relative_dynamics_match_equation_1_on_thousands_of_cases():
  rng = np.random.default_rng(0)
  count = 4000
  e, f, primitive, distance, has_distance, box_min, box_max = random_cases(rng, count)
  params = Act3DParams()
  actions = Act3DAction(primitive=jnp.asarray(primitive, jnp.int32),
                        distance=jnp.asarray(distance, jnp.float32),
                        has_distance=jnp.asarray(has_distance),
                        position=jnp.zeros((count, 3)), look_at=jnp.zeros((count, 3)))
  dyn = jax.jit(jax.vmap(lambda e, f, a: act3d.relative_dynamics(
      e, f, a, params, jnp.asarray(box_min, jnp.float32), jnp.asarray(box_max, jnp.float32))))
  new_e, new_f, n = (np.asarray(x) for x in dyn(jnp.asarray(e, jnp.float32),
                                                 jnp.asarray(f, jnp.float32), actions))
  clamped = pitch_clamped = 0
  for i in range(count):
    ref_e, ref_f, ref_n = numpy_step(e[i], f[i], primitive[i], distance[i], has_distance[i],
                                     box_min, box_max)
    assert n[i] == ref_n, i
    np.testing.assert_allclose(new_e[i], ref_e, atol=2e-5, err_msg=str(i))
    np.testing.assert_allclose(new_f[i], ref_f, atol=2e-5, err_msg=str(i))
    clamped += np.any((ref_e == box_min) | (ref_e == box_max)) and primitive[i] < 6
    pitch_clamped += primitive[i] >= 8 and abs(abs(np.arcsin(ref_f[2])) - MAX_PITCH) < 1e-9
  # The cases exercise the box clamp, the pitch clamp and every multiplier.
  assert clamped > 100 and pitch_clamped > 50
  assert set(np.unique(n)) == set(range(1, 9))


@pytest.mark.parametrize("distance,unit,expected", [
    (None, 1.0, 1), (1.5, 1.0, 2), (2.5, 1.0, 3), (0.2, 1.0, 1), (-3.0, 1.0, 1),
    (100.0, 1.0, 8), (0.9, 0.6, 2), (45.0, 30.0, 2), (44.0, 30.0, 1)])
def test_multiplier_rounding(distance, unit, expected):
  name = {1.0: "forward", 0.6: "left", 30.0: "turn_left"}[unit]
  action = Act3DAction.navigate(name, distance)
  assert int(act3d.multiplier(action, Act3DParams())) == expected


def test_turns_and_lateral_moves_by_hand():
  params = Act3DParams()
  e, f = jnp.zeros(3), jnp.asarray([0.0, 1.0, 0.0])  # looking north (+y), z up
  box = (jnp.full(3, -100.0), jnp.full(3, 100.0))
  step = lambda name, d=None: act3d.relative_dynamics(e, f, Act3DAction.navigate(name, d),
                                                       params, *box)
  np.testing.assert_allclose(step("right")[0], [0.6, 0, 0], atol=1e-6)  # east
  np.testing.assert_allclose(step("left", 1.2)[0], [-1.2, 0, 0], atol=1e-6)
  np.testing.assert_allclose(step("turn_left", 90)[1], [-1, 0, 0], atol=1e-6)  # west
  np.testing.assert_allclose(step("turn_right")[1], [0.5, np.sqrt(3) / 2, 0], atol=1e-6)
  np.testing.assert_allclose(step("turn_up")[1], [0, np.sqrt(3) / 2, 0.5], atol=1e-6)
  # Four turns up would pass the vertical: the pitch stops at 85 degrees, heading kept.
  up = step("turn_up", 120)[1]
  np.testing.assert_allclose(up, [0, np.cos(np.deg2rad(85)), np.sin(np.deg2rad(85))],
                             atol=1e-6)


@pytest.fixture(scope="module")
def room_task():
  room = make_room(1, 30_000, num_objects=5)
  centre = np.array(room.bounds_max) / 2
  cameras = orbit_cameras((centre[0], centre[1], 0.5), 2.0, 1.5, 4, 64, 48)
  target = room.objects[0]
  return room, Task.create(room.cloud, cameras, answer_objects=[target.instance],
                           scene_min=room.bounds_min, scene_max=room.bounds_max)


SMALL = Act3DParams(width=64, height=48, grounding_min_pixels=5)


@pytest.mark.slow
@pytest.mark.xla_default
def test_episode_under_jit_and_vmap_equals_single_steps(room_task):
  _, task = room_task
  actions = [Act3DAction.navigate("forward", 2.0), Act3DAction.navigate("turn_left", 60),
             Act3DAction.navigate("up"), Act3DAction.stop()]
  step = lambda s, a: act3d.step(jax.random.key(0), s, a, SMALL)
  key = jax.random.key(0)
  obs, state = act3d.reset(key, task, SMALL)
  singles = []
  for action in actions:
    obs, state, reward, done, info = step(state, action)
    singles.append((obs, state, done, info))
  assert bool(done) and bool(state.stopped) and int(state.num_interactions) == 3

  jit_step = jax.jit(step)
  _, jstate = jax.jit(lambda k, t: act3d.reset(k, t, SMALL))(key, task)
  batched_task = jax.tree.map(lambda x: jnp.stack([x, x]), task)
  _, bstate = jax.vmap(lambda t: act3d.reset(key, t, SMALL))(batched_task)
  for action, (obs, state, done, info) in zip(actions, singles):
    jobs, jstate, _, jdone, jinfo = jit_step(jstate, action)
    chex.assert_trees_all_close((jobs, jstate, jdone, jinfo), (obs, state, done, info),
                                atol=1e-5)
    both = jax.tree.map(lambda x: jnp.stack([x, x]), action)
    bobs, bstate, _, bdone, binfo = jax.vmap(step)(bstate, both)
    for b in range(2):
      chex.assert_trees_all_close(jax.tree.map(lambda x: x[b], (bobs, bstate, bdone, binfo)),
                                  (obs, state, done, info), atol=1e-5)


def test_rendered_observation_and_rounding(room_task):
  _, task = room_task
  obs, state = act3d.reset(jax.random.key(0), task, SMALL)
  chex.assert_shape(obs.image, (48, 64, 3))
  assert (np.asarray(obs.image) != 255).any(axis=-1).mean() > 0.5
  np.testing.assert_allclose(obs.position, np.round(np.asarray(state.position), 2), atol=1e-6)
  np.testing.assert_allclose(np.asarray(obs.position) * 100,
                             np.round(np.asarray(obs.position) * 100), atol=1e-3)


@pytest.mark.parametrize("bad", [
    Act3DAction.create(11), Act3DAction.create(-1), Act3DAction.create(0, float("nan"))])
def test_bad_actions_are_flagged_and_change_nothing(room_task, bad):
  _, task = room_task
  _, state = act3d.reset(jax.random.key(0), task, SMALL)
  _, new_state, _, done, info = act3d.step(jax.random.key(0), state, bad, SMALL)
  assert bool(info["invalid"]) and not bool(done)
  chex.assert_trees_all_equal(new_state, state)


def test_budget_allows_the_moves_then_only_the_answer(room_task):
  """max_interactions moves, then stop(answer) is still accepted (the paper's episode:
  up to N interactions, then the answer); a further move is refused and ends it."""
  _, task = room_task
  params = Act3DParams(width=32, height=24, max_interactions=3)
  _, state = act3d.reset(jax.random.key(0), task, params)
  for _ in range(3):
    _, state, _, done, info = act3d.step(jax.random.key(0), state,
                                         Act3DAction.navigate("turn_left"), params)
    assert not bool(done) and not bool(info["invalid"])
  _, stopped, _, done, info = act3d.step(jax.random.key(0), state, Act3DAction.create(STOP),
                                         params)
  assert bool(done) and bool(stopped.stopped) and not bool(info["invalid"])
  _, after, _, done, info = act3d.step(jax.random.key(0), state,
                                       Act3DAction.navigate("turn_left"), params)
  assert bool(info["invalid"]) and bool(done) and not bool(after.stopped)
  chex.assert_trees_all_equal(after.position, state.position)
  assert int(after.num_interactions) == 3
  _, later, _, _, info = act3d.step(jax.random.key(0), after, Act3DAction.create(STOP), params)
  assert bool(info["invalid"]) and not bool(later.stopped)  # nothing after the end


def test_grounding_needs_the_object_in_view(room_task):
  room, _ = room_task
  obj = room.objects[0]
  centre = np.asarray(obj.centre)
  # Start 3 m from the object looking away from it; turning around brings it into view.
  start = centre + np.array([0.0, 0.0, 0.8]) + np.array([3.0, 0.0, 0.0])
  away = start + np.array([1.0, 0.0, -0.3])
  camera = Camera.from_fov(90.0, 64, 48, look_at(start, away))
  task = Task.create(room.cloud, jax.tree.map(lambda x: x[None], camera), camera,
                     scene_min=room.bounds_min, scene_max=room.bounds_max,
                     answer_objects=[obj.instance])
  obs, state = act3d.reset(jax.random.key(0), task, SMALL)
  assert not bool(state.objects_seen[0])
  _, state, _, _, info = act3d.step(jax.random.key(0), state,
                                    Act3DAction.navigate("turn_left", 180), SMALL)
  assert bool(state.objects_seen[0]) and bool(info["grounded"]) and bool(info["newly_seen"][0])


def test_absolute_parameterization(room_task):
  _, task = room_task
  params = Act3DParams(width=32, height=24, parameterization="absolute")
  _, state = act3d.reset(jax.random.key(0), task, params)
  action = Act3DAction.absolute([1.0, 1.0, 1.5], [3.0, 1.0, 1.5])
  _, state, _, _, info = act3d.step(jax.random.key(0), state, action, params)
  assert not bool(info["invalid"])
  np.testing.assert_allclose(state.position, [1.0, 1.0, 1.5], atol=1e-6)
  np.testing.assert_allclose(state.forward, [1.0, 0.0, 0.0], atol=1e-6)
  same = Act3DAction.absolute([1.0, 1.0, 1.5], [1.0, 1.0, 1.5])
  _, unchanged, _, _, info = act3d.step(jax.random.key(0), state, same, params)
  assert bool(info["invalid"])
  chex.assert_trees_all_equal(unchanged, state)


def test_host_environment_agrees_with_the_jax_environment(room_task):
  """The benchmark's numpy baseline steps like the JAX env (same states, same images)."""
  from jaxspatial.envs.act3d_host import Act3DHostEnv
  room, task = room_task
  params = Act3DParams(width=64, height=48)
  _, state = act3d.reset(jax.random.key(0), task, params)
  host = Act3DHostEnv(room.cloud.xyz, room.cloud.rgb, room.bounds_min, room.bounds_max,
                      state.position, state.forward, params)
  rng = np.random.default_rng(1)
  for _ in range(10):
    primitive = int(rng.integers(0, 10))
    distance = float(rng.uniform(0.3, 5.0) * (30 if primitive >= 6 else 1))
    obs, state, *_ = act3d.step(jax.random.key(0), state,
                                Act3DAction.navigate(act3d.PRIMITIVES[primitive], distance),
                                params)
    image, position, forward, _ = host.step(primitive, distance)
    np.testing.assert_allclose(state.position, position, atol=1e-4)
    np.testing.assert_allclose(state.forward, forward, atol=1e-5)
    # Renderers agree up to pixels whose point sits on a rounding boundary.
    assert (np.asarray(obs.image) != image).any(axis=-1).mean() < 0.01
