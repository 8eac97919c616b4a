"""Hostile inputs to the environments and tasks: every bad value is refused with an error
naming the field, or flagged invalid on device; never a silent no-op, a NaN state or an
error from deep inside JAX.

Each environment runs ONE compiled program (reset, then a scan of steps, vmapped over a
batch of episodes), so hundreds of mutated actions cost one compile per environment. The
expected validity of every action comes from host simulations written from the
environments' documented rules (WORKSPACE.md, the modules' docstrings)."""

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from data_pipelines.synthetic import make_room, orbit_cameras
from jaxspatial.envs import act3d, peria, think3d
from jaxspatial.envs.act3d import Act3DAction, Act3DParams
from jaxspatial.envs.task import Task, check_task
from jaxspatial.envs.think3d import Think3DAction, Think3DParams

W, H = 32, 24
KEY = jax.random.PRNGKey(0)
STEPS = 3                 # actions per fuzzed episode
EPISODES = 96             # fuzzed episodes per environment (x STEPS mutated actions)
INTS = (-2 ** 31, -7, -1, 0, 1, 2, 3, 5, 6, 9, 10, 11, 2 ** 31 - 1)
FLOATS = (np.nan, np.inf, -np.inf, -1e30, -200.0, -5.0, -0.0, 0.0, 1e-30, 0.3, 2.5, 45.0,
          179.0, 1e30)


@pytest.fixture(scope="module")
def room():
  return make_room(3, 3000, num_objects=3)


@pytest.fixture(scope="module")
def task(room):
  centre = np.asarray(room.bounds_max) / 2
  cameras = orbit_cameras((centre[0], centre[1], 0.5), 2.0, 1.5, 3, W, H)
  return Task.create(room.cloud, cameras, scene_min=room.bounds_min, scene_max=room.bounds_max,
                     answer_objects=[room.objects[0].instance], num_input_cameras=2)


def _nan_pose(camera, index=None):
  pose = np.array(camera.world_from_camera)
  if index is None:
    pose[0, 3] = np.nan
  else:
    pose[index, 0, 3] = np.nan
  return camera.replace(world_from_camera=jnp.asarray(pose))


def _stack(items):
  return jax.tree.map(lambda *x: jnp.stack([jnp.asarray(v) for v in x]), *items)


def _field_named(error, names):
  message = str(error)
  assert any(name in message for name in names), message
  assert "expected" in message, message


# ----------------------------------------------------------------------------- Task


def test_task_create_refuses_what_would_wrap_clamp_or_run_in_nan(room, task):
  cameras = task.input_cameras
  with pytest.raises(ValueError, match=r"Task.question_ids: expected ids in \[0, 2\^31 - 1\] "
                                       r"\(stored as int32\), got 1099511627776"):
    Task.create(room.cloud, cameras, question_ids=[5, 2 ** 40])
  with pytest.raises(ValueError, match=r"Task.question_ids: .* got 2147483648"):
    Task.create(room.cloud, cameras, question_ids=[2 ** 31])
  with pytest.raises(ValueError, match=r"Task.question_ids: expected integer ids, got 1.5"):
    Task.create(room.cloud, cameras, question_ids=[1.5])
  with pytest.raises(ValueError, match=r"Task.answer_ids: .* got -3"):
    Task.create(room.cloud, cameras, answer_ids=[[1, 2], [-3]], max_answers=2)
  with pytest.raises(ValueError, match=r"Task.answer_objects: .* got 4294967296"):
    Task.create(room.cloud, cameras, answer_objects=[2 ** 32])
  with pytest.raises(ValueError, match=r"Task.question_ids: expected ids, got text"):
    Task.create(room.cloud, cameras, question_ids="what?")
  biggest = Task.create(room.cloud, cameras, question_ids=[2 ** 31 - 1, 0])
  np.testing.assert_array_equal(biggest.question_ids[:3], [2 ** 31 - 1, 0, -1])  # exact
  with pytest.raises(ValueError, match=r"Task.scene_min: expected scene_min <= scene_max on "
                                       r"every axis, got scene_min \[0.0, 5.0, 0.0\] and "
                                       r"scene_max \[6.0, 1.0, 3.0\] \(axis 1\)"):
    Task.create(room.cloud, cameras, scene_min=(0, 5, 0), scene_max=(6, 1, 3))
  with pytest.raises(ValueError, match=r"Task.scene_max: expected finite values"):
    Task.create(room.cloud, cameras, scene_min=(0, 0, 0), scene_max=(6, np.nan, 3))
  with pytest.raises(ValueError, match=r"Task.scene_min: expected shape \(3,\), got \(2,\)"):
    Task.create(room.cloud, cameras, scene_min=(0, 0), scene_max=(6, 5, 3))
  nan_camera = _nan_pose(task.initial_camera)
  with pytest.raises(ValueError, match=r"Task.initial_camera.world_from_camera: expected "
                                       r"finite values, got nan"):
    Task.create(room.cloud, cameras, initial_camera=nan_camera)
  with pytest.raises(ValueError, match=r"Task.input_cameras.world_from_camera: expected "
                                       r"finite values"):
    Task.create(room.cloud, _nan_pose(cameras, 1))
  with pytest.raises(ValueError, match=r"Task.initial_camera.fx: expected a focal length > 0"):
    Task.create(room.cloud, cameras, initial_camera=task.initial_camera.replace(
        fx=jnp.asarray(-20.0)))
  mirrored = np.array(task.initial_camera.world_from_camera)
  mirrored[:3, 0] *= -1
  with pytest.raises(ValueError, match=r"Task.initial_camera.world_from_camera: expected a "
                                       r"rigid pose .* det R = -1"):
    Task.create(room.cloud, cameras, initial_camera=task.initial_camera.replace(
        world_from_camera=jnp.asarray(mirrored)))
  with pytest.raises(ValueError, match=r"Task.answer_choice: expected an int >= -1"):
    Task.create(room.cloud, cameras, answer_choice=-2)


