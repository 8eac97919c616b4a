"""3DThinker's reference variant on data in the published formats: rows of the public
training JSONL (data/example.jsonl), frames the test writes at their `image_input` paths,
VGGT feature files of the reference shape ([1, N, 1374, 2048]) for each idx, MindCube-Tiny
questions held out, and a random Qwen2.5-VL of the real architecture (tiny widths) saved as
a Hugging Face folder whose tokenizer lacks the latent tokens. Stage 1 and stage 2 each run
one step through `launch.train` with the reference settings, overridden only where a CPU
needs it (steps, batch, float32, no remat, the projector's depth and input width, the
completion length); the reader's and the launch's refusals name what is missing."""

import dataclasses
import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
from flax import nnx
from PIL import Image

import recipes
from configs import thinker3d_stage1, thinker3d_stage2
from data_pipelines import caches
from data_pipelines import thinker3d_data as data
from data_pipelines.readers import BenchmarkFormatError
from jaxspatial import models
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.models.qwen2_5_vl.tokenizer import save_processor, train_tokenizer
from jaxspatial.rollout import tiny
from recipes import thinker3d

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT.parent / "shared" / "data" / "benchmarks"
TRAIN_IDX = (84, 70, 72)        # three 2-frame rows with short targets
EVAL_ROWS = (2, 5, 11)          # three 2-frame MindCube-Tiny questions
EVALUATED = 2                   # data.eval_limit: the last one's frames are never written
CPU = {"model.dtype": "float32", "model.param_dtype": "float32", "model.cache_dtype": "float32",
       "model.remat": False, "projector.mlp_depth": 1, "rollout.max_new_tokens": 16,
       "eval.batch": 2, "checkpoint.every": 1, "log_every": 1, "data.eval_limit": EVALUATED}
STAGE = {1: {"sft.steps": 1, "sft.batch": 2},
         2: {"rl.steps": 1, "rl.prompts": 1, "rl.micro_batches": 1, "advantage.group_size": 2}}

pytestmark = pytest.mark.skipif(not (BENCHMARKS / "mindcube_train_example.jsonl").is_file(),
                                reason="needs shared/data/benchmarks (the public rows)")


def _rows(name) -> list[dict]:
  lines = (BENCHMARKS / name).read_text().splitlines()
  return [json.loads(line) for line in lines if line.strip()]


def _write_frame(path, seed, size=(480, 640)):
  path.parent.mkdir(parents=True, exist_ok=True)
  pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), np.uint8)
  Image.fromarray(pixels).save(path)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
  """The files a reference run reads: checkpoint, training JSONL, frames, features,
  MindCube-Tiny questions and their frames."""
  root = tmp_path_factory.mktemp("thinker3d_reference")
  rows = [r for r in _rows("mindcube_train_example.jsonl") if r["idx"] in TRAIN_IDX]
  train = root / "train.jsonl"
  train.write_text("".join(json.dumps(r) + "\n" for r in rows))
  images, features = root / "3DThinker", root / "3DThinker" / "data"
  for n, row in enumerate(rows):
    for k, image in enumerate(row["image_input"]):
      # One frame of another size: resized to 480 x 640 as the public feature script does.
      _write_frame(images / image, 10 * n + k, (640, 480) if n == k == 0 else (480, 640))
    feature = np.random.default_rng(row["idx"]).normal(
        size=(1, len(row["image_input"]), 1374, 2048)).astype(np.float16)
    caches.write_vggt_features(features, row["idx"], feature)
  questions = [_rows("mindcube_tiny_questions.jsonl")[i] for i in EVAL_ROWS]
  evaluation = root / "tiny.jsonl"
  evaluation.write_text("".join(json.dumps(q) + "\n" for q in questions))
  for n, question in enumerate(questions[:EVALUATED]):
    for k, image in enumerate(question["images"]):
      _write_frame(root / "MindCube" / image, 100 + 10 * n + k, (640, 480))
  # A Qwen2.5-VL of the real architecture at tiny widths, its tokenizer without the latent
  # tokens (as a released checkpoint): the recipe adds them and grows the embedding.
  corpus = ([r["text_input"] for r in rows] + [r["text_output"] for r in rows]
            + [q["question"] for q in questions] + [data.INSTRUCTION, data.SYSTEM])
  tok = train_tokenizer(corpus * 4, vocab_size=1024)
  config = tiny.model_config(tok)  # the embedding as large as the vocabulary, no spare rows
  config = dataclasses.replace(config, text=dataclasses.replace(config.text,
                                                                vocab_size=len(tok)))
  model = Qwen25VL(config, rngs=nnx.Rngs(0))
  checkpoint = root / "qwen2_5_vl_tiny"
  models.export(model, checkpoint)
  save_processor(checkpoint, tok)
  return {"root": root, "checkpoint": checkpoint, "jsonl": train, "image_root": images,
          "features": features, "eval_jsonl": evaluation, "eval_image_root": root / "MindCube",
          "rows": rows, "hidden": model.config.text.hidden_size}


