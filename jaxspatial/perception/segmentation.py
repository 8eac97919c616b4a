"""SAM 3 (transformers' `Sam3Model`) as PERIA's six segmentation tools, run on the host.

`SAM3Backend.from_pretrained(folder)` loads a Hugging Face SAM 3 folder (config.json with
model_type "sam3", or "sam3_video" as facebook/sam3, whose detector Sam3Model reads; the
weights, the CLIP tokenizer, the image processor's settings). The tools follow PERIA's
public SAM 3 actor (`pedia/tool_definitions/agents/sam3.py`):
  auto_segment      the text prompt "objects" (PERIA's stand-in for "everything")
  bbox_segment      one positive box prompt with the text "visual"
  exemplar_segment  the same call: SAM 3 finds every instance like the box's content
  text_segment      a text prompt
  concept_count     a text prompt; the number of instances kept
  presence_check    a text prompt scored with the presence threshold (0.1); present when
                    the best score reaches the score threshold (0.25), as PERIA's code
A query's score is sigmoid(logit) * sigmoid(presence logit); queries scoring above the
threshold are kept, best first, at most `max_proposals` (20). Masks are the mask logits
resized (bilinear) to the image, then sigmoid > 0.5.

Each tool takes the image [H, W, 3] uint8 RGB (the caller resolves `image_index`) and
returns PERIA's observation text "Tool executed successfully.\\nResult: " + JSON; model-
written arguments never raise: a bad one gives "Error executing {tool}: ..." (PERIA's
actor instead falls back to auto_segment on an unreadable bbox_segment box and answers
exemplar_segment's with {"error": ...} as a success). Boxes are [x1, y1, x2, y2] on
PERIA's 0-1000 grid over width and height, as a list or a string "\\boxed{x1,y1,x2,y2}".
The default JSON is compact, boxes and centroids on the grid, mask areas as fractions of
the image; `peria_format=True` writes what PERIA's public code writes instead (pixel
boxes and areas, json.dumps' default separators).

`segment_padded` is the array form for the compiled program: [B, K] slots (K =
`max_proposals`) with a valid mask and masks at a fixed low resolution, so it can be a host
callback with static shapes (`padded_outputs()` declares them in `HostTool`'s form).

transformers' SAM 3 box prompts pool image features with `torchvision.ops.roi_align`, and
its image processor is a torchvision one; torchvision is not installed here (PyPI's does
not import beside this torch build). The image preprocessing is therefore done here (the
processor's settings, torch's uint8 antialiased bilinear resize, which torchvision's
resize calls), and where torchvision is missing `roi_align` below (torchvision's CPU
kernel written in torch) is given to transformers' SAM 3 module.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import numbers
import os
import types
from typing import Sequence

import jax.numpy as jnp
import numpy as np

# Also this module's names: the tests (and older callers) read them as segmentation.X.
from jaxspatial.perception.tool_args import (GRID, SUCCESS, ToolArgumentError, check_image,
                                             error_text, parse_box, parse_text, short,
                                             tool_arguments)

SAM3_TOOLS = ("auto_segment", "bbox_segment", "text_segment", "exemplar_segment",
              "concept_count", "presence_check")
TOOL_ARGUMENTS = {  # the public argument names; image_index is the caller's
    "auto_segment": ("image_index",),
    "bbox_segment": ("image_index", "bounding_box"),
    "exemplar_segment": ("image_index", "bounding_box"),
    "text_segment": ("image_index", "text_prompt"),
    "concept_count": ("image_index", "text_prompt"),
    "presence_check": ("image_index", "text_prompt"),
}
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class SegmentationConfig:
  """PERIA's SAM 3 settings (its actor's constants) and the output forms."""
  score_threshold: float = 0.25     # SCORE_THRESHOLD
  presence_threshold: float = 0.1   # PRESENCE_THRESHOLD (presence_check's kept scores)
  max_proposals: int = 20           # MAX_PROPOSALS; K of the padded form
  mask_threshold: float = 0.5       # on sigmoid(mask logit)
  mask_size: tuple[int, int] = (64, 64)  # (h, w) of the padded form's masks
  auto_prompt: str = "objects"      # auto_segment's text prompt
  box_prompt_text: str = "visual"   # the text beside a box prompt (transformers and PERIA)
  peria_format: bool = False        # PERIA's public JSON instead of the compact grid form

  def __post_init__(self):
    for name in ("score_threshold", "presence_threshold", "mask_threshold"):
      value = getattr(self, name)
      if not (isinstance(value, numbers.Real) and 0.0 <= value <= 1.0):
        raise ValueError(f"SegmentationConfig.{name}: expected a number in [0, 1], got "
                         f"{value!r}")
    if not (isinstance(self.max_proposals, int) and self.max_proposals >= 1):
      raise ValueError(f"SegmentationConfig.max_proposals: expected an int >= 1, got "
                       f"{self.max_proposals!r}")
    size = tuple(self.mask_size)
    if len(size) != 2 or not all(isinstance(s, int) and s >= 1 for s in size):
      raise ValueError(f"SegmentationConfig.mask_size: expected (h, w) positive ints, got "
                       f"{self.mask_size!r}")
    for name in ("auto_prompt", "box_prompt_text"):
      if not (isinstance(getattr(self, name), str) and getattr(self, name).strip()):
        raise ValueError(f"SegmentationConfig.{name}: expected a non-empty string")


# ---- shared by the perception tools (detection.py and depth.py use them too) -----------

def check_images(images_BxHxWx3, where: str) -> np.ndarray:
  """A batch [B, H, W, 3] uint8 RGB as a C-contiguous array, or ValueError naming `where`,
  the expected layout and the shape and dtype given."""
  expected = f"{where}: expected images [B, H, W, 3] uint8 RGB"
  try:
    images = np.asarray(images_BxHxWx3)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{expected}, got {type(images_BxHxWx3).__name__} ({e})") from e
  if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
    raise ValueError(f"{expected}, got shape {tuple(images.shape)} dtype {images.dtype}")
  if min(images.shape[:3]) == 0:
    raise ValueError(f"{expected}, got an empty batch or image {tuple(images.shape)}")
  return np.ascontiguousarray(images)


def grid_from_unit(values) -> np.ndarray:
  """Coordinates in [0, 1] of width / height -> the 0-1000 grid, rounded, clipped (int)."""
  return np.clip(np.round(np.asarray(values, np.float64) * GRID), 0, GRID).astype(np.int64)


def unit_cxcywh_from_grid(box) -> tuple[float, float, float, float]:
  """A 0-1000 box (x1, y1, x2, y2) as SAM 3's box prompt: (cx, cy, w, h) in [0, 1]."""
  x1, y1, x2, y2 = box
  return ((x1 + x2) / 2 / GRID, (y1 + y2) / 2 / GRID, (x2 - x1) / GRID, (y2 - y1) / GRID)


