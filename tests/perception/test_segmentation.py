"""SAM 3 through transformers as PERIA's segmentation tools: a tiny random Sam3Model saved with
a CLIP tokenizer written here, loaded back by SAM3Backend.from_pretrained; thresholds, the
0-1000 grid, masks, the padded form, error texts and roi_align against numpy references."""

import json
import math
import os
import re
import select
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxspatial.perception import segmentation as seg  # pylint: disable=wrong-import-position

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE_SIZE = 112
QUERIES = 30  # more than the 20 proposals kept


def _tiny_sam3_config():
  from transformers.models.sam3 import configuration_sam3 as c
  backbone = c.Sam3ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=64, image_size=IMAGE_SIZE, patch_size=14,
                             window_size=4, global_attn_indexes=[1],
                             pretrain_image_size=IMAGE_SIZE)
  vision = c.Sam3VisionConfig(backbone_config=backbone, fpn_hidden_size=32,
                              scale_factors=[2.0, 1.0])
  text = dict(vocab_size=64, hidden_size=32, intermediate_size=64, projection_dim=32,
              num_hidden_layers=1, num_attention_heads=4, max_position_embeddings=32,
              hidden_act="gelu", bos_token_id=58, eos_token_id=59, pad_token_id=59)
  small = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64)
  return c.Sam3Config(
      vision_config=vision, text_config=text,
      geometry_encoder_config=c.Sam3GeometryEncoderConfig(num_layers=1, **small),
      detr_encoder_config=c.Sam3DETREncoderConfig(num_layers=1, **small),
      detr_decoder_config=c.Sam3DETRDecoderConfig(num_layers=1, num_queries=QUERIES, **small),
      mask_decoder_config=c.Sam3MaskDecoderConfig(hidden_size=32, num_upsampling_stages=2))


