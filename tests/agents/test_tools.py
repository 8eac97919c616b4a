"""SpatialClaw's host tools on a synthetic room (stored depth, cameras and instance maps):
Reconstruct's gravity-aligned world against the room's own geometry, the render tools,
Segment from instance maps, OCR (PP-OCRv4), the VLM sub-question and Locate through a
scripted model, the utilities, and the argument checks and limits."""

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from data_pipelines.synthetic.samples import SampleConfig, make_sample
from jaxspatial.agents import tools as tool_lib
from jaxspatial.agents.tools import (CloudGeometry, DepthGeometry, EpisodeTools, InstanceMasks,
                                     ToolError, ToolLimits)

CONFIG = SampleConfig(num_points=30_000, width=96, height=72)


@pytest.fixture(scope="module")
def sample():
  return make_sample("test", 3, rig="rotation", config=CONFIG)


def _tools(sample, **options):
  names = {o.name: o.instance for o in sample.room.objects}
  return EpisodeTools(sample.rgb, geometry=DepthGeometry(sample.depth, sample.cameras),
                      segmenter=InstanceMasks(sample.instance, names), **options)


def _room_from_ours(result, sample):
  """The room coordinates (x, y, z up) of our world's points, from camera 0's two poses."""
  ours = result["extrinsics"][0].astype(np.float64)
  room = np.asarray(sample.cameras.world_from_camera[0], np.float64)
  return room @ np.linalg.inv(ours)


def test_reconstruct_world_is_gravity_aligned(sample):
  tools = _tools(sample)
  result = tools.Reconstruct(frames=[0, 2])
  assert result["points"].shape == (2, 72, 96, 3) and result["depth"].shape == (2, 72, 96)
  assert result["extrinsics"].shape == (2, 4, 4) and result["intrinsics"].shape == (2, 3, 3)
  assert result["metric"] and result["scale"] == 1.0
  assert list(result["frames"]) == [0, 2]
  first = result["extrinsics"][0]
  # The first camera at X = Z = 0, at its eye height above the ground (Y = 0 is the floor).
  assert np.allclose(first[[0, 2], 3], 0.0, atol=1e-5)
  eye_height = float(sample.cameras.world_from_camera[0][2, 3])
  assert first[1, 3] == pytest.approx(eye_height, abs=1e-4)
  # Its forward axis points along -Z (horizontal part), its right axis along +X.
  forward = first[:3, 2]
  assert forward[0] == pytest.approx(0.0, abs=1e-5) and forward[2] < 0
  assert first[:3, 0] == pytest.approx([1.0, 0.0, 0.0], abs=1e-5)
  # Heights are the room's z; the map to the room is rigid with +Y -> +z.
  transform = _room_from_ours(result, sample)
  assert transform[:3, 1] == pytest.approx([0.0, 0.0, 1.0], abs=1e-5)
  valid = result["valid"]
  points = result["points"][valid]
  room_points = points @ transform[:3, :3].T + transform[:3, 3]
  assert np.allclose(points[:, 1], room_points[:, 2], atol=1e-4)
  # Every valid pixel's point lies on the room's surfaces: near some cloud point.
  from scipy.spatial import cKDTree  # pylint: disable=import-outside-toplevel
  cloud = np.asarray(sample.room.cloud.xyz)[np.asarray(sample.room.cloud.valid)]
  distance, _ = cKDTree(cloud).query(room_points[::7])
  assert np.median(distance) < 0.05
  assert not result["points"][~valid].any() and (result["depth"][valid] > 0).all()