def result_text(payload: dict, peria_format: bool) -> str:
  """The success observation: compact JSON, or json.dumps' defaults as PERIA's code."""
  body = (json.dumps(payload) if peria_format else
          json.dumps(payload, ensure_ascii=False, separators=(",", ":")))
  return SUCCESS + body


def check_folder(folder, where: str, groups: dict[str, Sequence[str]]) -> str:
  """The folder, or FileNotFoundError naming it and every group with none of its files."""
  folder = os.fspath(folder)
  if not os.path.isdir(folder):
    raise FileNotFoundError(f"{where}: {folder} is not a folder")
  missing = [f"{what} ({' or '.join(names)})" for what, names in groups.items()
             if not any(os.path.exists(os.path.join(folder, n)) for n in names)]
  if missing:
    raise FileNotFoundError(f"{where}: {folder} has no {'; no '.join(missing)}")
  return folder


def check_model_type(folder: str, where: str, expected: Sequence[str]) -> dict:
  with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
    config = json.load(f)
  if config.get("model_type") not in expected:
    raise ValueError(f"{where}: {folder}/config.json has model_type "
                     f"{config.get('model_type')!r}, expected one of {list(expected)}")
  return config


def torch_dtype(dtype):
  """A torch dtype from "float32" / "bfloat16" / "float16" or a torch dtype."""
  import torch  # pylint: disable=import-outside-toplevel
  if isinstance(dtype, torch.dtype):
    return dtype
  if dtype not in _DTYPES:
    raise ValueError(f"dtype must be one of {_DTYPES} or a torch dtype, got {dtype!r}")
  return getattr(torch, dtype)


