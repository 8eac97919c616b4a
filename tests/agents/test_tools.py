"""SpatialClaw's host tools on a synthetic room (stored depth, cameras and instance maps):
Reconstruct's gravity-aligned world against the room's own geometry, the render tools,
SAM3 (text, box, points, video, existence) from instance maps, identity through frames
by mask IoU, OCR (PP-OCRv4), vlm.ask_with_thinking and vlm.locate through a scripted
model, the utilities, Reconstruct's backends (DA3 by default, Pi3's 255,000-pixel input),
and the argument checks and limits."""

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from data_pipelines.synthetic.samples import SampleConfig, make_sample
from jaxspatial.agents import scene_geometry, segmenters, vlm_replies
from jaxspatial.agents import tools as tool_lib
from jaxspatial.agents.kernel_program import kernel_path
from jaxspatial.agents.scene_geometry import CloudGeometry, DepthGeometry
from jaxspatial.agents.segmenters import InstanceMasks
from jaxspatial.agents.tools import EpisodeTools, ToolLimits
from jaxspatial.errors import ToolArgumentError
from jaxspatial.perception import tool_args

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
  # Every valid pixel's point lies on the room's surfaces: within a splat's world radius of
  # some cloud point (a pixel of a disc splat carries its point's depth).
  from scipy.spatial import cKDTree  # pylint: disable=import-outside-toplevel
  cloud = np.asarray(sample.room.cloud.xyz)[np.asarray(sample.room.cloud.valid)]
  distance, _ = cKDTree(cloud).query(room_points[::7])
  assert np.median(distance) < CONFIG.point_radius
  assert not result["points"][~valid].any() and (result["depth"][valid] > 0).all()


def test_render_tools_draw_the_last_reconstruction(sample):
  tools = _tools(sample)
  with pytest.raises(ToolArgumentError, match="Reconstruct"):
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
  with pytest.raises(ToolArgumentError, match="coincide"):
    tools.RenderView(eye=[0, 1, 0], target=[0, 1, 0])
  with pytest.raises(ToolArgumentError, match="rigid"):
    tools.RenderView(extrinsics=np.eye(4) * 2)
  with pytest.raises(ToolArgumentError, match="width"):
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
  transform = scene_geometry.gravity_alignment(np.stack(poses))
  assert transform[:3, :3] @ up == pytest.approx([0, 1, 0], abs=1e-9)
  new_first = transform @ poses[0]
  assert new_first[:3, 2] == pytest.approx([0, 0, -1], abs=1e-9)
  assert new_first[1, 3] == pytest.approx(0.0, abs=1e-9)  # no points: ground at the camera


def test_frame_checks_and_limits(sample):
  tools = _tools(sample)
  for bad, message in [(4, "out of range"), ([0, 0], "repeated"), ([], "at least one"),
                       ("0", "integer"), ([True], "integer"), (-1, "out of range"),
                       (list(range(70)), "limit of 64")]:
    with pytest.raises(ToolArgumentError, match=message):
      tools.Reconstruct(frames=bad)
  with pytest.raises(ToolArgumentError, match="pass frames"):
    tool_args.frame_indices(None, 100, tool_lib.MAX_FRAMES)
  small = _tools(sample, limits=ToolLimits(max_output_bytes=100_000))
  with pytest.raises(ToolArgumentError, match="over the limit"):
    small.Reconstruct(frames=[0, 1])
  with pytest.raises(ToolArgumentError, match="no reconstruction"):
    EpisodeTools(sample.rgb).Reconstruct(frames=[0])