def test_resets_refuse_concrete_unusable_tasks(task):
  """A task built directly (as the loader does) or edited skips Task.create's checks; the
  environments' resets refuse it while its values are concrete."""
  nan_start = task.replace(initial_camera=_nan_pose(task.initial_camera))
  inverted = task.replace(scene_min=task.scene_max, scene_max=task.scene_min)
  nan_input = task.replace(input_cameras=_nan_pose(task.input_cameras, 1))
  match = r"Task.initial_camera.world_from_camera: expected finite values"
  with pytest.raises(ValueError, match=match):
    act3d.reset(KEY, nan_start, Act3DParams(width=W, height=H))
  with pytest.raises(ValueError, match=match):
    peria.reset(KEY, nan_start, peria.PeriaParams(width=W, height=H))
  with pytest.raises(ValueError, match=r"Task.scene_min: expected scene_min <= scene_max"):
    act3d.reset(KEY, inverted, Act3DParams(width=W, height=H))
  with pytest.raises(ValueError, match=r"Task.input_cameras.world_from_camera: expected "
                                       r"finite values"):
    think3d.reset(KEY, nan_input, Think3DParams(width=W, height=H))
  # A NaN in a padding camera (past num_input_cameras = 2) is never used: accepted.
  padded = task.replace(input_cameras=_nan_pose(task.input_cameras, 2))
  check_task(padded)


def test_params_refuse_mirroring_or_collapsing_fields_of_view():
  for fov in (-90.0, 0.0, 180.0, 200.0, np.nan):
    with pytest.raises(ValueError, match=r"Act3DParams.hfov_deg: expected a field of view in "
                                         r"\(0, 180\) degrees"):
      Act3DParams(hfov_deg=fov)
    with pytest.raises(ValueError, match=r"PeriaParams.hfov_deg: expected a field of view"):
      peria.PeriaParams(hfov_deg=fov)
    with pytest.raises(ValueError, match=r"Think3DParams.ego_hfov_deg: expected a field of "):
      Think3DParams(ego_hfov_deg=fov).check()
  with pytest.raises(ValueError, match=r"Act3DParams.max_pitch_deg: expected a pitch limit in "
                                       r"\(0, 90\) degrees"):
    Act3DParams(max_pitch_deg=90.0)
  with pytest.raises(ValueError, match=r"Act3DParams.max_interactions: expected an int >= 0, "
                                       r"got -1"):
    Act3DParams(max_interactions=-1)
  with pytest.raises(ValueError, match=r"Act3DParams.forward_step_m: expected a finite step"):
    Act3DParams(forward_step_m=float("nan"))
  with pytest.raises(ValueError, match=r"Act3DParams.parameterization: expected 'relative'"):
    Act3DParams(parameterization="polar")
  with pytest.raises(ValueError, match=r"Think3DParams.up: expected None or a finite non-zero"):
    Think3DParams(up=(0.0, 0.0, 0.0)).check()