def test_render_tools_draw_the_last_reconstruction(sample):
  tools = _tools(sample)
  with pytest.raises(ToolError, match="Reconstruct"):
    tools.RenderBEV()
  tools.Reconstruct(frames=[0, 1, 2, 3])
  bev = tools.RenderBEV(size=96)
  assert bev["image"].shape == (96, 96, 3) and bev["image"].dtype == np.uint8
  assert (bev["depth"] > 0).mean() > 0.1
  # The BEV camera looks straight down with image up = -Z.
  c2w = bev["extrinsics"]
  assert c2w[:3, 2] == pytest.approx([0.0, -1.0, 0.0], abs=1e-5)
  assert c2w[:3, 1] == pytest.approx([0.0, 0.0, 1.0], abs=1e-5)
  # A view from the first camera's pose re-renders the first frame's content.
  first = tools.Reconstruct(frames=[0])
  view = tools.RenderView(extrinsics=first["extrinsics"][0], width=96, height=72, fov=70)
  seen = (view["depth"] > 0) & first["valid"][0]
  assert seen.mean() > 0.5
  assert np.median(np.abs(view["depth"][seen] - first["depth"][0][seen])) < 0.05
  eye = first["extrinsics"][0][:3, 3]
  look = tools.RenderView(eye=eye.tolist(), target=(eye + [0, 0, -1]).tolist(), width=96,
                          height=72)
  assert look["image"].shape == (72, 96, 3)
  with pytest.raises(ToolError, match="coincide"):
    tools.RenderView(eye=[0, 1, 0], target=[0, 1, 0])
  with pytest.raises(ToolError, match="rigid"):
    tools.RenderView(extrinsics=np.eye(4) * 2)
  with pytest.raises(ToolError, match="width"):
    tools.RenderView(eye=[0, 1, 0], target=[0, 1, -1], width=5000)


def test_cloud_geometry_matches_depth_geometry(sample):
  """A stored cloud rendered into the cameras gives the same world as the stored depth."""
  cloud_tools = EpisodeTools(sample.rgb, geometry=CloudGeometry(sample.room.cloud,
                                                                sample.cameras))
  depth_result = _tools(sample).Reconstruct(frames=[1])
  cloud_result = cloud_tools.Reconstruct(frames=[1])
  assert not cloud_result["metric"]
  both = depth_result["valid"][0] & cloud_result["valid"][0]
  assert both.mean() > 0.5
  # Up is estimated from one level-ish camera (pitched down 10 degrees in these rigs), so
  # the frames differ by that pitch: compare depths, which do not depend on the world.
  assert np.median(np.abs(depth_result["depth"][0][both] - cloud_result["depth"][0][both])) < 0.05


def test_gravity_alignment_estimates_up_from_cameras():
  rng = np.random.default_rng(0)
  up = np.array([0.3, 0.9, -0.2])
  up /= np.linalg.norm(up)
  poses = []
  for _ in range(5):
    forward = rng.normal(size=3)
    forward -= forward @ up * up
    forward /= np.linalg.norm(forward)
    right = np.cross(forward, up)
    down = np.cross(forward, right)
    pose = np.eye(4)
    pose[:3, :3] = np.stack([right, down, forward], -1)
    pose[:3, 3] = rng.normal(size=3)
    poses.append(pose)
  transform = tool_lib.gravity_alignment(np.stack(poses))
  assert transform[:3, :3] @ up == pytest.approx([0, 1, 0], abs=1e-9)
  new_first = transform @ poses[0]
  assert new_first[:3, 2] == pytest.approx([0, 0, -1], abs=1e-9)
  assert new_first[1, 3] == pytest.approx(0.0, abs=1e-9)  # no points: ground at the camera


def test_frame_checks_and_limits(sample):
  tools = _tools(sample)
  for bad, message in [(4, "out of range"), ([0, 0], "repeated"), ([], "at least one"),
                       ("0", "integer"), ([True], "integer"), (-1, "out of range"),
                       (list(range(70)), "limit of 64")]:
    with pytest.raises(ToolError, match=message):
      tools.Reconstruct(frames=bad)
  with pytest.raises(ToolError, match="pass frames"):
    tool_lib.frame_indices(None, 100)
  small = _tools(sample, limits=ToolLimits(max_output_bytes=100_000))
  with pytest.raises(ToolError, match="over the limit"):
    small.Reconstruct(frames=[0, 1])
  with pytest.raises(ToolError, match="no reconstruction"):
    EpisodeTools(sample.rgb).Reconstruct(frames=[0])