def _flags(stage, published, workdir, extra=None) -> dict:
  values = {**CPU, **STAGE[stage], "workdir": workdir, "model.checkpoint": published["checkpoint"],
            "projector.mm_hidden_size": published["hidden"]}
  for name in ("jsonl", "image_root", "features", "eval_jsonl", "eval_image_root"):
    values[f"data.{name}"] = published[name]
  return {**values, **(extra or {})}


def _launch(config, values):
  args = [f"--config.{k}={v}" for k, v in values.items()]
  return subprocess.run([sys.executable, "-m", "launch.train", "--config", config, *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=900)


def _metrics(workdir) -> list[dict]:
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()
          if line.strip()]


@pytest.mark.recipe_checks  # one step through launch.train: 1.5-2.5 min, `make train-checks`
def test_stage1_then_stage2_train_on_the_published_formats(published, tmp_path):
  stage1 = tmp_path / "stage1"
  out = _launch("configs/thinker3d_stage1.py", _flags(1, published, stage1))
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  rows = _metrics(stage1)
  assert [r["step"] for r in rows] == [1]
  for name in ("sft/loss", "sft/cross_entropy", "sft/alignment"):
    assert np.isfinite(rows[0][name]) and rows[0][name] > 0, rows[0]
  assert (stage1 / "checkpoints" / "latest" / "1").is_dir()
  results = json.loads((stage1 / "results.json").read_text())
  # Held out: MindCube-Tiny (no targets, no features): greedy format, accuracy per setting.
  after = results["after"]
  assert {"format", "correct", "latent_block", "reward", "correct/among"} <= set(after)
  assert "alignment" not in after and "latent_sim" not in after
  assert 0 <= after["correct"] <= 1 and after["reward"] == pytest.approx(
      after["format"] + after["correct"])

  stage2 = tmp_path / "stage2"
  out = _launch("configs/thinker3d_stage2.py", _flags(2, published, stage2, {
      "init_from": stage1, "evaluate": False}))
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  rows = _metrics(stage2)
  assert [r["step"] for r in rows] == [1]
  assert np.isfinite(rows[0]["rl/loss"]) and rows[0]["rl/kl"] == pytest.approx(0, abs=1e-6)
  assert 0 <= rows[0]["rl/latent_sim"] <= 1  # against the rows' VGGT features
  assert (stage2 / "checkpoints" / "latest" / "1").is_dir()


def _config(stage, published, workdir, extra=None):
  c = (thinker3d_stage1 if stage == 1 else thinker3d_stage2).get_config()
  for key, value in _flags(stage, published, workdir, extra).items():
    node = c
    *path, last = key.split(".")
    for part in path:
      node = node[part]
    node[last] = str(value) if isinstance(value, pathlib.Path) else value
  return c


def test_the_launch_names_what_is_missing(published, tmp_path):
  with pytest.raises(ValueError) as error:
    recipes.train(thinker3d_stage1.get_config())
  for flag in ("--config.model.checkpoint=", "--config.data.jsonl=",
               "--config.data.image_root=", "--config.data.features=", "3DThinker-10K",
               "extract_vggt_feature.py"):
    assert flag in str(error.value)
  c = thinker3d_stage2.get_config()
  c.model.checkpoint, c.data.image_root = str(published["checkpoint"]), "/nowhere"
  with pytest.raises(ValueError, match="missing: --config.data.jsonl=.*--config.data.features"):
    recipes.train(c)
  c = _config(1, published, tmp_path / "a", {"model.checkpoint": tmp_path / "no_model",
                                             "data.features": tmp_path / "no_features"})
  with pytest.raises(FileNotFoundError) as error:
    recipes.train(c)
  assert str(error.value) == (f"thinker3d stage 1 (variant 'reference'): model.checkpoint "
                              f"{tmp_path / 'no_model'}: no such folder; data.features "
                              f"{tmp_path / 'no_features'}: no such folder")
  # A feature file missing for one idx: its idx and path.
  features = tmp_path / "features"
  shutil.copytree(published["features"], features)
  idx = published["rows"][1]["idx"]
  missing = caches.vggt_feature_path(features, idx)
  missing.unlink()
  c = _config(1, published, tmp_path / "b", {"data.features": features})
  with pytest.raises(data.MissingFeaturesError, match=f"for idx {idx} not found: {missing}"):
    recipes.train(c)
  # A missing frame: its path, row and field.
  images = tmp_path / "images"
  shutil.copytree(published["image_root"], images, ignore=shutil.ignore_patterns("*.npz"))
  frame = images / published["rows"][1]["image_input"][1]
  frame.unlink()
  c = _config(1, published, tmp_path / "c", {"data.image_root": images})
  with pytest.raises(data.MissingFrameError) as error:
    recipes.train(c)
  assert str(error.value) == (f"{published['jsonl']}: row 2 (idx {idx}), field "
                              f"'image_input[1]': image not found: {frame}")
  # Stage 2 without stage 1's checkpoint.
  c = _config(2, published, tmp_path / "d", {"init_from": tmp_path / "no_stage1"})
  with pytest.raises(FileNotFoundError, match="run configs/thinker3d_stage1.py first"):
    recipes.train(c)


