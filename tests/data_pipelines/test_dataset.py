"""The TFDS ArrayRecord builder and the grain loader into padded Task batches."""

import json
import pathlib

import jax
import numpy as np
import pytest

pytest.importorskip("tensorflow_datasets")
pytest.importorskip("grain")

from data_pipelines.builders import SyntheticSpatial  # noqa: E402
from data_pipelines.loader import decode_text, encode_text, scene_tasks, task_batches  # noqa: E402
from data_pipelines.synthetic import RIGS, SampleConfig, make_sample, scene_seed  # noqa: E402
from jaxspatial.envs import act3d, think3d  # noqa: E402
from jaxspatial.envs.act3d import Act3DParams  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  builder = SyntheticSpatial(data_dir=str(tmp_path_factory.mktemp("tfds")), config="tiny")
  builder.download_and_prepare()
  return builder


def test_builder_writes_array_record_and_decodes_without_tensorflow(tiny):
  import sys
  assert "tensorflow" not in sys.modules
  sources = tiny.as_data_source()
  assert {k: len(v) for k, v in sources.items()} == {"train": 40, "validation": 8, "test": 16}
  files = list((tiny.data_path).glob("*.array_record*"))
  assert files, "ArrayRecord shards on disk"
  # TFDS orders examples by a hash of their key: find scene 1 by its seed.
  (example,) = [sources["train"][i] for i in range(40)
                if sources["train"][i]["scene_seed"] == scene_seed("train", 1)]
  direct = make_sample("train", 1, RIGS[1], SampleConfig(num_points=32_768, width=96, height=72))
  np.testing.assert_array_equal(example["xyz"], np.asarray(direct.room.cloud.xyz))
  assert len(example["images"]) == len(direct.rgb)
  np.testing.assert_array_equal(example["images"][0], direct.rgb[0])  # PNG is lossless
  np.testing.assert_allclose(example["depth"], direct.depth)
  assert [q["question"] for q in json.loads(example["questions"])] == [
      q.question for q in direct.questions]
  seeds = {split: {int(sources[split][i]["scene_seed"]) for i in range(len(sources[split]))}
           for split in sources}
  assert not seeds["train"] & seeds["test"] and not seeds["train"] & seeds["validation"]
  # tfds.data_source reads the prepared folder by name, as users do.
  import tensorflow_datasets as tfds
  root = pathlib.Path(tiny.data_dir).parents[2]  # <root>/synthetic_spatial/tiny/1.0.0
  source = tfds.data_source("synthetic_spatial/tiny", data_dir=str(root), split="test")
  assert len(source) == 16


def test_grain_batches_of_tasks(tiny):
  source = tiny.as_data_source()["validation"]
  batches = list(task_batches(source, batch_size=4, seed=3, drop_remainder=False))
  total = sum(len(json.loads(source[i]["questions"])) for i in range(len(source)))
  assert sum(len(meta["family"]) for _, meta in batches) == total
  tasks, meta = batches[0]
  assert tasks.cloud.xyz.shape == (4, 32_768, 3) and tasks.input_cameras.fx.shape == (4, 8)
  assert tasks.question_ids.shape == (4, 384) and tasks.answer_objects.shape == (4, 4)
  assert "?" in decode_text(tasks.question_ids[0])
  again = list(task_batches(source, batch_size=4, seed=3, drop_remainder=False))
  jax.tree.map(np.testing.assert_array_equal, batches[0], again[0])
  other = next(iter(task_batches(source, batch_size=4, seed=4)))
  assert not np.array_equal(other[0].question_ids, tasks.question_ids)
  # The batch is ready for the environments: reset every episode under vmap.
  params = Act3DParams(width=32, height=24)
  obs, state = jax.vmap(lambda t: act3d.reset(jax.random.key(0), t, params))(tasks)
  assert obs.image.shape == (4, 24, 32, 3)


def test_tasks_carry_the_stored_views_when_asked(tiny):
  source = tiny.as_data_source()["validation"]
  plain, _ = next(iter(task_batches(source, batch_size=4, seed=3)))
  assert plain.input_images.shape == (4, 8, 0, 0, 3), "off by default (Act3D, PERIA)"
  tasks, meta = next(iter(task_batches(source, batch_size=4, seed=3, input_images=True)))
  assert tasks.input_images.shape == (4, 8, 72, 96, 3) and tasks.input_images.dtype == np.uint8
  by_seed = {int(source[i]["scene_seed"]): source[i] for i in range(len(source))}
  for b in range(4):
    stored = np.asarray(by_seed[int(meta["scene_seed"][b])]["images"])
    for k in range(8):  # camera order; past the scene's views the last one repeats
      np.testing.assert_array_equal(tasks.input_images[b, k], stored[min(k, len(stored) - 1)])
  # Think3D's first prompt shows them (at the dataset's image size).
  task = jax.tree.map(lambda x: x[0], tasks)
  stored = np.asarray(by_seed[int(meta["scene_seed"][0])]["images"])
  obs, _ = think3d.reset(jax.random.key(0), task, think3d.Think3DParams(width=96, height=72))
  np.testing.assert_array_equal(obs.input_images[: len(stored)], stored)
  assert (np.asarray(obs.input_images[len(stored):]) == 255).all()
  # Images of another size than the cameras' intrinsics were made for are refused.
  example = dict(by_seed[int(meta["scene_seed"][0])])
  example["images"] = stored[:, :, :90]
  with pytest.raises(ValueError, match=r"images are 90x72 but camera 0's intrinsics \(cx 47.5, "
                                       r"cy 35.5\) were made for a 96x72 image"):
    scene_tasks(example, input_images=True)
  example["images"] = np.concatenate([stored, stored[:1]])  # one image too many
  with pytest.raises(ValueError, match=rf"images: expected \[{len(stored)}, H, W, 3\] \(one per "
                                       rf"camera\), got \({len(stored) + 1}, 72, 96, 3\)"):
    scene_tasks(example, input_images=True)


