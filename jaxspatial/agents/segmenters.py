"""SpatialClaw's segmentation sources: stored instance maps (`InstanceMasks`, synthetic
scenes) and SAM 3 (`SAM3Segmenter`); identity through frames by mask IoU
(`mask_iou`, `link_instances`) where a segmenter has no video mode of its own."""

from __future__ import annotations

import dataclasses
import threading
from typing import Sequence

import numpy as np

def mask_iou(a_KxHxW: np.ndarray, b_MxHxW: np.ndarray) -> np.ndarray:
  """IoU [K, M] of two stacks of boolean masks (0 where both are empty)."""
  a = np.asarray(a_KxHxW, bool).reshape(len(a_KxHxW), -1).astype(np.float32)
  b = np.asarray(b_MxHxW, bool).reshape(len(b_MxHxW), -1).astype(np.float32)
  inter = a @ b.T
  union = a.sum(1)[:, None] + b.sum(1)[None, :] - inter
  return np.where(union > 0, inter / np.maximum(union, 1.0), 0.0)


def link_instances(per_frame: Sequence[Sequence[np.ndarray]], start: int, grow: bool,
                   min_iou: float = 0.3) -> list[list[int | None]]:
  """Identity through a frame sequence by mask IoU: tracks[k][t] is the index into
  per_frame[t] of track k's instance (None: not found there). The tracks begin as the
  instances at position `start`; matching runs from `start` to the end, then from `start`
  back to the beginning, each frame's instances against the tracks' latest masks (one-to-one,
  the assignment with the largest total IoU; pairs under `min_iou` stay apart). With `grow`
  an instance that matches no track starts a new one (a text prompt finds objects that
  enter later); without it only the starting instances are followed (a box or points)."""
  from scipy.optimize import linear_sum_assignment  # pylint: disable=import-outside-toplevel
  count = len(per_frame)
  tracks: list[list[int | None]] = []
  for k in range(len(per_frame[start])):
    tracks.append([None] * count)
    tracks[k][start] = k
  for order in (range(start + 1, count), range(start - 1, -1, -1)):
    latest = {k: per_frame[start][k] for k in range(len(per_frame[start]))}
    for t in order:
      found = list(per_frame[t])
      matched = set()
      if latest and found:
        ids = list(latest)
        iou = mask_iou(np.stack([latest[k] for k in ids]), np.stack(found))
        for r, c in zip(*linear_sum_assignment(-iou)):
          if iou[r, c] >= min_iou:
            tracks[ids[r]][t] = int(c)
            latest[ids[r]] = found[c]
            matched.add(int(c))
      if grow:
        for c in range(len(found)):
          if c not in matched:
            tracks.append([None] * count)
            tracks[-1][t] = c
            latest[len(tracks) - 1] = found[c]
  return tracks