# ---- roi_align without torchvision -----------------------------------------------------

def _bilinear_weights(coords, size: int):
  """[n, size] weights of bilinear samples at `coords` along one axis, with torchvision's
  roi_align boundary rules: a sample beyond (-1, size) is 0, one in (-1, 0] reads 0, one
  at or past size - 1 reads the last row."""
  import torch  # pylint: disable=import-outside-toplevel
  outside = (coords < -1.0) | (coords > size)
  coords = coords.clamp(min=0.0)
  low = coords.floor().long()
  edge = low >= size - 1
  low = torch.where(edge, torch.full_like(low, size - 1), low)
  high = torch.where(edge, low, low + 1)
  coords = torch.where(edge, low.to(coords.dtype), coords)
  frac = coords - low.to(coords.dtype)
  weights = torch.zeros(coords.shape[0], size, dtype=coords.dtype, device=coords.device)
  rows = torch.arange(coords.shape[0], device=coords.device)
  weights.index_put_((rows, low), 1.0 - frac, accumulate=True)
  weights.index_put_((rows, high), frac, accumulate=True)
  weights[outside] = 0.0
  return weights


def roi_align(input_NxCxHxW, boxes, output_size, spatial_scale: float = 1.0,
              sampling_ratio: int = -1, aligned: bool = False):
  """torchvision.ops.roi_align (its CPU kernel) in torch: `boxes` a list of [K_n, 4]
  (x1, y1, x2, y2) tensors, one per image, or a [K, 5] tensor (image index first);
  returns [sum K, C, ph, pw]. Bilinear sampling is separable (the weights of a sample are
  a product of its row and column weights), so each box is two small matmuls."""
  import torch  # pylint: disable=import-outside-toplevel
  ph, pw = (output_size, output_size) if isinstance(output_size, int) else output_size
  if isinstance(boxes, torch.Tensor):
    rois = boxes
  else:
    rois = torch.cat([torch.cat([torch.full((len(b), 1), float(n), dtype=b.dtype,
                                            device=b.device), b], 1)
                      for n, b in enumerate(boxes)]) if len(boxes) else torch.zeros(0, 5)
  features = input_NxCxHxW.float()
  device = features.device
  height, width = features.shape[-2:]
  out = []
  for roi in rois.float():
    offset = 0.5 if aligned else 0.0
    x1, y1, x2, y2 = (roi[1:] * spatial_scale - offset).tolist()
    roi_w, roi_h = x2 - x1, y2 - y1
    if not aligned:  # malformed boxes become 1 x 1, as torchvision
      roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
    bin_h, bin_w = roi_h / ph, roi_w / pw
    grid_h = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_h / ph)
    grid_w = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_w / pw)
    channels = features.shape[1]
    if grid_h * grid_w == 0:
      out.append(torch.zeros(channels, ph, pw, device=device))
      continue
    # Sample iy of bin p sits at start + p * bin + (iy + 0.5) * bin / grid.
    arange = functools.partial(torch.arange, dtype=torch.float32, device=device)
    ys = (y1 + arange(ph)[:, None] * bin_h + (arange(grid_h)[None, :] + 0.5) * bin_h / grid_h)
    xs = (x1 + arange(pw)[:, None] * bin_w + (arange(grid_w)[None, :] + 0.5) * bin_w / grid_w)
    wy = _bilinear_weights(ys.reshape(-1), height).reshape(ph, grid_h, height).sum(1)
    wx = _bilinear_weights(xs.reshape(-1), width).reshape(pw, grid_w, width).sum(1)
    feature = features[int(roi[0])]
    pooled = torch.einsum("yh,chw,xw->cyx", wy, feature, wx) / (grid_h * grid_w)
    out.append(pooled)
  if not out:
    return input_NxCxHxW.new_zeros(0, input_NxCxHxW.shape[1], ph, pw)
  return torch.stack(out).to(input_NxCxHxW.dtype)