# ----------------------------------------------------------------------------- static checks


def _static_mutations(action, fields, rng, count):
  """Actions with one field of the wrong shape or dtype (each must raise naming it)."""
  out = []
  for _ in range(count):
    name = fields[rng.integers(len(fields))]
    value = jnp.asarray(getattr(action, name))
    choice = rng.integers(4)
    if choice == 0:
      bad = jnp.stack([value, value])                       # an extra axis
    elif choice == 1:
      bad = value.reshape(-1)[:0]                           # empty
    elif choice == 2:  # the other kind of number
      bad = (value.astype(jnp.float32) if jnp.issubdtype(value.dtype, jnp.integer)
             else value.astype(jnp.int32))
    else:
      bad = value.astype(jnp.complex64) if value.dtype != jnp.bool_ else value.astype(
          jnp.int32)
    out.append((name, action.replace(**{name: bad})))
  return out


@pytest.mark.parametrize("env", ["act3d", "think3d", "peria"])
def test_actions_of_the_wrong_shape_or_dtype_are_refused_naming_the_field(env, task):
  rng = np.random.default_rng(zlib_seed(env))
  if env == "act3d":
    params = Act3DParams(width=W, height=H)
    base, prefix = Act3DAction.navigate("forward", 1.0), "Act3DAction"
    fields = ("primitive", "distance", "has_distance", "position", "look_at")
    step = lambda a: act3d.step(KEY, None, a, params)
  elif env == "think3d":
    params = Think3DParams(width=W, height=H)
    base, prefix = Think3DAction.view(0, 10.0, 5.0), "Think3DAction"
    fields = ("kind", "camera_index", "azimuth_deg", "elevation_deg", "mode")
    step = lambda a: think3d.step(KEY, None, a, params)
  else:
    params = peria.PeriaParams(width=W, height=H, max_images=3, max_turns=3, max_path_points=3)
    base = peria.PeriaAction.create(peria.TOOL, 0, 0, (0, 0, 500, 500), max_points=3)
    prefix, fields = "PeriaAction", ("kind", "tool", "image", "argument", "points", "num_points")
    step = lambda a: peria.step(KEY, None, a, params)
  # The checks run before the state is read: a None state proves nothing was computed.
  for name, action in _static_mutations(base, fields, rng, 24):
    with pytest.raises((ValueError, TypeError)) as error:
      step(action)
    _field_named(error.value, [f"{prefix}.{name}"])


def zlib_seed(name: str) -> int:
  return zlib.crc32(name.encode())


# ----------------------------------------------------------------------------- fuzz on device


def _play(reset, step, params, tasks, which, actions, starts=None):
  """Episode e starts from reset(tasks[which[e]]) and takes actions[e] ([E, T] leaves).
  One jitted reset (shared by the tasks, same shapes) and ONE compiled scan of the step
  over all E x T steps (the state restarts at each episode's first step): two programs per
  environment (`starts`: reset states already made, then no reset is compiled). Returns
  the host start states and the steps' (obs, state less its task, done, info) with leaves
  [E, T, ...]."""
  if starts is None:
    reset_jit = jax.jit(lambda task: reset(KEY, task, params))
    starts = _stack([reset_jit(task)[1] for task in tasks])
  episodes, steps = np.shape(jax.tree.leaves(actions)[0])[:2]
  flat = jax.tree.map(lambda x: jnp.reshape(x, (episodes * steps,) + jnp.shape(x)[2:]), actions)
  first = jnp.asarray(np.arange(episodes * steps) % steps == 0)
  index = jnp.asarray(np.repeat(np.asarray(which), steps), jnp.int32)

  @jax.jit
  def run(starts, first, index, flat):
    def body(carry, inputs):
      is_first, k, action = inputs
      start = jax.tree.map(lambda x: x[k], starts)
      state = jax.tree.map(lambda a, b: jnp.where(is_first, a, b), start, carry)
      obs, new, _, done, info = step(KEY, state, action, params)
      return new, (obs, new.replace(task=None), done, info)
    _, out = jax.lax.scan(body, jax.tree.map(lambda x: x[0], starts), (first, index, flat))
    return out

  out = jax.device_get(run(starts, first, index, flat))
  out = jax.tree.map(lambda x: x.reshape((episodes, steps) + x.shape[1:]), out)
  return jax.device_get(starts), out


def _pick(rng, pool, size):
  return np.asarray(pool)[rng.integers(len(pool), size=size)]