class InstanceMasks:
  """A segmenter from stored instance maps [N, H, W] (-1 = none) and object names
  {name: instance id}: a text prompt selects the objects whose name contains it (or the
  other way round); a box, the instances covering most of it; points, the instances under
  the positive points and not under a negative one; several prompts, the objects all of
  them select; none, every object. Identity through frames is the stored ids. For scenes
  whose instance ids are known (the synthetic set); SAM 3 does this on real images."""

  def __init__(self, instance_NxHxW, names: dict[str, int]):
    self.instance = np.asarray(instance_NxHxW, np.int32)
    self.names = {str(k).lower(): int(v) for k, v in names.items()}

  def _chosen(self, frame: int, text, box, points, labels) -> list[int]:
    ids = self.instance[frame]
    chosen = sorted(set(int(v) for v in np.unique(ids) if v >= 0))
    if text is not None:
      want = " ".join(text.lower().split())
      named = {i for n, i in self.names.items() if n and (want in n or n in want)}
      chosen = [i for i in chosen if i in named]
    if box is not None:
      x1, y1, x2, y2 = (int(round(c)) for c in box)
      inside = ids[y1:y2, x1:x2]
      values, counts = np.unique(inside[inside >= 0], return_counts=True)
      boxed = {int(v) for v, c in zip(values, counts) if c >= 0.2 * inside.size}
      chosen = [i for i in chosen if i in boxed]
    if points is not None:
      under = [int(ids[min(int(y), ids.shape[0] - 1), min(int(x), ids.shape[1] - 1)])
               for x, y in points]
      positive = {u for u, l in zip(under, labels) if l and u >= 0}
      negative = {u for u, l in zip(under, labels) if not l}
      chosen = [i for i in chosen if i in positive and i not in negative]
    return chosen

  def segment(self, frame: int, image: np.ndarray, text: str | None, box, points=None,
              labels=None) -> list[dict]:
    del image
    out = []
    for instance in self._chosen(frame, text, box, points, labels):
      mask = self.instance[frame] == instance
      if mask.any():
        out.append({"mask": mask, "score": 1.0})
    return out

  def exists(self, frame: int, image: np.ndarray, text: str) -> tuple[bool, float]:
    present = bool(self.segment(frame, image, text, None))
    return present, float(present)

  def segment_video(self, frames: Sequence[int], images, prompt_frame: int, text, box,
                    points=None, labels=None) -> tuple[list[dict], str]:
    """([{"masks": {frame: (mask, score)}}] per object, the method's name): the stored ids
    of the objects the prompts select (in every frame for text alone, else in
    `prompt_frame`)."""
    del images
    if box is None and points is None:
      ids = sorted({i for f in frames for i in self._chosen(f, text, None, None, None)})
    else:
      ids = self._chosen(prompt_frame, text, box, points, labels)
    out = []
    for instance in ids:
      masks = {}
      for f in frames:
        mask = self.instance[f] == instance
        if mask.any():
          masks[f] = (mask, 1.0)
      out.append({"masks": masks})
    return out, "stored instance ids"


class SAM3Segmenter:
  """SAM 3 (`perception.segmentation.SAM3Backend`) from a model folder or a backend.
  Text and a box go to SAM 3 as prompts (a box alone: SAM 3's exemplar prompt, every
  instance like the boxed one); points pick, among SAM 3's instances for the text or box
  (or every object, the backend's auto prompt), those whose mask holds every positive
  point and no negative one (SAM3Backend takes no point prompts). `exists`: any instance
  scoring above the threshold."""

  def __init__(self, source, device: str = "cpu", score_threshold: float | None = None):
    self.source, self.device, self.score_threshold = source, device, score_threshold
    self._backend = None
    self._lock = threading.Lock()

  def backend(self):
    from jaxspatial.perception import tools as perception_tools  # pylint: disable=import-outside-toplevel
    with self._lock:
      if self._backend is None:
        if isinstance(self.source, (str, bytes)) or hasattr(self.source, "__fspath__"):
          self._backend = perception_tools.load_backend("sam3", self.source,
                                                        device=self.device)
        else:
          self._backend = self.source
      return self._backend

  def _padded(self, image: np.ndarray, text, box, mask_size) -> dict:
    from jaxspatial.perception.segmentation import GRID  # pylint: disable=import-outside-toplevel
    backend = self.backend()
    height, width = image.shape[:2]
    config = dataclasses.replace(backend.config, mask_size=mask_size)
    grid_box = None
    if box is not None:
      grid_box = np.asarray([[box[0] * GRID / width, box[1] * GRID / height,
                              box[2] * GRID / width, box[3] * GRID / height]])
    return backend.with_config(config).segment_padded(image[None], text_prompt=text,
                                                      boxes_grid_Bx4=grid_box,
                                                      score_threshold=self.score_threshold)

  def segment(self, frame: int, image: np.ndarray, text: str | None, box, points=None,
              labels=None) -> list[dict]:
    del frame
    out = self._padded(image, text, box, image.shape[:2])
    found = [{"mask": out["masks"][0, k], "score": float(out["scores"][0, k])}
             for k in range(int(out["count"][0]))]
    if points is not None:
      def picked(mask):
        inside = [bool(mask[min(int(y), mask.shape[0] - 1), min(int(x), mask.shape[1] - 1)])
                  for x, y in points]
        return all(h for h, l in zip(inside, labels) if l) and not any(
            h for h, l in zip(inside, labels) if not l)
      found = [item for item in found if picked(item["mask"])]
    return found

  def exists(self, frame: int, image: np.ndarray, text: str) -> tuple[bool, float]:
    del frame
    out = self._padded(image, text, None, (8, 8))
    count = int(out["count"][0])
    return count > 0, float(out["scores"][0, :count].max()) if count else 0.0
