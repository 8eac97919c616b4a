"""GroundingDINO through transformers as PERIA's grounding_dino tool: a tiny random model and
processor (a WordPiece vocabulary written here, the PIL image processor) saved and loaded
back; thresholds against transformers' own post-processing, NMS against numpy, labels,
the padded form and error texts."""

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxspatial.perception import detection as det  # pylint: disable=wrong-import-position

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "a", "cat", "dog", "red", "car",
         "table", "chair"]
MAX_TEXT_LEN = 16
QUERIES = 30


@pytest.fixture(scope="module")
def dino_folder(tmp_path_factory):
  from transformers import (BertTokenizer, GroundingDinoConfig, GroundingDinoForObjectDetection,
                            GroundingDinoImageProcessorPil, GroundingDinoProcessor, SwinConfig)
  vocab = tmp_path_factory.mktemp("dino_vocab") / "vocab.txt"
  vocab.write_text("\n".join(WORDS) + "\n")
  processor = GroundingDinoProcessor(
      image_processor=GroundingDinoImageProcessorPil(size={"shortest_edge": 64,
                                                           "longest_edge": 96}),
      tokenizer=BertTokenizer(str(vocab)))
  swin = SwinConfig(window_size=7, embed_dim=8, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1],
                    image_size=64, out_indices=[2, 3, 4])
  config = GroundingDinoConfig(
      d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4,
      decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32, num_queries=QUERIES,
      num_feature_levels=4, encoder_n_points=2, decoder_n_points=2, use_timm_backbone=False,
      backbone_config=swin, max_text_len=MAX_TEXT_LEN,
      text_config=dict(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=8, max_position_embeddings=32, model_type="bert",
                       vocab_size=len(WORDS)))
  torch.manual_seed(0)
  model = GroundingDinoForObjectDetection(config).eval()
  # Initialised weights saturate every token probability at 1; a smaller decoder output
  # spreads the scores (about 0.4 to 0.8) so thresholds select among them. Their boxes are
  # the encoder's disjoint anchors; wider ones overlap (some past the image's edges).
  with torch.no_grad():
    model.model.decoder.layer_norm.weight.mul_(0.08)
    model.model.decoder.layer_norm.bias.zero_()
    model.bbox_embed[0].layers[-1].bias[2:] += 1.5
  folder = tmp_path_factory.mktemp("dino")
  model.save_pretrained(folder)
  processor.save_pretrained(folder)
  return folder


@pytest.fixture(scope="module")
def backend(dino_folder):
  return det.GroundingDinoBackend.from_pretrained(dino_folder)


@pytest.fixture(scope="module")
def image():
  return np.random.default_rng(0).integers(0, 256, (50, 70, 3), np.uint8)


def _result(text):
  prefix = "Tool executed successfully.\nResult: "
  assert text.startswith(prefix), text
  return json.loads(text[len(prefix):])


def _numpy_nms(boxes, scores, threshold):
  """Greedy NMS, pair by pair: IoU = intersection / (area_a + area_b - intersection)."""
  order = sorted(range(len(scores)), key=lambda i: -scores[i])
  keep = []
  for i in order:
    ok = True
    for j in keep:
      ix = max(0.0, min(boxes[i][2], boxes[j][2]) - max(boxes[i][0], boxes[j][0]))
      iy = max(0.0, min(boxes[i][3], boxes[j][3]) - max(boxes[i][1], boxes[j][1]))
      inter = ix * iy
      union = ((boxes[i][2] - boxes[i][0]) * (boxes[i][3] - boxes[i][1])
               + (boxes[j][2] - boxes[j][0]) * (boxes[j][3] - boxes[j][1]) - inter)
      if union > 0 and inter / union > threshold:
        ok = False
        break
    if ok:
      keep.append(i)
  return keep


def _reference(backend, image, question, box_threshold, nms_iou=0.8, cap=20):
  """transformers' post_process_grounded_object_detection on the backend's raw outputs,
  then the test's NMS and the cap: (pixel boxes, scores, phrases), best first."""
  labels = det.parse_labels(question)
  raw = backend.forward(image[None], [labels])
  post = backend.processor.post_process_grounded_object_detection(
      raw["outputs"], torch.from_numpy(raw["input_ids"]), threshold=box_threshold,
      text_threshold=0.25, target_sizes=[image.shape[:2]])[0]
  boxes, scores = post["boxes"].numpy(), post["scores"].numpy()
  keep = _numpy_nms(boxes.tolist(), scores.tolist(), nms_iou)[:cap]
  return boxes[keep], scores[keep], [post["text_labels"][i] for i in keep], raw