def test_process_shards_are_disjoint_and_iterators_resume_exactly(tiny):
  source = tiny.as_data_source()["validation"]
  seeds = lambda shard: {int(s) for _, meta in task_batches(source, 1, seed=5, shard=shard)
                         for s in meta["scene_seed"]}
  parts = [seeds((i, 3)) for i in range(3)]
  assert not parts[0] & parts[1] and not parts[1] & parts[2] and not parts[0] & parts[2]
  assert set().union(*parts) == seeds((0, 1))
  with pytest.raises(ValueError, match="shard"):
    task_batches(source, 1, shard=(3, 3))
  iterator = iter(task_batches(source, batch_size=3, seed=2, num_epochs=None))
  next(iterator)
  state = iterator.get_state()
  expected = [next(iterator) for _ in range(3)]
  resumed = iter(task_batches(source, batch_size=3, seed=2, num_epochs=None))
  resumed.set_state(json.loads(json.dumps(state)))  # checkpoints store it as JSON
  for want in expected:
    jax.tree.map(np.testing.assert_array_equal, next(resumed), want)


def test_text_round_trip_and_overflow():
  ids = encode_text("Was ist links vom Würfel?", 40)
  assert decode_text(ids) == "Was ist links vom Würfel?" and (ids[-5:] == -1).all()
  with pytest.raises(ValueError, match="30 bytes, more than the padded length 8"):
    encode_text("x" * 30, 8)


def test_questions_carry_every_annotated_answer():
  """Act3D's R_EM matches any annotated answer (ScanQA lists several): a record's
  `answers` become the task's reference rows; too many or too long ones are refused."""
  from data_pipelines import loader
  question = {"question": "What is on the desk?", "answer_text": "a lamp",
              "answers": ["a lamp", "desk lamp", "white lamp on the left side of the desk"]}
  rows = loader.answer_rows(question, 7)
  assert rows.shape == (loader.MAX_ANSWERS, loader.MAX_ANSWER_BYTES)
  decoded = [loader.decode_text(r) for r in rows if r[0] >= 0]
  assert decoded == question["answers"]
  assert [loader.decode_text(r) for r in loader.answer_rows({"answer_text": "two"}, 7)
          if r[0] >= 0] == ["two"]
  with pytest.raises(ValueError, match="scene 7: .* 5 reference answers, more than"):
    loader.answer_rows({"question": "q", "answers": ["a"] * 5}, 7)
  with pytest.raises(ValueError, match="more than the padded length 128"):
    loader.answer_rows({"question": "q", "answers": ["x" * 129]}, 7)


def test_the_sample_sheet_shows_every_view_numbered_and_every_option_whole(tiny, tmp_path):
  from PIL import Image  # pylint: disable=import-outside-toplevel
  from data_pipelines.sample_sheet import sample_sheet  # pylint: disable=import-outside-toplevel
  from data_pipelines.readers import parse_options  # pylint: disable=import-outside-toplevel
  source = tiny.as_data_source()["train"]
  examples = [source[i] for i in range(3)]
  sheet, layouts = sample_sheet(examples)
  for example, layout in zip(examples, layouts):
    # Every stored view is on the sheet, pixel for pixel (upscaled by a whole factor).
    assert len(layout.views) == len(example["images"])
    for box, image in zip(layout.views, example["images"]):
      tile = np.asarray(sheet.crop(box))
      scale = tile.shape[1] // image.shape[1]
      np.testing.assert_array_equal(tile, np.repeat(np.repeat(image, scale, 0), scale, 1))
    # Each option starts a line of its own; a question's views exist on the sheet.
    for q in json.loads(example["questions"]):
      _, options = parse_options(q["question"])
      starts = [line.strip() for line in layout.lines]
      for letter, option in zip("ABCDEF", options):
        assert any(line.startswith(f"{letter}. {option}"[:40]) for line in starts), option
      for word, number in zip(q["question"].split(), q["question"].split()[1:]):
        if word == "view" and number.strip(",?").isdigit():
          assert int(number.strip(",?")) <= len(layout.views), q["question"]
  sheet.save(tmp_path / "samples.png")
  assert Image.open(tmp_path / "samples.png").size == sheet.size


def test_show_samples_draws_the_built_dataset_and_exits_zero(tiny, tmp_path):
  """absl passes main's return value to sys.exit: a main returning anything but None fails."""
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  root = pathlib.Path(__file__).resolve().parents[2]
  done = subprocess.run(
      [sys.executable, "-m", "launch.show_samples", "--data_dir",
       str(tiny.data_path.parents[2]), "--count", "2", "--out", str(tmp_path / "s.png")],
      cwd=root, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert (tmp_path / "s.png").stat().st_size > 0 and "2 scenes of" in done.stdout