def _clip_tokenizer(folder):
  """A CLIP BPE tokenizer over a-z (with end-of-word forms) and a few merges."""
  from transformers import CLIPTokenizer
  letters = "abcdefghijklmnopqrstuvwxyz"
  vocab = {c: i for i, c in enumerate(letters)}
  vocab.update({c + "</w>": len(letters) + i for i, c in enumerate(letters)})
  merges = ["o b", "ob j", "obj e", "obje c", "objec t", "object s</w>"]
  for merge in merges:
    vocab.setdefault(merge.replace(" ", ""), len(vocab))
  vocab["<|startoftext|>"], vocab["<|endoftext|>"] = 58, 59
  assert len(vocab) == 60
  with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as f:
    json.dump(vocab, f)
  with open(os.path.join(folder, "merges.txt"), "w", encoding="utf-8") as f:
    f.write("#version: 0.2\n" + "\n".join(merges) + "\n")
  return CLIPTokenizer(os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt"))


@pytest.fixture(scope="module")
def sam3_folder(tmp_path_factory):
  return make_sam3_folder(tmp_path_factory)


def make_sam3_folder(tmp_path_factory):
  """A tiny random SAM 3 saved as a Hugging Face folder (also used by the rollout tests)."""
  from transformers import Sam3Model
  torch.manual_seed(0)
  model = Sam3Model(_tiny_sam3_config()).eval()
  # Initialised weights give every query the same score and empty masks; noise spreads
  # scores around the 0.25 threshold and gives masks of varied sizes.
  generator = torch.Generator().manual_seed(1)
  with torch.no_grad():
    for param in model.parameters():
      if param.ndim >= 2:
        param.add_(torch.randn(param.shape, generator=generator) * 0.15)
  folder = tmp_path_factory.mktemp("sam3")
  vocab = tmp_path_factory.mktemp("sam3_vocab")
  model.save_pretrained(folder)
  _clip_tokenizer(vocab).save_pretrained(folder)
  # Sam3ImageProcessor needs torchvision; its saved settings are plain JSON (the Hub's form).
  with open(folder / "preprocessor_config.json", "w", encoding="utf-8") as f:
    json.dump({"image_processor_type": "Sam3ImageProcessor", "size": {"height": IMAGE_SIZE,
               "width": IMAGE_SIZE}, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
               "rescale_factor": 1 / 255, "do_resize": True, "do_rescale": True,
               "do_normalize": True, "resample": 2}, f)
  return folder


@pytest.fixture(scope="module")
def backend(sam3_folder):
  return seg.SAM3Backend.from_pretrained(sam3_folder)


@pytest.fixture(scope="module")
def image():
  return np.random.default_rng(0).integers(0, 256, (60, 80, 3), np.uint8)


def _result(text):
  prefix = "Tool executed successfully.\nResult: "
  assert text.startswith(prefix), text
  return json.loads(text[len(prefix):])


def _reference_scores(backend, image, text, box=None):
  """sigmoid(logit) * sigmoid(presence) from the model called directly."""
  tokens = backend.tokenizer([text], padding="max_length", max_length=32, truncation=True,
                             return_tensors="pt")
  kwargs = {}
  if box is not None:
    kwargs = {"input_boxes": torch.tensor([[seg.unit_cxcywh_from_grid(box)]]),
              "input_boxes_labels": torch.ones(1, 1, dtype=torch.long)}
  with torch.no_grad():
    out = backend.model(pixel_values=backend.pixel_values(image[None]), **tokens, **kwargs)
  logits = out.pred_logits.numpy().astype(np.float64)[0]
  presence = out.presence_logits.numpy().astype(np.float64)[0, 0]
  scores = 1 / (1 + np.exp(-logits)) / (1 + np.exp(-presence))
  return scores, out.pred_boxes.numpy()[0], out.pred_masks.numpy()[0]


def _grid(unit):
  return np.clip(np.round(np.asarray(unit, np.float64) * 1000), 0, 1000).astype(int)


def test_config_holds_perias_constants_and_refuses_bad_values():
  config = seg.SegmentationConfig()
  assert (config.score_threshold, config.presence_threshold, config.max_proposals) == (
      0.25, 0.1, 20)
  assert config.auto_prompt == "objects" and config.box_prompt_text == "visual"
  with pytest.raises(ValueError, match=r"score_threshold: expected a number in \[0, 1\]"):
    seg.SegmentationConfig(score_threshold=1.5)
  with pytest.raises(ValueError, match="max_proposals: expected an int >= 1"):
    seg.SegmentationConfig(max_proposals=0)
  with pytest.raises(ValueError, match=r"mask_size: expected \(h, w\)"):
    seg.SegmentationConfig(mask_size=(0, 4))


def test_from_pretrained_names_the_folder_and_what_is_missing(sam3_folder, tmp_path):
  with pytest.raises(FileNotFoundError, match="is not a folder"):
    seg.SAM3Backend.from_pretrained(tmp_path / "nowhere")
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(FileNotFoundError) as e:
    seg.SAM3Backend.from_pretrained(empty)
  message = str(e.value)
  assert str(empty) in message and "config (config.json)" in message
  assert "weights (model.safetensors or" in message and "tokenizer (tokenizer.json" in message
  partial = tmp_path / "partial"
  shutil.copytree(sam3_folder, partial)
  os.remove(partial / "preprocessor_config.json")
  with pytest.raises(FileNotFoundError, match="no image processor settings"):
    seg.SAM3Backend.from_pretrained(partial)
  with open(partial / "processor_config.json", "w", encoding="utf-8") as f:
    json.dump({"image_processor": {"size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
                                   "resample": 3}}, f)
  with pytest.raises(ValueError, match="only 2 \\(bilinear"):
    seg.SAM3Backend.from_pretrained(partial)
  config = json.loads((partial / "config.json").read_text())
  (partial / "config.json").write_text(json.dumps({**config, "model_type": "sam2"}))
  with pytest.raises(ValueError,
                     match="model_type 'sam2', expected one of \\['sam3', 'sam3_video'\\]"):
    seg.SAM3Backend.from_pretrained(partial)
  with pytest.raises(ValueError, match="dtype must be one of"):
    seg.SAM3Backend.from_pretrained(sam3_folder, dtype="int8")


def test_pixel_values_rescale_and_normalise_as_the_processor(backend):
  rng = np.random.default_rng(1)
  same = rng.integers(0, 256, (2, IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8)
  expected = (same.astype(np.float32) / 255 - 0.5) / 0.5
  np.testing.assert_allclose(backend.pixel_values(same).numpy(),
                             expected.transpose(0, 3, 1, 2), atol=1e-6)
  # A resize keeps a constant image constant.
  flat = np.full((1, 30, 50, 3), 51, np.uint8)
  values = backend.pixel_values(flat).numpy()
  assert values.shape == (1, 3, IMAGE_SIZE, IMAGE_SIZE)
  np.testing.assert_allclose(values, (51 / 255 - 0.5) / 0.5, atol=1e-6)


def test_auto_segment_applies_the_threshold_the_cap_and_the_grid(backend, image):
  scores, boxes, _ = _reference_scores(backend, image, "objects")
  raw = backend.forward(image[None], ["objects"])
  np.testing.assert_allclose(raw["scores"][0], scores, rtol=1e-5)
  above = int((scores > 0.25).sum())
  assert 0 < above < QUERIES  # the noise puts the threshold inside the scores
  result = _result(backend.auto_segment(image))
  assert result["image_size"] == [60, 80]
  order = np.argsort(-scores)[:min(above, 20)]
  assert [p["score"] for p in result["proposals"]] == [round(s, 2) for s in scores[order]]
  assert [p["bbox_xyxy"] for p in result["proposals"]] == _grid(boxes[order]).tolist()
  # A threshold between the 5th and 6th best scores keeps exactly 5.
  ranked = np.sort(scores)[::-1]
  five = backend.with_config(seg.SegmentationConfig(score_threshold=float(
      (ranked[4] + ranked[5]) / 2)))
  assert len(_result(five.auto_segment(image))["proposals"]) == 5
  everything = backend.with_config(seg.SegmentationConfig(score_threshold=0.0))
  assert len(_result(everything.auto_segment(image))["proposals"]) == 20
  counted = _result(everything.concept_count(image, "objects"))
  assert counted["count"] == 20 and counted["query"] == "objects"
  assert set(counted["instances"][0]) == {"bbox_xyxy", "score"}


def test_masks_give_area_fractions_and_centroids(backend, image):
  scores, boxes, mask_logits = _reference_scores(backend, image, "cat")
  proposals = _result(backend.text_segment(image, text_prompt=" cat "))
  assert proposals["query"] == "cat"
  best = int(np.argmax(scores))
  full = torch.nn.functional.interpolate(torch.from_numpy(mask_logits[best])[None, None],
                                         size=(60, 80), mode="bilinear",
                                         align_corners=False)[0, 0].sigmoid().numpy() > 0.5
  first = proposals["proposals"][0]
  assert full.any() and not full.all()
  assert first["area_fraction"] == round(full.mean(), 4)
  rows, cols = np.nonzero(full)
  assert first["centroid"] == [round((cols.mean() + 0.5) * 1000 / 80, 1),
                               round((rows.mean() + 0.5) * 1000 / 60, 1)]
  peria = backend.with_config(seg.SegmentationConfig(peria_format=True))
  text = peria.text_segment(image, "cat")
  assert '"image_size": [60, 80]' in text  # json.dumps' default separators
  first = _result(text)["proposals"][0]
  x1, y1, x2, y2 = boxes[best]
  assert first["bbox_xyxy"] == [int(x1 * 80), int(y1 * 60), int(x2 * 80), int(y2 * 60)]
  assert first["area"] == int(full.sum())
  assert first["centroid"] == [round(cols.mean(), 1), round(rows.mean(), 1)]


def test_presence_check_follows_perias_rule(backend, image):
  scores, _, _ = _reference_scores(backend, image, "dog")
  best = float(scores.max())
  result = _result(backend.presence_check(image, "dog"))
  assert result == {"image_size": [60, 80], "query": "dog", "present": best >= 0.25,
                    "confidence": round(best, 3), "count": int((scores >= 0.25).sum())}
  # Kept at the presence threshold but short of the score threshold: not present.
  strict = backend.with_config(seg.SegmentationConfig(score_threshold=min(best + 0.01, 1.0)))
  result = _result(strict.presence_check(image, "dog"))
  assert not result["present"] and result["count"] == 0
  assert result["confidence"] == round(best, 3)
  # Nothing above the presence threshold: confidence 0.
  deaf = backend.with_config(seg.SegmentationConfig(presence_threshold=min(best + 0.01, 1.0)))
  assert _result(deaf.presence_check(image, "dog"))["confidence"] == 0.0


def test_box_prompts_reach_the_model_as_normalised_centre_and_size(backend, image):
  assert seg.unit_cxcywh_from_grid((100, 200, 500, 800)) == pytest.approx((0.3, 0.5, 0.4, 0.6))
  seen = []
  hook = backend.model.geometry_encoder.register_forward_hook(
      lambda module, args, kwargs, out: seen.append(kwargs["box_embeddings"].clone()),
      with_kwargs=True)
  try:
    boxed = _result(backend.bbox_segment(image, "\\boxed{100,200,500,800}"))
  finally:
    hook.remove()
  np.testing.assert_allclose(seen[0].numpy(), [[[0.3, 0.5, 0.4, 0.6]]], atol=1e-7)
  scores, boxes, _ = _reference_scores(backend, image, "visual", (100, 200, 500, 800))
  order = np.argsort(-scores)[:min(int((scores > 0.25).sum()), 20)]
  assert [p["bbox_xyxy"] for p in boxed["proposals"]] == _grid(boxes[order]).tolist()
  assert [p["score"] for p in boxed["proposals"]] == [round(s, 2) for s in scores[order]]
  # The box changes the answer; a list box and the exemplar tool make the same call.
  assert boxed["proposals"] != _result(backend.auto_segment(image))["proposals"]
  exemplar = _result(backend.exemplar_segment(image, [100, 200, 500, 800]))
  assert exemplar["exemplar_bbox"] == [100, 200, 500, 800]
  assert exemplar["proposals"] == boxed["proposals"]
  peria = _result(backend.with_config(seg.SegmentationConfig(peria_format=True))
                  .exemplar_segment(image, "\\boxed{100,200,500,800}"))
  assert peria["exemplar_bbox"] == pytest.approx([0.3, 0.5, 0.4, 0.6])


@pytest.mark.parametrize("value, expected", [
    ([1, 2, 3, 4], (1, 2, 3, 4)),
    ("\\boxed{10,20,30,40}", (10, 20, 30, 40)),
    ("boxed{10, 20, 30.5, 40}", (10, 20, 30.5, 40)),
    ("the cup: \\boxed{0,0,1000,1000}", (0, 0, 1000, 1000)),
    ("[5, 6, 7, 8]", (5, 6, 7, 8)),
])
def test_parse_box_reads_lists_and_boxed_strings(value, expected):
  assert seg.parse_box(value) == pytest.approx(expected)


@pytest.mark.parametrize("value, message", [
    ([500, 200, 100, 800], "needs x1 < x2 and y1 < y2"),
    ([100, 200, 100, 800], "needs x1 < x2 and y1 < y2"),
    ([100, 200, 1200, 800], "outside the 0-1000 grid"),
    ([-5, 200, 100, 800], "outside the 0-1000 grid"),
    ("\\boxed{1,2,3}", "4 comma-separated numbers"),
    ("\\boxed{a,b,c,d}", "4 comma-separated numbers"),
    ("somewhere left", "must be \\[x1, y1, x2, y2\\]"),
    ([1, 2, float("nan"), 4], "non-finite"),
    ([True, 2, 3, 4], "4 numbers"),
    ({"x1": 1}, "got dict"),
    (None, "bounding_box is missing"),
])
def test_bad_boxes_are_error_text(backend, image, value, message):
  for tool in ("bbox_segment", "exemplar_segment"):
    text = getattr(backend, tool)(image, value)
    assert text.startswith(f"Error executing {tool}: bounding_box"), text
    assert re.search(message, text), text


def test_bad_arguments_are_error_text_and_never_raise(backend, image):
  cases = [
      ("text_segment", {"text_prompt": ""}, "text_prompt is empty"),
      ("concept_count", {"text_prompt": "   "}, "text_prompt is empty"),
      ("presence_check", {"text_prompt": 7}, "text_prompt must be a string, got int 7"),
      ("text_segment", {}, "text_prompt is missing"),
      ("text_segment", {"text_prompt": "x" * 5000}, "too long (5000 characters"),
      ("text_segment", {"text": "cat"}, "unexpected argument 'text'"),
      ("auto_segment", ["image_index", 0], "arguments must be an object"),
      ("segment_everything", {}, "unknown SAM 3 tool"),
  ]
  for tool, arguments, message in cases:
    text = backend.run_tool(tool, image, arguments)
    assert text.startswith(f"Error executing {tool}: ") and message in text, text
  assert backend.run_tool("auto_segment", image, {"image_index": 0}).startswith(
      "Tool executed successfully.")
  long_name = backend.run_tool("x" * 500, image, {})
  assert len(long_name) < 300 and "unknown SAM 3 tool" in long_name


@pytest.mark.parametrize("bad, shown", [
    (np.zeros((60, 80, 3), np.float32), "dtype float32"),
    (np.zeros((60, 80), np.uint8), "shape (60, 80)"),
    (np.zeros((60, 80, 4), np.uint8), "shape (60, 80, 4)"),
    (np.zeros((0, 80, 3), np.uint8), "empty"),
])
def test_bad_images_are_refused_naming_shape_and_dtype(backend, bad, shown):
  with pytest.raises(ValueError, match=r"auto_segment: expected an image \[H, W, 3\] uint8") as e:
    backend.auto_segment(bad)
  assert shown in str(e.value)
  with pytest.raises(ValueError, match=r"segment_padded: expected images \[B, H, W, 3\] uint8"):
    backend.segment_padded(bad)


def test_segment_padded_pads_masks_and_agrees_with_the_tools(backend, image):
  rng = np.random.default_rng(2)
  images = np.stack([image, rng.integers(0, 256, (60, 80, 3), np.uint8)])
  out = backend.segment_padded(images, text_prompt=["cat", "dog"])
  k = 20
  assert out["boxes"].shape == (2, k, 4) and out["boxes"].dtype == np.float32
  assert out["scores"].shape == (2, k) and out["masks"].shape == (2, k, 64, 64)
  assert out["masks"].dtype == bool and out["count"].dtype == np.int32
  assert out["prompt_ok"].all()
  for b, text in enumerate(["cat", "dog"]):
    scores, boxes, mask_logits = _reference_scores(backend, images[b], text)
    n = min(int((scores > 0.25).sum()), k)
    assert out["count"][b] == n
    np.testing.assert_array_equal(out["valid"][b], np.arange(k) < n)
    order = np.argsort(-scores)[:n]
    np.testing.assert_allclose(out["scores"][b, :n], scores[order], rtol=2e-5)
    np.testing.assert_allclose(out["boxes"][b, :n], np.clip(boxes[order] * 1000, 0, 1000),
                               atol=2e-3)
    small = torch.nn.functional.interpolate(torch.from_numpy(mask_logits[order])[None],
                                            size=(64, 64), mode="bilinear",
                                            align_corners=False)[0].sigmoid().numpy() > 0.5
    assert (out["masks"][b, :n] == small).mean() > 0.999  # batch-1 vs batch-2 rounding
    # Padding slots are zeros.
    assert not out["masks"][b, n:].any() and (out["scores"][b, n:] == 0).all()
    assert (out["boxes"][b, n:] == 0).all()
  # A row whose box the model got wrong has no proposals; the other row is the box tool's.
  boxes = np.array([[100, 200, 500, 800], [500, 200, 100, 800]], np.float32)
  out = backend.segment_padded(images, boxes_grid_Bx4=boxes)
  np.testing.assert_array_equal(out["prompt_ok"], [True, False])
  assert out["count"][1] == 0 and not out["valid"][1].any()
  tool = _result(backend.bbox_segment(images[0], [100, 200, 500, 800]))
  assert out["count"][0] == len(tool["proposals"])
  np.testing.assert_array_equal(np.round(out["boxes"][0, :out["count"][0]]).astype(int),
                                [p["bbox_xyxy"] for p in tool["proposals"]])
  nan_box = np.array([[np.nan, 0, 10, 10], [0, 0, 10, 10]], np.float32)
  np.testing.assert_array_equal(backend.segment_padded(images, boxes_grid_Bx4=nan_box)[
      "prompt_ok"], [False, True])
  with pytest.raises(ValueError, match=r"boxes_grid_Bx4 must be \[2, 4\]"):
    backend.segment_padded(images, boxes_grid_Bx4=boxes[:1])
  with pytest.raises(ValueError, match="text_prompt must be a non-empty string or 2"):
    backend.segment_padded(images, text_prompt=["cat"])


def test_segment_padded_runs_as_a_host_callback_under_jit(backend, image):
  import jax
  import jax.numpy as jnp
  specs = backend.padded_outputs()
  images = np.stack([image, image[::-1]])
  shapes = {k: jax.ShapeDtypeStruct((2,) + shape, dtype) for k, (shape, dtype) in specs.items()}

  def host(images_np, boxes_np):
    return backend.segment_padded(np.asarray(images_np), boxes_grid_Bx4=np.asarray(boxes_np))

  boxes = jnp.asarray([[100, 200, 500, 800], [0, 0, 1000, 1000]], jnp.float32)
  inside = jax.jit(lambda im, bx: jax.pure_callback(host, shapes, im, bx))(images, boxes)
  direct = host(images, np.asarray(boxes))
  for key in specs:
    np.testing.assert_array_equal(np.asarray(inside[key]), direct[key])


def _roi_align_reference(features, rois, ph, pw, spatial_scale, sampling_ratio, aligned):
  """torchvision's CPU roi_align kernel, transliterated loop by loop (float64)."""
  _, channels, height, width = features.shape

  def bilinear(plane, y, x):
    if y < -1.0 or y > height or x < -1.0 or x > width:
      return 0.0
    y, x = max(y, 0.0), max(x, 0.0)
    y_low, x_low = int(y), int(x)
    if y_low >= height - 1:
      y_high = y_low = height - 1
      y = float(y_low)
    else:
      y_high = y_low + 1
    if x_low >= width - 1:
      x_high = x_low = width - 1
      x = float(x_low)
    else:
      x_high = x_low + 1
    ly, lx = y - y_low, x - x_low
    hy, hx = 1 - ly, 1 - lx
    return (hy * hx * plane[y_low, x_low] + hy * lx * plane[y_low, x_high]
            + ly * hx * plane[y_high, x_low] + ly * lx * plane[y_high, x_high])

  out = np.zeros((len(rois), channels, ph, pw))
  for n, roi in enumerate(rois):
    offset = 0.5 if aligned else 0.0
    start_w, start_h = roi[1] * spatial_scale - offset, roi[2] * spatial_scale - offset
    end_w, end_h = roi[3] * spatial_scale - offset, roi[4] * spatial_scale - offset
    roi_w, roi_h = end_w - start_w, end_h - start_h
    if not aligned:
      roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
    bin_h, bin_w = roi_h / ph, roi_w / pw
    grid_h = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_h / ph)
    grid_w = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_w / pw)
    count = max(grid_h * grid_w, 1)
    for c in range(channels):
      plane = features[int(roi[0]), c]
      for i in range(ph):
        for j in range(pw):
          total = 0.0
          for iy in range(grid_h):
            y = start_h + i * bin_h + (iy + 0.5) * bin_h / grid_h
            for ix in range(grid_w):
              x = start_w + j * bin_w + (ix + 0.5) * bin_w / grid_w
              total += bilinear(plane, y, x)
          out[n, c, i, j] = total / count
  return out


