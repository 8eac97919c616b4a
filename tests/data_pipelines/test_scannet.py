"""ScanNet scans (read_scan), SQA3D (read_sqa3d) and the ScanQA / SQA3D scene builders:
scans written here in ScanNet's published layout, checked against what was written; the
real ScanQA validation file over 71 tiny scans; named errors on bad input."""

import collections
import json
import math
import pathlib
import time

import numpy as np
import pytest

from data_pipelines.benchmarks.scannet import (MAX_ANSWER_BYTES, ViewRule, scanqa_scenes,
                                               sqa3d_scenes)
from data_pipelines.readers import (BenchmarkFormatError, MissingImageError, MissingScanError,
                                    ScanFormatError, read_scan, read_sqa3d)
from data_pipelines.readers.sqa3d import sqa3d_category
from jaxspatial.geometry import Camera, PointCloud
from jaxspatial.render import render

SHARED = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data" / "benchmarks"
SCANQA_VAL = SHARED / "scanqa_v1.0_val.json"
needs_shared = pytest.mark.skipif(not SCANQA_VAL.is_file(), reason=f"{SCANQA_VAL} is absent")

FAST = ViewRule(search_width=32, search_height=24, max_grid=4, batch=32)


# --- writing scans in ScanNet's layout -------------------------------------------------------