def _ensure_roi_align() -> None:
  """Gives transformers' SAM 3 module `roi_align` when torchvision is not installed (it
  imports torchvision only if available, and calls it only for box prompts)."""
  from transformers.models.sam3 import modeling_sam3  # pylint: disable=import-outside-toplevel
  if not hasattr(modeling_sam3, "torchvision"):
    modeling_sam3.torchvision = types.SimpleNamespace(
        ops=types.SimpleNamespace(roi_align=roi_align))


# ---- the backend ----------------------------------------------------------------------

def _image_settings(folder: str, where: str) -> dict:
  """The image processor's settings from preprocessor_config.json (Hub folders) or
  processor_config.json's "image_processor" (transformers 5's save_pretrained), with
  Sam3ImageProcessor's defaults for keys left out."""
  settings = None
  for name, key in (("preprocessor_config.json", None), ("processor_config.json",
                                                          "image_processor")):
    path = os.path.join(folder, name)
    if os.path.exists(path):
      with open(path, encoding="utf-8") as f:
        data = json.load(f)
      data = data.get(key) if key else data
      if isinstance(data, dict):
        settings = data
        break
  if settings is None:
    raise FileNotFoundError(f"{where}: {folder} has no image processor settings "
                            "(preprocessor_config.json, or processor_config.json with an "
                            "\"image_processor\" entry)")
  size = settings.get("size") or {"height": 1008, "width": 1008}
  out = {"height": int(size.get("height", 1008)), "width": int(size.get("width", 1008)),
         "mean": list(settings.get("image_mean", [0.5, 0.5, 0.5])),
         "std": list(settings.get("image_std", [0.5, 0.5, 0.5])),
         "rescale_factor": float(settings.get("rescale_factor", 1 / 255)),
         "do_resize": bool(settings.get("do_resize", True)),
         "do_rescale": bool(settings.get("do_rescale", True)),
         "do_normalize": bool(settings.get("do_normalize", True))}
  resample = settings.get("resample", 2)
  if resample != 2:  # PIL's BILINEAR, Sam3ImageProcessor's filter
    raise ValueError(f"{where}: resample {resample!r} in the image processor settings; only "
                     "2 (bilinear, SAM 3's) is implemented")
  return out