def _which(episodes):
  """Task 0 (good) for most episodes, task 1 (unusable, seen only on device) for every 8th."""
  unusable = np.arange(episodes) % 8 == 7
  return unusable.astype(np.int32), unusable


ACT3D = Act3DParams(width=W, height=H, max_interactions=2, grounding_min_pixels=5)


@pytest.fixture(scope="module")
def act3d_starts(task):
  """Reset states of the good task and of one with a NaN initial camera, under jit (the
  camera is a tracer there: the episode is flagged on device). Both parameterizations
  reset alike."""
  bad_task = task.replace(initial_camera=_nan_pose(task.initial_camera))
  reset = jax.jit(lambda t: act3d.reset(KEY, t, ACT3D))
  return _stack([reset(t)[1] for t in (task, bad_task)])


def test_act3d_fuzz_every_mutated_action_is_applied_or_flagged(task, act3d_starts):
  params = ACT3D
  rng = np.random.default_rng(1)
  shape = (EPISODES, STEPS)
  ordinary = rng.uniform(size=shape) < 0.5
  primitive = np.where(ordinary, rng.integers(0, 11, size=shape),
                       _pick(rng, INTS, shape)).astype(np.int32)
  distance = np.where(rng.uniform(size=shape) < 0.5, rng.uniform(-1, 10, size=shape),
                      _pick(rng, FLOATS, shape)).astype(np.float32)
  has_distance = rng.uniform(size=shape) < 0.7
  actions = Act3DAction(primitive=jnp.asarray(primitive), distance=jnp.asarray(distance),
                        has_distance=jnp.asarray(has_distance),
                        position=jnp.zeros(shape + (3,)), look_at=jnp.zeros(shape + (3,)))
  which, unusable = _which(EPISODES)
  starts, (obs, states, done, info) = _play(act3d.reset, act3d.step, params, None, which,
                                            actions, act3d_starts)
  np.testing.assert_array_equal(starts.done, [False, True])  # flagged on device from the start
  for e in range(EPISODES):
    is_done, moves = bool(unusable[e]), 0
    previous = starts.position[which[e]]
    for t in range(STEPS):
      p, d, has = int(primitive[e, t]), float(distance[e, t]), bool(has_distance[e, t])
      is_stop = p == act3d.STOP
      exhausted = moves >= params.max_interactions
      valid = (0 <= p <= act3d.STOP) and (not has or np.isfinite(d)) and not is_done and (
          is_stop or not exhausted)
      assert bool(info["invalid"][e, t]) == (not valid), (e, t, p, d, has)
      new_p, new_f = states.position[e, t], states.forward[e, t]
      if not valid or is_stop:  # the state did not move
        np.testing.assert_array_equal(new_p, previous)
      if not unusable[e]:
        assert np.isfinite(new_p).all() and np.isfinite(new_f).all(), (e, t)
        np.testing.assert_allclose(np.linalg.norm(new_f), 1.0, atol=1e-4)
        assert abs(np.degrees(np.arcsin(new_f[2]))) <= params.max_pitch_deg + 1e-3
        assert np.isfinite(obs.position[e, t]).all()
      moves += valid and not is_stop
      is_done = is_done or (valid and is_stop) or (not is_stop and exhausted)
      assert bool(done[e, t]) == is_done, (e, t)
      assert int(states.num_interactions[e, t]) == moves <= params.max_interactions
      previous = new_p


