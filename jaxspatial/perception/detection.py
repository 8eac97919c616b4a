"""GroundingDINO (transformers' `GroundingDinoForObjectDetection`) as PERIA's `grounding_dino`
tool, run on the host.

`GroundingDinoBackend.from_pretrained(folder)` loads a Hugging Face folder (config.json with
model_type "grounding-dino", the weights, the processor: BERT tokenizer and image processor;
transformers picks its PIL image processor where torchvision is missing). The tool follows
PERIA's public actor (`pedia/tool_definitions/agents/grounding_dino.py`): `question` holds
labels separated by periods; a query's score is its highest token probability; queries
above the box threshold (0.25) are kept, then class-agnostic NMS drops boxes overlapping a
better one with IoU > 0.8 (torchvision.ops.nms' rule), then the best 20 are listed. A
detection's label: the requested label whose tokens reach the highest probability, if any
token passes the text threshold (0.25). The model reads the labels as written (PERIA
passes the question's casing through) joined as "a. b." (GroundingDINO's documented
caption form); `DetectionConfig.lowercase_prompt` lower-cases them first, as
GroundingDINO's own inference helper (`preprocess_caption`) does. An uncased text encoder
(bert-base-uncased, the released checkpoints') lower-cases anyway, so the option matters
for cased tokenizers.

The tool returns "Tool executed successfully.\\nResult: " + JSON {"image_size": [H, W],
"detections": [{"bbox_xyxy", "score", "label"}], "num_detections": n, "not_found": [...]}
("not_found" only when some label has no detection): compact, boxes on the 0-1000 grid by
default; `peria_format=True` writes PERIA's public form (pixel boxes, the label as the
phrase transformers' post-processing decodes from the tokens above the text threshold,
json.dumps' default separators). A bad `question` gives "Error executing grounding_dino:
..." and never raises. `detect_padded` is the fixed-shape array form for host callbacks.
"""

from __future__ import annotations

import copy
import dataclasses
import numbers
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from jaxspatial.perception.segmentation import (check_folder, check_images, check_model_type,
                                                grid_from_unit, result_text, torch_dtype)
from jaxspatial.perception.tool_args import (GRID, MAX_PROMPT_CHARS, ToolArgumentError,
                                             check_image, error_text, short, tool_arguments)

TOOL_ARGUMENTS = ("image_index", "question")  # image_index is the caller's
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


@dataclasses.dataclass(frozen=True)
class DetectionConfig:
  """PERIA's GroundingDINO settings (its actor's constants) and the output form."""
  box_threshold: float = 0.25   # BOX_THRESHOLD
  text_threshold: float = 0.25  # TEXT_THRESHOLD
  nms_iou: float = 0.8          # NMS_THRESHOLD
  max_detections: int = 20      # MAX_DETECTIONS; K of the padded form
  peria_format: bool = False
  lowercase_prompt: bool = False  # PERIA passes the labels' casing through

  def __post_init__(self):
    for name in ("box_threshold", "text_threshold", "nms_iou"):
      value = getattr(self, name)
      if not (isinstance(value, numbers.Real) and 0.0 <= value <= 1.0):
        raise ValueError(f"DetectionConfig.{name}: expected a number in [0, 1], got {value!r}")
    if not (isinstance(self.max_detections, int) and self.max_detections >= 1):
      raise ValueError(f"DetectionConfig.max_detections: expected an int >= 1, got "
                       f"{self.max_detections!r}")


def parse_labels(question, name: str = "question") -> list[str]:
  """The labels of a model-written question ("cat. red car."), stripped, empty ones
  dropped; ToolArgumentError when missing, not a string, too long or without a label."""
  if question is None:
    raise ToolArgumentError(f"{name} is missing; expected labels separated by periods")
  if not isinstance(question, str):
    raise ToolArgumentError(f"{name} must be a string of labels separated by periods, got "
                            f"{type(question).__name__} {short(question)}")
  if len(question) > MAX_PROMPT_CHARS:
    raise ToolArgumentError(f"{name} is too long ({len(question)} characters, at most "
                            f"{MAX_PROMPT_CHARS})")
  labels = [label.strip() for label in question.split(".") if label.strip()]
  if not labels:
    raise ToolArgumentError(f"{name} has no label; expected labels separated by periods, got "
                            f"{short(question)}")
  return labels


