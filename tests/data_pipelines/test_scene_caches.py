"""A benchmark's image sets reconstructed into Think3D's caches: a MindCube file in its
published format, the Pi3 adapter over the tiny torch Pi3 of the reconstruction tests, the
caches read back against the numpy reference of Think3D's fusion, and an interrupted run
that resumes without redoing finished sets."""

import json

import numpy as np
import pytest
from PIL import Image

from data_pipelines.caches import read_think3d_cache
from data_pipelines.scene_caches import (build_scene_caches, cache_name, image_sets,
                                         read_manifest, reconstruct_benchmark)
from jaxspatial.perception.reconstruction import Pi3Reconstructor
from tests.perception.test_fusion import scene_poses
from tests.perception.test_reconstruction import TinyPi3, frames, reference_pi3


class Counted(Pi3Reconstructor):
  """Pi3 over the tiny model, counting calls; `fail_on` makes one call raise."""

  def __init__(self, fail_on=None):
    super().__init__(TinyPi3())
    self.calls, self.fail_on = 0, fail_on

  def reconstruct(self, images):
    self.calls += 1
    if self.calls == self.fail_on:
      raise KeyboardInterrupt  # as a user stopping the run
    return super().reconstruct(images)


@pytest.fixture()
def benchmark(tmp_path):
  """MindCube rows over four views of two scenes; two questions share a list, one lists
  the same views in the other order (another camera order: another set)."""
  root = tmp_path / "MindCube"
  (root / "other_all_image").mkdir(parents=True)
  views = {"a": frames()[0], "b": frames()[1], "c": frames()[1][:, ::-1],
           "d": frames()[0][::-1]}
  for name, image in views.items():
    Image.fromarray(np.ascontiguousarray(image)).save(root / "other_all_image" / f"{name}.png")
  lists = {"among_x_q0": "ab", "among_x_q1": "ab", "around_y_q0": "cd", "rotation_z_q0": "ba"}
  rows = [{"id": qid, "category": ["c"], "type": "two_view", "meta_info": [],
           "question": "Which is left? A. chair B. table", "gt_answer": "A",
           "images": [f"other_all_image/{v}.png" for v in chosen]}
          for qid, chosen in lists.items()]
  path = root / "questions.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  return path, root, views


def test_each_image_list_becomes_one_think3d_cache_and_a_rerun_resumes(benchmark, tmp_path):
  path, root, views = benchmark
  out = tmp_path / "cache"
  lines = []
  first = Counted(fail_on=2)
  with pytest.raises(KeyboardInterrupt):  # stopped during the second set
    reconstruct_benchmark("mindcube", path, out, reconstructor=first, log=lines.append)
  ab = ("other_all_image/a.png", "other_all_image/b.png")
  assert sorted(p.name for p in out.iterdir()) == sorted([cache_name(ab), "manifest.json"])
  assert [s["images"] for s in read_manifest(out)["sets"]] == [list(ab)]

  resumed = Counted()
  summary = reconstruct_benchmark("mindcube", path, out, reconstructor=resumed,
                                  log=lines.append)
  assert resumed.calls == 2 and summary["written"] == 2 and summary["skipped"] == 1
  assert "[1/3]" in lines[-3] and "cached, skipped" in lines[-3] and "points in" in lines[-1]
  manifest = read_manifest(out)
  assert [(s["images"], s["questions"]) for s in manifest["sets"]] == [
      (list(ab), ["among_x_q0", "among_x_q1"]),
      (["other_all_image/c.png", "other_all_image/d.png"], ["around_y_q0"]),
      (["other_all_image/b.png", "other_all_image/a.png"], ["rotation_z_q0"])]
  for entry in manifest["sets"]:
    cloud, poses, paths = read_think3d_cache(out / entry["cache"])
    assert paths == entry["images"]
    images = np.stack([views[p[-5]] for p in paths])
    _, _, (xyz, rgb, _) = reference_pi3(TinyPi3(), images)
    np.testing.assert_array_equal(np.asarray(cloud.xyz), xyz)
    np.testing.assert_array_equal(np.asarray(cloud.rgb), rgb)
    np.testing.assert_array_equal(poses, scene_poses().astype(np.float32))

  again = Counted()
  assert reconstruct_benchmark("mindcube", path, out, reconstructor=again,
                               log=lines.append)["skipped"] == 3
  assert again.calls == 0


def test_bad_sets_are_named_or_skipped(benchmark, tmp_path):
  from data_pipelines.readers import read_mindcube
  path, root, _ = benchmark
  sets = image_sets(read_mindcube(path, image_root=str(root)), str(root))
  Image.new("RGB", (10, 10)).save(root / "other_all_image" / "d.png")  # another size
  with pytest.raises(RuntimeError, match=r"set \('other_all_image/c\.png', "
                                         r"'other_all_image/d\.png'\).*one size, got "
                                         r".*c\.png: 38x25, .*d\.png: 10x10"):
    build_scene_caches(sets, Counted(), tmp_path / "a", root, log=lambda _: None)
  summary = build_scene_caches(sets, Counted(), tmp_path / "b", root, on_error="skip",
                               log=lambda _: None)
  assert (summary["written"], summary["failed"]) == (2, 1)
  assert read_manifest(tmp_path / "b")["failed"][0]["images"][1] == "other_all_image/d.png"
  with pytest.raises(ValueError, match=r"benchmark: expected one of \('mindcube', 'mindcube_tiny', 'blink_mv'\)"):
    reconstruct_benchmark("vsibench", path, tmp_path / "c", reconstructor=Counted())