def test_roi_align_matches_torchvisions_kernel():
  rng = np.random.default_rng(3)
  features = rng.normal(size=(2, 3, 9, 11))
  boxes = [np.array([[1.0, 1.5, 7.2, 6.0], [-3.0, -2.0, 4.0, 3.0], [2.0, 2.0, 2.3, 2.2]]),
           np.array([[8.5, 6.0, 14.0, 12.0], [20.0, 20.0, 30.0, 30.0]])]
  rois = np.concatenate([np.concatenate([np.full((len(b), 1), float(n)), b], 1)
                         for n, b in enumerate(boxes)])
  for sampling_ratio, aligned, scale in ((-1, False, 1.0), (2, False, 0.5), (-1, True, 1.0)):
    got = seg.roi_align(torch.tensor(features, dtype=torch.float32),
                        [torch.tensor(b, dtype=torch.float32) for b in boxes], (3, 4),
                        spatial_scale=scale, sampling_ratio=sampling_ratio, aligned=aligned)
    expected = _roi_align_reference(features, rois, 3, 4, scale, sampling_ratio, aligned)
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-5)
  assert seg.roi_align(torch.zeros(1, 3, 5, 5), [torch.zeros(0, 4)], 2).shape == (0, 3, 2, 2)


def test_bfloat16_weights_run(sam3_folder, image):
  half = seg.SAM3Backend.from_pretrained(sam3_folder, dtype="bfloat16")
  assert next(half.model.parameters()).dtype == torch.bfloat16
  out = half.segment_padded(image[None], boxes_grid_Bx4=[[100, 200, 500, 800]])
  assert out["scores"].dtype == np.float32 and np.isfinite(out["scores"]).all()
  assert _result(half.text_segment(image, "cat"))["query"] == "cat"


