"""ScanNet v2 scans in their published per-scene layout, as ScanQA, ScanRefer and SQA3D read
them. Under `scene_root/<scene_id>/`:

    <scene_id>_vh_clean_2.ply                 the cleaned, decimated mesh: vertex x y z (float),
                                              red green blue (uchar), alpha (uchar), then faces
                                              (binary little-endian as published; ascii and
                                              big-endian are read too)
    <scene_id>_vh_clean_2.0.010000.segs.json  {"segIndices": [one segment id per vertex], ...}
    <scene_id>.aggregation.json               {"segGroups": [{"objectId" (or "id"), "label",
      (or <scene_id>_vh_clean.aggregation.json)  "segments": [segment ids]}, ...], ...}
    <scene_id>.txt                            "key = value" lines, among them
                                              `axisAlignment = 16 floats` (a row-major 4x4)

`read_scan` returns the mesh's vertices as a point cloud with per-vertex instance labels.
With `align` (the default, as ScanQA / ScanRefer do) the points are moved by the axis
alignment: p' = M [p; 1], so the room is axis-aligned, z up, the floor near z = 0.

Instances: every segGroup is one object; our instance index k is its position in the sorted
list of the objects' ids (`Scan.object_ids[k]` is ScanNet's objectId, what ScanQA's and
ScanRefer's `object_ids` name). A vertex whose segment no group claims is -1. A segment
claimed by two groups goes to the later group in the file (the public loaders' rule, which
overwrite in file order); an object left with no vertex that way is dropped from the lists.

Errors: a missing file is a MissingScanError naming its path; a file that breaks its format a
ScanFormatError naming the file, the field (or vertex / group) and what was expected and got.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import re

import numpy as np

from jaxspatial import errors

MESH_SUFFIX = "_vh_clean_2.ply"
SEGS_SUFFIX = "_vh_clean_2.0.010000.segs.json"
AGGREGATION_SUFFIXES = (".aggregation.json", "_vh_clean.aggregation.json")
META_SUFFIX = ".txt"
# |R^T R - I| of an axis alignment; the published matrices (6 decimals) are far closer.
ALIGNMENT_TOLERANCE = 1e-3

_PLY_TYPES = {
    "char": "i1", "int8": "i1", "uchar": "u1", "uint8": "u1",
    "short": "i2", "int16": "i2", "ushort": "u2", "uint16": "u2",
    "int": "i4", "int32": "i4", "uint": "u4", "uint32": "u4",
    "float": "f4", "float32": "f4", "double": "f8", "float64": "f8",
}
_PLY_FORMATS = {"ascii": None, "binary_little_endian": "<", "binary_big_endian": ">"}


class ScanFormatError(errors.InputError):
  """A scan file that breaks ScanNet's published format: `path`, the `field` (a JSON key,
  a PLY header line, `vertex 12`, `segGroups[3].segments`), and the problem (expected vs
  got)."""

  def __init__(self, path, field: str, problem: str):
    self.path, self.field, self.problem = str(path), field, problem
    super().__init__(f"{path}: {field}: {problem}")

  def __reduce__(self):
    return type(self), (self.path, self.field, self.problem)


class MissingScanError(errors.MissingInputError):
  """A file of a scan that is not on disk (`path`; `what` says which file it is)."""

  def __init__(self, path, what: str):
    self.path, self.what = str(path), what
    super().__init__(f"scan file not found: {path} ({what})")

  def __reduce__(self):
    return type(self), (self.path, self.what)


@dataclasses.dataclass(frozen=True, eq=False)
class Scan:
  """One ScanNet scan as a point cloud (the mesh's vertices).

  xyz [N, 3] float32 (aligned when read with `align`), rgb [N, 3] uint8, instance [N] int32
  (-1 unlabelled, else an index into the object lists); object_ids [O] int64 (ScanNet's
  objectId, ascending), object_names (the groups' labels), object_centres [O, 3] float32
  (the centre of each object's points' bounding box); bounds [2, 3] float32 (min, max of
  xyz); alignment [4, 4] float64 (the matrix applied, identity without `align`);
  raw_centre [3] float64 (the centre of the PLY vertices' bounding box before alignment:
  the origin of SQA3D's positions)."""

  scene_id: str
  xyz: np.ndarray
  rgb: np.ndarray
  instance: np.ndarray
  object_ids: np.ndarray
  object_names: tuple[str, ...]
  object_centres: np.ndarray
  bounds: np.ndarray
  alignment: np.ndarray
  raw_centre: np.ndarray

  @property
  def num_points(self) -> int:
    return len(self.xyz)

  def instance_of(self, object_id: int) -> int | None:
    """Our instance index of ScanNet's objectId, None when the scan has no such object."""
    k = int(np.searchsorted(self.object_ids, object_id))
    return k if k < len(self.object_ids) and self.object_ids[k] == object_id else None


def scan_files(scene_root, scene_id: str) -> dict[str, pathlib.Path]:
  """The paths `read_scan` reads (the aggregation: the first of its two names on disk, else
  the first name)."""
  folder = pathlib.Path(scene_root) / scene_id
  aggregation = [folder / f"{scene_id}{suffix}" for suffix in AGGREGATION_SUFFIXES]
  return {"mesh": folder / f"{scene_id}{MESH_SUFFIX}",
          "segs": folder / f"{scene_id}{SEGS_SUFFIX}",
          "aggregation": next((p for p in aggregation if p.is_file()), aggregation[0]),
          "meta": folder / f"{scene_id}{META_SUFFIX}"}


def read_scan(scene_root, scene_id: str, *, align: bool = True) -> Scan:
  """Reads `scene_root/<scene_id>/`'s mesh, segments, aggregation and (with `align`) axis
  alignment into a `Scan`."""
  if not isinstance(scene_id, str) or not scene_id or "/" in scene_id or "\\" in scene_id \
      or scene_id in (".", ".."):
    raise ValueError(f"read_scan: expected a scene id such as 'scene0011_00', got "
                     f"{scene_id!r:.80}")
  files = scan_files(scene_root, scene_id)
  folder = files["mesh"].parent
  if not folder.is_dir():
    raise MissingScanError(folder, f"the scan folder of {scene_id}")
  for name in ("mesh", "segs"):
    if not files[name].is_file():
      raise MissingScanError(files[name], f"{scene_id}'s {_WHAT[name]}")
  if not files["aggregation"].is_file():
    other = files["aggregation"].parent / f"{scene_id}{AGGREGATION_SUFFIXES[1]}"
    raise MissingScanError(f"{files['aggregation']} (or {other})",
                           f"{scene_id}'s {_WHAT['aggregation']}")
  if align and not files["meta"].is_file():
    raise MissingScanError(files["meta"], f"{scene_id}'s {_WHAT['meta']}, read for its "
                           "axisAlignment (pass align=False to keep the raw frame)")

  raw, rgb = read_ply_vertices(files["mesh"])
  segments = read_segments(files["segs"], len(raw), files["mesh"])
  groups = read_aggregation(files["aggregation"])
  alignment = read_axis_alignment(files["meta"]) if align else np.eye(4)

  raw_centre = (raw.min(0) + raw.max(0)) / 2.0
  xyz = (raw @ alignment[:3, :3].T + alignment[:3, 3]).astype(np.float32)
  instance, object_ids, names = _instances(segments, groups, files["aggregation"],
                                           files["segs"])
  centres = _centres(xyz, instance, len(object_ids))
  bounds = np.stack([xyz.min(0), xyz.max(0)]).astype(np.float32)
  return Scan(scene_id=scene_id, xyz=xyz, rgb=rgb, instance=instance, object_ids=object_ids,
              object_names=names, object_centres=centres, bounds=bounds,
              alignment=alignment, raw_centre=raw_centre)


_WHAT = {"mesh": "mesh (vertices and colours)", "segs": "over-segmentation (segIndices)",
         "aggregation": "instance aggregation (segGroups)", "meta": "metadata file"}


# --- PLY ---------------------------------------------------------------------------------


def _parse_ply_header(path, data: bytes):
  """(format, elements [(name, count, [(property, dtype | ('list', count, item))])],
  offset of the body)."""
  if not data.startswith(b"ply"):
    raise ScanFormatError(path, "<header>", f"expected a PLY file starting with 'ply', got "
                          f"{data[:16]!r}")
  end = re.search(rb"(?:^|\n)end_header[ \t]*\r?\n", data[:1 << 20])
  if end is None:
    raise ScanFormatError(path, "<header>", "expected an 'end_header' line in the first MiB")
  try:
    lines = data[:end.start()].decode("ascii").splitlines()
  except UnicodeDecodeError:
    raise ScanFormatError(path, "<header>", "expected ASCII header lines") from None
  fmt, elements = None, []
  for number, line in enumerate(lines[1:], 2):
    words = line.split()
    if not words or words[0] in ("comment", "obj_info"):
      continue
    where = f"header line {number}"
    if words[0] == "format":
      if len(words) != 3 or words[1] not in _PLY_FORMATS:
        raise ScanFormatError(path, where, f"expected 'format <{' | '.join(_PLY_FORMATS)}> "
                              f"1.0', got {line!r:.80}")
      fmt = words[1]
    elif words[0] == "element":
      if len(words) != 3 or not words[2].isdigit():
        raise ScanFormatError(path, where, f"expected 'element <name> <count>', got "
                              f"{line!r:.80}")
      elements.append((words[1], int(words[2]), []))
    elif words[0] == "property":
      if not elements:
        raise ScanFormatError(path, where, f"expected an element before {line!r:.80}")
      if len(words) == 5 and words[1] == "list" and words[2] in _PLY_TYPES \
          and words[3] in _PLY_TYPES:
        elements[-1][2].append((words[4], ("list", _PLY_TYPES[words[2]],
                                           _PLY_TYPES[words[3]])))
      elif len(words) == 3 and words[1] in _PLY_TYPES:
        elements[-1][2].append((words[2], _PLY_TYPES[words[1]]))
      else:
        raise ScanFormatError(path, where, f"expected 'property <type> <name>' or 'property "
                              f"list <type> <type> <name>' with types among "
                              f"{sorted(_PLY_TYPES)}, got {line!r:.80}")
    else:
      raise ScanFormatError(path, where, f"expected format, element, property or comment, "
                            f"got {line!r:.80}")
  if fmt is None:
    raise ScanFormatError(path, "<header>", "expected a 'format' line")
  return fmt, elements, end.end()


def read_ply_vertices(path) -> tuple[np.ndarray, np.ndarray]:
  """A PLY file's vertex positions (float64 [N, 3]) and colours (uint8 [N, 3]); the other
  elements (faces) are not read. Needs x, y, z and uchar red, green, blue vertex
  properties."""
  path = pathlib.Path(path)
  try:
    data = path.read_bytes()
  except FileNotFoundError:
    raise MissingScanError(path, "a PLY mesh") from None
  fmt, elements, body = _parse_ply_header(path, data)
  names = [e[0] for e in elements]
  if "vertex" not in names:
    raise ScanFormatError(path, "<header>", f"expected an 'element vertex', got elements "
                          f"{names}")
  position = names.index("vertex")
  _, count, properties = elements[position]
  props = dict(properties)
  for name in ("x", "y", "z", "red", "green", "blue"):
    if name not in props:
      raise ScanFormatError(path, "element vertex", f"expected a property {name!r}, got "
                            f"{[p for p, _ in properties]}")
  for name, kind in properties:
    if isinstance(kind, tuple):
      raise ScanFormatError(path, f"vertex property {name!r}", "expected scalar vertex "
                            "properties, got a list")
  for name in ("red", "green", "blue"):
    if props[name] != "u1":
      raise ScanFormatError(path, f"vertex property {name!r}", f"expected uchar colours, got "
                            f"{_type_name(props[name])}")
  if count == 0:
    raise ScanFormatError(path, "element vertex", "expected at least one vertex, got 0")
  if fmt == "ascii":
    table = _ascii_vertices(path, data[body:], elements[:position], count, len(properties))
    column = {name: table[:, i] for i, (name, _) in enumerate(properties)}
    colours = np.stack([column[c] for c in ("red", "green", "blue")], -1)
    bad = ~((colours >= 0) & (colours <= 255) & (colours == np.round(colours)))
    if bad.any():
      row = int(np.argmax(bad.any(1)))
      raise ScanFormatError(path, f"vertex {row}", f"expected colours as integers 0..255, "
                            f"got {colours[row].tolist()}")
    xyz = np.stack([column[c] for c in ("x", "y", "z")], -1).astype(np.float64)
    rgb = colours.astype(np.uint8)
  else:
    order = _PLY_FORMATS[fmt]
    offset = body
    for name, n, element_props in elements[:position]:
      if any(isinstance(k, tuple) for _, k in element_props):
        raise ScanFormatError(path, f"element {name}", "expected the vertex element before "
                              "any element with list properties (faces)")
      offset += n * np.dtype([(p, order + k) for p, k in element_props]).itemsize
    dtype = np.dtype([(p, order + k) for p, k in properties])
    need = offset + count * dtype.itemsize
    if len(data) < need:
      raise ScanFormatError(path, "element vertex", f"expected {count} vertices of "
                            f"{dtype.itemsize} bytes ({need} bytes with the header), got a "
                            f"file of {len(data)} bytes (truncated)")
    table = np.frombuffer(data, dtype, count=count, offset=offset)
    xyz = np.stack([table[c].astype(np.float64) for c in ("x", "y", "z")], -1)
    rgb = np.stack([table[c] for c in ("red", "green", "blue")], -1).astype(np.uint8)
  finite = np.isfinite(xyz).all(1)
  if not finite.all():
    row = int(np.argmax(~finite))
    raise ScanFormatError(path, f"vertex {row}", f"expected finite x, y, z, got "
                          f"{xyz[row].tolist()}")
  return xyz, rgb


def _type_name(kind: str) -> str:
  return {"u1": "uchar", "i1": "char", "u2": "ushort", "i2": "short", "u4": "uint",
          "i4": "int", "f4": "float", "f8": "double"}.get(kind, kind)


def _ascii_vertices(path, body: bytes, before, count: int, width: int) -> np.ndarray:
  try:
    lines = body.decode("ascii").splitlines()
  except UnicodeDecodeError:
    raise ScanFormatError(path, "<body>", "expected ASCII numbers in an ascii PLY") from None
  lines = [line for line in lines if line.strip()]
  skip = sum(n for _, n, _ in before)
  rows = lines[skip: skip + count]
  if len(rows) < count:
    raise ScanFormatError(path, "element vertex", f"expected {count} vertex lines, got "
                          f"{len(rows)} (truncated)")
  table = np.empty((count, width), np.float64)
  for i, line in enumerate(rows):
    words = line.split()
    if len(words) != width:
      raise ScanFormatError(path, f"vertex {i}", f"expected {width} values, got "
                            f"{len(words)}: {line!r:.80}")
    try:
      table[i] = [float(w) for w in words]
    except ValueError:
      raise ScanFormatError(path, f"vertex {i}", f"expected numbers, got {line!r:.80}") \
          from None
  return table


# --- segments, aggregation, alignment -----------------------------------------------------


def _load_json(path) -> object:
  try:
    text = pathlib.Path(path).read_text()
  except FileNotFoundError:
    raise MissingScanError(path, "a scan JSON file") from None
  except UnicodeDecodeError:
    raise ScanFormatError(path, "<file>", "expected UTF-8 JSON text") from None
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise ScanFormatError(path, "<file>", f"not JSON ({e.msg} at line {e.lineno})") from None


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _int_list(path, field: str, value) -> np.ndarray:
  if not isinstance(value, list):
    raise ScanFormatError(path, field, f"expected a list of integers, got "
                          f"{type(value).__name__}")
  for i, item in enumerate(value):
    if not _is_int(item):
      raise ScanFormatError(path, f"{field}[{i}]", f"expected an integer, got {item!r:.40}")
  return np.asarray(value, np.int64).reshape(-1)


def read_segments(path, num_vertices: int | None = None, mesh_path=None) -> np.ndarray:
  """segs.json's segIndices (int64 [N]); with `num_vertices`, one per mesh vertex."""
  record = _load_json(path)
  if not isinstance(record, dict):
    raise ScanFormatError(path, "<file>", f"expected a JSON object with 'segIndices', got "
                          f"{type(record).__name__}")
  if "segIndices" not in record:
    raise ScanFormatError(path, "segIndices", f"missing (keys: {sorted(record)[:8]})")
  segments = _int_list(path, "segIndices", record["segIndices"])
  if num_vertices is not None and len(segments) != num_vertices:
    mesh = f" ({mesh_path})" if mesh_path is not None else ""
    raise ScanFormatError(path, "segIndices", f"expected {num_vertices} segment ids (one per "
                          f"vertex of the mesh{mesh}), got {len(segments)}")
  return segments


def read_aggregation(path) -> list[tuple[int, str, np.ndarray]]:
  """aggregation.json's segGroups as (objectId, label, segment ids), in file order."""
  record = _load_json(path)
  if not isinstance(record, dict):
    raise ScanFormatError(path, "<file>", f"expected a JSON object with 'segGroups', got "
                          f"{type(record).__name__}")
  if "segGroups" not in record:
    raise ScanFormatError(path, "segGroups", f"missing (keys: {sorted(record)[:8]})")
  groups = record["segGroups"]
  if not isinstance(groups, list):
    raise ScanFormatError(path, "segGroups", f"expected a list, got {type(groups).__name__}")
  out, seen = [], {}
  for i, group in enumerate(groups):
    where = f"segGroups[{i}]"
    if not isinstance(group, dict):
      raise ScanFormatError(path, where, f"expected an object, got {type(group).__name__}")
    key = "objectId" if "objectId" in group else "id"
    if key not in group:
      raise ScanFormatError(path, f"{where}.objectId", "missing (and no 'id' either)")
    object_id = group[key]
    if not _is_int(object_id) or object_id < 0:
      raise ScanFormatError(path, f"{where}.{key}", f"expected an integer >= 0, got "
                            f"{object_id!r:.40}")
    if object_id in seen:
      raise ScanFormatError(path, f"{where}.{key}", f"objectId {object_id} repeats "
                            f"segGroups[{seen[object_id]}]'s")
    seen[object_id] = i
    label = group.get("label")
    if not isinstance(label, str):
      raise ScanFormatError(path, f"{where}.label", f"expected a string, got "
                            f"{type(label).__name__ if 'label' in group else 'nothing'}")
    if "segments" not in group:
      raise ScanFormatError(path, f"{where}.segments", "missing")
    out.append((object_id, label, _int_list(path, f"{where}.segments", group["segments"])))
  return out


def read_axis_alignment(path) -> np.ndarray:
  """The `axisAlignment = 16 floats` line of a scan's .txt as a 4x4 (float64)."""
  path = pathlib.Path(path)
  try:
    text = path.read_text()
  except FileNotFoundError:
    raise MissingScanError(path, "a scan metadata file") from None
  except UnicodeDecodeError:
    raise ScanFormatError(path, "<file>", "expected text lines 'key = value'") from None
  for number, line in enumerate(text.splitlines(), 1):
    key, _, value = line.partition("=")
    if key.strip() != "axisAlignment":
      continue
    where = f"axisAlignment (line {number})"
    words = value.split()
    if len(words) != 16:
      raise ScanFormatError(path, where, f"expected 16 numbers (a row-major 4x4), got "
                            f"{len(words)}")
    try:
      numbers = [float(w) for w in words]
    except ValueError:
      raise ScanFormatError(path, where, f"expected numbers, got {value.strip()!r:.80}") \
          from None
    matrix = np.asarray(numbers, np.float64).reshape(4, 4)
    if not np.isfinite(matrix).all():
      raise ScanFormatError(path, where, "expected finite numbers")
    if np.abs(matrix[3] - [0, 0, 0, 1]).max() > 1e-6:
      raise ScanFormatError(path, where, f"expected the last row 0 0 0 1, got "
                            f"{matrix[3].tolist()}")
    rotation = matrix[:3, :3]
    error = float(np.abs(rotation.T @ rotation - np.eye(3)).max())
    if error > ALIGNMENT_TOLERANCE or np.linalg.det(rotation) <= 0:
      raise ScanFormatError(path, where, f"expected a rigid transform (a rotation, |R^T R - I| "
                            f"<= {ALIGNMENT_TOLERANCE}), got |R^T R - I| = {error:.3g}, "
                            f"det R = {np.linalg.det(rotation):.3g}")
    return matrix
  raise ScanFormatError(path, "axisAlignment", "missing: expected a line 'axisAlignment = "
                        "<16 numbers>' (pass align=False to keep the raw frame)")


def _instances(segments: np.ndarray, groups, aggregation_path, segs_path):
  """Per-vertex instance indices (sorted objectIds), the ids and the labels."""
  uniq, inverse = np.unique(segments, return_inverse=True)
  order = sorted(range(len(groups)), key=lambda i: groups[i][0])
  index_of_group = np.empty(len(groups), np.int64)
  index_of_group[order] = np.arange(len(groups))
  owner = np.full(len(uniq), -1, np.int64)  # segment -> instance index; later groups win
  for g, (object_id, _, segs) in enumerate(groups):
    at = np.searchsorted(uniq, segs)
    known = (at < len(uniq)) & (uniq[np.minimum(at, len(uniq) - 1)] == segs)
    if not known.all():
      bad = int(segs[np.argmax(~known)])
      raise ScanFormatError(aggregation_path, f"segGroups[{g}].segments", f"objectId "
                            f"{object_id}: segment id {bad} is not among {segs_path}'s "
                            f"segIndices ({len(uniq)} segments)")
    owner[at] = index_of_group[g]
  instance = owner[inverse]
  ids = np.asarray([groups[i][0] for i in order], np.int64)
  names = [groups[i][1] for i in order]
  present = np.zeros(len(groups), bool)
  present[instance[instance >= 0]] = True
  if not present.all():  # objects whose every segment a later group took
    remap = np.full(len(groups), -1, np.int64)
    remap[present] = np.arange(int(present.sum()))
    instance = np.where(instance >= 0, remap[np.maximum(instance, 0)], -1)
    ids = ids[present]
    names = [n for n, keep in zip(names, present) if keep]
  return instance.astype(np.int32), ids, tuple(names)


def _centres(xyz: np.ndarray, instance: np.ndarray, objects: int) -> np.ndarray:
  """The bounding-box centre of each instance's points ([O, 3] float32)."""
  if objects == 0:
    return np.zeros((0, 3), np.float32)
  labelled = np.flatnonzero(instance >= 0)
  order = labelled[np.argsort(instance[labelled], kind="stable")]
  starts = np.searchsorted(instance[order], np.arange(objects))
  points = xyz[order].astype(np.float64)
  low = np.minimum.reduceat(points, starts, axis=0)
  high = np.maximum.reduceat(points, starts, axis=0)
  return ((low + high) / 2.0).astype(np.float32)


def quaternion_matrix(x: float, y: float, z: float, w: float) -> np.ndarray:
  """The rotation matrix of a quaternion (x, y, z, w), normalised first."""
  q = np.asarray([x, y, z, w], np.float64)
  norm = float(np.linalg.norm(q))
  if not math.isfinite(norm) or norm < 1e-9:
    raise ValueError(f"quaternion_matrix: expected a non-zero finite quaternion, got "
                     f"{q.tolist()}")
  x, y, z, w = q / norm
  return np.asarray([
      [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
      [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
      [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])