def caption(labels: Sequence[str], lowercase: bool = False,
            special_tokens: Sequence[str] = ()) -> str:
  """GroundingDINO's caption for labels: each ended by a period, as written or
  `lowercase`d. A label spelling one of the tokenizer's `special_tokens` ("[SEP]",
  "[CLS]": matched case-sensitively, they would split the labels' token spans) has that
  spelling lower-cased either way."""
  def written(label: str) -> str:
    if lowercase:
      return label.lower()
    for token in special_tokens:
      if token != token.lower() and token in label:
        label = label.replace(token, token.lower())
    return label
  return " ".join(f"{written(label)}." for label in labels)


def box_iou(a_Nx4: np.ndarray, b_Mx4: np.ndarray) -> np.ndarray:
  """[N, M] IoU of (x1, y1, x2, y2) boxes (areas (x2 - x1)(y2 - y1), as torchvision)."""
  a, b = np.asarray(a_Nx4, np.float64), np.asarray(b_Mx4, np.float64)
  area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
  area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
  width = np.clip(np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0],
                                                                       b[None, :, 0]), 0, None)
  height = np.clip(np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1],
                                                                        b[None, :, 1]), 0, None)
  inter = width * height
  with np.errstate(divide="ignore", invalid="ignore"):
    iou = inter / (area_a[:, None] + area_b[None, :] - inter)
  return np.nan_to_num(iou, nan=0.0)


def nms(boxes_Nx4, scores_N, iou_threshold: float) -> np.ndarray:
  """Indices kept by greedy NMS, best first: a box is dropped when its IoU with a better
  kept box is above `iou_threshold` (torchvision.ops.nms' rule)."""
  boxes, scores = np.asarray(boxes_Nx4), np.asarray(scores_N)
  order = np.argsort(-scores, kind="stable")
  iou = box_iou(boxes[order], boxes[order])
  suppressed = np.zeros(len(order), bool)
  keep = []
  for i in range(len(order)):
    if suppressed[i]:
      continue
    keep.append(order[i])
    suppressed |= iou[i] > iou_threshold
  return np.asarray(keep, np.int64)


def label_spans(input_ids_T, count: int, separators: set[int]) -> list[tuple[int, int]]:
  """Token ranges [start, end) of the first `count` labels in a caption's ids: runs of
  tokens between separators (special tokens and the period). Fewer ranges than labels
  means the rest were cut off by the text length."""
  spans, start = [], None
  for t, token in enumerate(np.asarray(input_ids_T).tolist()):
    if token in separators:
      if start is not None:
        spans.append((start, t))
        start = None
    elif start is None:
      start = t
  if start is not None:
    spans.append((start, len(np.asarray(input_ids_T))))
  return spans[:count]