def test_sam3_masks_from_instance_maps(sample):
  tools = _tools(sample)
  frame = int(np.argmax([(v >= 0).sum() for v in sample.instance]))
  visible = [o for o in sample.room.objects if (sample.instance[frame] == o.instance).sum() > 20]
  target = visible[0]
  truth = sample.instance[frame] == target.instance
  found = tools.SAM3(frame=frame, text=target.name)
  assert found["count"] >= 1
  assert np.array_equal(found["masks"][0], truth)
  x1, y1, x2, y2 = found["boxes"][0]
  by_box = tools.SAM3(frame=frame, box=[float(x1), float(y1), float(x2), float(y2)])
  assert any(np.array_equal(m, truth) for m in by_box["masks"])
  # A point on the object picks it alone; a negative point on it leaves nothing.
  rows, cols = np.nonzero(truth)
  inside = [float(cols[len(cols) // 2]), float(rows[len(rows) // 2])]
  by_point = tools.SAM3(frame=frame, points=[inside])
  assert by_point["count"] == 1 and np.array_equal(by_point["masks"][0], truth)
  assert tools.SAM3(frame=frame, points=[inside, inside], point_labels=[1, 0])["count"] == 0
  assert tools.SAM3(frame=frame, text="zebra")["count"] == 0
  assert tools.SAM3(frame=frame, text="zebra", points=[inside])["count"] == 0
  assert tools.SAM3_exists(frame, target.name) == {"present": True, "score": 1.0}
  assert tools.SAM3_exists(frame, "zebra") == {"present": False, "score": 0.0}
  for kwargs, message in [({}, "give text"), ({"box": [5, 5, 2, 9]}, "x1 < x2"),
                          ({"text": ""}, "non-empty"), ({"text": "x" * 300}, "limit"),
                          ({"points": [[96, 0]]}, "0 <= x < 96"),
                          ({"points": [[1, 1]], "point_labels": [0]}, "positive"),
                          ({"points": [[1, 1]], "point_labels": [1, 1]}, "shape"),
                          ({"text": "a", "point_labels": [1]}, "without points")]:
    with pytest.raises(ToolArgumentError, match=message):
      tools.SAM3(frame=frame, **kwargs)
  with pytest.raises(ToolArgumentError, match="no segmentation"):
    EpisodeTools(sample.rgb).SAM3(frame=0, text="chair")
  with pytest.raises(ToolArgumentError, match="no segmentation"):
    EpisodeTools(sample.rgb).SAM3_exists(0, "chair")


def test_sam3_video_follows_stored_instances(sample):
  """InstanceMasks' own tracker: an object keeps one id in every frame it is in."""
  tools = _tools(sample)
  counts = {o.name: [(v == o.instance).sum() for v in sample.instance] for o in sample.room.objects}
  name, per_frame = max(counts.items(), key=lambda kv: sum(c > 0 for c in kv[1]))
  instance = next(o.instance for o in sample.room.objects if o.name == name)
  out = tools.SAM3_video(frames=[0, 1, 2, 3], text=name)
  assert out["method"] == "stored instance ids" and list(out["frames"]) == [0, 1, 2, 3]
  assert out["masks"].shape == (len(out["ids"]), 4, 72, 96)
  [k] = [k for k in range(len(out["ids"]))
         if all(np.array_equal(out["masks"][k, j], sample.instance[j] == instance)
                for j in range(4))]
  assert out["present"][k].tolist() == [c > 0 for c in per_frame]
  with pytest.raises(ToolArgumentError, match="prompt_frame"):
    tools.SAM3_video(frames=[0, 1], text=name, prompt_frame=3)
  small = _tools(sample, limits=ToolLimits(max_output_bytes=1000))
  with pytest.raises(ToolArgumentError, match="over the limit"):
    small.SAM3_video(frames=[0, 1, 2, 3], text=name)


class _MovingSquares:
  """A per-frame segmenter (no tracker of its own) over two squares that move 2 pixels a
  frame, listed in a different order each frame; a third appears in frame 2."""

  def __init__(self):
    self.calls = []

  @staticmethod
  def truth(obj, t, size=(40, 60)):
    mask = np.zeros(size, bool)
    x, y = {0: (4 + 2 * t, 5), 1: (40 - 2 * t, 25), 2: (30, 2)}[obj]
    mask[y:y + 10, x:x + 10] = True
    return mask

  def segment(self, frame, image, text, box, points=None, labels=None):
    del image
    self.calls.append((frame, text, box is not None, points is not None))
    objects = [0, 1] + ([2] if frame >= 2 else [])
    if box is not None:
      objects = [o for o in objects if self.truth(o, frame)[int(box[1]):int(box[3]),
                                                            int(box[0]):int(box[2])].mean() > 0.5]
    if points is not None:
      objects = [o for o in objects if self.truth(o, frame)[int(points[0][1]), int(points[0][0])]]
    order = objects[::-1] if frame % 2 else objects
    return [{"mask": self.truth(o, frame), "score": 0.5 + 0.1 * o} for o in order]


def test_sam3_video_carries_identity_by_mask_iou():
  frames = np.zeros((5, 40, 60, 3), np.uint8)
  segmenter = _MovingSquares()
  tools = EpisodeTools(frames, segmenter=segmenter)
  out = tools.SAM3_video(text="square")
  assert out["method"] == "per-frame segmentation, identity by mask IoU"
  assert [c[0] for c in segmenter.calls] == [0, 1, 2, 3, 4]
  # Each object keeps one id: its masks are the truth in every frame it is in.
  for obj in (0, 1, 2):
    expected = np.stack([_MovingSquares.truth(obj, t) if obj < 2 or t >= 2 else
                         np.zeros((40, 60), bool) for t in range(5)])
    assert sum(np.array_equal(out["masks"][k], expected) for k in range(len(out["ids"]))) == 1
  assert len(out["ids"]) == 3
  # A box in frame 3 picks object 1 there; it is followed back and forward, no other.
  segmenter.calls.clear()
  box = tools.SAM3_video(box=[34, 25, 44, 35], prompt_frame=3)
  assert [c[0] for c in segmenter.calls] == [0, 1, 2, 3, 4]
  assert [c[2] for c in segmenter.calls] == [False, False, False, True, False]
  assert len(box["ids"]) == 1
  assert np.array_equal(box["masks"][0], np.stack([_MovingSquares.truth(1, t) for t in range(5)]))
  assert box["scores"][0].tolist() == pytest.approx([0.6] * 5)
  assert box["boxes"][0, 0].tolist() == [40, 25, 50, 35]
  # Points pick object 0 in frame 0; a frame list and an IoU the motion cannot keep.
  far = EpisodeTools(frames, segmenter=_MovingSquares(),
                     limits=ToolLimits(video_min_iou=0.9))
  lost = far.SAM3_video(frames=[0, 4], points=[[6, 7]])
  assert lost["present"].tolist() == [[True, False]]


def test_link_instances_against_a_hand_made_sequence():
  def square(x):
    mask = np.zeros((10, 30), bool)
    mask[2:8, x:x + 6] = True
    return mask
  # Frame 1 lists the two squares the other way round; frame 2 loses one, frame 3 adds one.
  per_frame = [[square(0), square(20)], [square(21), square(1)], [square(2)],
               [square(12), square(3)]]
  assert segmenters.link_instances(per_frame, 0, grow=True) == [
      [0, 1, 0, 1], [1, 0, None, None], [None, None, None, 0]]
  assert segmenters.link_instances(per_frame, 0, grow=False) == [[0, 1, 0, 1], [1, 0, None, None]]
  assert segmenters.link_instances(per_frame, 2, grow=False) == [[0, 1, 0, 1]]
  iou = segmenters.mask_iou(np.stack([square(0)]), np.stack([square(3), square(20)]))
  assert iou.tolist() == [[pytest.approx(3 / 9), 0.0]]


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


def test_vlm_tools_through_the_loop_model(sample):
  asked = []

  def ask(question, images, thinking=False):
    asked.append((question, [i.shape for i in images], thinking))
    if "Find this" in question:
      return ("<think>the chair is left</think>box [100, 200, 400, 800] point (250, 500)\n"
              "box [600, 100, 700, 300]")
    return "It has four legs, so it is a chair.\nFinal answer: a red chair"

  tools = _tools(sample, ask=ask, limits=ToolLimits(max_vlm_calls=3, image_long_edge=48))
  reply = tools.vlm_ask_with_thinking("What is this?", images=[0, sample.rgb[1]])
  assert reply == {"answer": "a red chair", "thinking": "It has four legs, so it is a chair."}
  assert asked[0][1] == [(36, 48, 3), (36, 48, 3)] and asked[0][2]  # resized; thinking
  found = tools.vlm_locate(frame=2, description="the chair")
  assert not asked[1][2]
  assert found["visible"] and found["boxes"] == [[100.0, 200.0, 400.0, 800.0],
                                                 [600.0, 100.0, 700.0, 300.0]]
  assert found["points"] == [[250.0, 500.0], [650.0, 200.0]]  # the second: its box's centre
  # The frame is 96 x 72: 0-1000 grid -> pixels.
  assert found["pixel_points"][0] == [pytest.approx(24.0), pytest.approx(36.0)]
  assert found["pixel_boxes"][0] == [pytest.approx(9.6), pytest.approx(14.4),
                                     pytest.approx(38.4), pytest.approx(57.6)]
  queries = tools.take_queries()
  assert [q for q, _ in queries] == ["What is this?", "vlm.locate in frame 2: the chair"]
  assert queries[0][1] == "a red chair"
  assert tools.take_queries() == []
  tools.vlm_ask_with_thinking("again?")
  with pytest.raises(ToolArgumentError, match="limit of 3"):
    tools.vlm_ask_with_thinking("once more?")
  with pytest.raises(ToolArgumentError, match="images"):
    _tools(sample, ask=ask).vlm_ask_with_thinking("x", images=[0] * 65)
  with pytest.raises(ToolArgumentError, match="not available"):
    _tools(sample).vlm_locate(0, "x")
  hidden = _tools(sample, ask=lambda q, i, thinking=False: "NOT VISIBLE").vlm_locate(0, "a cat")
  assert not hidden["visible"] and hidden["boxes"] == [] and hidden["points"] == []
  assert vlm_replies.locate_reply("(1200, 5)") == ([], [])
  assert vlm_replies.locate_reply("x" * 100_000) == ([], [])
  assert vlm_replies.split_thinking("<think>a</think>\nB") == ("a", "B")
  assert vlm_replies.split_thinking("B") == ("", "B")


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
  with pytest.raises(ToolArgumentError, match="labels"):
    tools.Annotate(0, points=[[1, 1]], labels=["a", "b"])
  with pytest.raises(ToolArgumentError, match="NaN"):
    tools.Project([[np.nan, 0, 0]], np.eye(4), np.eye(3))
  with pytest.raises(ToolArgumentError, match="shape"):
    tools.Project([[0, 0]], np.eye(4), np.eye(3))


def test_groups_select_the_tools(sample):
  # The paper's names (spatialclaw.md section 6) for the segmentation and VLM tools.
  assert {kernel_path(n) for n in _tools(sample).names()} >= {
      "tools.Reconstruct", "tools.SAM3", "vlm.locate", "vlm.ask_with_thinking"}
  assert set(_tools(sample).mapping()) == {n for g in tool_lib.GROUPS.values() for n in g}
  assert list(_tools(sample, groups=("utilities",)).mapping()) == ["Project", "Annotate",
                                                                   "MaskStats"]
  assert _tools(sample, groups=()).mapping() == {}
  with pytest.raises(ValueError, match="unknown tool groups"):
    _tools(sample, groups=("magic",))
  docs = tool_lib.documentation(_tools(sample).names())
  assert all(f"{kernel_path(name)}(" in docs for name in _tools(sample).names())


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

  frames = np.zeros((2, 40, 50, 3), np.uint8)
  tools = EpisodeTools(frames, segmenter=segmenters.SAM3Segmenter(Fake()))
  found = tools.SAM3(frame=0, box=[5, 10, 25, 40])
  assert calls[0][0] == (1, 40, 50, 3) and calls[0][1] is None
  assert np.allclose(calls[0][2], [[100, 250, 500, 1000]]) and calls[0][3] == (40, 50)
  assert found["count"] == 1 and found["masks"].shape == (1, 40, 50)
  assert found["boxes"][0].tolist() == [0, 0, 3, 2] and found["scores"][0] == pytest.approx(0.9)
  tools.SAM3(frame=0, text="chair")
  assert calls[1][1] == "chair" and calls[1][2] is None
  # Points keep the instances whose mask holds them (the auto prompt: text None).
  assert tools.SAM3(frame=0, points=[[1, 1]])["count"] == 1 and calls[2][1] is None
  assert tools.SAM3(frame=0, points=[[10, 10]])["count"] == 0
  assert tools.SAM3_exists(0, "chair") == {"present": True, "score": pytest.approx(0.9)}
  video = tools.SAM3_video(text="chair")
  assert video["method"] == "per-frame segmentation, identity by mask IoU"
  assert video["present"].tolist() == [[True, True]]


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
      k = scene_geometry._intrinsic_matrices(sample.cameras)[index]  # pylint: disable=protected-access
      return Reconstruction(
          xyz=np.asarray(cloud.xyz)[keep], rgb=np.asarray(cloud.rgb)[keep],
          valid=np.ones(int(keep.sum()), bool),
          cameras_c2w=np.asarray(sample.cameras.world_from_camera)[index], intrinsics=k,
          image_size=sample.rgb.shape[1:3])

  model = EpisodeTools(sample.rgb, geometry=scene_geometry.ModelGeometry(Room())).Reconstruct(
      frames=[2, 1])
  stored = _tools(sample).Reconstruct(frames=[2, 1])
  assert seen == [[2, 1]] and not model["metric"]
  both = model["valid"] & stored["valid"]
  assert both.mean() > 0.5
  assert np.median(np.abs(model["depth"][both] - stored["depth"][both])) < 0.05


def test_reconstruct_defaults_to_da3_and_says_what_runs(tmp_path):
  """The paper's backend is the default; without its folder the error names the model,
  the folder and the backends that run instead."""
  for kwargs, error in (({}, ValueError), ({"checkpoint": tmp_path / "missing"},
                                           FileNotFoundError)):
    with pytest.raises(error) as raised:
      scene_geometry.ModelGeometry(**kwargs)
    message = str(raised.value)
    for part in ("'da3'", "DA3NESTED-GIANT-LARGE", "'stored'", "'pi3'"):
      assert part in message, part
  assert str(tmp_path / "missing") in message
  (tmp_path / "da3").mkdir()
  assert scene_geometry.ModelGeometry(checkpoint=tmp_path / "da3").backend == "da3"


@pytest.mark.parametrize("height, width, expected", [
    # By hand: 640 x 480 scaled to 255,000 px is 583.1 x 437.3 -> 42 x 31 patches = 588 x 434
    # (255,192 px, over), the wider side trimmed -> 574 x 434 (249,116 px).
    (480, 640, (434, 574)),
    # 1920 x 1080 -> 673.3 x 378.7 -> 48 x 27 patches = 672 x 378 (254,016 px).
    (1080, 1920, (378, 672)),
    (72, 96, (434, 574)),     # small frames are scaled up, as Pi3's loader does
])
def test_pi3_input_size_fits_its_pixel_budget(height, width, expected):
  size = scene_geometry.pi3_input_size(height, width)
  assert size == expected
  assert size[0] % 14 == 0 and size[1] % 14 == 0 and size[0] * size[1] <= 255_000


def test_pi3_is_fed_its_pixel_budget_and_cameras_come_back_at_frame_size(sample, tmp_path,
                                                                          monkeypatch):
  """Pi3 (by name, a stand-in loaded in its place) gets the frames at 574 x 434 in RGB;
  the depth rendered back at the frames' size matches the stored depth."""
  from jaxspatial.perception import reconstruction  # pylint: disable=import-outside-toplevel
  from jaxspatial.perception.reconstruction import Reconstruction  # pylint: disable=import-outside-toplevel
  seen = {}

  class Stand:
    def reconstruct(self, frames):
      seen["shape"] = frames.shape
      index = [1, 2]
      cloud = sample.room.cloud
      keep = np.asarray(cloud.valid)
      k = scene_geometry._intrinsic_matrices(sample.cameras)[index].astype(np.float64)  # pylint: disable=protected-access
      sx, sy = frames.shape[2] / 96, frames.shape[1] / 72   # the frames' K at the model size
      k[:, 0, 0] *= sx
      k[:, 1, 1] *= sy
      k[:, 0, 2] = (k[:, 0, 2] + 0.5) * sx - 0.5
      k[:, 1, 2] = (k[:, 1, 2] + 0.5) * sy - 0.5
      return Reconstruction(
          xyz=np.asarray(cloud.xyz)[keep], rgb=np.asarray(cloud.rgb)[keep],
          valid=np.ones(int(keep.sum()), bool),
          cameras_c2w=np.asarray(sample.cameras.world_from_camera)[index], intrinsics=k,
          image_size=frames.shape[1:3])

  def load(backend, checkpoint, device="cpu", **options):
    seen.update(backend=backend, options=options)
    return Stand()

  monkeypatch.setattr(reconstruction, "load_reconstructor", load)
  (tmp_path / "pi3").mkdir()
  geometry = scene_geometry.ModelGeometry("pi3", tmp_path / "pi3")
  result = EpisodeTools(sample.rgb, geometry=geometry).Reconstruct(frames=[1, 2])
  assert seen["shape"] == (2, 434, 574, 3) and seen["backend"] == "pi3"
  assert seen["options"] == {"channel_order": "rgb"}
  stored = _tools(sample).Reconstruct(frames=[1, 2])
  both = result["valid"] & stored["valid"]
  assert both.mean() > 0.5
  assert np.median(np.abs(result["depth"][both] - stored["depth"][both])) < 0.05
  # Think3D's sizing instead: the frames as they are (Pi3's adapter rounds up to 14s).
  think3d = scene_geometry.ModelGeometry("pi3", tmp_path / "pi3", pi3_pixels=None,
                                   channel_order="bgr")
  EpisodeTools(sample.rgb, geometry=think3d).Reconstruct(frames=[1, 2])
  assert seen["shape"] == (2, 72, 96, 3) and seen["options"] == {"channel_order": "bgr"}