def test_config_holds_perias_constants_and_refuses_bad_values():
  config = det.DetectionConfig()
  assert (config.box_threshold, config.text_threshold, config.nms_iou,
          config.max_detections) == (0.25, 0.25, 0.8, 20)
  with pytest.raises(ValueError, match=r"nms_iou: expected a number in \[0, 1\]"):
    det.DetectionConfig(nms_iou=-0.1)
  with pytest.raises(ValueError, match="max_detections: expected an int >= 1"):
    det.DetectionConfig(max_detections=0)


def test_from_pretrained_names_the_folder_and_what_is_missing(dino_folder, tmp_path):
  with pytest.raises(FileNotFoundError, match="is not a folder"):
    det.GroundingDinoBackend.from_pretrained(tmp_path / "nowhere")
  partial = tmp_path / "partial"
  shutil.copytree(dino_folder, partial)
  os.remove(partial / "model.safetensors")
  os.remove(partial / "processor_config.json")
  with pytest.raises(FileNotFoundError) as e:
    det.GroundingDinoBackend.from_pretrained(partial)
  assert str(partial) in str(e.value) and "weights (model.safetensors" in str(e.value)
  assert "image processor settings (preprocessor_config.json" in str(e.value)
  shutil.rmtree(partial)
  shutil.copytree(dino_folder, partial)
  config = json.loads((partial / "config.json").read_text())
  (partial / "config.json").write_text(json.dumps({**config, "model_type": "owlvit"}))
  with pytest.raises(ValueError, match="model_type 'owlvit'"):
    det.GroundingDinoBackend.from_pretrained(partial)


def test_nms_matches_a_pairwise_numpy_nms():
  rng = np.random.default_rng(4)
  # Clustered boxes, so many pairs overlap at every threshold.
  centres = rng.uniform(20, 80, (6, 2)).repeat(8, 0) + rng.normal(0, 4, (48, 2))
  sizes = rng.uniform(10, 30, (48, 2))
  boxes = np.concatenate([centres - sizes / 2, centres + sizes / 2], 1)
  scores = rng.uniform(0, 1, 48)
  for threshold in (0.0, 0.3, 0.5, 0.8, 1.0):
    expected = _numpy_nms(boxes.tolist(), scores.tolist(), threshold)
    np.testing.assert_array_equal(det.nms(boxes, scores, threshold), expected)
  assert len(det.nms(boxes, scores, 0.3)) < len(det.nms(boxes, scores, 0.8)) < 48
  assert len(det.nms(np.zeros((0, 4)), np.zeros(0), 0.5)) == 0


def test_thresholds_nms_and_boxes_follow_transformers_post_processing(backend, image):
  labels = det.parse_labels("cat. red car.")
  raw = backend.forward(image[None], [labels])
  scores = np.sort(raw["probs"][0].max(-1))[::-1]
  assert scores[-1] > 0.25  # every query passes PERIA's threshold in the tiny model
  for keep in (25, 7):  # more than the cap, and fewer
    threshold = float((scores[keep - 1] + scores[keep]) / 2)
    for nms_iou in (0.8, 0.3):
      config = det.DetectionConfig(box_threshold=threshold, nms_iou=nms_iou)
      boxes, ref_scores, phrases, _ = _reference(backend, image, "cat. red car.", threshold,
                                                 nms_iou)
      result = _result(backend.with_config(config).grounding_dino(image, "cat. red car."))
      assert result["num_detections"] == len(result["detections"]) == len(ref_scores)
      assert [d["score"] for d in result["detections"]] == [round(float(s), 3)
                                                            for s in ref_scores]
      # The 0-1000 mapping up to rounding (the tiny model's anchor boxes sit on halves).
      grid = np.clip(boxes / [70, 50, 70, 50] * 1000, 0, 1000)
      written = np.array([d["bbox_xyxy"] for d in result["detections"]]).reshape(-1, 4)
      assert np.abs(written - grid).max() <= 0.5 + 1e-3
      peria = _result(backend.with_config(dataclasses.replace(config, peria_format=True))
                      .grounding_dino(image, "cat. red car."))
      assert [d["bbox_xyxy"] for d in peria["detections"]] == boxes.astype(int).tolist()
      assert [d["label"] for d in peria["detections"]] == phrases
  # The cases above include NMS at work: at 0.3 the widened boxes suppress each other.
  loose = _reference(backend, image, "cat. red car.", 0.25, 0.8)[1]
  tight = _reference(backend, image, "cat. red car.", 0.25, 0.3)[1]
  assert len(loose) == 20 and len(tight) < 20