def test_a_sam3_video_folder_loads_its_detector(sam3_folder, tmp_path, image):
  """facebook/sam3's layout: a sam3_video config holding the detector's, weights under
  "detector_model."; Sam3Model reads the detector from it."""
  from safetensors.torch import load_file, save_file
  from transformers import Sam3VideoConfig
  video = tmp_path / "video"
  shutil.copytree(sam3_folder, video)
  detector = json.loads((sam3_folder / "config.json").read_text())
  (video / "config.json").write_text(json.dumps(Sam3VideoConfig(
      detector_config=detector).to_dict()))
  weights = load_file(sam3_folder / "model.safetensors")
  save_file({"detector_model." + k: v for k, v in weights.items()}, video / "model.safetensors",
            metadata={"format": "pt"})
  loaded = seg.SAM3Backend.from_pretrained(video)
  np.testing.assert_array_equal(loaded.forward(image[None], ["cat"])["scores"],
                                seg.SAM3Backend.from_pretrained(sam3_folder).forward(
                                    image[None], ["cat"])["scores"])


# ---- the registry (jaxspatial.perception.TOOLS), its server and recipe on this folder ----

SAM3_CALLS = {"auto_segment": {}, "bbox_segment": {"bounding_box": [100, 150, 600, 900]},
              "text_segment": {"text_prompt": "objects"},
              "exemplar_segment": {"bounding_box": "\\boxed{0,0,500,500}"},
              "concept_count": {"text_prompt": "cat"}, "presence_check": {"text_prompt": "cat"}}


