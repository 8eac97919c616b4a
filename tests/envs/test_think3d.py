"""Think3D's view tool against hand-built scenes, and jit / vmap / single-call agreement."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from data_pipelines.synthetic import make_room, orbit_cameras
from jaxspatial.envs import think3d
from jaxspatial.envs.task import Task
from jaxspatial.envs.think3d import Think3DAction, Think3DParams
from jaxspatial.geometry import Camera, PointCloud, look_at, project
from jaxspatial.render import render

KEY = jax.random.key(0)
SMALL = Think3DParams(width=64, height=48)


def marker_task(direction_deg_right: float, direction_deg_up: float) -> Task:
  """A camera at the origin looking north (+y), z up, and a red ball 3 m away in the
  given direction; a grey ring of points far away so the scene has bounds."""
  az, el = np.deg2rad(direction_deg_right), np.deg2rad(direction_deg_up)
  centre = 3.0 * np.array([np.sin(az) * np.cos(el), np.cos(az) * np.cos(el), np.sin(el)])
  rng = np.random.default_rng(0)
  ball = centre + 0.3 * rng.normal(size=(2000, 3)) / 3
  ring = np.stack([10 * np.cos(t := rng.uniform(0, 2 * np.pi, 500)), 10 * np.sin(t),
                   rng.uniform(-1, 1, 500)], 1)
  xyz = np.concatenate([ball, ring]).astype(np.float32)
  rgb = np.concatenate([np.tile([255, 0, 0], (2000, 1)), np.tile([128, 128, 128], (500, 1))])
  instance = np.concatenate([np.zeros(2000, int), np.full(500, -1)])
  camera = Camera.from_fov(60.0, 64, 48, look_at([0.0, 0.0, 0.0], [0.0, 1.0, 0.0]))
  cameras = jax.tree.map(lambda x: jnp.stack([x, x]), camera)
  return Task.create(PointCloud.create(xyz, rgb.astype(np.uint8), instance=instance), cameras,
                     num_input_cameras=1)


def red_pixels(image):
  image = np.asarray(image).astype(int)
  return (image[..., 0] > 200) & (image[..., 1] < 60) & (image[..., 2] < 60)


def test_ego_turn_right_brings_a_marker_on_the_right_into_view():
  task = marker_task(80.0, 0.0)  # outside the 140-degree view, 10 degrees past its edge
  _, state = think3d.reset(KEY, task, SMALL)
  views = {}
  for azimuth in (0.0, 45.0, -45.0):
    obs, _, _, _, info = think3d.step(KEY, state, Think3DAction.view(0, azimuth, 0.0, "ego"),
                                      SMALL)
    assert not bool(info["invalid"])
    views[azimuth] = red_pixels(obs.image)
  assert views[0.0].sum() == 0 and views[-45.0].sum() == 0
  assert views[45.0].sum() > 20
  columns = np.nonzero(views[45.0])[1]
  assert columns.min() > 32, "the marker sits right of centre after turning right"


@pytest.mark.parametrize("convention,sees", [("paper", True), ("code", False)])
def test_ego_positive_elevation_looks_up_in_the_paper_convention(convention, sees):
  task = marker_task(0.0, 75.0)  # above the 128-degree vertical field of view
  params = Think3DParams(width=64, height=48, elevation_convention=convention)
  _, state = think3d.reset(KEY, task, params)
  obs, *_ = think3d.step(KEY, state, Think3DAction.view(0, 0.0, 0.0, "ego"), params)
  assert red_pixels(obs.image).sum() == 0
  obs, *_ = think3d.step(KEY, state, Think3DAction.view(0, 0.0, 30.0, "ego"), params)
  visible = red_pixels(obs.image)
  assert (visible.sum() > 20) == sees
  if sees:
    assert np.nonzero(visible)[0].max() < 24, "a marker above sits in the upper half"


@pytest.fixture(scope="module")
def room_task():
  room = make_room(2, 60_000, num_objects=6)
  centre = np.array(room.bounds_max) / 2
  cameras = orbit_cameras((centre[0], centre[1], 0.5), 2.0, 1.5, 4, 64, 48)
  return room, Task.create(room.cloud, cameras, scene_min=room.bounds_min,
                           scene_max=room.bounds_max)


@pytest.mark.parametrize("pull_back", [False, True])
def test_global_elevation_60_is_a_layout_view_with_the_floor_below(room_task, pull_back):
  room, task = room_task
  params = Think3DParams(width=64, height=48, splat_radius=2, pull_back=pull_back,
                         draw_cameras=False)  # the points alone; markers are tested below
  camera, near = think3d.view_camera(task, Think3DAction.view(0, 0.0, 60.0, "global"), params)
  assert float(camera.forward[2]) < -0.5, "looking down"
  if pull_back:
    assert float(camera.position[2]) > room.bounds_max[2], "raised above the room"
  _, state = think3d.reset(KEY, task, params)
  obs, state, *_ = think3d.step(KEY, state, Think3DAction.view(0, 0.0, 60.0, "global"), params)
  view = render(task.cloud, state.camera, 48, 64, 2, near=state.near)
  np.testing.assert_array_equal(np.asarray(view.rgb), np.asarray(obs.image))
  index = np.asarray(view.point_index)
  xyz, instance = np.asarray(task.cloud.xyz), np.asarray(task.cloud.instance)
  if not pull_back:  # close up, the floor fills the lower half of the image
    lower_half = index[24:]
    assert (lower_half >= 0).mean() > 0.8
    assert (xyz[lower_half[lower_half >= 0], 2] < 0.02).mean() > 0.7
  else:  # the whole room from above: floor and objects fill the centre, walls around
    centre = index[16:32, 22:42]
    assert (centre >= 0).all()
    assert ((xyz[centre, 2] < 0.02) | (instance[centre] >= 0)).mean() > 0.8


def test_world_up_keeps_the_horizon_level(room_task):
  _, task = room_task
  params = Think3DParams(width=64, height=48, up=(0.0, 0.0, 1.0))
  anchor = jax.tree.map(lambda x: x[0], task.input_cameras)
  assert abs(float(anchor.forward[2])) > 0.3, "the anchor looks down, so its own frame is tilted"
  for mode in ("ego", "global"):
    camera, _ = think3d.view_camera(task, Think3DAction.view(0, 90.0, 20.0, mode), params)
    assert abs(float(camera.right[2])) < 1e-5, mode
    tilted, _ = think3d.view_camera(task, Think3DAction.view(0, 90.0, 20.0, mode), SMALL)
    assert abs(float(tilted.right[2])) > 0.1, mode
  # Turning right by 90 degrees about +z: the heading turns clockwise seen from above.
  camera, _ = think3d.view_camera(task, Think3DAction.view(0, 90.0, 0.0, "ego"), params)
  heading = np.asarray(anchor.forward[:2]) / np.linalg.norm(anchor.forward[:2])
  new_heading = np.asarray(camera.forward[:2]) / np.linalg.norm(camera.forward[:2])
  np.testing.assert_allclose(new_heading, [heading[1], -heading[0]], atol=1e-5)


def test_global_orbit_keeps_the_distance_and_pull_back_fits_the_scene(room_task):
  room, task = room_task
  no_pull = Think3DParams(width=64, height=48, pull_back=False)
  anchor = jax.tree.map(lambda x: x[1], task.input_cameras)
  centroid = think3d.scene_centroid(task)
  for az, el in [(30.0, 0.0), (-90.0, 20.0), (170.0, -40.0)]:
    camera, _ = think3d.view_camera(task, Think3DAction.view(1, az, el, "global"), no_pull)
    np.testing.assert_allclose(np.linalg.norm(camera.position - centroid),
                               np.linalg.norm(anchor.position - centroid), rtol=1e-5)
  # Pivot at the anchor camera (the public code): the camera turns in place.
  code_pivot = Think3DParams(width=64, height=48, pull_back=False, pivot="anchor_camera")
  camera, _ = think3d.view_camera(task, Think3DAction.view(1, 40.0, 25.0, "global"), code_pivot)
  np.testing.assert_allclose(camera.position, anchor.position, atol=1e-5)
  # With pull-back every corner of the scene box projects inside the image.
  camera, near = think3d.view_camera(task, Think3DAction.view(1, 30.0, 45.0, "global"), SMALL)
  corners = np.stack(np.meshgrid(*zip(room.bounds_min, room.bounds_max), indexing="ij"),
                     -1).reshape(-1, 3)
  u, v, z = (np.asarray(x) for x in project(camera, jnp.asarray(corners, jnp.float32)))
  assert (z > 0).all()
  assert (u >= -0.5).all() and (u <= 63.5).all() and (v >= -0.5).all() and (v <= 47.5).all()


@pytest.mark.slow
@pytest.mark.xla_default
def test_rounds_stop_and_jit_vmap_agree(room_task):
  _, task = room_task
  actions = [Think3DAction.view(0, 45.0, 0.0, "ego"), Think3DAction.view(2, -30.0, 60.0, "global"),
             Think3DAction.view(1, 0.0, 10.0, "ego"), Think3DAction.view(0, 10.0, 0.0, "ego")]
  step = lambda s, a: think3d.step(KEY, s, a, SMALL)
  _, state = think3d.reset(KEY, task, SMALL)
  singles = []
  for action in actions:
    out = step(state, action)
    state = out[1]
    singles.append(out)
  dones = [bool(o[3]) for o in singles]
  assert dones == [False, False, False, True], "the answer after the last view stays open"
  assert bool(singles[3][4]["invalid"]), "a view after the last round is invalid"

  _, jstate = jax.jit(lambda t: think3d.reset(KEY, t, SMALL))(task)
  _, bstate = jax.vmap(lambda t: think3d.reset(KEY, t, SMALL))(
      jax.tree.map(lambda x: jnp.stack([x, x]), task))
  for action, expected in zip(actions, singles):
    out = jax.jit(step)(jstate, action)
    jstate = out[1]
    chex.assert_trees_all_close(out, expected, atol=1e-5)
    bout = jax.vmap(step)(bstate, jax.tree.map(lambda x: jnp.stack([x, x]), action))
    bstate = bout[1]
    for b in range(2):
      chex.assert_trees_all_close(jax.tree.map(lambda x: x[b], bout), expected, atol=1e-5)

  _, state = think3d.reset(KEY, task, SMALL)
  _, state, _, done, info = step(state, Think3DAction.stop())
  assert bool(done) and bool(state.stopped) and not bool(info["invalid"])


@pytest.mark.parametrize("bad", [
    Think3DAction.create(0, 4, 0.0, 0.0, 1),            # camera index past num_input_cameras
    Think3DAction.create(0, -1, 0.0, 0.0, 1),
    Think3DAction.create(0, 0, float("nan"), 0.0, 1),   # NaN angle
    Think3DAction.create(0, 0, 0.0, 120.0, 0),          # elevation out of range
    Think3DAction.create(0, 0, 0.0, 0.0, 2),            # unknown mode
    Think3DAction.create(5, 0, 0.0, 0.0, 1)])           # unknown kind
def test_bad_actions_are_flagged_and_change_nothing(room_task, bad):
  _, task = room_task
  task = task.replace(num_input_cameras=jnp.asarray(3, jnp.int32))
  _, state = think3d.reset(KEY, task, SMALL)
  _, state, *_ = think3d.step(KEY, state, Think3DAction.view(1, 20.0, 0.0, "ego"), SMALL)
  obs, new_state, _, done, info = think3d.step(KEY, state, bad, SMALL)
  assert bool(info["invalid"]) and not bool(done)
  chex.assert_trees_all_equal(new_state, state)


def test_params_are_checked():
  with pytest.raises(ValueError, match="pivot: expected 'centroid' or 'anchor_camera', got 'x'"):
    think3d.reset(KEY, marker_task(0, 0), Think3DParams(pivot="x"))
  with pytest.raises(ValueError, match="mode must be one of"):
    Think3DAction.view(0, 0.0, 0.0, "top")


def test_the_answer_after_the_last_view_is_accepted_and_a_view_past_it_ends_the_episode(
    room_task):
  _, task = room_task
  params = SMALL  # max_rounds 3
  view = Think3DAction.view(0, 30.0, 0.0, "ego")
  _, state = think3d.reset(KEY, task, params)
  for round_ in (1, 2, 3):
    _, state, _, done, info = think3d.step(KEY, state, view, params)
    assert not bool(info["invalid"]) and not bool(done) and int(state.round) == round_
  _, answered, _, done, info = think3d.step(KEY, state, Think3DAction.stop(), params)
  assert not bool(info["invalid"]) and bool(done) and bool(answered.stopped)
  _, after, _, done, info = think3d.step(KEY, answered, Think3DAction.stop(), params)
  assert bool(info["invalid"]) and bool(done), "nothing is accepted after the answer"
  # A fourth view: invalid, the view does not change, and the episode is over.
  obs, over, _, done, info = think3d.step(KEY, state, view, params)
  assert bool(info["invalid"]) and bool(done) and not bool(over.stopped)
  assert int(over.round) == 3
  chex.assert_trees_all_equal(over.replace(done=state.done), state)
  _, _, _, done, info = think3d.step(KEY, over, Think3DAction.stop(), params)
  assert bool(info["invalid"]) and bool(done)


@pytest.fixture(scope="module")
def image_tasks(room_task):
  """The room's 4 orbit cameras, 3 of them real, each with a random 64x48 image; and the
  same task without images."""
  room, task = room_task
  images = np.random.default_rng(1).integers(0, 256, (4, 48, 64, 3), dtype=np.uint8)
  with_images = Task.create(room.cloud, task.input_cameras, scene_min=room.bounds_min,
                            scene_max=room.bounds_max, num_input_cameras=3,
                            input_images=images)
  return images, with_images, with_images.replace(input_images=jnp.zeros((4, 0, 0, 3),
                                                                          jnp.uint8))


def test_reset_returns_the_input_views_padded_with_background(image_tasks):
  images, with_images, without = image_tasks
  params = SMALL  # num_prompt_images 8: more than the 4 cameras
  obs, _ = think3d.reset(KEY, with_images, params)
  views = np.asarray(obs.input_images)
  assert views.shape == (8, 48, 64, 3)
  np.testing.assert_array_equal(views[:3], images[:3])
  assert (views[3:] == 255).all(), "past the 3 real cameras: background"
  first = render(with_images.cloud, jax.tree.map(lambda x: x[0], with_images.input_cameras),
                 48, 64, 1).rgb
  np.testing.assert_array_equal(obs.image, first)  # the first observation is unchanged
  # Without images, renders of the input cameras (their own intrinsics) stand in.
  obs, _ = think3d.reset(KEY, without, params)
  views = np.asarray(obs.input_images)
  for i in range(3):
    camera = jax.tree.map(lambda x: x[i], without.input_cameras)
    np.testing.assert_array_equal(views[i], render(without.cloud, camera, 48, 64, 1).rgb)
  assert (views[3:] == 255).all()
  np.testing.assert_array_equal(obs.image, first)
  few = Think3DParams(width=64, height=48, num_prompt_images=2)
  assert think3d.reset(KEY, with_images, few)[0].input_images.shape == (2, 48, 64, 3)
  _, state = think3d.reset(KEY, with_images, params)
  obs, *_ = think3d.step(KEY, state, Think3DAction.view(0, 10.0, 0.0, "ego"), params)
  assert obs.input_images.shape == (0, 48, 64, 3), "only reset carries the input views"


def test_zero_angles_return_the_anchors_input_image(image_tasks):
  images, with_images, without = image_tasks
  params = SMALL
  _, state = think3d.reset(KEY, with_images, params)
  for anchor, mode in ((1, "ego"), (2, "global")):
    obs, new_state, _, _, info = think3d.step(KEY, state, Think3DAction.view(anchor, 0.0, 0.0,
                                                                             mode), params)
    assert not bool(info["invalid"])
    np.testing.assert_array_equal(obs.image, images[anchor])
    # A rejected action afterwards shows the same view again.
    obs, _, _, _, info = think3d.step(KEY, new_state, Think3DAction.view(7, 5.0, 0.0, "ego"),
                                      params)
    assert bool(info["invalid"])
    np.testing.assert_array_equal(obs.image, images[anchor])
  anchor_camera = jax.tree.map(lambda x: x[1], with_images.input_cameras)
  own_view = render(without.cloud, anchor_camera, 48, 64, 1).rgb
  _, state = think3d.reset(KEY, without, params)
  obs, *_ = think3d.step(KEY, state, Think3DAction.view(1, 0.0, 0.0, "global"), params)
  np.testing.assert_array_equal(obs.image, own_view)  # no image: the anchor's own render
  # input_image_at_zero=False renders the (0, 0) view like any other.
  off = SMALL.replace(input_image_at_zero=False)
  _, state = think3d.reset(KEY, with_images, params)  # reset does not depend on the option
  obs, *_ = think3d.step(KEY, state, Think3DAction.view(1, 0.0, 0.0, "ego"), off)
  camera, near = think3d.view_camera(with_images, Think3DAction.view(1, 0.0, 0.0, "ego"), off)
  np.testing.assert_array_equal(obs.image, render(with_images.cloud, camera, 48, 64, 1,
                                                  near=near).rgb)


def test_the_observation_size_must_match_the_input_images(image_tasks):
  _, with_images, _ = image_tasks
  wrong = Think3DParams(width=32, height=24)
  with pytest.raises(ValueError, match="the observation is 32x24 but Task.input_images are 64x48"):
    think3d.reset(KEY, with_images, wrong)
  with pytest.raises(ValueError, match="num_prompt_images: expected >= 0, got -1"):
    think3d.reset(KEY, with_images, Think3DParams(width=64, height=48, num_prompt_images=-1))


def test_global_views_draw_the_real_input_cameras(image_tasks):
  _, _, task = image_tasks
  params = SMALL
  plain = params.replace(draw_cameras=False)
  _, state = think3d.reset(KEY, task, params)
  action = Think3DAction.view(0, 20.0, 60.0, "global")
  obs, new_state, *_ = think3d.step(KEY, state, action, params)
  bare, *_ = think3d.step(KEY, state, action, plain)
  camera = new_state.camera
  np.testing.assert_array_equal(bare.image, render(task.cloud, camera, 48, 64, 1,
                                                   near=new_state.near).rgb)
  image, bare_image = np.asarray(obs.image).astype(float), np.asarray(bare.image).astype(float)
  pose = np.asarray(camera.world_from_camera, np.float64)
  colours = [(255, 0, 0), (0, 0, 255), (0, 128, 0), (255, 165, 0)]  # matplotlib's, as the code
  for i in range(4):
    centre = np.asarray(task.input_cameras.world_from_camera[i])[:3, 3]
    p = (centre - pose[:3, 3]) @ pose[:3, :3]
    u = int(np.floor(float(camera.fx) * p[0] / p[2] + float(camera.cx) + 0.5))
    v = int(np.floor(float(camera.fy) * p[1] / p[2] + float(camera.cy) + 0.5))
    assert p[2] > 0 and 3 <= u < 61 and 3 <= v < 45, "every camera is in this view"
    if i < 3:  # the dot: the camera's colour at opacity 0.8 over the points (the label's
      # box, drawn after it as in the code, may cover part of it in so small a view)
      near = (slice(v - 1, v + 2), slice(u - 1, u + 2))
      dot = 0.8 * np.asarray(colours[i], float) + 0.2 * bare_image[near]
      assert (np.abs(image[near] - dot) <= 0.51).all(-1).any(), f"camera {i + 1}'s dot"
    else:      # camera 4 is padding (num_input_cameras = 3)
      np.testing.assert_array_equal(image[v - 2: v + 3, u - 2: u + 3],
                                    bare_image[v - 2: v + 3, u - 2: u + 3])
  assert (image != bare_image).any(-1).sum() > 60
  # Ego views and the (0, 0) photo draw no cameras.
  ego = Think3DAction.view(0, 20.0, 10.0, "ego")
  np.testing.assert_array_equal(think3d.step(KEY, state, ego, params)[0].image,
                                think3d.step(KEY, state, ego, plain)[0].image)
