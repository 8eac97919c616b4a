"""PERIA's image workspace against references written from the public tool server
(PEDIA's train_tool_server and pedia/tool_definitions/functions): argument names, the
int(c * size / 1000) pixel map, drawing styles (PIL for boxes and highlights, numpy for
the rest), its error order, and the turn budget."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image, ImageDraw

from data_pipelines.synthetic import make_room, orbit_cameras
from jaxspatial.envs import peria
from jaxspatial.envs.task import Task

H, W = 480, 640  # the public default size, where [0, 0, 1000, 1000] used to be rejected
PARAMS = peria.PeriaParams(width=W, height=H, max_images=6, max_turns=6, max_path_points=4)
YY, XX = np.mgrid[0:H, 0:W].astype(np.float64)


@pytest.fixture(scope="module")
def start():
  room = make_room(3, 3000, num_objects=3)
  centre = np.asarray(room.cloud.xyz)[np.asarray(room.cloud.valid)].mean(0)
  task = Task.create(room.cloud, orbit_cameras((centre[0], centre[1], 0.5), 2.0, 1.5, 2, W, H))
  obs, state = peria.reset(jax.random.PRNGKey(0), task, PARAMS)
  return obs, state


@pytest.fixture(scope="module")
def step():
  return jax.jit(peria.step, static_argnums=3)


def call(tool, image, points, **kwargs):
  return peria.PeriaAction.create(peria.TOOL, peria.TOOLS.index(tool), image, points,
                                  max_points=PARAMS.max_path_points, **kwargs)


def pixels(coords):
  """The public tools' map: int(c * width / 1000) for x, int(c * height / 1000) for y."""
  return [int(int(c) * (W if i % 2 == 0 else H) / 1000) for i, c in enumerate(coords)]


def pil(image, draw):
  out = Image.fromarray(np.asarray(image))
  draw(ImageDraw.Draw(out))
  return np.asarray(out)


def near_segments(points, half):
  mask = np.zeros((H, W), bool)
  for a, b in zip(points[:-1], points[1:]):
    d = np.subtract(b, a, dtype=float)
    t = np.clip(((XX - a[0]) * d[0] + (YY - a[1]) * d[1]) / max(d @ d, 1e-12), 0, 1)
    mask |= np.hypot(XX - a[0] - t * d[0], YY - a[1] - t * d[1]) <= half
  return mask


def discs(points, radius):
  return np.any([np.hypot(XX - x, YY - y) <= radius for x, y in points], axis=0)


def painted(image, mask, color):
  out = np.array(image)
  out[mask] = color
  return out


def bilinear_upscale_2x(region):
  """Output pixel j samples the region at j / 2 - 1/4 (half-pixel centres), edge-clamped."""
  h, w = region.shape[:2]
  ys = np.clip((np.arange(2 * h) + 0.5) / 2 - 0.5, 0, h - 1)
  xs = np.clip((np.arange(2 * w) + 0.5) / 2 - 0.5, 0, w - 1)
  y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
  y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
  fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
  r = region.astype(float)
  top = r[y0][:, x0] * (1 - fx) + r[y0][:, x1] * fx
  bottom = r[y1][:, x0] * (1 - fx) + r[y1][:, x1] * fx
  return top * (1 - fy) + bottom * fy