def _write(path, records):
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  return path


def test_reader_errors_name_file_row_idx_and_field(published, tmp_path):
  good = published["rows"][0]
  root = published["image_root"]
  rows = data.read_training_rows(published["jsonl"], root)
  assert [r.idx for r in rows] == [r["idx"] for r in published["rows"]]
  assert rows[0].answer_choice == "ABCDE".index(good["answer"][0])
  assert rows[0].images == tuple(str(root / p) for p in good["image_input"])
  cases = [
      ({"text_output": "<think>x</think><answer>A</answer>"}, "text_output",
       "expected one <output_3D> placeholder at the start"),
      ({"answer": "the left one"}, "answer", "expected an option letter A-E"),
      ({"image_input": []}, "image_input", "expected a non-empty list of paths"),
      ({"image_input": ["/etc/passwd"]}, "image_input[0]", "absolute path"),
      ({"image_input": ["../x.jpg"]}, "image_input[0]", "without '..'"),
      ({"text_input": 3}, "text_input", "expected str, got int"),
      ({"idx": -1}, "idx", "expected an int >= 0"),
  ]
  for change, name, problem in cases:
    path = _write(tmp_path / "bad.jsonl", [good, {**good, "idx": 999, **change}])
    with pytest.raises(data.Thinker3DFormatError) as error:
      data.read_training_rows(path, root)
    assert isinstance(error.value, BenchmarkFormatError)
    idx = change.get("idx", 999)
    assert str(error.value).startswith(f"{path}: row 2 (idx {idx!r}), field {name!r}: "), (
        str(error.value))
    assert problem in str(error.value)
  no_answer = {**{k: v for k, v in good.items() if k != "answer"}, "idx": 999}
  path = _write(tmp_path / "bad.jsonl", [good, no_answer])
  with pytest.raises(data.Thinker3DFormatError, match=r"row 2 \(idx 999\), field 'answer': "
                     "missing"):
    data.read_training_rows(path, root)
  path = _write(tmp_path / "bad.jsonl", [good, good])
  with pytest.raises(data.Thinker3DFormatError, match="row 2 .* repeats the idx of row 1"):
    data.read_training_rows(path, root)
  # A feature file holding another number of frames than the row has images.
  features = tmp_path / "features"
  caches.write_vggt_features(features, good["idx"], np.zeros((3, 1374, 2048), np.float16))
  with pytest.raises(caches.CacheFormatError, match="holds 3 frames; row 1 .* has 2 images"):
    data.load_features(rows[0], features, 1374, 2048)
  # The feature_vggt folder itself is accepted as the cache root.
  assert data.feature_root(published["features"] / "feature_vggt") == published["features"]


def test_frames_prompts_and_batches_follow_the_public_code(published):
  rows = data.read_training_rows(published["jsonl"], published["image_root"])
  frames = data.load_frames(rows[0].images)   # its first frame was written 640 x 480
  assert frames.shape == (2, 640, 480, 3) and frames.dtype == np.uint8
  model = Qwen25VL.from_pretrained(published["checkpoint"])
  assert model.image_tokens((data.FRAME_HEIGHT, data.FRAME_WIDTH)) == 391
  assert data.prompt_text("Q?").startswith("Q?\nFirst imagine the mental 3D scene")
  assert data.answer_choice("D. Diagonally forward and right") == 3
  assert data.answer_choice("F. six") is None
  assert data.group_by_views(rows) == {2: [0, 1, 2]}
  # An epoch visits every example once; a group smaller than the batch repeats.
  batches = thinker3d.epoch_batches([5, 2], 2, seed=0, stream=3, epoch=0)
  assert len(batches) == thinker3d.batches_per_epoch([5, 2], 2) == 4
  seen = {0: [], 1: []}
  for group, index in batches:
    seen[group] += list(index)
  assert sorted(seen[1]) == [0, 1] and set(seen[0]) == set(range(5)) and len(seen[0]) == 6
  assert [list(i) for _, i in batches] == [list(i) for _, i in thinker3d.epoch_batches(
      [5, 2], 2, seed=0, stream=3, epoch=0)]