@pytest.fixture
def no_model_env(monkeypatch):
  monkeypatch.delenv("JAXSPATIAL_SAM3_MODEL", raising=False)


def test_the_registrys_sam3_tools_answer_as_the_backend(sam3_folder, backend, image):
  from jaxspatial.perception import TOOLS
  assert sorted(SAM3_CALLS) == sorted(seg.SAM3_TOOLS)
  for name, arguments in SAM3_CALLS.items():
    text = TOOLS[name].bind(sam3_folder).text(image, image_index=0, **arguments)
    assert text == backend.run_tool(name, image, arguments), name
  tool = TOOLS["concept_count"].bind(str(sam3_folder))
  assert tool(image, text_prompt="cat") == _result(backend.concept_count(image, "cat"))
  assert tool(image) == {"error": "Error executing concept_count: text_prompt is missing"}
  # One backend per folder, shared by the family's tools.
  assert tool.backend() is TOOLS["auto_segment"].bind(sam3_folder).backend()


def _launch(args, stderr):
  """The server command on a free loopback port; stderr to a file (a full pipe nobody
  reads would stall the server)."""
  env = {k: v for k, v in os.environ.items() if k != "JAXSPATIAL_SAM3_MODEL"}
  env["JAX_PLATFORMS"] = "cpu"
  return subprocess.Popen([sys.executable, "-m", "launch.perception_server", "--host",
                           "127.0.0.1", "--port", "0", *args], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=stderr, text=True)