def test_act3d_absolute_fuzz_never_lands_on_a_degenerate_pose(act3d_starts):
  """Absolute targets: NaN, infinite, huge (the direction overflows float32) or coincident."""
  params = ACT3D.replace(parameterization="absolute", max_interactions=12)
  rng = np.random.default_rng(2)
  shape = (EPISODES, STEPS)
  base = rng.normal(size=shape + (2, 3)) * 3
  wild = _pick(rng, (np.nan, np.inf, -np.inf, 3e38, -3e38, 1e20, 0.0), shape + (2, 3))
  points = np.where(rng.uniform(size=shape + (2, 3)) < 0.15, wild, base).astype(np.float32)
  same = rng.uniform(size=shape) < 0.1
  points[same, 1] = points[same, 0]  # look_at == position
  primitive = np.where(rng.uniform(size=shape) < 0.15, act3d.STOP, -1).astype(np.int32)
  actions = Act3DAction(primitive=jnp.asarray(primitive), distance=jnp.zeros(shape),
                        has_distance=jnp.zeros(shape, bool),
                        position=jnp.asarray(points[..., 0, :]),
                        look_at=jnp.asarray(points[..., 1, :]))
  starts, (obs, states, done, info) = _play(act3d.reset, act3d.step, params, None,
                                            np.zeros(EPISODES, np.int32), actions, act3d_starts)
  for e in range(EPISODES):
    is_done = False
    for t in range(STEPS):
      finite = bool(np.isfinite(points[e, t]).all())
      delta = points[e, t, 1].astype(np.float64) - points[e, t, 0] if finite else None
      squared = float(np.sum(delta * delta)) if finite else np.nan
      is_stop = primitive[e, t] == act3d.STOP
      if not is_stop:
        # NaN or infinite targets are refused; ordinary ones (apart, nowhere near float32
        # overflow) accepted; for huge finite ones either, as long as the pose stays sound.
        if not finite or squared == 0:
          assert info["invalid"][e, t], (e, t, points[e, t])
        elif not is_done and 1e-6 < squared < 1e30:
          assert not info["invalid"][e, t], (e, t, points[e, t])
      f = states.forward[e, t]
      assert np.isfinite(states.position[e, t]).all() and np.isfinite(f).all(), (e, t)
      np.testing.assert_allclose(np.linalg.norm(f), 1.0, atol=1e-4)
      assert np.isfinite(obs.position[e, t]).all() and np.isfinite(obs.look_at[e, t]).all()
      is_done = is_done or bool(is_stop)
      assert bool(done[e, t]) == is_done


def test_think3d_fuzz_every_mutated_action_is_applied_or_flagged(task):
  # No prompt views nor camera markers: drawing is not what is fuzzed, and each is a
  # program part to compile (the CI budget).
  params = Think3DParams(width=W, height=H, max_rounds=2, num_prompt_images=0,
                         draw_cameras=False)
  rng = np.random.default_rng(3)
  shape = (EPISODES, STEPS)
  ordinary = rng.uniform(size=shape) < 0.6
  kind = np.where(ordinary, rng.integers(0, 2, size=shape), _pick(rng, INTS, shape))
  camera = np.where(ordinary, rng.integers(0, 3, size=shape), _pick(rng, INTS, shape))
  mode = np.where(ordinary, rng.integers(0, 2, size=shape), _pick(rng, INTS, shape))
  angles = np.where(ordinary[..., None], rng.uniform(-200, 200, size=shape + (2,)),
                    _pick(rng, FLOATS, shape + (2,))).astype(np.float32)
  actions = Think3DAction(kind=jnp.asarray(kind, jnp.int32),
                          camera_index=jnp.asarray(camera, jnp.int32),
                          azimuth_deg=jnp.asarray(angles[..., 0]),
                          elevation_deg=jnp.asarray(angles[..., 1]),
                          mode=jnp.asarray(mode, jnp.int32))
  bad_task = task.replace(input_cameras=_nan_pose(task.input_cameras, 0))
  which, unusable = _which(EPISODES)
  starts, (obs, states, done, info) = _play(think3d.reset, think3d.step, params,
                                            [task, bad_task], which, actions)
  np.testing.assert_array_equal(starts.done, [False, True])
  real = int(task.num_input_cameras)
  for e in range(EPISODES):
    is_done, rounds = bool(unusable[e]), 0
    for t in range(STEPS):
      k, c, m = int(kind[e, t]), int(camera[e, t]), int(mode[e, t])
      az, el = float(angles[e, t, 0]), float(angles[e, t, 1])
      view_ok = (k == think3d.VIEW and 0 <= c < real and abs(az) <= params.max_azimuth_deg
                 and abs(el) <= params.max_elevation_deg and m in (0, 1))
      is_stop = k == think3d.STOP
      rounds_left = rounds < params.max_rounds
      valid = not is_done and (is_stop or (view_ok and rounds_left))
      assert bool(info["invalid"][e, t]) == (not valid), (e, t, k, c, az, el, m)
      rounds += valid and not is_stop
      # A stop ends it; so does any other action after the last round.
      is_done = is_done or (valid and is_stop) or (not is_stop and not rounds_left)
      assert bool(done[e, t]) == is_done, (e, t)
      assert int(states.round[e, t]) == rounds
      if not unusable[e]:
        assert np.isfinite(states.camera.world_from_camera[e, t]).all(), (e, t)
        assert np.isfinite(states.near[e, t]) and states.near[e, t] > 0