def write_ply(path, xyz, rgb, faces, ascii=False):
  header = ["ply", f"format {'ascii' if ascii else 'binary_little_endian'} 1.0",
            "comment VCGLIB generated", f"element vertex {len(xyz)}", "property float x",
            "property float y", "property float z", "property uchar red",
            "property uchar green", "property uchar blue", "property uchar alpha",
            f"element face {len(faces)}", "property list uchar int vertex_indices",
            "end_header"]
  if ascii:
    lines = [f"{x!r} {y!r} {z!r} {r} {g} {b} 255" for (x, y, z), (r, g, b)
             in zip(xyz.astype(np.float32).tolist(), rgb.tolist())]
    lines += [f"3 {a} {b} {c}" for a, b, c in faces.tolist()]
    path.write_text("\n".join(header + lines) + "\n")
    return
  vertex = np.zeros(len(xyz), [("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("red", "u1"),
                               ("green", "u1"), ("blue", "u1"), ("alpha", "u1")])
  for i, name in enumerate("xyz"):
    vertex[name] = xyz[:, i]
  for i, name in enumerate(("red", "green", "blue")):
    vertex[name] = rgb[:, i]
  vertex["alpha"] = 255
  face = np.zeros(len(faces), [("n", "u1"), ("v", "<i4", (3,))])
  face["n"], face["v"] = 3, faces
  path.write_bytes(("\n".join(header) + "\n").encode() + vertex.tobytes() + face.tobytes())


def write_scan(root, scene_id, raw_xyz, rgb, segments, groups, alignment, *, ascii=False,
               aggregation=".aggregation.json", id_key="objectId"):
  """groups: [(objectId, label, [segment ids])] in file order."""
  folder = pathlib.Path(root) / scene_id
  folder.mkdir(parents=True, exist_ok=True)
  n = len(raw_xyz)
  faces = np.stack([np.arange(n - 2), np.arange(1, n - 1), np.arange(2, n)], 1)
  write_ply(folder / f"{scene_id}_vh_clean_2.ply", raw_xyz, rgb, faces, ascii)
  (folder / f"{scene_id}_vh_clean_2.0.010000.segs.json").write_text(json.dumps(
      {"params": {"kThresh": "0.0001", "segMinVerts": "20"}, "sceneId": scene_id,
       "segIndices": [int(s) for s in segments]}))
  (folder / f"{scene_id}{aggregation}").write_text(json.dumps(
      {"sceneId": f"scannet.{scene_id}", "appId": "Aggregator.v2",
       "segGroups": [{**({"id": i} if id_key == "id" else {"id": i, "objectId": i}),
                      "label": label, "segments": [int(s) for s in segs]}
                     for i, label, segs in groups],
       "segmentsFile": f"scannet.{scene_id}_vh_clean_2.0.010000.segs.json"}))
  numbers = " ".join(repr(float(v)) for v in np.asarray(alignment).reshape(-1))
  (folder / f"{scene_id}.txt").write_text(
      f"colorHeight = 968\ncolorWidth = 1296\naxisAlignment = {numbers}\nnumDepthFrames = 100\n")
  return folder


def z_rotation(degrees, translation):
  a = math.radians(degrees)
  m = np.eye(4)
  m[:2, :2] = [[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]]
  m[:3, 3] = translation
  return m


ALIGN = z_rotation(33.0, (-2.4, 1.7, -0.08))
BOXES = [  # objectId, label, centre (aligned), size, colour; in the aggregation's file order
    (12, "chair", (1.0, 0.8, 0.35), (0.5, 0.5, 0.7), (200, 40, 40)),
    (5, "table", (3.0, 2.2, 0.4), (0.9, 0.6, 0.8), (40, 160, 40)),
    (9, "sofa", (3.1, 0.6, 0.4), (0.8, 0.5, 0.8), (40, 60, 200)),
    (20, "lamp", (0.7, 2.4, 0.6), (0.3, 0.3, 1.2), (220, 200, 30)),
]
ROOM = (4.0, 3.0, 2.6)


def box_surface(rng, centre, size, n):
  """n points on a box's surface."""
  face = rng.integers(0, 6, n)
  p = rng.uniform(-0.5, 0.5, (n, 3))
  axis, sign = face // 2, np.where(face % 2 == 0, -0.5, 0.5)
  p[np.arange(n), axis] = sign
  return p * np.asarray(size) + np.asarray(centre)


def make_room(seed=0):
  """The aligned room's points, colours, segments and groups (floor, walls, boxes)."""
  rng = np.random.default_rng(seed)
  width, depth, height = ROOM
  parts = []  # (points, colour, segment id)
  gx, gy = np.meshgrid(np.arange(0.05, width, 0.1), np.arange(0.05, depth, 0.1))
  floor = np.stack([gx.ravel(), gy.ravel(), np.zeros(gx.size)], 1)
  quadrant = (floor[:, 0] > width / 2) * 2 + (floor[:, 1] > depth / 2)
  for q in range(4):
    parts.append((floor[quadrant == q], (150, 140, 130), 1000 + 7 * q))
  s, t, h = (np.arange(0.05, side, 0.15) for side in (width, depth, height))
  ws, wh = np.meshgrid(s, h)
  wt, wht = np.meshgrid(t, h)
  walls = [np.stack([ws.ravel(), np.zeros(ws.size), wh.ravel()], 1),
           np.stack([ws.ravel(), np.full(ws.size, depth), wh.ravel()], 1),
           np.stack([np.zeros(wt.size), wt.ravel(), wht.ravel()], 1),
           np.stack([np.full(wt.size, width), wt.ravel(), wht.ravel()], 1)]
  for k, wall in enumerate(walls):
    parts.append((wall, (230, 230, 225), 2000 + 11 * k))
  for k, (_, _, centre, size, colour) in enumerate(BOXES):
    points = box_surface(rng, centre, size, 300)
    upper = points[:, 2] > centre[2]
    parts.append((points[~upper], colour, 3000 + 13 * k))
    parts.append((points[upper], colour, 3005 + 13 * k))
  xyz = np.concatenate([p for p, _, _ in parts])
  rgb = np.concatenate([np.tile(np.asarray(c, np.uint8), (len(p), 1)) for p, c, _ in parts])
  segments = np.concatenate([np.full(len(p), s) for p, _, s in parts])
  groups = [(0, "floor", [1000, 1007, 1014, 1021])]
  groups += [(1 + k, "wall", [2000 + 11 * k]) for k in range(3)]  # the fourth wall: unlabelled
  groups += [(i, label, [3000 + 13 * k, 3005 + 13 * k])
             for k, (i, label, _, _, _) in enumerate(BOXES)]
  return xyz, rgb, segments, groups


def to_raw(aligned, alignment):
  inverse = np.linalg.inv(alignment)
  return aligned @ inverse[:3, :3].T + inverse[:3, 3]


@pytest.fixture(scope="module")
def room(tmp_path_factory):
  root = tmp_path_factory.mktemp("scans")
  xyz, rgb, segments, groups = make_room()
  write_scan(root, "scene0000_00", to_raw(xyz, ALIGN), rgb, segments, groups, ALIGN)
  return root, xyz, rgb, segments, groups


def expected_labels(segments, groups):
  ids = sorted(i for i, _, _ in groups)
  labels = np.full(len(segments), -1)
  for object_id, _, segs in groups:
    labels[np.isin(segments, segs)] = ids.index(object_id)
  return ids, labels


# --- read_scan ----------------------------------------------------------------------------


def test_read_scan_matches_what_was_written(room):
  root, xyz, rgb, segments, groups = room
  scan = read_scan(root, "scene0000_00")
  raw = to_raw(xyz, ALIGN).astype(np.float32).astype(np.float64)
  assert scan.xyz.dtype == np.float32 and scan.xyz.shape == xyz.shape
  np.testing.assert_allclose(scan.xyz, xyz, atol=2e-5)
  np.testing.assert_array_equal(scan.rgb, rgb)
  ids, labels = expected_labels(segments, groups)
  assert scan.object_ids.tolist() == ids == [0, 1, 2, 3, 5, 9, 12, 20]
  np.testing.assert_array_equal(scan.instance, labels)
  assert scan.instance.dtype == np.int32 and (scan.instance == -1).sum() > 0
  names = dict((i, label) for i, label, _ in groups)
  assert scan.object_names == tuple(names[i] for i in ids)
  for k, object_id in enumerate(ids):
    points = xyz[labels == k]
    np.testing.assert_allclose(scan.object_centres[k], (points.min(0) + points.max(0)) / 2,
                               atol=2e-5)
    assert scan.instance_of(object_id) == k
  assert scan.instance_of(4) is None and scan.instance_of(999) is None
  chair = scan.instance_of(12)
  np.testing.assert_allclose(scan.object_centres[chair], BOXES[0][2], atol=0.02)
  np.testing.assert_allclose(scan.bounds, [xyz.min(0), xyz.max(0)], atol=2e-5)
  np.testing.assert_allclose(scan.alignment, ALIGN)
  np.testing.assert_allclose(scan.raw_centre, (raw.min(0) + raw.max(0)) / 2, atol=1e-9)

  unaligned = read_scan(root, "scene0000_00", align=False)
  np.testing.assert_allclose(unaligned.xyz, raw, atol=1e-6)
  np.testing.assert_array_equal(unaligned.instance, scan.instance)
  np.testing.assert_allclose(unaligned.alignment, np.eye(4))


def test_read_scan_ascii_ply_other_aggregation_name_and_overlaps(tmp_path):
  xyz, rgb, segments, groups = make_room(seed=1)
  # A later group takes one of the sofa's two segments; "ghost" loses its only segment to
  # "cushion", so it has no vertex left and is dropped.
  groups = groups + [(30, "pillow", [3000 + 13 * 2]), (31, "ghost", [3005]),
                     (32, "cushion", [3005])]
  write_scan(tmp_path, "scene0001_00", to_raw(xyz, ALIGN), rgb, segments, groups, ALIGN,
             ascii=True, aggregation="_vh_clean.aggregation.json", id_key="id")
  scan = read_scan(tmp_path, "scene0001_00")
  np.testing.assert_allclose(scan.xyz, xyz, atol=2e-5)
  assert 31 not in scan.object_ids.tolist()
  assert scan.object_ids.tolist() == [0, 1, 2, 3, 5, 9, 12, 20, 30, 32]
  sofa, pillow = scan.instance_of(9), scan.instance_of(30)
  np.testing.assert_array_equal(scan.instance[segments == 3000 + 26], pillow)
  np.testing.assert_array_equal(scan.instance[segments == 3005 + 26], sofa)
  np.testing.assert_array_equal(scan.instance[segments == 3005], scan.instance_of(32))
  assert scan.instance.max() == len(scan.object_ids) - 1
  assert scan.object_names[scan.instance_of(32)] == "cushion"


def _corrupt(tmp_path, name, change):
  """The room written to tmp_path, then `change(folder)` applied; returns the folder."""
  xyz, rgb, segments, groups = make_room(seed=2)
  folder = write_scan(tmp_path, name, to_raw(xyz, ALIGN), rgb, segments, groups, ALIGN)
  change(folder)
  return folder


def _edit_json(path, edit):
  record = json.loads(path.read_text())
  edit(record)
  path.write_text(json.dumps(record))


def _edit_text(path, old, new):
  path.write_text(path.read_text().replace(old, new))


S = "scene0002_00"
MESH, SEGS = f"{S}_vh_clean_2.ply", f"{S}_vh_clean_2.0.010000.segs.json"
AGG, META = f"{S}.aggregation.json", f"{S}.txt"


@pytest.mark.parametrize("change,error,file,pattern", [
    (lambda f: (f / MESH).write_bytes((f / MESH).read_bytes()[:2000]), ScanFormatError, MESH,
     r"element vertex: expected \d+ vertices of 16 bytes .* got a file of 2000 bytes"),
    (lambda f: (f / MESH).write_bytes((f / MESH).read_bytes().replace(b"uchar red", b"uchar r",
                                                                      1)),
     ScanFormatError, MESH, r"element vertex: expected a property 'red'"),
    (lambda f: (f / MESH).write_bytes((f / MESH).read_bytes().replace(
        b"binary_little_endian", b"binary_middle_endian", 1)), ScanFormatError, MESH,
     r"header line 2: expected 'format"),
    (lambda f: (f / MESH).write_bytes(b"PK\x03\x04zip"), ScanFormatError, MESH,
     r"<header>: expected a PLY file"),
    (lambda f: _edit_json(f / SEGS, lambda r: r["segIndices"].pop()), ScanFormatError, SEGS,
     r"segIndices: expected \d+ segment ids \(one per vertex of the mesh .*\), got \d+"),
    (lambda f: _edit_json(f / SEGS, lambda r: r["segIndices"].__setitem__(5, "7")),
     ScanFormatError, SEGS, r"segIndices\[5\]: expected an integer, got '7'"),
    (lambda f: _edit_json(f / SEGS, lambda r: r.pop("segIndices")), ScanFormatError, SEGS,
     r"segIndices: missing"),
    (lambda f: (f / SEGS).write_text("{not json"), ScanFormatError, SEGS, r"<file>: not JSON"),
    (lambda f: _edit_json(f / AGG, lambda r: r["segGroups"][5]["segments"].append(4242)),
     ScanFormatError, AGG, r"segGroups\[5\]\.segments: objectId 5: segment id 4242 is not "
     r"among .*segs\.json's segIndices"),
    (lambda f: _edit_json(f / AGG, lambda r: r["segGroups"][2].__setitem__("objectId", 0)),
     ScanFormatError, AGG, r"segGroups\[2\]\.objectId: objectId 0 repeats segGroups\[0\]'s"),
    (lambda f: _edit_json(f / AGG, lambda r: r["segGroups"][3].pop("label")),
     ScanFormatError, AGG, r"segGroups\[3\]\.label: expected a string, got nothing"),
    (lambda f: _edit_json(f / AGG, lambda r: r["segGroups"][1].pop("segments")),
     ScanFormatError, AGG, r"segGroups\[1\]\.segments: missing"),
    (lambda f: _edit_json(f / AGG, lambda r: r.pop("segGroups")), ScanFormatError, AGG,
     r"segGroups: missing"),
    (lambda f: _edit_text(f / META, "axisAlignment", "axisAlign"), ScanFormatError, META,
     r"axisAlignment: missing: expected a line 'axisAlignment = <16 numbers>'"),
    (lambda f: _edit_text(f / META, " 1.0\nnumDepth", "\nnumDepth"), ScanFormatError, META,
     r"axisAlignment \(line 3\): expected 16 numbers \(a row-major 4x4\), got 15"),
    (lambda f: _edit_text(f / META, "axisAlignment = ", "axisAlignment = 2.0 0.0 "),
     ScanFormatError, META, r"axisAlignment \(line 3\): expected 16 numbers"),
    (lambda f: (f / META).write_text("axisAlignment = " + " ".join(
        ["2", "0", "0", "0", "0", "1", "0", "0", "0", "0", "1", "0", "0", "0", "0", "1"])),
     ScanFormatError, META, r"axisAlignment \(line 1\): expected a rigid transform"),
    (lambda f: (f / MESH).unlink(), MissingScanError, MESH, r"scan file not found: .*\(scene"
     r"0002_00's mesh"),
    (lambda f: (f / AGG).unlink(), MissingScanError, AGG, r"scan file not found: .* \(or .*"
     r"_vh_clean\.aggregation\.json\)"),
    (lambda f: (f / META).unlink(), MissingScanError, META, r"scan file not found: .*axis"
     r"Alignment \(pass align=False"),
])
def test_read_scan_errors_name_file_and_field(tmp_path, change, error, file, pattern):
  folder = _corrupt(tmp_path, S, change)
  with pytest.raises(error, match=pattern) as caught:
    read_scan(tmp_path, S)
  assert str(folder / file) in str(caught.value)


def test_read_scan_nonfinite_vertex_and_missing_folder(tmp_path):
  xyz, rgb, segments, groups = make_room(seed=3)
  raw = to_raw(xyz, ALIGN)
  raw[17, 1] = np.nan
  write_scan(tmp_path, S, raw, rgb, segments, groups, ALIGN)
  with pytest.raises(ScanFormatError, match=r"vertex 17: expected finite x, y, z"):
    read_scan(tmp_path, S)
  with pytest.raises(MissingScanError, match=r"scan file not found: .*scene0999_00 \(the scan "
                                             r"folder of scene0999_00\)"):
    read_scan(tmp_path, "scene0999_00")


# --- ScanQA scenes: the initial viewpoint -------------------------------------------------


def scanqa_row(scene_id, number, object_ids, names, answers=("brown",), question=None):
  return {"answers": list(answers), "object_ids": list(object_ids),
          "object_names": list(names), "question": question or f"What is object {number}?",
          "question_id": f"val-{scene_id[:9]}-{number}", "scene_id": scene_id}


def test_scanqa_scene_initial_view(room, tmp_path):
  root, xyz, _, segments, groups = room
  rows = [scanqa_row("scene0000_00", 0, [12, 4], ["chair", "cabinet"],
                     ("dark brown", "brown")),
          scanqa_row("scene0000_00", 1, [20], ["lamp"], ("yellow",))]
  path = tmp_path / "scanqa.json"
  path.write_text(json.dumps(rows))
  start = time.perf_counter()
  (scene,) = list(scanqa_scenes(path, root))
  print(f"one scene, 640 x 480, default rule: {time.perf_counter() - start:.2f} s")
  scan = read_scan(root, "scene0000_00")
  assert scene.benchmark == "scanqa" and scene.geometry == "scan"
  assert scene.scene_id == "scene0000_00" and len(scene.images) == 1
  assert scene.images[0].shape == (480, 640, 3) and scene.images[0].dtype == np.uint8
  assert len(scene.xyz) == len(xyz)  # under 200,000 points: all of them, reordered
  np.testing.assert_allclose(np.sort(scene.xyz, axis=0), np.sort(scan.xyz, axis=0))
  np.testing.assert_allclose(scene.scene_min, scan.bounds[0])
  assert scene.object_names == list(scan.object_names)

  pose = scene.world_from_camera[0]
  eye, forward = pose[:3, 3], pose[:3, 2]
  low, high = scan.bounds
  assert (eye[:2] > low[:2]).all() and (eye[:2] < high[:2]).all()
  assert eye[2] == pytest.approx(low[2] + 1.5, abs=1e-5)
  assert abs(forward[2]) < 1e-6 and pose[:3, 1][2] < 0  # level, image down = world down
  assert np.linalg.norm(scan.xyz - eye, axis=1).min() >= 0.3
  fx, fy, cx, cy = scene.intrinsics[0]
  assert fx == pytest.approx(320.0) and (cx, cy) == (319.5, 239.5)  # 90 degrees across
  cloud = PointCloud.create(scene.xyz, scene.rgb, instance=scene.instance)
  view = render(cloud, Camera.create(fx, fy, cx, cy, pose), 480, 640, 1, (255, 255, 255))
  np.testing.assert_array_equal(np.asarray(view.rgb), scene.images[0])
  shown = collections.Counter(np.asarray(view.instance).ravel().tolist())
  boxes = {scan.instance_of(i) for i, *_ in BOXES}
  assert sum(shown[k] >= 100 for k in boxes) >= 2, shown

  q0, q1 = scene.questions
  assert q0 == {"question_id": "val-scene0000-0", "question": "What is object 0?",
                "options": [], "answer": "dark brown", "answer_text": "dark brown",
                "answers": ["dark brown", "brown"], "category": "open",
                "answer_objects": [scan.instance_of(12)], "initial_view": 0, "views": [0],
                "needs_exploration": True, "order": 0, "object_ids": [12, 4],
                "object_names": ["chair", "cabinet"]}  # object 4 is not in the scan
  assert q1["answer_objects"] == [scan.instance_of(20)] and q1["order"] == 1
  example = scene.example(0)
  assert example["xyz"].shape == scene.xyz.shape and len(example["images"]) == 1

  # The answer objects never drive the choice; the cloud and view are deterministic.
  rows[0].update(object_ids=[5], object_names=["table"])
  rows[1].update(object_ids=[9], object_names=["sofa"])
  path.write_text(json.dumps(rows))
  (again,) = list(scanqa_scenes(path, root))
  np.testing.assert_array_equal(again.world_from_camera, scene.world_from_camera)
  np.testing.assert_array_equal(again.xyz, scene.xyz)
  np.testing.assert_array_equal(again.images[0], scene.images[0])


def test_subsampling_is_seeded_and_bounded(room, tmp_path):
  root, xyz, *_ = room
  path = tmp_path / "scanqa.json"
  path.write_text(json.dumps([scanqa_row("scene0000_00", 0, [12], ["chair"])]))
  kwargs = dict(points=1000, width=64, height=48, rule=FAST)
  (a,) = scanqa_scenes(path, root, **kwargs)
  (b,) = scanqa_scenes(path, root, **kwargs)
  (c,) = scanqa_scenes(path, root, seed=1, **kwargs)
  assert len(a.xyz) == 1000 and a.images[0].shape == (48, 64, 3)
  np.testing.assert_array_equal(a.xyz, b.xyz)
  np.testing.assert_array_equal(a.instance, b.instance)
  assert not np.array_equal(np.sort(a.xyz, 0), np.sort(c.xyz, 0))
  scan = read_scan(root, "scene0000_00")
  rows = {tuple(p) for p in scan.xyz.tolist()}
  assert all(tuple(p) in rows for p in a.xyz.tolist())  # a subset of the scan's points
  lookup = {tuple(p): k for p, k in zip(scan.xyz.tolist(), scan.instance.tolist())}
  assert [lookup[tuple(p)] for p in a.xyz.tolist()] == a.instance.tolist()


def test_scanqa_text_limits_and_missing_scans(room, tmp_path):
  root = room[0]
  path = tmp_path / "scanqa.json"
  long = "x" * (MAX_ANSWER_BYTES - 1) + "é"  # 193 bytes
  path.write_text(json.dumps([scanqa_row("scene0000_00", 0, [12], ["chair"]),
                              scanqa_row("scene0000_00", 1, [12], ["chair"], ("ok", long))]))
  with pytest.raises(BenchmarkFormatError, match=r"scanqa\.json: row 2 \(id 'val-scene0000-1'"
                                                 r"\), field 'answers\[1\]': 193 bytes"):
    list(scanqa_scenes(path, root, rule=FAST))
  path.write_text(json.dumps([scanqa_row("scene0000_00", 0, [12], ["chair"],
                                         question="Where " + "is it " * 200 + "?")]))
  with pytest.raises(BenchmarkFormatError, match=r"row 1 .*field 'question': 1207 bytes of "
                                                 r"UTF-8, more than MAX_QUESTION_BYTES 1024"):
    list(scanqa_scenes(path, root, rule=FAST))
  path.write_text(json.dumps([scanqa_row("scene0042_00", 0, [1], ["door"])]))
  with pytest.raises(MissingImageError, match=r"row 1 \(id 'val-scene0042-0'\), field 'images'"
                                              r": image not found: .*scene0042_00"):
    list(scanqa_scenes(path, root, rule=FAST))
  (tmp_path / "scans" / "scene0042_00").mkdir(parents=True)
  with pytest.raises(MissingScanError, match=r"scan file not found: .*scene0042_00/scene0042_00"
                                             r"_vh_clean_2\.ply"):
    list(scanqa_scenes(path, tmp_path / "scans", rule=FAST))


def tiny_scan(root, scene_id, objects, rng):
  """A 3 m x 3 m floor (64 points) and each object a cluster of 5 points."""
  gx, gy = np.meshgrid(np.linspace(0, 3, 8), np.linspace(0, 3, 8))
  floor = np.stack([gx.ravel(), gy.ravel(), np.zeros(64)], 1)
  centres = rng.uniform([0.3, 0.3, 0.2], [2.7, 2.7, 1.0], (len(objects), 3))
  clusters = (centres[:, None] + rng.normal(0, 0.05, (len(objects), 5, 3))).reshape(-1, 3)
  xyz = np.concatenate([floor, clusters])
  rgb = rng.integers(0, 256, (len(xyz), 3)).astype(np.uint8)
  segments = np.concatenate([np.zeros(64, int), np.repeat(np.arange(1, len(objects) + 1), 5)])
  groups = [(i, name, [k + 1]) for k, (i, name) in enumerate(objects)]
  align = z_rotation(rng.uniform(-180, 180), rng.uniform(-3, 3, 3))
  write_scan(root, scene_id, to_raw(xyz, align), rgb, segments, groups, align)


@needs_shared
def test_scanqa_validation_every_scene(tmp_path):
  rows = json.loads(SCANQA_VAL.read_text())
  counts = collections.Counter(r["scene_id"] for r in rows)
  objects = collections.defaultdict(dict)
  for r in rows:
    objects[r["scene_id"]].update(zip(r["object_ids"], r["object_names"]))
  assert len(rows) == 4675 and len(counts) == 71
  rng = np.random.default_rng(0)
  start = time.perf_counter()
  for scene_id in counts:
    tiny_scan(tmp_path, scene_id, sorted(objects[scene_id].items()), rng)
  written = time.perf_counter() - start
  scenes = list(scanqa_scenes(SCANQA_VAL, tmp_path, width=64, height=48, rule=FAST))
  print(f"71 tiny scans written in {written:.2f} s, built in "
        f"{time.perf_counter() - start - written:.2f} s")
  assert len(scenes) == 71
  assert sum(len(s.questions) for s in scenes) == 4675
  assert {s.scene_id: len(s.questions) for s in scenes} == dict(counts)
  assert [q["question_id"] for s in scenes for q in s.questions] == [
      r["question_id"] for r in sorted(rows, key=lambda r: list(counts).index(r["scene_id"]))]
  by_id = {r["question_id"]: r for r in rows}
  for scene in scenes:
    ids = sorted(objects[scene.scene_id])
    assert scene.object_names == [objects[scene.scene_id][i] for i in ids]
    assert scene.images[0].shape == (48, 64, 3) and scene.world_from_camera.shape == (1, 4, 4)
    for q in scene.questions:
      row = by_id[q["question_id"]]
      assert q["answers"] == row["answers"] and q["answer"] == row["answers"][0]
      assert q["answer_objects"] == sorted({ids.index(i) for i in row["object_ids"]})
      assert q["question"] == row["question"] and q["category"] == "open"
  # Every stored record passes the loader at the benchmarks' task sizes: one task a question.
  from data_pipelines.builders import BENCHMARK_LIMITS  # pylint: disable=import-outside-toplevel
  from data_pipelines.loader import scene_tasks  # pylint: disable=import-outside-toplevel
  tasks = [scene_tasks(scene.example(i), limits=BENCHMARK_LIMITS)
           for i, scene in enumerate(scenes)]
  assert sum(map(len, tasks)) == 4675
  first = tasks[0][0][0]
  assert first.answer_ids.shape == (BENCHMARK_LIMITS.answers, BENCHMARK_LIMITS.answer_bytes)


# --- SQA3D ---------------------------------------------------------------------------------


INFO = {"info": {"description": "This is v1.0 of the SQA3D dataset.", "version": "1.0"},
        "license": {"name": "CC BY 4.0"}, "data_type": "scannet", "data_subtype": "v2"}


def sqa3d_files(tmp_path, items):
  """items: (question_id, scene_id, situation, question, answer, (x, y), yaw_degrees)."""
  questions = {**INFO, "task_type": "Situated question answering", "questions": [
      {"scene_id": s, "situation": sit, "alternative_situation": [f"Alt {i}."],
       "question": q, "question_id": i} for i, s, sit, q, _, _, _ in items]}
  annotations = {**INFO, "annotations": [
      {"scene_id": s, "question_type": "N/A", "answer_type": "other", "question_id": i,
       "answers": [{"answer": a, "answer_confidence": "yes", "answer_id": 1}],
       "rotation": {"_x": 0, "_y": 0, "_z": math.sin(math.radians(yaw) / 2),
                    "_w": math.cos(math.radians(yaw) / 2)},
       "position": {"x": x, "y": y, "z": 0}} for i, s, _, _, a, (x, y), yaw in items]}
  qpath = tmp_path / "v1_balanced_questions_val_scannetv2.json"
  apath = tmp_path / "v1_balanced_sqa_annotations_val_scannetv2.json"
  qpath.write_text(json.dumps(questions))
  apath.write_text(json.dumps(annotations))
  return qpath, apath


SQA_ITEMS = [
    (220602000000, "scene0000_00", "I am facing the table.", "What color is the table?",
     "green", (0.3, 0.2), 10.0),
    (220602000001, "scene0000_00", "I am facing the table.", "Is the lamp on my left?",
     "yes", (0.3, 0.2), 10.0),
    (220602000002, "scene0000_00", "I sit on the sofa.", "How many chairs are there?",
     "one", (-0.5, 0.4), 200.0),
    (220602000003, "scene0000_00", "I stand by the lamp.", "Can I reach the table?",
     "no", (0.8, -0.6), -75.0),
]


def test_sqa3d_categories():
  assert [sqa3d_category(q) for q in (
      "What color is it?", "  is the door open?", "Isn't it red?", "How many?", "Can I sit?",
      "Which way?", "Am I facing it?", "If I turn, what is there?", "Where is the sink?",
      "Are there chairs?")] == ["what", "is", "is", "how", "can", "which", "others", "others",
                                "others", "others"]


def test_read_sqa3d(tmp_path, room):
  qpath, apath = sqa3d_files(tmp_path, SQA_ITEMS)
  questions = read_sqa3d(qpath, apath, scene_root=room[0])
  assert [q.question_id for q in questions] == [str(i[0]) for i in SQA_ITEMS]
  assert [q.category for q in questions] == ["what", "is", "how", "can"]
  q = questions[2]
  assert q.benchmark == "sqa3d" and q.answer == "one" and q.answers == ("one",)
  assert q.scene_id == "scene0000_00" and q.question == "How many chairs are there?"
  assert q.meta["situation"] == "I sit on the sofa."
  assert q.meta["alternative_situation"] == ("Alt 220602000002.",)
  assert q.meta["position"] == (-0.5, 0.4, 0.0) and q.meta["answer_type"] == "other"
  np.testing.assert_allclose(q.meta["rotation"], (0, 0, math.sin(math.radians(100)),
                                                  math.cos(math.radians(100))))
  with pytest.raises(MissingImageError, match=r"row 1 \(id '220602000000'\).*scene0000_00"):
    read_sqa3d(qpath, apath, scene_root=tmp_path / "nowhere")


def _sqa3d_case(tmp_path, target, edit):
  qpath, apath = sqa3d_files(tmp_path, SQA_ITEMS)
  path = qpath if target == "q" else apath
  record = json.loads(path.read_text())
  edit(record["questions" if target == "q" else "annotations"])
  path.write_text(json.dumps(record))
  return qpath, apath


@pytest.mark.parametrize("target,edit,file,pattern", [
    ("q", lambda r: r[1].pop("situation"), "questions",
     r"row 2 \(id '220602000001'\), field 'situation': missing"),
    ("q", lambda r: r[2].__setitem__("question", 7), "questions",
     r"row 3 \(id '220602000002'\), field 'question': expected str, got int"),
    ("q", lambda r: r[3].__setitem__("question_id", 220602000000), "questions",
     r"row 4 \(id '220602000000'\), field 'question_id': repeats row 1's id"),
    ("q", lambda r: r.append({"scene_id": "scene0000_00", "situation": "s", "question": "q?",
                              "question_id": 5}), "questions",
     r"row 5 \(id '5'\), field 'question_id': no annotation with this id"),
    ("q", lambda r: r[0].__setitem__("alternative_situation", "one"), "questions",
     r"row 1 .*field 'alternative_situation': expected a list of strings"),
    ("a", lambda r: r[1].__setitem__("scene_id", "scene0001_00"), "annotations",
     r"row 2 \(id '220602000001'\), field 'scene_id': expected 'scene0000_00' .* got "
     r"'scene0001_00'"),
    ("a", lambda r: r[0].__setitem__("answers", []), "annotations",
     r"row 1 \(id '220602000000'\), field 'answers': expected at least one answer"),
    ("a", lambda r: r[0]["answers"][0].pop("answer"), "annotations",
     r"row 1 .*field 'answers\[0\]\.answer': expected a non-empty string"),
    ("a", lambda r: r[2]["position"].pop("y"), "annotations",
     r"row 3 \(id '220602000002'\), field 'position\.y': missing"),
    ("a", lambda r: r[3]["rotation"].__setitem__("_w", "1"), "annotations",
     r"row 4 .*field 'rotation\._w': expected a finite number, got '1'"),
    ("a", lambda r: r[3].__setitem__("rotation", {"_x": 0, "_y": 0, "_z": 0, "_w": 0}),
     "annotations", r"row 4 .*field 'rotation': expected a non-zero quaternion"),
    ("a", lambda r: r.append({**r[0], "question_id": 9}), "annotations",
     r"row 5 \(id '9'\), field 'question_id': no question with this id"),
    ("a", lambda r: r[2].__setitem__("question_id", 220602000000), "annotations",
     r"row 3 \(id '220602000000'\), field 'question_id': repeats row 1's id"),
])
def test_read_sqa3d_errors(tmp_path, target, edit, file, pattern):
  qpath, apath = _sqa3d_case(tmp_path, target, edit)
  with pytest.raises(BenchmarkFormatError, match=pattern) as caught:
    read_sqa3d(qpath, apath)
  assert str(qpath if file == "questions" else apath) in str(caught.value)


def test_read_sqa3d_file_errors(tmp_path):
  qpath, apath = sqa3d_files(tmp_path, SQA_ITEMS)
  apath.write_text(json.dumps({"annotation": []}))
  with pytest.raises(BenchmarkFormatError, match=r"annotations.*field 'annotations': expected a "
                                                 r"JSON object with a 'annotations' list"):
    read_sqa3d(qpath, apath)
  qpath, apath = sqa3d_files(tmp_path, SQA_ITEMS)
  qpath.write_text("[1, 2")
  with pytest.raises(BenchmarkFormatError, match=r"questions.*field '<file>': not JSON"):
    read_sqa3d(qpath, apath)
  with pytest.raises(FileNotFoundError, match=r"benchmark file not found: .*absent\.json"):
    read_sqa3d(tmp_path / "absent.json", apath)


def test_sqa3d_scenes_pose_from_the_situation(tmp_path, room):
  root = room[0]
  qpath, apath = sqa3d_files(tmp_path, SQA_ITEMS)
  scenes = list(sqa3d_scenes(qpath, apath, root, width=64, height=48, max_views=2))
  scan = read_scan(root, "scene0000_00")
  raw = read_scan(root, "scene0000_00", align=False)
  centre = (raw.xyz.min(0) + raw.xyz.max(0)) / 2.0  # SQA3D's origin: the raw mesh's centre
  assert [len(s.questions) for s in scenes] == [3, 1]  # situations: 2, then 1
  assert [len(s.images) for s in scenes] == [2, 1]
  assert all(s.benchmark == "sqa3d" and s.scene_id == "scene0000_00" for s in scenes)
  questions = [q for s in scenes for q in s.questions]
  assert [q["initial_view"] for q in questions] == [0, 0, 1, 0]
  assert [q["views"] for q in questions] == [[0], [0], [1], [0]]
  assert questions[0]["question"] == "I am facing the table. What color is the table?"
  assert questions[2]["category"] == "how" and questions[2]["answers"] == ["one"]
  assert questions[3]["situation"] == "I stand by the lamp."
  poses = [scenes[0].world_from_camera[0], scenes[0].world_from_camera[1],
           scenes[1].world_from_camera[0]]
  for pose, (_, _, _, _, _, (x, y), yaw) in zip(poses, [SQA_ITEMS[0], SQA_ITEMS[2],
                                                        SQA_ITEMS[3]]):
    at = ALIGN @ np.array([centre[0] + x, centre[1] + y, centre[2], 1.0])
    np.testing.assert_allclose(pose[:2, 3], at[:2], atol=1e-4)
    assert pose[2, 3] == pytest.approx(scan.bounds[0, 2] + 1.5, abs=1e-5)
    # Facing: the -x arrow turned by yaw (the quaternion's angle about z), then aligned.
    facing = np.array([-math.cos(math.radians(yaw)), -math.sin(math.radians(yaw)), 0.0])
    np.testing.assert_allclose(pose[:3, 2], ALIGN[:3, :3] @ facing, atol=1e-5)
  for scene in scenes:
    assert all(image.shape == (48, 64, 3) for image in scene.images)
    assert scene.intrinsics.shape == (len(scene.images), 4)


def test_sqa3d_text_limits(tmp_path, room):
  items = [SQA_ITEMS[0], (7, "scene0000_00", "I stand." * 130, "What?", "red", (0, 0), 0.0)]
  qpath, apath = sqa3d_files(tmp_path, items)
  with pytest.raises(BenchmarkFormatError, match=r"questions.*row 2 \(id '7'\), field "
                                                 r"'question': 1046 bytes"):
    list(sqa3d_scenes(qpath, apath, room[0], width=64, height=48))
  items = [SQA_ITEMS[0], (7, "scene0000_00", "I stand.", "What?", "r" * 200, (0, 0), 0.0)]
  qpath, apath = sqa3d_files(tmp_path, items)
  with pytest.raises(BenchmarkFormatError, match=r"annotations.*row 2 \(id '7'\), field "
                                                 r"'answers\[0\]': 200 bytes"):
    list(sqa3d_scenes(qpath, apath, room[0], width=64, height=48))