def test_segment_masks_from_instance_maps(sample):
  tools = _tools(sample)
  frame = int(np.argmax([(v >= 0).sum() for v in sample.instance]))
  visible = [o for o in sample.room.objects if (sample.instance[frame] == o.instance).sum() > 20]
  target = visible[0]
  found = tools.Segment(frame=frame, text=target.name)
  assert found["count"] >= 1
  assert np.array_equal(found["masks"][0], sample.instance[frame] == target.instance)
  x1, y1, x2, y2 = found["boxes"][0]
  by_box = tools.Segment(frame=frame, box=[float(x1), float(y1), float(x2), float(y2)])
  assert any(np.array_equal(m, found["masks"][0]) for m in by_box["masks"])
  assert tools.Segment(frame=frame, text="zebra")["count"] == 0
  for kwargs, message in [({}, "exactly one"), ({"text": "a", "box": [0, 0, 1, 1]}, "exactly one"),
                          ({"box": [5, 5, 2, 9]}, "x1 < x2"), ({"text": ""}, "non-empty"),
                          ({"text": "x" * 300}, "limit")]:
    with pytest.raises(ToolError, match=message):
      tools.Segment(frame=frame, **kwargs)
  with pytest.raises(ToolError, match="no segmentation"):
    EpisodeTools(sample.rgb).Segment(frame=0, text="chair")


def test_ocr_reads_text_in_a_frame():
  image = Image.new("RGB", (320, 120), (235, 235, 235))
  ImageDraw.Draw(image).text((30, 35), "EXIT 42", font=ImageFont.load_default(size=40),
                             fill=(10, 10, 10))
  frames = np.stack([np.asarray(image)] * 2)
  tools = EpisodeTools(frames)
  lines = tools.OCR(frame=1)["lines"]
  assert any("EXIT" in line["text"] for line in lines)
  x0, y0, x1, y1 = lines[0]["box"]
  assert 0 <= x0 < x1 <= 320 and 0 <= y0 < y1 <= 120
  cropped = tools.OCR(frame=0, box=[160, 0, 320, 120])["lines"]
  assert all(line["box"][0] >= 160 for line in cropped)


def test_vlm_and_locate_through_the_loop_model(sample):
  asked = []

  def ask(question, images):
    asked.append((question, [i.shape for i in images]))
    return "(250, 500)" if "Find this" in question else "It is a red chair."

  tools = _tools(sample, ask=ask, limits=ToolLimits(max_vlm_calls=3, image_long_edge=48))
  assert tools.VLM("What is this?", images=[0, sample.rgb[1]]) == "It is a red chair."
  assert asked[0][1] == [(36, 48, 3), (36, 48, 3)]  # resized to the long edge
  found = tools.Locate(frame=2, description="the chair")
  assert found["visible"] and found["point"] == [250.0, 500.0]
  assert found["pixel"] == [pytest.approx(24.0), pytest.approx(36.0)]
  queries = tools.take_queries()
  assert [q for q, _ in queries] == ["What is this?", "Locate in frame 2: the chair"]
  assert tools.take_queries() == []
  tools.VLM("again?")
  with pytest.raises(ToolError, match="limit of 3"):
    tools.VLM("once more?")
  with pytest.raises(ToolError, match="images"):
    _tools(sample, ask=ask).VLM("x", images=[0] * 65)
  with pytest.raises(ToolError, match="not available"):
    _tools(sample).VLM("x")
  assert tool_lib.locate_point("NOT VISIBLE") is None
  assert tool_lib.locate_point("(1200, 5)") is None
  assert tool_lib.locate_point("x" * 100_000) is None


def test_utilities(sample):
  tools = _tools(sample)
  result = tools.Reconstruct(frames=[0])
  valid = result["valid"][0]
  rows, cols = np.nonzero(valid)
  points = result["points"][0][rows, cols]
  projected = tools.Project(points, result["extrinsics"][0], result["intrinsics"][0])
  assert projected["in_front"].all()
  assert np.abs(projected["pixels"] - np.stack([cols, rows], -1)).max() < 1e-2
  assert np.allclose(projected["depth"], result["depth"][0][rows, cols], atol=1e-4)
  drawn = tools.Annotate(0, points=[[10, 10]], boxes=[[20, 20, 40, 30]], labels=["p", "b"])
  assert drawn["image"].shape == sample.rgb[0].shape
  assert not np.array_equal(drawn["image"], sample.rgb[0])
  stats = tools.MaskStats(valid)
  assert stats["area"] == int(valid.sum())
  assert tools.MaskStats(np.zeros((4, 4), bool)) == {"area": 0, "centroid": None, "box": None}
  with pytest.raises(ToolError, match="labels"):
    tools.Annotate(0, points=[[1, 1]], labels=["a", "b"])
  with pytest.raises(ToolError, match="NaN"):
    tools.Project([[np.nan, 0, 0]], np.eye(4), np.eye(3))
  with pytest.raises(ToolError, match="shape"):
    tools.Project([[0, 0]], np.eye(4), np.eye(3))