class GroundingDinoBackend:
  """transformers' GroundingDINO with its processor; PERIA's grounding_dino tool."""

  def __init__(self, model, processor, config: DetectionConfig, device: str = "cpu"):
    self.model, self.processor, self.config, self.device = model, processor, config, device
    tokenizer = processor.tokenizer
    self.max_text_len = int(model.config.max_text_len)
    self.separators = {i for i in (tokenizer.cls_token_id, tokenizer.sep_token_id,
                                   tokenizer.pad_token_id) if i is not None}
    self.separators.add(tokenizer.convert_tokens_to_ids("."))
    # Longest first, so a token containing another is lower-cased whole.
    self.special_tokens = tuple(sorted(getattr(tokenizer, "all_special_tokens", ()),
                                       key=len, reverse=True))

  @classmethod
  def from_pretrained(cls, folder, device: str = "cpu", dtype="float32",
                      config: DetectionConfig | None = None) -> "GroundingDinoBackend":
    """A local GroundingDINO folder: config.json (model_type "grounding-dino"), weights and
    the processor's files. FileNotFoundError names the folder and what is missing."""
    where = "GroundingDinoBackend.from_pretrained"
    folder = check_folder(folder, where, {
        "config": ("config.json",), "weights": _WEIGHTS,
        "tokenizer": ("tokenizer.json", "vocab.txt"),
        "image processor settings": ("preprocessor_config.json", "processor_config.json")})
    check_model_type(folder, where, ("grounding-dino", "grounding_dino"))
    from transformers import (AutoProcessor,  # pylint: disable=import-outside-toplevel
                              GroundingDinoForObjectDetection)
    processor = AutoProcessor.from_pretrained(folder)
    model = GroundingDinoForObjectDetection.from_pretrained(
        folder, dtype=torch_dtype(dtype)).to(device).eval()
    return cls(model, processor, config or DetectionConfig(), device)

  def with_config(self, config: DetectionConfig) -> "GroundingDinoBackend":
    """The same model with other settings."""
    other = copy.copy(self)
    other.config = config
    return other

  def forward(self, images_BxHxWx3, labels: Sequence[Sequence[str]]) -> dict:
    """The raw outputs for one label list per image: probs [B, Q, T] (sigmoid of the
    token logits), boxes [B, Q, 4] (x1, y1, x2, y2 in [0, 1] of the image), input_ids
    [B, T'] (the caption's tokens, cut to max_text_len), spans (per image, per label: its
    token range, None where the caption was cut before it), and `outputs`, the model's
    output object (for transformers' own post-processing)."""
    import torch  # pylint: disable=import-outside-toplevel
    images = check_images(images_BxHxWx3, "GroundingDinoBackend.forward")
    if len(labels) != images.shape[0]:
      raise ValueError(f"GroundingDinoBackend.forward: {len(labels)} label lists for "
                       f"{images.shape[0]} images")
    captions = [caption(ls, self.config.lowercase_prompt, self.special_tokens) for ls in labels]
    inputs = self.processor(images=list(images), text=captions,
                            return_tensors="pt", padding=True, truncation=True,
                            max_length=self.max_text_len, input_data_format="channels_last")
    dtype = next(self.model.parameters()).dtype
    inputs = {k: (v.to(self.device, dtype) if v.is_floating_point() else v.to(self.device))
              for k, v in inputs.items()}
    with torch.inference_mode():
      outputs = self.model(**inputs)
    probs = outputs.logits.float().sigmoid().cpu().numpy()
    cx, cy, w, h = np.moveaxis(outputs.pred_boxes.float().cpu().numpy(), -1, 0)
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)
    input_ids = inputs["input_ids"].cpu().numpy()
    spans = []
    for ids, ls in zip(input_ids, labels):
      found = label_spans(ids[:self.max_text_len], len(ls), self.separators)
      spans.append(found + [None] * (len(ls) - len(found)))
    return {"probs": probs, "boxes": boxes, "input_ids": input_ids, "spans": spans,
            "outputs": outputs}

  def _detections(self, raw: dict, b: int) -> dict:
    """One image's detections after the box threshold, NMS and the cap, best first:
    indices (queries), scores, boxes (unit), label_ids (-1: no label passes the text
    threshold)."""
    probs = raw["probs"][b]
    scores = probs.max(-1)
    above = np.flatnonzero(scores > self.config.box_threshold)
    kept = above[nms(raw["boxes"][b, above], scores[above], self.config.nms_iou)]
    kept = kept[:self.config.max_detections]
    label_ids = np.full(len(kept), -1, np.int32)
    spans = [s for s in raw["spans"][b] if s is not None]
    if spans:
      # Each label's best token probability, per kept query: [n, labels].
      best = np.stack([probs[kept, s:e].max(-1) for s, e in spans], -1)
      label_ids = np.where(best.max(-1) > self.config.text_threshold, best.argmax(-1),
                           -1).astype(np.int32)
    return {"queries": kept, "scores": scores[kept], "boxes": raw["boxes"][b, kept],
            "label_ids": label_ids}

  def padded_outputs(self) -> dict:
    """Per-example output shapes of `detect_padded` as (shape, dtype), HostTool's form."""
    k = self.config.max_detections
    return {"boxes": ((k, 4), jnp.float32), "scores": ((k,), jnp.float32),
            "label_ids": ((k,), jnp.int32), "count": ((), jnp.int32),
            "valid": ((k,), jnp.bool_)}

  def detect_padded(self, images_BxHxWx3, question: str | Sequence[str]) -> dict:
    """Fixed-shape detections: boxes [B, K, 4] float32 (0-1000 grid), scores [B, K],
    label_ids [B, K] int32 (into the question's labels; -1 none or padding), count [B]
    int32, valid [B, K] bool (the first `count` slots, best first). `question` (the
    caller's, static): one for every image or one per image; a bad one raises."""
    images = check_images(images_BxHxWx3, "GroundingDinoBackend.detect_padded")
    batch = images.shape[0]
    questions = [question] * batch if isinstance(question, str) else list(question)
    if len(questions) != batch:
      raise ValueError(f"GroundingDinoBackend.detect_padded: {len(questions)} questions for "
                       f"{batch} images")
    try:
      labels = [parse_labels(q) for q in questions]
    except ToolArgumentError as e:
      raise ValueError(f"GroundingDinoBackend.detect_padded: {e}") from e
    raw = self.forward(images, labels)
    for b, (row, spans) in enumerate(zip(labels, raw["spans"])):
      if None in spans:
        raise ValueError(f"GroundingDinoBackend.detect_padded: question {b} has labels that "
                         f"do not fit in the model's {self.max_text_len} text tokens (first "
                         f"cut: {short(row[spans.index(None)], 40)})")
    k = self.config.max_detections
    out = {"boxes": np.zeros((batch, k, 4), np.float32), "scores": np.zeros((batch, k), np.float32),
           "label_ids": np.full((batch, k), -1, np.int32), "count": np.zeros(batch, np.int32),
           "valid": np.zeros((batch, k), bool)}
    for b in range(batch):
      found = self._detections(raw, b)
      n = len(found["queries"])
      out["count"][b] = n
      out["valid"][b, :n] = True
      out["scores"][b, :n] = found["scores"]
      out["boxes"][b, :n] = np.clip(found["boxes"] * GRID, 0, GRID)
      out["label_ids"][b, :n] = found["label_ids"]
    return out

  def grounding_dino(self, image_HxWx3, question=None) -> str:
    """PERIA's grounding_dino tool on one image: the observation text."""
    image = check_image(image_HxWx3, "grounding_dino")
    try:
      labels = parse_labels(question)
    except ToolArgumentError as e:
      return error_text("grounding_dino", e)
    try:
      raw = self.forward(image[None], [labels])
    except RuntimeError as e:
      # A sliver (a model-written crop a few pixels tall) leaves the encoder fewer
      # positions than the model has queries; the model sees its call failed.
      return error_text("grounding_dino", f"the model cannot read this {image.shape[0]} x "
                        f"{image.shape[1]} image: {short(str(e), 120)}")
    cut = [label for label, span in zip(labels, raw["spans"][0]) if span is None]
    if cut:
      return error_text("grounding_dino", f"question is too long: {len(cut)} of "
                        f"{len(labels)} labels do not fit in the model's "
                        f"{self.max_text_len} text tokens (first cut: {short(cut[0], 40)})")
    found = self._detections(raw, 0)
    height, width = image.shape[:2]
    detections = []
    phrases = self._phrases(raw, found["queries"]) if self.config.peria_format else []
    for i in range(len(found["queries"])):
      x1, y1, x2, y2 = (float(v) for v in found["boxes"][i])
      if self.config.peria_format:
        # float32 products, as transformers scales boxes before PERIA truncates them.
        pixels = found["boxes"][i].astype(np.float32) * np.float32([width, height] * 2)
        box = [int(v) for v in pixels]
        label = phrases[i]
      else:
        box = grid_from_unit([x1, y1, x2, y2]).tolist()
        label = labels[found["label_ids"][i]] if found["label_ids"][i] >= 0 else None
      detections.append({"bbox_xyxy": box, "score": round(float(found["scores"][i]), 3),
                         "label": label})
    payload = {"image_size": [height, width], "detections": detections,
               "num_detections": len(detections)}
    if self.config.peria_format:
      # PERIA compares the decoded phrases with the labels as written.
      seen = {d["label"] for d in detections}
      not_found = [label for label in labels if label not in seen]
    else:
      assigned = set(found["label_ids"].tolist())
      not_found = [label for i, label in enumerate(labels) if i not in assigned]
    if not_found:
      payload["not_found"] = not_found
    return result_text(payload, self.config.peria_format)

  def _phrases(self, raw: dict, queries: np.ndarray) -> list[str]:
    """transformers' labels for queries of image 0: the decoded tokens above the text
    threshold (`get_phrases_from_posmap` + batch_decode, as its post-processing)."""
    # pylint: disable=import-outside-toplevel
    import torch
    from transformers.models.grounding_dino.processing_grounding_dino import (
        get_phrases_from_posmap)
    if not len(queries):
      return []
    posmaps = torch.from_numpy(raw["probs"][0, queries] > self.config.text_threshold)
    token_ids = get_phrases_from_posmap(posmaps, torch.from_numpy(raw["input_ids"][0]))
    return self.processor.batch_decode(token_ids)

  def run_tool(self, name, image_HxWx3, arguments) -> str:
    """A parsed call of `grounding_dino` with the model's `arguments` (image_index is the
    caller's); an unknown tool, a non-dict or an unknown argument is error text."""
    label = name if isinstance(name, str) and len(name) <= 64 else short(name, 64)
    if name != "grounding_dino":
      return error_text(label, "unknown tool; expected 'grounding_dino'")
    try:
      arguments = tool_arguments(arguments, TOOL_ARGUMENTS)
    except ToolArgumentError as e:
      return error_text(name, e)
    return self.grounding_dino(image_HxWx3, arguments.get("question"))
