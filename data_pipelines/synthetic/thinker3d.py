"""3DThinker's synthetic task: three views from one spot (ahead, left, right), "where is the
box?" as a multiple choice, and target features for the latent alignment.

The scenes are the main job's (`look_around`: a grey floor and one coloured box ahead, to
the left or to the right of the camera). The views are rendered with the jit renderer; the
target features are `GeometryStandInExtractor`'s (depth and world coordinates pooled to a
token grid, a fixed projection to the channels): a deterministic stand-in for VGGT, which
cannot be downloaded here. They are written and read in 3DThinker's published layout,
`<root>/feature_vggt/{idx}/vggt.npz` (key `feature`, [1, N, tokens, channels]).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from data_pipelines import caches
from data_pipelines.synthetic import look_around
from data_pipelines.synthetic.stand_in_features import GeometryStandInExtractor
from jaxspatial.geometry import Camera, look_at
from jaxspatial.models.latent3d import OUTPUT_3D
from jaxspatial.render import render

VIEWS = ("ahead", "left", "right")          # image order; the options' order
SIDE_OF_VIEW = {"ahead": "front", "left": "left", "right": "right"}
LETTERS = "ABC"
ORDINALS = ("first", "second", "third")
SYSTEM = ("Imagine the 3D scene behind the images first, in the mental 3D tokens; then "
          "reason in <think>...</think> and give the option letter in <answer>...</answer>.")


@dataclasses.dataclass(frozen=True)
class Thinker3DExamples:
  images: np.ndarray          # [N, 3, H, W, 3] uint8 (ahead, left, right)
  features: np.ndarray        # [N, 3, tokens, channels] float32 target features
  answer_choice: np.ndarray   # [N] int32 option index
  questions: list[str]
  targets: list[str]          # stage-1 SFT targets (with the <output_3D> placeholder)
  colours: list[str]
  sides: list[str]

  def __len__(self) -> int:
    return len(self.questions)

  def take(self, index) -> "Thinker3DExamples":
    index = np.asarray(index)
    pick = lambda items: [items[i] for i in index]
    return Thinker3DExamples(self.images[index], self.features[index],
                             self.answer_choice[index], pick(self.questions),
                             pick(self.targets), pick(self.colours), pick(self.sides))


def question(colour: str) -> str:
  options = " ".join(f"{LETTERS[k]}. {v}" for k, v in enumerate(VIEWS))
  return (f"The three images look ahead, to the left and to the right from one spot. Where "
          f"is the {colour} box? {options}")


def target(colour: str, view: int) -> str:
  return (f"{OUTPUT_3D}<think>The {colour} box is in the {ORDINALS[view]} image."
          f"</think><answer>{LETTERS[view]}</answer>")


def view_cameras(width: int, height: int, hfov_deg: float) -> Camera:
  """The three cameras (batched), in VIEWS order."""
  eye = look_around.CENTRE + np.asarray([0.0, 0.0, look_around.CAMERA_HEIGHT])
  cameras = []
  for view in VIEWS:
    dx, dy = look_around.SIDE_DIRECTION[SIDE_OF_VIEW[view]]
    pose = look_at(eye, eye + np.asarray([dx, dy, 0.0]), (0.0, 0.0, 1.0))
    cameras.append(Camera.from_fov(hfov_deg, width, height, pose))
  return jax.tree.map(lambda *x: jnp.stack(x), *cameras)


@functools.partial(jax.jit, static_argnames=("width", "height"))
def _render_views(cloud, cameras, width: int, height: int):
  views = jax.vmap(lambda camera: render(cloud, camera, height, width, 1,
                                         (255, 255, 255)))(cameras)
  return views.rgb, views.depth


def make_examples(count: int, seed: int, *, points: int = 6000, width: int = 56,
                  height: int = 56, hfov_deg: float = 90.0,
                  extractor: GeometryStandInExtractor = GeometryStandInExtractor(
                      grid=4, channels=32),
                  feature_root=None, first_index: int = 0) -> Thinker3DExamples:
  """`count` examples from `seed` (train and test use disjoint seeds). With `feature_root`,
  the features go through the cache: written where missing (sample idx = first_index + i),
  then read back."""
  tasks, looks = look_around.make_tasks(count, seed, points, width, height, hfov_deg)
  cameras = view_cameras(width, height, hfov_deg)
  intrinsics = np.stack([np.asarray(cameras.fx), np.asarray(cameras.fy),
                         np.asarray(cameras.cx), np.asarray(cameras.cy)], 1)
  poses = np.asarray(cameras.world_from_camera)
  images, features = [], []
  for i in range(count):
    cloud = jax.tree.map(lambda x: x[i], tasks.cloud)
    rgb, depth = jax.device_get(_render_views(cloud, cameras, width, height))
    images.append(rgb)
    idx = first_index + i
    if feature_root is None:
      features.append(extractor(depth, poses, intrinsics))
      continue
    if not caches.vggt_feature_path(feature_root, idx).exists():
      caches.write_vggt_features(feature_root, idx, extractor(depth, poses, intrinsics))
    features.append(caches.read_vggt_features(feature_root, idx, extractor.tokens,
                                              extractor.channels))
  views = [VIEWS.index(next(v for v in VIEWS if SIDE_OF_VIEW[v] == q.side)) for q in looks]
  return Thinker3DExamples(
      images=np.stack(images).astype(np.uint8), features=np.stack(features).astype(np.float32),
      answer_choice=np.asarray(views, np.int32), questions=[question(q.colour) for q in looks],
      targets=[target(q.colour, v) for q, v in zip(looks, views)],
      colours=[q.colour for q in looks], sides=[q.side for q in looks])