@pytest.mark.slow
def test_the_perception_server_command_serves_registry_tools_from_a_folder(sam3_folder, image,
                                                                           tmp_path):
  from jaxspatial.perception import TOOLS
  from jaxspatial.perception.client import RemoteTool
  served = sorted(["text_ocr", *seg.SAM3_TOOLS])
  logs = {name: open(tmp_path / f"{name}.err", "w", encoding="utf-8")
          for name in ("server", "refused")}
  server = _launch(["--tools", "text_ocr,sam3", "--models", f"sam3={sam3_folder}"],
                   logs["server"])
  refused = _launch(["--tools", "text_segment"], logs["refused"])  # no folder: usage error
  try:
    ready, _, _ = select.select([server.stdout], [], [], 90)
    line = server.stdout.readline() if ready else ""
    match = re.fullmatch(r"perception server at (http://127\.0\.0\.1:\d+): (.*)", line.strip())
    assert match, (line, server.poll(), (tmp_path / "server.err").read_text())
    assert match.group(2).split(", ") == served
    url = match.group(1)
    box = [100, 150, 600, 900]
    local = TOOLS["bbox_segment"].bind(sam3_folder).text(image, bounding_box=box)
    # Called as TextTool calls a remote tool, (image, bounding_box), and with keywords.
    assert RemoteTool(url, "bbox_segment", timeout_s=30, retries=0)(image, box) == local
    assert RemoteTool(url, "text_segment", timeout_s=30, retries=0)(
        image, text_prompt="cat") == TOOLS["text_segment"].bind(sam3_folder).text(
            image, text_prompt="cat")
    refused.wait(timeout=90)
    stderr = (tmp_path / "refused.err").read_text()
    assert refused.returncode == 1, stderr
    assert "text_segment (family 'sam3') needs a SAM 3 model folder" in stderr
    assert "pass --models sam3=/path/to/folder to launch.perception_server" in stderr
    server.send_signal(signal.SIGTERM)
    server.communicate(timeout=30)
    assert server.returncode == 0, (tmp_path / "server.err").read_text()
  finally:
    for process in (server, refused):
      if process.poll() is None:
        process.kill()
        process.communicate()
    for log in logs.values():
      log.close()