def test_each_public_tool_appends_its_image(start, step):
  obs, state = start
  image0 = np.asarray(obs.image)
  assert int(obs.index) == 0 and int(state.count) == 1
  key = jax.random.PRNGKey(0)
  whole = (0, 0, 1000, 1000)
  x0, y0, x1, y1 = pixels(whole)
  line = pixels((0, 1000, 1000, 0))
  path = pixels((100, 100, 900, 150, 500, 1000))
  label = pixels((1000, 500))
  calls = [
      (call("bounding_box", 0, whole),
       lambda images: pil(images[0], lambda d: d.rectangle((x0, y0, x1, y1), outline=(0, 128, 0),
                                                           width=3))),
      (call("draw_line", 1, (0, 1000, 1000, 0)),
       lambda images: painted(images[1], near_segments(np.reshape(line, (2, 2)), 1.5),
                              (0, 0, 255))),
      (call("draw_path", 0, (100, 100, 900, 150, 500, 1000)),
       lambda images: painted(painted(images[0], near_segments(np.reshape(path, (3, 2)), 1.5),
                                      (0, 0, 255)), discs(np.reshape(path, (3, 2)), 4.0),
                              (255, 0, 0))),
      (call("image_label", 3, (1000, 500)),
       lambda images: painted(painted(images[3], discs([label], 7.0), (255, 255, 255)),
                              discs([label], 6.0), (255, 0, 0))),
      (call("image_crop", 0, (0, 0, 500, 500)),
       lambda images: bilinear_upscale_2x(images[0][:H // 2, :W // 2])),
  ]
  images = [image0]
  for k, (action, expected) in enumerate(calls, 1):
    obs, state, _, done, info = step(key, state, action, PARAMS)
    assert not bool(info["invalid"]) and int(info["error"]) == peria.NO_ERROR
    assert int(obs.index) == k and int(state.count) == k + 1 and not bool(done)
    np.testing.assert_allclose(np.asarray(obs.image, float), expected(images), atol=0.51,
                               err_msg=peria.TOOLS[int(action.tool)])
    np.testing.assert_array_equal(np.asarray(state.images[k]), np.asarray(obs.image))
    images.append(np.asarray(obs.image))
  assert (images[1] != image0).any() and (images[5] != image0).any()

  # The highlight blends yellow at 100/255 over the box, as PIL's alpha_composite does.
  _, state = start
  obs, _, _, _, _ = step(key, state, call("image_highlight", 0, (250, 0, 1000, 1000)), PARAMS)
  base = Image.fromarray(image0).convert("RGBA")
  overlay = Image.new("RGBA", base.size, (255, 255, 255, 0))
  ImageDraw.Draw(overlay).rectangle(pixels((250, 0, 1000, 1000)), fill=(255, 255, 0, 100))
  reference = np.asarray(Image.alpha_composite(base, overlay).convert("RGB"))
  np.testing.assert_allclose(np.asarray(obs.image, int), reference, atol=1)


@pytest.mark.parametrize("action, error", [
    (call("image_crop", 0, (0, 0, 500, 500), argument=peria.ARGUMENTS.index("points")),
     peria.ERROR_ARGUMENTS),                                      # not the tool's argument
    (call("image_crop", 4, (0, 0, 500, 500), argument=1), peria.ERROR_ARGUMENTS),  # first
    (call("draw_line", 0, (0, 0, 10, 10, 20, 20)), peria.ERROR_ARGUMENTS),  # two points only
    (call("image_label", 0, (10, 10, 20, 20)), peria.ERROR_ARGUMENTS),      # one point only
    (call("bounding_box", 0, (500, 0, 100, 100)), peria.ERROR_ARGUMENTS),   # x2 < x1
    (call("image_crop", 0, (100, 100, 100, 900)), peria.ERROR_ARGUMENTS),   # no width
    (call("draw_path", 1, (0, 0, 10, 10)), peria.ERROR_INDEX),   # image 1 not in the list
    (call("draw_path", 2, (0, 0)), peria.ERROR_INDEX),           # the index comes first
    (call("draw_path", 0, (5, 5)), peria.ERROR_PATH_POINTS),
    # The perception tools' text keys are no interaction tool's argument.
    (call("image_crop", 0, (), argument=peria.ARGUMENTS.index("text_prompt")),
     peria.ERROR_ARGUMENTS),
    (call("image_label", 0, (10, 10), argument=peria.ARGUMENTS.index("question")),
     peria.ERROR_ARGUMENTS),
])
def test_an_invalid_call_names_its_error_and_produces_no_image(start, step, action, error):
  _, state = start
  obs, new, _, done, info = step(jax.random.PRNGKey(0), state, action, PARAMS)
  assert bool(info["invalid"]) and int(info["error"]) == error == int(new.error)
  assert int(obs.index) == -1 and not np.asarray(obs.image).any()
  assert int(new.count) == 1 and int(new.calls) == 1 and not bool(done)
  np.testing.assert_array_equal(np.asarray(new.images), np.asarray(state.images))


def test_budget_is_max_turns_minus_one_calls_and_stop_ends(start, step):
  params = peria.PeriaParams(width=W, height=H, max_images=3, max_turns=3, max_path_points=4)
  _, state = start
  state = state.replace(images=state.images[:3])
  key = jax.random.PRNGKey(0)
  for k in (1, 2):
    obs, state, _, done, info = step(key, state, call("bounding_box", 0, (0, 0, 500, 500)),
                                     params)
    assert int(obs.index) == k and not bool(done) and not bool(info["invalid"])
  obs, past, _, done, info = step(key, state, call("bounding_box", 0, (0, 0, 500, 500)), params)
  assert bool(done) and bool(info["invalid"]) and int(info["error"]) == peria.ERROR_LIMIT
  assert int(obs.index) == -1 and int(past.count) == 3
  obs, after, _, _, info = step(key, past, call("bounding_box", 0, (0, 0, 500, 500)), params)
  assert bool(info["invalid"]) and int(info["error"]) == peria.ERROR_LIMIT
  stop = peria.PeriaAction.create(peria.STOP, max_points=4)
  obs, stopped, _, done, info = step(key, state, stop, params)
  assert bool(done) and not bool(info["invalid"]) and int(info["error"]) == peria.NO_ERROR
  assert int(obs.index) == -1 and not np.asarray(obs.image).any()
  assert int(stopped.count) == int(state.count) and int(stopped.calls) == 2


def test_bad_configuration_and_actions_raise_naming_the_field():
  with pytest.raises(ValueError, match=r"max_images \(8\) must be at least max_turns \(11\)"):
    peria.PeriaParams(max_images=8, max_turns=11)
  with pytest.raises(ValueError, match="max_path_points: expected at least 2"):
    peria.PeriaParams(max_path_points=1)
  with pytest.raises(ValueError, match="pixel_map: expected one of"):
    peria.PeriaParams(pixel_map="nearest")
  with pytest.raises(ValueError, match="at most max_points=2 points, got 3"):
    peria.PeriaAction.create(peria.TOOL, 3, 0, (0, 0, 1, 1, 2, 2), max_points=2)


def test_step_checks_the_action_shape(start):
  _, state = start
  with pytest.raises(ValueError, match=r"PeriaAction.points: expected \[max_path_points=4, 2\]"):
    peria.step(jax.random.PRNGKey(0), state,
               peria.PeriaAction.create(peria.TOOL, 0, 0, (0, 0, 1, 1)), PARAMS)


def test_vmapped_steps_equal_single_steps(start, step):
  _, state = start
  actions = [call("draw_path", 0, (0, 0, 1000, 1000, 0, 1000)), call("draw_path", 3, (0, 0, 9, 9))]
  batched = jax.jit(jax.vmap(peria.step, (None, None, 0, None)), static_argnums=3)(
      jax.random.PRNGKey(0), state, jax.tree.map(lambda *x: jnp.stack(x), *actions), PARAMS)
  for i, action in enumerate(actions):
    single = step(jax.random.PRNGKey(0), state, action, PARAMS)
    for a, b in zip(jax.tree.leaves(jax.tree.map(lambda x: x[i], batched)),
                    jax.tree.leaves(single)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# -- tasks that carry their images (image benchmarks: ChartQA's letterboxed chart) ------------

SMALL = peria.PeriaParams(width=40, height=30, max_images=3, max_turns=3, max_path_points=4)


def image_task(views=2, initial=0, size=(30, 40), cloud_points=0):
  """A geometry "none" task as the loader builds it from a benchmark: the stored views at
  nominal identity-pose cameras (an empty cloud: all points invalid, bounds given), or
  with `initial` a view whose pose differs (a scan's view k)."""
  from jaxspatial.geometry import Camera, PointCloud  # pylint: disable=import-outside-toplevel
  h, w = size
  rng = np.random.default_rng(views * 10 + initial)
  images = rng.integers(0, 256, (views, h, w, 3), dtype=np.uint8)
  poses = np.tile(np.eye(4, dtype=np.float32), (views, 1, 1))
  if initial:
    poses[:, 0, 3] = np.arange(views, dtype=np.float32)  # view k sits at x = k
  focal = np.full(views, float(max(h, w)), np.float32)
  cameras = Camera.create(focal, focal, np.full(views, (w - 1) / 2, np.float32),
                          np.full(views, (h - 1) / 2, np.float32), poses)
  n = max(cloud_points, 8)
  cloud = PointCloud.create(np.ones((n, 3), np.float32), np.zeros((n, 3), np.uint8),
                            valid=np.arange(n) < cloud_points)
  task = Task.create(cloud, cameras, jax.tree.map(lambda x: x[initial], cameras),
                     scene_min=np.zeros(3), scene_max=np.zeros(3), input_images=images)
  return task, images


def test_image_zero_is_the_tasks_input_view_when_it_has_images():
  task, images = image_task()
  assert task.has_input_images
  obs, state = peria.reset(jax.random.PRNGKey(0), task, SMALL)
  np.testing.assert_array_equal(np.asarray(obs.image), images[0])
  np.testing.assert_array_equal(np.asarray(state.images[0]), images[0])
  assert int(obs.index) == 0 and int(state.count) == 1 and not bool(state.done)
  # The tools act on it: the whole-image crop is the image, a box is drawn on it.
  whole = call("image_crop", 0, (0, 0, 1000, 1000))
  obs, state, _, _, info = peria.step(jax.random.PRNGKey(0), state, whole, SMALL)
  assert not bool(info["invalid"]) and int(obs.index) == 1
  np.testing.assert_allclose(np.asarray(obs.image, float), images[0], atol=0.51)
  obs, state, _, _, _ = peria.step(jax.random.PRNGKey(0), state,
                                   call("bounding_box", 0, (0, 0, 500, 500)), SMALL)
  expected = pil(images[0], lambda d: d.rectangle((0, 0, 20, 15), outline=(0, 128, 0), width=3))
  np.testing.assert_array_equal(np.asarray(obs.image), expected)


def test_image_zero_is_the_view_at_the_initial_camera():
  task, images = image_task(views=3, initial=2)
  obs, _ = peria.reset(jax.random.PRNGKey(0), task, SMALL)
  np.testing.assert_array_equal(np.asarray(obs.image), images[2])


def test_image_tasks_under_jit_and_vmap():
  tasks = [image_task(views=2)[0], image_task(views=2, initial=1)[0]]
  batch = jax.tree.map(lambda *x: jnp.stack(x), *tasks)
  obs, state = jax.jit(jax.vmap(peria.reset, (None, 0, None)), static_argnums=2)(
      jax.random.PRNGKey(0), batch, SMALL)
  for k, task in enumerate(tasks):
    expected = np.asarray(task.input_images[k])  # task 0 starts at view 0, task 1 at view 1
    np.testing.assert_array_equal(np.asarray(obs.image[k]), expected)
    np.testing.assert_array_equal(np.asarray(state.images[k, 0]), expected)


def test_image_of_another_size_is_refused_naming_both_sizes():
  task, _ = image_task(size=(30, 40))
  with pytest.raises(ValueError, match=r"image list is 64x48 but Task.input_images are 40x30"
                     r".*set width=40, height=30"):
    peria.reset(jax.random.PRNGKey(0), task, peria.PeriaParams(width=64, height=48,
                                                               max_images=3, max_turns=3))


def test_a_task_without_images_still_renders_its_initial_camera(start):
  """The synthetic 3D tasks (no stored images: [K, 0, 0, 3]) start from the render."""
  obs, state = start
  assert not state.task.has_input_images
  camera = peria.Camera.from_fov(PARAMS.hfov_deg, W, H,
                                 state.task.initial_camera.world_from_camera)
  expected = peria.render(state.task.cloud, camera, H, W, PARAMS.splat_radius,
                          PARAMS.background).rgb
  np.testing.assert_array_equal(np.asarray(obs.image), np.asarray(expected))
  assert np.asarray(obs.image).std() > 0  # the room is visible