def _label_ids(backend, raw, labels, queries, text_threshold=0.25):
  """Label index per query: the label whose own tokens (tokenised alone) reach the highest
  probability, -1 when none passes the text threshold."""
  ids = raw["input_ids"][0].tolist()
  tokenizer = backend.processor.tokenizer
  position, spans = 1, []  # after [CLS]
  for label in labels:
    pieces = tokenizer(label.lower(), add_special_tokens=False)["input_ids"]
    assert ids[position:position + len(pieces)] == pieces
    spans.append((position, position + len(pieces)))
    position += len(pieces) + 1  # the label's period
  probs = raw["probs"][0]
  best = np.stack([probs[queries, s:e].max(-1) for s, e in spans], -1)
  return np.where(best.max(-1) > text_threshold, best.argmax(-1), -1)


def test_labels_come_from_the_questions_token_spans(backend, image):
  question = "Red car. cat. dog"
  labels = det.parse_labels(question)
  assert labels == ["Red car", "cat", "dog"]
  assert det.caption(labels) == "Red car. cat. dog."  # as written, as PERIA passes it
  assert det.caption(labels, lowercase=True) == "red car. cat. dog."
  raw = backend.forward(image[None], [labels])
  for text_threshold in (0.25, 0.6):
    config = det.DetectionConfig(text_threshold=text_threshold)
    scores = raw["probs"][0].max(-1)
    queries = det.nms(raw["boxes"][0], scores, 0.8)[:20]
    expected = _label_ids(backend, raw, labels, queries, text_threshold)
    result = _result(backend.with_config(config).grounding_dino(image, question))
    names = [labels[i] if i >= 0 else None for i in expected]
    assert [d["label"] for d in result["detections"]] == names
    missing = [label for i, label in enumerate(labels) if i not in set(expected.tolist())]
    assert result.get("not_found", []) == missing
    padded = backend.with_config(config).detect_padded(image[None], question)
    np.testing.assert_array_equal(padded["label_ids"][0, :len(expected)], expected)
  assert -1 in expected  # at 0.6 some detections have no label


def test_the_prompt_goes_as_written_unless_lowercase_prompt_is_set(backend, image):
  labels = det.parse_labels("Red CAR. [SEP] cat")
  written = backend.forward(image[None], [labels])
  lowered = backend.with_config(det.DetectionConfig(lowercase_prompt=True)).forward(
      image[None], [labels])
  # The test's tokenizer is uncased, as the released checkpoints' BERT: the same tokens, and
  # a label spelling "[SEP]" is read as text either way, not as a separator.
  np.testing.assert_array_equal(written["input_ids"], lowered["input_ids"])
  assert written["spans"] == lowered["spans"] and None not in written["spans"][0]
  assert len(written["spans"][0]) == 2


def test_detect_padded_pads_and_agrees_with_the_tool(backend, image):
  rng = np.random.default_rng(5)
  images = np.stack([image, rng.integers(0, 256, (50, 70, 3), np.uint8)])
  few = backend.with_config(det.DetectionConfig(box_threshold=0.6))
  out = few.detect_padded(images, ["cat. red car.", "dog."])
  assert out["boxes"].shape == (2, 20, 4) and out["boxes"].dtype == np.float32
  assert out["scores"].shape == out["label_ids"].shape == out["valid"].shape == (2, 20)
  assert out["count"].dtype == np.int32 and out["label_ids"].dtype == np.int32
  for b, question in enumerate(["cat. red car.", "dog."]):
    n = out["count"][b]
    assert 0 < n < 20
    np.testing.assert_array_equal(out["valid"][b], np.arange(20) < n)
    assert (out["scores"][b, n:] == 0).all() and (out["boxes"][b, n:] == 0).all()
    assert (out["label_ids"][b, n:] == -1).all()
    assert (np.diff(out["scores"][b, :n]) <= 0).all()
    tool = _result(few.grounding_dino(images[b], question))
    assert tool["num_detections"] == n
    np.testing.assert_allclose(out["scores"][b, :n], [d["score"] for d in tool["detections"]],
                               atol=5e-4)
    written = np.array([d["bbox_xyxy"] for d in tool["detections"]])
    assert np.abs(out["boxes"][b, :n] - written).max() <= 0.5 + 1e-3
  single = few.detect_padded(images[1:], "dog.")
  np.testing.assert_array_equal(single["count"], out["count"][1:])
  with pytest.raises(ValueError, match="detect_padded: question has no label"):
    few.detect_padded(images, ". .")
  with pytest.raises(ValueError, match="1 questions for 2 images"):
    few.detect_padded(images, ["cat."])
  with pytest.raises(ValueError, match="question 1 has labels that do not fit in the model's 16"):
    few.detect_padded(images, ["cat.", "cat. dog. car. table. chair. red. a. cat. dog."])