class SAM3Backend:
  """transformers' Sam3Model with its tokenizer and image settings; PERIA's SAM tools."""

  def __init__(self, model, tokenizer, image_settings: dict, config: SegmentationConfig,
               device: str = "cpu"):
    self.model, self.tokenizer = model, tokenizer
    self.image_settings, self.config, self.device = image_settings, config, device
    self.text_length = int(model.config.text_config.max_position_embeddings)

  @classmethod
  def from_pretrained(cls, folder, device: str = "cpu", dtype="float32",
                      config: SegmentationConfig | None = None) -> "SAM3Backend":
    """A local SAM 3 folder: config.json (model_type "sam3", or "sam3_video": its detector),
    weights, tokenizer files and the image processor settings. FileNotFoundError names the
    folder and what is missing."""
    where = "SAM3Backend.from_pretrained"
    folder = check_folder(folder, where, {
        "config": ("config.json",), "weights": _WEIGHTS,
        "tokenizer": ("tokenizer.json", "vocab.json")})
    check_model_type(folder, where, ("sam3", "sam3_video"))
    settings = _image_settings(folder, where)
    from transformers import AutoTokenizer, Sam3Model  # pylint: disable=import-outside-toplevel
    _ensure_roi_align()
    model = Sam3Model.from_pretrained(folder, dtype=torch_dtype(dtype)).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return cls(model, tokenizer, settings, config or SegmentationConfig(), device)

  def with_config(self, config: SegmentationConfig) -> "SAM3Backend":
    """The same model with other settings."""
    other = copy.copy(self)
    other.config = config
    return other

  # -- model calls --

  def pixel_values(self, images_BxHxWx3):
    """[B, 3, h, w] float32 model input: the uint8 images resized as torchvision resizes
    uint8 tensors (antialiased bilinear, rounded to uint8), then rescaled and normalised."""
    import torch  # pylint: disable=import-outside-toplevel
    import torch.nn.functional as F  # pylint: disable=import-outside-toplevel
    s = self.image_settings
    # A copy: callback inputs arrive read-only, and torch wants writable memory.
    x = torch.from_numpy(np.array(check_images(images_BxHxWx3, "SAM3Backend"))).permute(
        0, 3, 1, 2)
    if s["do_resize"] and tuple(x.shape[-2:]) != (s["height"], s["width"]):
      x = F.interpolate(x.contiguous(), size=(s["height"], s["width"]), mode="bilinear",
                        antialias=True, align_corners=False)
    x = x.float()
    mean = torch.tensor(s["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(s["std"]).view(1, 3, 1, 1)
    if s["do_rescale"]:
      x = x * s["rescale_factor"]
    if s["do_normalize"]:
      x = (x - mean) / std
    return x

  def forward(self, images_BxHxWx3, texts: Sequence[str],
              boxes_grid_Bx4=None) -> dict[str, np.ndarray]:
    """The raw outputs for one text per image and optionally one positive box each (0-1000
    grid): scores [B, Q] (sigmoid(logit) * sigmoid(presence)), presence [B] (its
    probability), boxes [B, Q, 4] (x1, y1, x2, y2 in [0, 1]), mask_logits [B, Q, h, w]."""
    raw = self._raw(images_BxHxWx3, texts, boxes_grid_Bx4)
    return {**raw, "mask_logits": raw["mask_logits"].float().cpu().numpy()}

  def _raw(self, images_BxHxWx3, texts: Sequence[str], boxes_grid_Bx4=None) -> dict:
    """`forward` with the mask logits left a tensor on the model's device: the tools take
    the few kept ones (a real model's are [B, 200, 288, 288])."""
    import torch  # pylint: disable=import-outside-toplevel
    images = check_images(images_BxHxWx3, "SAM3Backend.forward")
    if len(texts) != images.shape[0]:
      raise ValueError(f"SAM3Backend.forward: {len(texts)} texts for {images.shape[0]} images")
    dtype = next(self.model.parameters()).dtype
    tokens = self.tokenizer(list(texts), padding="max_length", max_length=self.text_length,
                            truncation=True, return_tensors="pt")
    inputs = {"pixel_values": self.pixel_values(images).to(self.device, dtype),
              "input_ids": tokens["input_ids"].to(self.device),
              "attention_mask": tokens["attention_mask"].to(self.device)}
    if boxes_grid_Bx4 is not None:
      boxes = np.asarray(boxes_grid_Bx4, np.float64).reshape(images.shape[0], 4)
      cxcywh = np.stack([unit_cxcywh_from_grid(b) for b in boxes])
      inputs["input_boxes"] = torch.tensor(cxcywh[:, None], dtype=dtype, device=self.device)
      inputs["input_boxes_labels"] = torch.ones(images.shape[0], 1, dtype=torch.long,
                                                device=self.device)
    with torch.inference_mode():
      out = self.model(**inputs)
    presence = out.presence_logits.float().sigmoid().reshape(-1)
    scores = out.pred_logits.float().sigmoid() * presence[:, None]
    return {"scores": scores.cpu().numpy(), "presence": presence.cpu().numpy(),
            "boxes": out.pred_boxes.float().cpu().numpy(), "mask_logits": out.pred_masks}

  def _kept(self, scores_Q: np.ndarray, threshold: float) -> np.ndarray:
    """Query indices scoring above `threshold`, best first, at most max_proposals."""
    order = np.argsort(-scores_Q, kind="stable")
    return order[scores_Q[order] > threshold][:self.config.max_proposals]

  # -- the padded array form --

  def padded_outputs(self) -> dict:
    """Per-example output shapes of `segment_padded` as (shape, dtype), HostTool's form."""
    k, (h, w) = self.config.max_proposals, self.config.mask_size
    return {"boxes": ((k, 4), jnp.float32), "scores": ((k,), jnp.float32),
            "masks": ((k, h, w), jnp.bool_), "count": ((), jnp.int32),
            "valid": ((k,), jnp.bool_), "prompt_ok": ((), jnp.bool_)}

  def segment_padded(self, images_BxHxWx3, text_prompt: str | Sequence[str] | None = None,
                     boxes_grid_Bx4=None, score_threshold: float | None = None) -> dict:
    """Fixed-shape proposals for a batch: boxes [B, K, 4] float32 (0-1000 grid), scores
    [B, K], masks [B, K, h, w] bool (config.mask_size), count [B] int32, valid [B, K] bool
    (the first `count` slots, best first; the rest zeros), prompt_ok [B] bool.

    `text_prompt`: one text for every image or one per image (the caller's, static); None
    means config.auto_prompt, or config.box_prompt_text with boxes. `boxes_grid_Bx4`: one
    positive box per image, as the model wrote it on device: a row that is not a valid
    0-1000 box (non-finite, out of range, x2 <= x1) gets prompt_ok False and no proposals.
    """
    import torch  # pylint: disable=import-outside-toplevel
    import torch.nn.functional as F  # pylint: disable=import-outside-toplevel
    images = check_images(images_BxHxWx3, "SAM3Backend.segment_padded")
    batch = images.shape[0]
    default = self.config.auto_prompt if boxes_grid_Bx4 is None else self.config.box_prompt_text
    texts = _texts(text_prompt, batch, default, "SAM3Backend.segment_padded")
    prompt_ok = np.ones(batch, bool)
    boxes_in = None
    if boxes_grid_Bx4 is not None:
      boxes_in = np.asarray(boxes_grid_Bx4, np.float64)
      if boxes_in.shape != (batch, 4):
        raise ValueError(f"SAM3Backend.segment_padded: boxes_grid_Bx4 must be [{batch}, 4], "
                         f"got {boxes_in.shape}")
      finite = np.isfinite(boxes_in).all(1)
      safe = np.where(finite[:, None], boxes_in, 0.0)
      prompt_ok = (finite & (safe.min(1) >= 0) & (safe.max(1) <= GRID)
                   & (safe[:, 2] > safe[:, 0]) & (safe[:, 3] > safe[:, 1]))
      # A bad row still runs (one batched call) on a harmless whole-image box.
      boxes_in = np.where(prompt_ok[:, None], safe, [0.0, 0.0, GRID, GRID])
    raw = self._raw(images, texts, boxes_in)
    threshold = self.config.score_threshold if score_threshold is None else score_threshold
    k, (h, w) = self.config.max_proposals, self.config.mask_size
    out = {"boxes": np.zeros((batch, k, 4), np.float32), "scores": np.zeros((batch, k), np.float32),
           "masks": np.zeros((batch, k, h, w), bool), "count": np.zeros(batch, np.int32),
           "valid": np.zeros((batch, k), bool), "prompt_ok": prompt_ok}
    for b in range(batch):
      if not prompt_ok[b]:
        continue
      kept = self._kept(raw["scores"][b], threshold)
      n = len(kept)
      out["count"][b] = n
      out["valid"][b, :n] = True
      out["scores"][b, :n] = raw["scores"][b, kept]
      out["boxes"][b, :n] = np.clip(raw["boxes"][b, kept] * GRID, 0, GRID)
      if n:
        logits = raw["mask_logits"][b, torch.from_numpy(kept)].float()[None]
        small = F.interpolate(logits, size=(h, w), mode="bilinear", align_corners=False)[0]
        out["masks"][b, :n] = (small.sigmoid() > self.config.mask_threshold).cpu().numpy()
    return out

  # -- PERIA's tools --

  def _proposals(self, image: np.ndarray, text: str, box=None) -> list[dict]:
    """The kept instances of one image: score, box (x1, y1, x2, y2 in [0, 1]) and the
    full-resolution mask's area and centroid (pixels), best first."""
    import torch.nn.functional as F  # pylint: disable=import-outside-toplevel
    height, width = image.shape[:2]
    raw = self._raw(image[None], [text], None if box is None else [box])
    found = []
    for q in self._kept(raw["scores"][0], self.config.score_threshold):
      # PERIA resizes the logits to the image, then thresholds their sigmoid; one mask at a
      # time keeps a large image's memory bounded.
      logits = raw["mask_logits"][0, int(q)].float()[None, None]
      mask = (F.interpolate(logits, size=(height, width), mode="bilinear",
                            align_corners=False)[0, 0].sigmoid()
              > self.config.mask_threshold).cpu().numpy()
      area = int(mask.sum())
      if area:
        rows, cols = np.nonzero(mask)
        centroid = (float(cols.mean()), float(rows.mean()))
      else:
        centroid = None
      found.append({"score": float(raw["scores"][0, q]), "box": raw["boxes"][0, q],
                    "area": area, "centroid": centroid})
    return found

  def _format(self, found: list[dict], height: int, width: int, counting: bool = False):
    """PERIA's proposal dicts: pixels (peria_format) or the 0-1000 grid."""
    items = []
    for p in found:
      x1, y1, x2, y2 = (float(v) for v in p["box"])
      if self.config.peria_format:
        # float32 products, as PERIA's processor scales boxes before truncating them.
        scaled = np.asarray(p["box"], np.float32) * np.float32([width, height] * 2)
        pixels = [int(v) for v in scaled]
        item = {"score": round(p["score"], 2), "bbox_xyxy": pixels}
        if not counting:
          if p["area"]:
            cx, cy = p["centroid"]
            item["area"] = p["area"]
          else:  # PERIA's fallback for an empty mask: the box's area and centre
            item["area"] = (pixels[2] - pixels[0]) * (pixels[3] - pixels[1])
            cx, cy = (pixels[0] + pixels[2]) / 2.0, (pixels[1] + pixels[3]) / 2.0
          item["centroid"] = [round(cx, 1), round(cy, 1)]
      else:
        item = {"score": round(p["score"], 2),
                "bbox_xyxy": grid_from_unit([x1, y1, x2, y2]).tolist()}
        if not counting:
          item["area_fraction"] = round(p["area"] / (height * width), 4)
          if p["area"]:
            # Pixel j's centre is at edge coordinate j + 0.5: grid (j + 0.5) * 1000 / W.
            cx, cy = ((p["centroid"][0] + 0.5) * GRID / width,
                      (p["centroid"][1] + 0.5) * GRID / height)
          else:
            cx, cy = (x1 + x2) / 2 * GRID, (y1 + y2) / 2 * GRID
          item["centroid"] = [round(cx, 1), round(cy, 1)]
      if counting:
        item = {"bbox_xyxy": item["bbox_xyxy"], "score": item["score"]}
      items.append(item)
    return items

  def _segment(self, image, text: str, box=None, query: str | None = None,
               exemplar: bool = False) -> str:
    found = self._proposals(image, text, box)
    height, width = image.shape[:2]
    payload = {"image_size": [height, width]}
    if query is not None:
      payload["query"] = query
    if exemplar:
      payload["exemplar_bbox"] = (list(unit_cxcywh_from_grid(box)) if self.config.peria_format
                                  else [_number(c) for c in box])
    payload["proposals"] = self._format(found, height, width)
    return result_text(payload, self.config.peria_format)

  def auto_segment(self, image_HxWx3) -> str:
    """PERIA's auto_segment: every object (the text prompt config.auto_prompt)."""
    image = check_image(image_HxWx3, "auto_segment")
    return self._segment(image, self.config.auto_prompt)

  def bbox_segment(self, image_HxWx3, bounding_box=None) -> str:
    """PERIA's bbox_segment: the instances the box prompt selects."""
    return self._box_segment("bbox_segment", image_HxWx3, bounding_box, exemplar=False)

  def exemplar_segment(self, image_HxWx3, bounding_box=None) -> str:
    """PERIA's exemplar_segment: every instance like the box's content."""
    return self._box_segment("exemplar_segment", image_HxWx3, bounding_box, exemplar=True)

  def _text_arguments(self, tool: str, image_HxWx3, text_prompt):
    """(image, text prompt), or (None, the tool's error text) for a bad text argument."""
    image = check_image(image_HxWx3, tool)
    try:
      return image, parse_text(text_prompt, "text_prompt")
    except ToolArgumentError as e:
      return None, error_text(tool, e)

  def _box_segment(self, tool: str, image_HxWx3, bounding_box, exemplar: bool) -> str:
    image = check_image(image_HxWx3, tool)
    try:
      box = parse_box(bounding_box)
    except ToolArgumentError as e:
      return error_text(tool, e)
    return self._segment(image, self.config.box_prompt_text, box, exemplar=exemplar)

  def text_segment(self, image_HxWx3, text_prompt=None) -> str:
    """PERIA's text_segment: the instances of an open-vocabulary text prompt."""
    image, text = self._text_arguments("text_segment", image_HxWx3, text_prompt)
    if image is None:
      return text  # the tool's error text
    return self._segment(image, text, query=text)

  def concept_count(self, image_HxWx3, text_prompt=None) -> str:
    """PERIA's concept_count: {"count": n, "instances": [{"bbox_xyxy", "score"}]}."""
    image, text = self._text_arguments("concept_count", image_HxWx3, text_prompt)
    if image is None:
      return text  # the tool's error text
    found = self._proposals(image, text)
    height, width = image.shape[:2]
    instances = self._format(found, height, width, counting=True)
    return result_text({"image_size": [height, width], "query": text,
                        "count": len(instances), "instances": instances},
                       self.config.peria_format)

  def presence_check(self, image_HxWx3, text_prompt=None) -> str:
    """PERIA's presence_check: scores kept above the presence threshold; confidence is the
    best of them (0 when none), present when it reaches the score threshold, count the
    kept scores that reach it."""
    image, text = self._text_arguments("presence_check", image_HxWx3, text_prompt)
    if image is None:
      return text  # the tool's error text
    raw = self._raw(image[None], [text])
    kept = raw["scores"][0, self._kept(raw["scores"][0], self.config.presence_threshold)]
    confidence = float(kept.max()) if kept.size else 0.0
    height, width = image.shape[:2]
    return result_text({"image_size": [height, width], "query": text,
                        "present": confidence >= self.config.score_threshold,
                        "confidence": round(confidence, 3),
                        "count": int((kept >= self.config.score_threshold).sum())},
                       self.config.peria_format)

  def run_tool(self, name, image_HxWx3, arguments) -> str:
    """A parsed call: tool `name` on the image the caller resolved from `image_index`, with
    the model's `arguments`. An unknown tool, a non-dict or an unknown argument is error
    text, as the tools' own argument errors are."""
    label = name if isinstance(name, str) and len(name) <= 64 else short(name, 64)
    if name not in SAM3_TOOLS:
      return error_text(label, f"unknown SAM 3 tool; expected one of {list(SAM3_TOOLS)}")
    try:
      arguments = tool_arguments(arguments, TOOL_ARGUMENTS[name])
    except ToolArgumentError as e:
      return error_text(name, e)
    if name == "auto_segment":
      return self.auto_segment(image_HxWx3)
    if name in ("bbox_segment", "exemplar_segment"):
      return getattr(self, name)(image_HxWx3, arguments.get("bounding_box"))
    return getattr(self, name)(image_HxWx3, arguments.get("text_prompt"))


def _number(value: float):
  return int(value) if float(value).is_integer() else value


def _texts(text_prompt, batch: int, default: str, where: str) -> list[str]:
  """One caller-given text per image (these are the caller's: bad ones raise)."""
  if text_prompt is None:
    return [default] * batch
  texts = [text_prompt] * batch if isinstance(text_prompt, str) else list(text_prompt)
  if len(texts) != batch or not all(isinstance(t, str) and t.strip() for t in texts):
    raise ValueError(f"{where}: text_prompt must be a non-empty string or {batch} of them, "
                     f"got {short(text_prompt)}")
  return [t.strip() for t in texts]