class _ByteTokenizer:
  pad_token_id = 0

  def encode(self, text, add_special_tokens=False, **_):
    del add_special_tokens
    return list(text.encode("utf-8"))


def test_make_perception_builds_local_sam3_text_tools_from_a_folder(sam3_folder, backend, image,
                                                                    no_model_env):
  import jax
  import jax.numpy as jnp
  import ml_collections
  from jaxspatial.perception import ModelFolderError, encode_text
  from recipes.agents import make_perception
  c = ml_collections.ConfigDict({"perception": dict(
      tools=("text_ocr", "auto_segment"), url="", max_tokens=96, timeout_s=30.0, retries=0,
      models=dict(ocr="", sam3=str(sam3_folder), grounding_dino=""))})
  tokenizer = _ByteTokenizer()
  ocr_tool, sam_tool = make_perception(c, tokenizer)
  assert (ocr_tool.name, sam_tool.name, sam_tool.max_tokens) == ("text_ocr", "auto_segment", 96)
  expected = backend.auto_segment(image)
  assert sam_tool.text(image, None) == expected
  assert sam_tool.text(image, [0, 0, 500, 500]).startswith(
      "Error executing auto_segment: unexpected argument 'bounding_box'")
  ids, mask = jax.jit(sam_tool)(image, jnp.zeros(4), False, True)
  want_ids, want_mask = encode_text(tokenizer, expected, 96)
  np.testing.assert_array_equal(ids, want_ids)
  np.testing.assert_array_equal(mask, want_mask)
  c.perception.models.sam3 = ""
  with pytest.raises(ModelFolderError, match=r"auto_segment \(family 'sam3'\) needs a SAM 3 "
                     r"model folder .*--config\.perception\.models\.sam3=/path/to/folder"):
    make_perception(c, tokenizer)