def test_groups_select_the_tools(sample):
  assert set(_tools(sample).mapping()) == {n for g in tool_lib.GROUPS.values() for n in g}
  assert list(_tools(sample, groups=("utilities",)).mapping()) == ["Project", "Annotate",
                                                                   "MaskStats"]
  assert _tools(sample, groups=()).mapping() == {}
  with pytest.raises(ValueError, match="unknown tool groups"):
    _tools(sample, groups=("magic",))
  docs = tool_lib.documentation(_tools(sample).names())
  assert all(f"tools.{name}(" in docs for name in _tools(sample).names())


def test_sam3_segmenter_passes_prompts_on_the_grid():
  """SAM3Segmenter's plumbing against SAM3Backend's interface (no weights here): a pixel
  box goes to the 0-1000 grid, masks come back at the frame's size."""
  from jaxspatial.perception.segmentation import SegmentationConfig  # pylint: disable=import-outside-toplevel
  calls = []

  class Fake:
    config = SegmentationConfig()

    def with_config(self, config):
      other = Fake()
      other.config = config
      return other

    def segment_padded(self, images, text_prompt=None, boxes_grid_Bx4=None,
                       score_threshold=None):
      calls.append((images.shape, text_prompt, boxes_grid_Bx4, self.config.mask_size))
      h, w = self.config.mask_size
      masks = np.zeros((1, 20, h, w), bool)
      masks[0, 0, :2, :3] = True
      return {"masks": masks, "scores": np.full((1, 20), 0.9, np.float32),
              "count": np.array([1])}

  frames = np.zeros((1, 40, 50, 3), np.uint8)
  tools = EpisodeTools(frames, segmenter=tool_lib.SAM3Segmenter(Fake()))
  found = tools.Segment(frame=0, box=[5, 10, 25, 40])
  assert calls[0][0] == (1, 40, 50, 3) and calls[0][1] is None
  assert np.allclose(calls[0][2], [[100, 250, 500, 1000]]) and calls[0][3] == (40, 50)
  assert found["count"] == 1 and found["masks"].shape == (1, 40, 50)
  assert found["boxes"][0].tolist() == [0, 0, 3, 2] and found["scores"][0] == pytest.approx(0.9)
  tools.Segment(frame=0, text="chair")
  assert calls[1][1] == "chair" and calls[1][2] is None


def test_model_geometry_through_perception_reconstruct(sample):
  """A reconstructor object (perception.reconstruct's `backend=` form) gives its fused cloud
  and cameras; per-frame depth is that cloud rendered into its cameras."""
  from jaxspatial.perception.reconstruction import Reconstruction  # pylint: disable=import-outside-toplevel
  seen = []

  class Room:
    def reconstruct(self, frames):
      index = [int(np.argmax([np.array_equal(f, g) for g in sample.rgb])) for f in frames]
      seen.append(index)
      cloud = sample.room.cloud
      keep = np.asarray(cloud.valid)
      k = tool_lib._intrinsic_matrices(sample.cameras)[index]  # pylint: disable=protected-access
      return Reconstruction(
          xyz=np.asarray(cloud.xyz)[keep], rgb=np.asarray(cloud.rgb)[keep],
          valid=np.ones(int(keep.sum()), bool),
          cameras_c2w=np.asarray(sample.cameras.world_from_camera)[index], intrinsics=k,
          image_size=sample.rgb.shape[1:3])

  model = EpisodeTools(sample.rgb, geometry=tool_lib.ModelGeometry(Room())).Reconstruct(
      frames=[2, 1])
  stored = _tools(sample).Reconstruct(frames=[2, 1])
  assert seen == [[2, 1]] and not model["metric"]
  both = model["valid"] & stored["valid"]
  assert both.mean() > 0.5
  assert np.median(np.abs(model["depth"][both] - stored["depth"][both])) < 0.05