def test_bad_arguments_are_error_text_and_never_raise(backend, image):
  cases = [
      ({"question": ""}, "question has no label"),
      ({"question": " . . "}, "question has no label"),
      ({"question": ["cat"]}, "question must be a string of labels separated by periods, got list"),
      ({}, "question is missing"),
      ({"question": "cat. " * 400}, "too long (2000 characters"),
      ({"question": "cat. dog. car. table. chair. red. a. cat. dog."},
       "2 of 9 labels do not fit in the model's 16 text tokens"),
      ({"question": "cat", "box_threshold": 0.0}, "unexpected argument 'box_threshold'"),
      ("cat", "arguments must be an object"),
  ]
  for arguments, message in cases:
    text = backend.run_tool("grounding_dino", image, arguments)
    assert text.startswith("Error executing grounding_dino: ") and message in text, text
  assert backend.run_tool("owl_vit", image, {}).startswith("Error executing owl_vit: unknown")
  assert _result(backend.run_tool("grounding_dino", image, {"image_index": 0,
                                                            "question": "cat."}))


@pytest.mark.parametrize("bad, shown", [
    (np.zeros((50, 70, 3), np.int64), "dtype int64"),
    (np.zeros((3, 50, 70), np.uint8), "shape (3, 50, 70)"),
])
def test_bad_images_are_refused_naming_shape_and_dtype(backend, bad, shown):
  with pytest.raises(ValueError, match=r"grounding_dino: expected an image \[H, W, 3\]") as e:
    backend.grounding_dino(bad, "cat.")
  assert shown in str(e.value)
  with pytest.raises(ValueError, match=r"detect_padded: expected images \[B, H, W, 3\]"):
    backend.detect_padded(bad, "cat.")


def test_an_image_too_small_for_the_model_is_error_text(backend):
  # Three rows of pixels leave the tiny model's encoder fewer positions than its 30 queries.
  thin = np.random.default_rng(6).integers(0, 256, (3, 40, 3), np.uint8)
  text = backend.grounding_dino(thin, "cat.")
  assert text.startswith("Error executing grounding_dino: the model cannot read this 3 x 40 "
                         "image"), text


def test_the_registrys_grounding_dino_answers_as_the_backend_and_builds_in_a_recipe(
    dino_folder, backend, image, monkeypatch):
  import ml_collections
  from jaxspatial.perception import TOOLS
  from recipes.agents import make_perception
  monkeypatch.delenv("JAXSPATIAL_GROUNDING_DINO_MODEL", raising=False)
  tool = TOOLS["grounding_dino"].bind(dino_folder)
  text = tool.text(image, image_index=1, question="cat. red car.")
  assert text == backend.grounding_dino(image, "cat. red car.")
  assert tool(image, question="cat. red car.") == _result(text)
  assert tool(image, question=" . ") == {
      "error": "Error executing grounding_dino: question has no label; expected labels "
               "separated by periods, got ' . '"}
  c = ml_collections.ConfigDict({"perception": dict(
      tools=("grounding_dino",), url="", max_tokens=64, timeout_s=30.0, retries=0,
      models=dict(ocr="", sam3="", grounding_dino=str(dino_folder)))})
  (host,) = make_perception(c, tokenizer=type("T", (), {"pad_token_id": 0})())
  assert host.name == "grounding_dino" and host.max_tokens == 64
  assert (host.arguments, host.optional) == (("image_index", "question"), ())
  # Inside the rollout the model's question arrives as its keyword; without one the tool
  # says it is missing.
  assert host.text(image, None, question="cat. red car.") == text
  assert host.text(image, None).startswith("Error executing grounding_dino: question is "
                                           "missing")