def test_the_batches_hold_the_public_layout(published, tmp_path):
  """The prompt is Qwen's chat template with no system turn (its default one), the frames
  (391 tokens each), then text_input + the instruction; the target is `<output_3D>`
  expanded to the 12-latent block, the rest of text_output and `<|im_end|>`, with CE on
  every target token but the pads; the latent tokens are added after the checkpoint's
  vocabulary and the embedding grows to hold them."""
  import jax  # pylint: disable=import-outside-toplevel
  from jaxspatial.train.trainer import mesh_from_config  # pylint: disable=import-outside-toplevel
  c = _config(1, published, tmp_path / "layout", {"data.eval_jsonl": ""})
  job = thinker3d.Thinker3D(c)
  mesh = mesh_from_config(c.mesh)
  with jax.set_mesh(mesh):
    job.build(mesh)
  assert not job.test                                     # no MindCube-Tiny: no evaluation
  import transformers  # pylint: disable=import-outside-toplevel
  original = len(transformers.AutoTokenizer.from_pretrained(published["checkpoint"]))
  assert job.latent_ids == (original + 1, original, original + 2)  # start, pad, end
  vocab = job.policy.model.config.text.vocab_size
  assert vocab == (original + 3 + 63) // 64 * 64  # grown by the 3 tokens, rounded up
  assert job.policy.model.language_model.embed_tokens.embedding[...].shape[0] == vocab
  split = job.train[0]
  decode = lambda ids: job.tokenizer.decode(ids.tolist(), skip_special_tokens=False)
  for b, row in enumerate(published["rows"]):
    prompt = decode(split.prompt_ids[b][split.prompt_mask[b]])
    frame = "<|vision_start|>" + "<|image_pad|>" * 391 + "<|vision_end|>"
    assert prompt == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                      f"<|im_start|>user\n{frame * 2}{row['text_input']}{data.INSTRUCTION}"
                      "<|im_end|>\n<|im_start|>assistant\n")
    length = split.prompt_ids.shape[1]
    target = split.tokens[b, length:][split.attention[b, length:]]
    assert decode(target) == ("<|latent_start|>" + "<|latent_pad|>" * 12 + "<|latent_end|>"
                              + row["text_output"][len("<output_3D>"):] + "<|im_end|>")
    loss = split.loss[b, length:][split.attention[b, length:]]
    np.testing.assert_array_equal(loss, target != job.latent_ids[1])
    assert split.answer_choice[b] == "ABCDE".index(row["answer"][0])
  features = split.features(np.arange(2))
  assert features.shape == (2, 2, 1374, 2048) and features.dtype == np.float32
  assert split.images(np.arange(2)).shape == (2, 2, 640, 480, 3)


def test_held_out_means_count_each_question_once_over_frame_counts():
  """Held-out batches run per frame count; a group smaller than the batch repeats rows,
  which count once; accuracy per setting. (The rollouts are stubbed: the bookkeeping.)"""
  import types  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import ml_collections  # pylint: disable=import-outside-toplevel

  def split(views, choices, settings):
    n = len(choices)
    return thinker3d.Split(views, ["q"] * n, np.asarray(choices, np.int32),
                           np.zeros((n, 4), np.int32), np.ones((n, 4), bool), None, None,
                           None, lambda i: np.zeros((len(i), views, 2, 2, 3), np.uint8), None,
                           [str(k) for k in range(n)], settings)

  def sample(split, index, key, temperature, primed=False):
    del key, temperature, primed
    correct = jnp.asarray(split.answer_choice[index] == 1, jnp.float32)
    return types.SimpleNamespace(reward_components={
        "format": jnp.ones_like(correct), "correct": correct,
        "latent_block": jnp.zeros_like(correct)})

  job = thinker3d.Thinker3D.__new__(thinker3d.Thinker3D)
  job.c = ml_collections.ConfigDict({"eval": {"batch": 2}})
  job.test = [split(2, [1, 0, 1], ["among", "among", "around"]), split(3, [1], ["rotation"])]
  job.sample = sample
  metrics = job.held_out()
  assert metrics == {"format": 1.0, "correct": 0.75, "latent_block": 0.0, "reward": 1.75,
                     "correct/among": 0.5, "correct/around": 1.0, "correct/rotation": 1.0}