def test_peria_fuzz_unknown_kinds_are_counted_invalid_calls(task):
  """The issue: an action kind that is neither TOOL nor STOP was a silent no-op (not
  invalid, not counted toward the turn limit). It is now a malformed call ("arguments"):
  invalid, counted, and past the budget it ends the episode like a call. Episodes 0 and 1
  are scripted (unknown kinds, then the same crop as a real call); the rest fuzz."""
  params = peria.PeriaParams(width=W, height=H, max_images=3, max_turns=3, max_path_points=3)
  rng = np.random.default_rng(4)
  shape = (EPISODES, STEPS)
  ordinary = rng.uniform(size=shape) < 0.6
  kind = np.where(rng.uniform(size=shape) < 0.8, peria.TOOL, _pick(rng, INTS, shape))
  tool = np.where(ordinary, rng.integers(0, 6, size=shape), _pick(rng, INTS, shape))
  image = np.where(ordinary, rng.integers(0, 2, size=shape), _pick(rng, INTS, shape))
  argument = np.where(rng.uniform(size=shape) < 0.8,
                      np.asarray(peria.TOOL_ARGUMENT)[np.clip(tool, 0, 5)],
                      _pick(rng, INTS, shape))
  box = np.sort(rng.uniform(0, 1000, size=shape + (2, 2)), axis=-2)  # x1 <= x2, y1 <= y2
  points = np.concatenate([box, rng.uniform(0, 1000, size=shape + (1, 2))], -2)
  wild = rng.uniform(size=points.shape) < 0.1
  points = np.where(wild, _pick(rng, FLOATS, points.shape), points).astype(np.float32)
  count = np.where(ordinary, np.asarray([2, 1, 2, 3, 2, 2])[np.clip(tool, 0, 5)],
                   _pick(rng, INTS, shape))
  # Scripted: a crop of the whole image with kinds 2, -1, 7; then the crop as TOOL.
  kind[0], kind[1] = (2, -1, 7), peria.TOOL
  tool[:2], image[:2], argument[:2], count[:2] = 0, 0, peria.TOOL_ARGUMENT[0], 2
  points[:2] = [[0, 0], [1000, 1000], [0, 0]]
  actions = peria.PeriaAction(kind=jnp.asarray(kind, jnp.int32),
                              tool=jnp.asarray(tool, jnp.int32),
                              image=jnp.asarray(image, jnp.int32),
                              argument=jnp.asarray(argument, jnp.int32),
                              points=jnp.asarray(points),
                              num_points=jnp.asarray(count, jnp.int32))
  bad_task = task.replace(initial_camera=_nan_pose(task.initial_camera))
  which, unusable = _which(EPISODES)
  starts, (obs, states, done, info) = _play(peria.reset, peria.step, params, [task, bad_task],
                                            which, actions)
  np.testing.assert_array_equal(starts.done, [False, True])
  np.testing.assert_array_equal(info["invalid"][0], [True, True, True])
  np.testing.assert_array_equal(info["error"][0], [peria.ERROR_ARGUMENTS] * 2 + [peria.ERROR_LIMIT])
  np.testing.assert_array_equal(states.calls[0], [1, 2, 3])  # counted toward max_turns - 1
  np.testing.assert_array_equal(done[0], [False, False, True])
  np.testing.assert_array_equal(states.count[0], [1, 1, 1])
  np.testing.assert_array_equal(info["invalid"][1], [False, False, True])  # the real calls
  np.testing.assert_array_equal(states.count[1], [2, 3, 3])
  for e in range(EPISODES):
    is_done, calls, images = bool(unusable[e]), 0, 1
    for t in range(STEPS):
      attempt = kind[e, t] != peria.STOP
      error = int(info["error"][e, t])
      over = attempt and not is_done and calls >= params.max_turns - 1
      if attempt and (is_done or over):
        assert error == peria.ERROR_LIMIT, (e, t)
      elif attempt and kind[e, t] != peria.TOOL:
        assert error == peria.ERROR_ARGUMENTS, (e, t)
      assert bool(info["invalid"][e, t]) == (attempt and error != peria.NO_ERROR)
      valid = attempt and error == peria.NO_ERROR
      calls += attempt and not is_done
      images += valid
      is_done = is_done or not attempt or over
      assert int(states.calls[e, t]) == calls and int(states.count[e, t]) == images, (e, t)
      assert bool(done[e, t]) == is_done
      assert int(obs.index[e, t]) == (images - 1 if valid else -1)
      if not valid:
        assert not obs.image[e, t].any()
